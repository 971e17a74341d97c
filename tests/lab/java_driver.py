"""Build the Java lab driver (``drivers/java/KwireDriver.java``) against pinned kafka-clients versions.

For each version Maven copies kafka-clients, its compression libraries and slf4j-simple into
``.cache/drivers/java/<version>/libs`` and javac compiles the one shared source into
``.../classes``. A stamp (hash of the inputs) makes the build idempotent: a second call
runs no Maven, no javac and needs no network. A lock file serialises concurrent builds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "JAVA_CLIENT_VERSIONS",
    "JAVA_DRIVER_DIR",
    "JavaDriverError",
    "ensure_java_driver",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache"
M2_REPO = CACHE_DIR / "m2"
JAVA_DRIVER_DIR = CACHE_DIR / "drivers" / "java"
SOURCE_DIR = Path(__file__).resolve().parent / "drivers" / "java"
SOURCE = SOURCE_DIR / "KwireDriver.java"
POM_TEMPLATE = SOURCE_DIR / "pom.template.xml"

#: The pinned kafka-clients versions (3.9.2 is the newest 3.9.x Maven Central serves).
JAVA_CLIENT_VERSIONS: tuple[str, ...] = ("0.10.2.2", "2.8.2", "3.9.2", "4.1.1")
#: slf4j 1.7.36 is what kafka-clients 3.x/4.x declare; 0.10/2.8 call only the 1.7 API.
SLF4J_VERSION = "1.7.36"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
FETCH_TIMEOUT_S = 600.0
COMPILE_TIMEOUT_S = 300.0
LOCK_TIMEOUT_S = FETCH_TIMEOUT_S + COMPILE_TIMEOUT_S + 60.0
#: Lean JVM settings for a 2-core machine: small heap, serial GC, quick start.
JVM_FLAGS = ("-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


class JavaDriverError(RuntimeError):
    """The driver could not be fetched or compiled (message is one line)."""


def _java_tool(name: str) -> str:
    """``java`` or ``javac`` from $JAVA_HOME if set, else from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).exists():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise JavaDriverError(f"{name} not found (install a JDK >= 11)")
    return found


def _one_line(text: str, limit: int = 300) -> str:
    """The most telling line of Maven's or javac's output: its first error line, else its last line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line and line != "[ERROR]"]
    errors = [line for line in lines if "[ERROR]" in line or "error:" in line]
    return (errors or lines or ["(no output)"])[0 if errors else -1][:limit]


@contextlib.contextmanager
def _locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive flock on *path*, waiting at most *timeout* seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise JavaDriverError(f"timed out after {timeout:.0f}s waiting for lock {path}") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pom(version: str) -> str:
    return (
        POM_TEMPLATE.read_text().replace("@KAFKA_VERSION@", version).replace("@SLF4J_VERSION@", SLF4J_VERSION)
    )


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _error_names_file() -> Path:
    """Write the project's error table (code TAB name) for the driver's error_name field."""
    from decoder.protocol import ERRORS

    text = "".join(f"{code}\t{entry[0]}\n" for code, entry in sorted(ERRORS.items()))
    path = JAVA_DRIVER_DIR / "error_names.tsv"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _fetch_libs(version: str, home: Path) -> None:
    """Copy kafka-clients *version* and its runtime dependencies into ``home/libs`` (once)."""
    pom = _pom(version)
    stamp = home / "libs" / ".complete"
    if stamp.exists() and stamp.read_text() == _digest(pom):
        return
    shutil.rmtree(home / "libs", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(pom)
    command = [
        "mvn",
        "-B",
        "-q",
        "-Dstyle.color=never",
        f"-Dmaven.repo.local={M2_REPO}",
        "-f",
        str(home / "pom.xml"),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={home / 'libs'}",
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except FileNotFoundError:
        raise JavaDriverError("mvn not found (install Maven)") from None
    except subprocess.TimeoutExpired:
        raise JavaDriverError(f"mvn copy-dependencies for kafka-clients {version} timed out") from None
    if proc.returncode != 0:
        raise JavaDriverError(
            f"mvn could not fetch kafka-clients {version}: {_one_line(proc.stdout + proc.stderr)}"
        )
    if not list((home / "libs").glob(f"kafka-clients-{version}.jar")):
        raise JavaDriverError(f"mvn ran but kafka-clients-{version}.jar is not in {home / 'libs'}")
    stamp.write_text(_digest(pom))


def _compile(version: str, home: Path) -> None:
    """javac KwireDriver.java against ``home/libs`` into ``home/classes`` (once per source)."""
    source = SOURCE.read_text()
    stamp = home / "classes" / ".complete"
    key = _digest(source, (home / "libs" / ".complete").read_text())
    if stamp.exists() and stamp.read_text() == key:
        return
    shutil.rmtree(home / "classes", ignore_errors=True)
    (home / "classes").mkdir(parents=True)
    command = [
        _java_tool("javac"),
        "-nowarn",
        "-encoding",
        "UTF-8",
        "-cp",
        str(home / "libs" / "*"),
        "-d",
        str(home / "classes"),
        str(SOURCE),
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise JavaDriverError(f"javac for kafka-clients {version} timed out") from None
    if proc.returncode != 0:
        raise JavaDriverError(
            f"javac KwireDriver.java against kafka-clients {version} failed: {_one_line(proc.stdout + proc.stderr)}"
        )
    stamp.write_text(key)


def ensure_java_driver(version: str) -> list[str]:
    """Fetch and compile the Java driver for kafka-clients *version* (one of
    ``JAVA_CLIENT_VERSIONS``) if not done yet; return the argv prefix that runs it
    (append the driver arguments: ``--bootstrap ... --out FILE``).

    Raises JavaDriverError (one line) when Maven or javac fails.
    """
    if version not in JAVA_CLIENT_VERSIONS:
        raise JavaDriverError(
            f"kafka-clients {version} is not pinned; pinned: {', '.join(JAVA_CLIENT_VERSIONS)}"
        )
    home = JAVA_DRIVER_DIR / version
    with _locked(JAVA_DRIVER_DIR / f"{version}.lock"):
        _fetch_libs(version, home)
        _compile(version, home)
        names = _error_names_file()
    classpath = os.pathsep.join([str(home / "classes"), str(home / "libs" / "*")])
    return [_java_tool("java"), *JVM_FLAGS, f"-Dkwire.errorNames={names}", "-cp", classpath, "KwireDriver"]
