"""A class-data-sharing (AppCDS) archive of the Spark driver's classes, made once, then reused.

A local Spark driver loads and verifies thousands of classes from pyspark's jars on every
start: with an archive, a new session and one GROUP BY took 4.2 s of driver CPU instead of 8.9 s.
Runs map the archive (``-XX:SharedArchiveFile``; the JVM falls back to loading classes itself if
the archive does not fit, e.g. after a pyspark upgrade, which also changes the archive's name).

The archive is recorded by a JVM of its own (``python -m spark_jobs.class_archive``, which
``scripts/test`` runs before the tests): a JVM recording one (``-XX:ArchiveClassesAtExit``) started its
session in 12.6 s instead of 5-6 s without an archive (2.4-3.1 s with one), and went on
writing it for 14 s after its work was done. A run that finds no archive runs without one
and starts that recorder in the background at the lowest CPU priority.

The recorder analyses the bundled capture (:data:`_WARM_UP_CAPTURE`) rather than an empty
dataset, so the classes the tasks load are in the archive too. The archive is made by the JDK
the driver runs on (:mod:`spark_jobs.driver_java`), and only fits that one. On JDK 25, an
ahead-of-time cache (JEP 483/514: classes loaded and linked too) was tried in its place and
left: ``kwire analyze`` on the demo 3% slower than with this archive (``farm-bench -n 5``),
and a cold ``kwire sql`` 4% slower still.

The archive (~170-200 MB) lives in the clone's git-ignored ``.cache/spark-cds/``
(``$KWIRE_SPARK_CDS_DIR`` elsewhere); ``KWIRE_SPARK_CDS=0`` turns this off.

The JDK archives no class from a signed jar, and two of pyspark's jars are signed: janino and
commons-compiler, the code generator every query's first plan loads (355 classes; 240 ms to
load from the signed jars, 140 ms from unsigned copies, in a JVM of their own). The recorder
makes unsigned copies of every signed jar beside the archive (:func:`archive_classpath`), and
drivers that record or map the archive put them first on their class path, so the archive
holds those classes too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from kwire.runtime import cache_dir
from spark_jobs.driver_java import driver_java

__all__ = [
    "archive_classpath",
    "archive_dir",
    "archive_options",
    "jar_listing",
    "note_driver_pid",
    "pid_alive",
    "record",
]

_REPO = Path(__file__).resolve().parents[1]


def archive_dir() -> Path:
    """Where archives go: ``$KWIRE_SPARK_CDS_DIR``, else :func:`kwire.runtime.cache_dir` ``spark-cds``."""
    if os.environ.get("KWIRE_SPARK_CDS_DIR"):
        return Path(os.environ["KWIRE_SPARK_CDS_DIR"])
    return cache_dir("spark-cds")


#: Bumped when what a driver's class path holds changes for the same jars (2: unsigned copies).
_LAYOUT = 2


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def jar_listing(jars: Path) -> list[tuple[str, int]]:
    """(name, size) of each jar in ``jars``, sorted: what names a set of jars."""
    return sorted((p.name, p.stat().st_size) for p in jars.glob("*.jar")) if jars.is_dir() else []


def _key() -> str:
    """Names the JVM and the jar set: an archive only fits the classpath it was made from."""
    import pyspark

    jars = _pyspark_jars()
    listing = jar_listing(jars)
    digest = hashlib.sha256(repr((str(driver_java()), str(jars), listing, _LAYOUT)).encode()).hexdigest()[:16]
    return f"driver-{pyspark.__version__}-{digest}"


def _signature(name: str) -> bool:
    """Whether a jar entry is part of the jar's signature."""
    return name.startswith("META-INF/") and name.rsplit(".", 1)[-1] in ("SF", "RSA", "DSA", "EC")


def _unsigned_copy(source: Path, dest: Path) -> None:
    """``source`` without its signature files, written to ``dest`` (atomically)."""
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if _signature(info.filename):
                continue
            out.writestr(info, src.read(info))
    os.replace(partial, dest)


def _classpath_dir() -> Path:
    return archive_dir() / f"{_key()}.jars"


def _make_classpath() -> None:
    """Unsigned copies of pyspark's signed jars in :func:`_classpath_dir` (once: the archive
    records their sizes and times, so they are never written again)."""
    folder = _classpath_dir()
    if folder.is_dir():
        return
    for stale in folder.parent.glob(f".{folder.name}.*.tmp"):  # a recorder killed mid-copy
        shutil.rmtree(stale, ignore_errors=True)
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    partial.mkdir(parents=True)
    for jar in sorted(_pyspark_jars().glob("*.jar")):
        with zipfile.ZipFile(jar) as z:
            signed = any(_signature(name) for name in z.namelist())
        if signed:
            _unsigned_copy(jar, partial / jar.name)
    os.replace(partial, folder)


def archive_classpath() -> str:
    """What a driver that records or maps the archive puts first on its class path (the
    unsigned copies; empty before the recorder made them)."""
    folder = _classpath_dir()
    with contextlib.suppress(OSError):
        return os.pathsep.join(str(p) for p in sorted(folder.glob("*.jar")))
    return ""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` is running (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _settle(folder: Path, final: Path) -> bool:
    """Move recordings whose JVM has exited (the file is then complete) into place, clear
    leftovers; True while another driver is still recording."""
    busy = False
    for marker in folder.glob(f"{final.stem}.*.pid"):
        recording = marker.with_suffix(".recording")
        try:
            jvm_pid = int(marker.read_text())
        except (OSError, ValueError):
            jvm_pid = 0
        if jvm_pid and pid_alive(jvm_pid):
            busy = True
            continue
        if recording.is_file() and recording.stat().st_size > 0 and not final.exists():
            os.replace(recording, final)
        recording.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
    return busy


def _archive_path() -> Path:
    return archive_dir() / f"{_key()}.jsa"


_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # the JVM prints what it skips on stdout
_RECORDING_ENV = "KWIRE_SPARK_CDS_RECORDING"  # set in the recorder: its own session records


def archive_options(*, start_recorder: bool = True) -> tuple[str, Path | None]:
    """JVM options for a local driver: map the archive if there is one. Without one, this run
    goes without, and (``start_recorder``) a background process records it for later runs.
    The second value is the recording to mark with :func:`note_driver_pid` (the recorder's own
    session only; else None)."""
    if os.environ.get("KWIRE_SPARK_CDS", "1") == "0":
        return "", None
    try:
        final = _archive_path()
        final.parent.mkdir(parents=True, exist_ok=True)
        busy = _settle(final.parent, final)
    except OSError:
        return "", None
    if final.is_file():
        return f"-XX:SharedArchiveFile={final} {_QUIET}", None
    if busy:
        return "", None
    if os.environ.get(_RECORDING_ENV) == "1":  # the recorder's own session
        recording = final.parent / f"{final.stem}.{os.getpid()}.recording"
        return f"-XX:ArchiveClassesAtExit={recording} {_QUIET}", recording
    if start_recorder:
        _start_recorder(final.parent)
    return "", None


def _start_recorder(folder: Path) -> None:
    """``python -m spark_jobs.class_archive`` detached, at the lowest CPU priority (one at a time:
    a lock file holds the recorder's pid)."""
    lock = folder / "recorder.lock"
    try:
        pid = int(lock.read_text() or 0)
    except (OSError, ValueError):
        pid = 0
    if pid and pid_alive(pid):
        return
    lock.unlink(missing_ok=True)
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:
        return  # another run is starting one
    try:
        with open(folder / "recorder.log", "wb") as log:
            proc = subprocess.Popen(
                ["nice", "-n", "19", sys.executable, "-m", "spark_jobs.class_archive"],
                cwd=str(_REPO) if (_REPO / "spark_jobs").is_dir() else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        os.write(fd, str(proc.pid).encode())
    except OSError:
        lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


#: The bundled capture the recorder's session analyses (``scripts/demo``'s): with rows, the
#: analysis runs its tasks too, and the archive keeps the classes they load.
_WARM_UP_CAPTURE = _REPO / "captures" / "tansu-mixed.pcap"


def _warm_up_dataset(work: Path) -> Path:
    """A dataset to analyse while recording: the bundled capture decoded, else an empty one."""
    dataset = work / "dataset"
    if _WARM_UP_CAPTURE.is_file():
        decoded = subprocess.run(
            [sys.executable, "-m", "kwire", "decode", str(_WARM_UP_CAPTURE), "-o", str(dataset), "--quiet"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=300,
        )
        if decoded.returncode == 0:
            return dataset
        shutil.rmtree(dataset, ignore_errors=True)
    dataset.mkdir()
    return dataset


def _warm_up(spark, work: Path) -> None:
    """Load the classes a run loads: the whole analysis over the bundled capture (without code
    generation, then with it), then a few queries over rows (a Parquet round trip, joins,
    windows, aggregates, a checkpoint)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_jobs import codegen_cache
    from spark_jobs.kafka_versions import load_broker_versions
    from spark_jobs.session import TINY_DATA_BYTES, session_sql_conf
    from spark_jobs.submit import analyse

    dataset = _warm_up_dataset(work)
    analyse(spark, dataset, work / "report", versions=load_broker_versions())

    # again with code generation, as past the tiny size: the classes Janino makes for the
    # analysis go to spark_jobs.codegen_cache's folder, for a first analysis of such a dataset
    def settings_for(data_bytes: int) -> None:
        for key, value in session_sql_conf(data_bytes).items():
            spark.conf.set(key, value)

    codegen_cache.install(spark)
    settings_for(TINY_DATA_BYTES + 1)
    analyse(spark, dataset, work / "report-codegen", versions=load_broker_versions())
    settings_for(0)
    rows = spark.range(2000).select(
        (F.col("id") % 7).alias("k"), F.col("id").alias("v"), F.timestamp_micros("id").alias("t")
    )
    rows.write.partitionBy("k").parquet(str(work / "rows"))
    back = spark.read.parquet(str(work / "rows")).localCheckpoint(eager=True)
    w = Window.partitionBy("k").orderBy("t")
    back.withColumn("lag", F.lag("v").over(w)).groupBy("k").agg(
        F.count("*"), F.percentile_approx("v", 0.5), F.collect_set("lag")
    ).join(back.groupBy("k").agg(F.max("t")), "k").collect()
    back.createOrReplaceTempView("rows")
    spark.sql("SELECT k, count(*) AS n FROM rows GROUP BY 1 ORDER BY 2 DESC").collect()


def record(timeout_s: float = 600.0) -> Path | None:
    """Record the archive now, in a driver JVM of this process, and wait (at most ``timeout_s``)
    for the JVM to write it; returns the archive (None if it could not be made)."""
    from spark_jobs.session import build_session

    final = _archive_path()
    if final.is_file():
        return final
    _make_classpath()
    os.environ[_RECORDING_ENV] = "1"
    spark = build_session("local[2]", "kwire-class-archive", data_bytes=0)
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    gateway = spark.sparkContext._gateway
    with tempfile.TemporaryDirectory(prefix="kwire-cds-") as tmp:
        try:
            _warm_up(spark, Path(tmp))
        finally:
            spark.stop()
    proc = getattr(gateway, "proc", None)  # the driver JVM (spark-submit execs it)
    if proc is not None:
        proc.stdin.close()  # the JVM exits at EOF on its stdin, writing the archive
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    deadline = time.monotonic() + timeout_s
    while pid_alive(jvm_pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    _settle(final.parent, final)
    return final if final.is_file() else None


def note_driver_pid(recording: Path, spark) -> None:
    """Record the driver JVM's pid beside its recording: the archive is complete once it exits."""
    try:
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        recording.with_suffix(".pid").write_text(str(pid))
    except Exception:  # the archive is an optimisation: never fail a run for it
        pass


def _main() -> int:
    if os.environ.get("KWIRE_SPARK_CDS", "1") == "0":
        return 0
    folder = archive_dir()
    try:
        made = record()
    finally:
        lock = folder / "recorder.lock"
        try:
            if lock.read_text() == str(os.getpid()):
                lock.unlink()
        except OSError:
            pass
    print(f"class archive: {made or 'not made'}")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(_main())
