"""Spark's generated code compiled once and kept on disk: later local drivers load it.

Spark compiles the Java it generates for each query (whole-stage code, projections,
orderings) with Janino, and keeps the classes only as long as its JVM. With code generation on
(datasets past the tiny size, :func:`spark_jobs.session.data_profile`) an analysis of 100k
synthetic exchanges compiled 1,531 classes from 13 MB of source, about 11 s of its threads'
time in a 26 s analysis (Spark's own ``CodegenMetrics``), and every later analysis compiled
the same source again. :file:`jvm/CodegenDiskCache.java` puts a directory in front of Spark's
in-JVM cache: a class whose source (by SHA-256) was compiled by an earlier run is defined from
the bytes Janino made then, else compiled as before and stored.

The hook is one small class, compiled here with the driver JDK's ``javac`` the first time a
run needs it (about 1.5 s, once per pyspark version; the class archive's recorder,
:mod:`spark_jobs.class_archive`, usually has) and loaded into the running driver with a class
loader of its own (not the driver's class path: the class-data-sharing archive only fits the
class path it was made with). Only local drivers past the tiny size get it
(:func:`spark_jobs.session.build_session`; tiny data runs without generated code, and loading
the hook costs some 0.14 s); their executors are the same JVM. Cluster executors compile as
Spark does. No ``javac`` (a JRE): no hook, nothing else changes.

The recorder of the class archive analyses the bundled capture with code generation on too, so
that a first analysis past the tiny size finds most of its classes stored: 1,322 of 1,535 on
100k synthetic exchanges.

Where it lives: the clone's git-ignored ``.cache/spark-codegen/`` (``$KWIRE_SPARK_CODEGEN_DIR``
elsewhere), one folder per pyspark version and jar set, pruned to :data:`MAX_BYTES` (the least
recently used files first). ``KWIRE_SPARK_CODEGEN_CACHE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kwire.runtime import cache_dir
from spark_jobs.class_archive import jar_listing
from spark_jobs.driver_java import driver_java

__all__ = ["MAX_BYTES", "cache_folder", "counts", "hook_classes", "install", "prune"]

_SOURCE = Path(__file__).resolve().with_name("jvm") / "CodegenDiskCache.java"
_CLASS = "kwire.spark.CodegenDiskCache"
_SWITCH = "KWIRE_SPARK_CODEGEN_CACHE"
#: The stored classes kept per jar set; past it the least recently read go first.
MAX_BYTES = 256 * 1024 * 1024


def _root() -> Path:
    if os.environ.get("KWIRE_SPARK_CODEGEN_DIR"):
        return Path(os.environ["KWIRE_SPARK_CODEGEN_DIR"])
    return cache_dir("spark-codegen")


def _jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


@functools.cache
def _jar_set() -> str:
    """Names pyspark's version and jars: generated source compiles to other bytes against others."""
    import pyspark

    listing = jar_listing(_jars())
    return f"{pyspark.__version__}-{hashlib.sha256(repr(listing).encode()).hexdigest()[:16]}"


def cache_folder() -> Path:
    """Where this pyspark's compiled classes are kept."""
    return _root() / f"classes-{_jar_set()}"


def _javac() -> Path | None:
    javac = driver_java().with_name("javac")
    if javac.is_file():
        return javac
    found = shutil.which("javac")
    return Path(found) if found else None


def _hook_folder() -> Path:
    """Where the hook compiled from this source against this pyspark's jars goes."""
    source = _SOURCE.read_bytes()
    return _root() / f"hook-{hashlib.sha256(source + _jar_set().encode()).hexdigest()[:16]}"


def hook_classes() -> Path | None:
    """The folder holding the compiled hook, compiled now if missing; None without a ``javac``
    or when compiling fails."""
    folder = _hook_folder()
    if (folder / "kwire" / "spark" / "CodegenDiskCache.class").is_file():
        return folder
    javac = _javac()
    if javac is None:
        return None
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".hook-", dir=folder.parent))
    try:
        subprocess.run(
            [
                str(javac),
                "--release",
                "17",
                "-nowarn",
                "-Xlint:none",
                "-d",
                str(partial),
                "-cp",
                str(_jars() / "*"),
                str(_SOURCE),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(partial, folder)
    except (OSError, subprocess.SubprocessError):
        return folder if folder.is_dir() else None  # another run may have made it meanwhile
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


#: The hook's ``Class`` per driver JVM (by its py4j gateway) this process loaded it into.
_LOADED: dict[int, Any] = {}


def _hook(spark: Any) -> Any | None:
    """The hook's ``Class`` in the driver JVM (loaded once per JVM), or None."""
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    if id(gateway) in _LOADED:
        return _LOADED[id(gateway)]
    classes = hook_classes()
    if classes is None:
        return None
    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(classes) + os.sep).toURI().toURL()
    parent = jvm.org.apache.spark.util.Utils.getSparkClassLoader()
    hook = jvm.java.net.URLClassLoader(urls, parent).loadClass(_CLASS)
    _LOADED[id(gateway)] = hook
    return hook


def install(spark: Any, *, folder: Path | None = None) -> bool:
    """Put the disk cache (``folder``, default :func:`cache_folder`) in front of the local
    driver's code cache; False when it is off, the driver is not local, or the hook cannot be
    had (the run goes on as Spark's own). Installed again, it forgets the classes defined so far
    and reads ``folder`` from then on."""
    if os.environ.get(_SWITCH, "1") == "0" or not spark.sparkContext.master.startswith("local"):
        return False
    folder = folder or cache_folder()
    with contextlib.suppress(OSError):
        _prune_now_and_then(folder)
    try:
        hook = _hook(spark)
        if hook is None:
            return False
        jvm = spark.sparkContext._jvm
        gateway = spark.sparkContext._gateway
        kinds = gateway.new_array(jvm.java.lang.Class, 2)
        kinds[0] = jvm.java.lang.Class.forName("java.lang.String")
        kinds[1] = jvm.java.lang.Long.TYPE
        args = gateway.new_array(jvm.java.lang.Object, 2)
        args[0] = str(folder)
        args[1] = jvm.java.lang.Long.valueOf(int(spark.conf.get("spark.sql.codegen.cache.maxEntries", "100")))
        hook.getMethod("install", kinds).invoke(None, args)
    except Exception:  # py4j errors, an unexpected Spark: the run goes on without
        return False
    return True


def counts(spark: Any) -> dict[str, int]:
    """This driver's hits, misses, stored and failed loads or stores (zeros without the hook)."""
    hook = _LOADED.get(id(spark.sparkContext._gateway))
    if hook is None:
        return dict.fromkeys(("hits", "misses", "stored", "failed"), 0)
    no_kinds = spark.sparkContext._gateway.new_array(spark.sparkContext._jvm.java.lang.Class, 0)
    got = list(hook.getMethod("counts", no_kinds).invoke(None, None))
    return dict(zip(("hits", "misses", "stored", "failed"), (int(v) for v in got), strict=True))


def _prune_now_and_then(folder: Path, every_s: float = 3600.0, stale_s: float = 86400.0) -> None:
    """:func:`prune` at most once every ``every_s`` (a walk of the folder costs some 20 ms per
    thousand files), and remove the folders beside it (another pyspark's classes, an older
    hook) untouched for ``stale_s``."""
    stamp = folder / ".pruned"
    with contextlib.suppress(OSError):
        if time.time() - stamp.stat().st_mtime < every_s:
            return
    prune(folder, MAX_BYTES)
    folder.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    for other in folder.parent.iterdir():
        if (
            other.name.startswith(("classes-", "hook-"))
            and other not in (folder, _hook_folder())
            and other.is_dir()
        ):
            with contextlib.suppress(OSError):
                if time.time() - _last_use(other) > stale_s:
                    shutil.rmtree(other, ignore_errors=True)


def _last_use(folder: Path) -> float:
    """The latest time ``folder``'s stamp, the folder itself or a class file in it was used
    (a hook's folder holds one class file)."""
    times = [folder.stat().st_mtime]
    for path in (folder / ".pruned", folder / "kwire" / "spark" / "CodegenDiskCache.class"):
        with contextlib.suppress(OSError):
            st = path.stat()
            times.append(max(st.st_atime, st.st_mtime))
    return max(times)


def prune(folder: Path, max_bytes: int) -> int:
    """Remove the least recently used files of ``folder`` until it holds at most ``max_bytes``,
    and temporary files a killed run left; returns the files removed."""
    if not folder.is_dir():
        return 0
    files = []
    removed = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.name.endswith(".tmp"):
                path.unlink()
                removed += 1
            elif path.is_file() and path.name != ".pruned":
                st = path.stat()
                files.append((max(st.st_atime, st.st_mtime), st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            removed += 1
            total -= size
    return removed
