"""A class-data-sharing (AppCDS) archive of the Spark driver's classes, made once, then reused.

A local Spark driver loads and verifies thousands of classes from pyspark's jars on every
start: with an archive, a new session and one GROUP BY took 4.2 s of driver CPU instead of 8.9 s. The first run with no
archive records one as its JVM exits (``-XX:ArchiveClassesAtExit``); later runs map it
(``-XX:SharedArchiveFile``; the JVM falls back to loading classes itself if the archive does not
fit, e.g. after a pyspark upgrade, which also changes the archive's name).

The archive (~170 MB) lives in the clone's git-ignored ``.cache/spark-cds/``
(``$KWIRE_SPARK_CDS_DIR`` elsewhere); ``KWIRE_SPARK_CDS=0`` turns this off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

__all__ = ["archive_dir", "archive_options", "note_driver_pid", "pid_alive"]

_REPO = Path(__file__).resolve().parents[1]


def archive_dir() -> Path:
    """Where archives go: ``$KWIRE_SPARK_CDS_DIR``, else the clone's ``.cache/spark-cds``, else
    ``~/.cache/kwire/spark-cds`` for an installed kwire."""
    if os.environ.get("KWIRE_SPARK_CDS_DIR"):
        return Path(os.environ["KWIRE_SPARK_CDS_DIR"])
    if (_REPO / "pyproject.toml").is_file():
        return _REPO / ".cache" / "spark-cds"
    return Path.home() / ".cache" / "kwire" / "spark-cds"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java") or "java"
    return os.path.realpath(java)


def _key() -> str:
    """Names the JVM and the jar set: an archive only fits the classpath it was made from."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    listing = sorted((p.name, p.stat().st_size) for p in jars.glob("*.jar")) if jars.is_dir() else []
    digest = hashlib.sha256(repr((_java(), str(jars), listing)).encode()).hexdigest()[:16]
    return f"driver-{pyspark.__version__}-{digest}"


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


def archive_options() -> tuple[str, Path | None]:
    """JVM options for a local driver, and the recording to mark with :func:`note_driver_pid`
    (None when an archive is used, another driver is recording one, or archives are off)."""
    if os.environ.get("KWIRE_SPARK_CDS", "1") == "0":
        return "", None
    folder = archive_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{_key()}.jsa"
        busy = _settle(folder, final)
    except OSError:
        return "", None
    quiet = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # the JVM prints what it skips on stdout
    if final.is_file():
        return f"-XX:SharedArchiveFile={final} {quiet}", None
    if busy:
        return "", None
    recording = folder / f"{final.stem}.{os.getpid()}.recording"
    return f"-XX:ArchiveClassesAtExit={recording} {quiet}", recording


def note_driver_pid(recording: Path, spark) -> None:
    """Record the driver JVM's pid beside its recording: the archive is complete once it exits."""
    try:
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        recording.with_suffix(".pid").write_text(str(pid))
    except Exception:  # the archive is an optimisation: never fail a run for it
        pass
