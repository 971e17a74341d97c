"""Which Java runs the Spark driver JVM that kwire starts itself (a local master).

JDK 25 runs kwire's analysis faster than JDK 17, each with its class-data archive
(:mod:`spark_jobs.class_archive`), on this 2-core machine (``farm-bench``, alternating): ``kwire
analyze`` on the demo capture 0.934 of JDK 17's wall time (11.49 s against 12.63 s median, 5
pairs), 1M synthetic exchanges 72.4-73.9 s against 77.4-80.9 s (2 pairs, analysis only). A cold
``kwire sql`` of one GROUP BY starts a little slower: 1.04 (3.00 s against 2.89 s, 8 pairs).

The choice, first match wins:

* ``$KWIRE_JAVA_HOME``: that JDK (``system`` means the ``java`` of ``$JAVA_HOME`` or ``PATH``);
* ``$JAVA_HOME`` set: the user's choice, as Spark itself would take it;
* else the newest JDK of at least :data:`PREFERRED_MAJOR` in ``/usr/lib/jvm`` (machines of this
  project's kind carry a Temurin 25 beside the system's JDK 17);
* else ``java`` on ``PATH``.

Only the driver JVM that :func:`spark_jobs.session.build_session` launches is affected, for the
time of its launch (:func:`launch_env`): Kafka brokers, ``spark-submit`` and cluster workers
keep the Java of the environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PREFERRED_MAJOR", "driver_java", "driver_java_home", "java_major", "launch_env"]

#: The oldest JDK looked for in ``/usr/lib/jvm`` (the LTS measured above).
PREFERRED_MAJOR = 25
_JVM_DIR = Path("/usr/lib/jvm")


def _release_major(home: Path) -> int:
    """The feature version in a JDK's ``release`` file (0 if unreadable)."""
    try:
        text = (home / "release").read_text(errors="replace")
    except OSError:
        return 0
    found = re.search(r'^JAVA_VERSION="(?:1\.)?(\d+)', text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def _newest_installed() -> Path | None:
    best: tuple[int, str] | None = None
    with contextlib.suppress(OSError):
        for home in _JVM_DIR.iterdir():
            major = _release_major(home)
            if major >= PREFERRED_MAJOR and (home / "bin" / "java").is_file():
                best = max(best or (0, ""), (major, str(home)))
    return Path(best[1]) if best else None


def driver_java_home() -> Path | None:
    """The JDK to launch the driver with, or None for the environment's own ``java``."""
    wanted = os.environ.get("KWIRE_JAVA_HOME", "")
    if wanted:
        return None if wanted == "system" else Path(wanted)
    if os.environ.get("JAVA_HOME"):
        return None
    return _newest_installed()


def driver_java() -> Path:
    """The ``java`` binary the driver runs (resolved through links)."""
    home = driver_java_home() or (Path(os.environ["JAVA_HOME"]) if os.environ.get("JAVA_HOME") else None)
    java = home / "bin" / "java" if home else Path(shutil.which("java") or "java")
    return Path(os.path.realpath(java))


def java_major(java: Path) -> int:
    """The feature version of the JDK that holds ``java`` (``.../bin/java``); 0 if unknown."""
    return _release_major(java.parent.parent)


@contextlib.contextmanager
def launch_env() -> Iterator[None]:
    """``JAVA_HOME`` set to :func:`driver_java_home` while a driver JVM is launched inside, then
    put back (pyspark reads it from ``os.environ`` when it starts the JVM)."""
    home = driver_java_home()
    if home is None:
        yield
        return
    before = os.environ.get("JAVA_HOME")
    os.environ["JAVA_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("JAVA_HOME", None)
        else:
            os.environ["JAVA_HOME"] = before
