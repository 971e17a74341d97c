"""Fetch Apache Kafka broker releases from Maven Central into ``.cache/kafka/<version>/libs/``.

Each release is resolved by Maven over a small generated pom (the broker jar, its
transitive runtime dependencies, a log4j binding and, for old releases, the JAXB jars
that JDK 11+ no longer ships). ``ensure_kafka`` is idempotent and holds a lock file,
so concurrent callers fetch once; a finished fetch is marked by ``libs/.complete``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = [
    "CACHE_DIR",
    "RELEASES",
    "KafkaFetchError",
    "Release",
    "dist_size",
    "ensure_kafka",
    "release",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache"
KAFKA_CACHE = CACHE_DIR / "kafka"
M2_REPO = CACHE_DIR / "m2"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
FETCH_TIMEOUT_S = 900.0
LOCK_TIMEOUT_S = FETCH_TIMEOUT_S + 60.0

# KAFKA-9573: Kafka 0.10.x calls javax.xml.bind.DatatypeConverter (CoreUtils, to make the
# cluster id), gone from the JDK since 11: without these jars 0.10.2 dies at startup on JDK 17.
# 0.9.0.1 and 2.8.2 reference no javax.xml.bind class and need no JAXB.
_JAXB = ("javax.xml.bind:jaxb-api:2.3.1", "com.sun.xml.bind:jaxb-impl:2.3.9")


@dataclass(frozen=True)
class Release:
    """One pinned Kafka release and the facts needed to run it."""

    version: str
    scala: str
    #: "kraft" (separate controller quorum) or "zk" (ZooKeeper-backed brokers).
    mode: str
    #: Extra Maven coordinates (group:artifact:version) added next to ``kafka_<scala>``.
    extra: tuple[str, ...] = ()
    #: "log4j2" (Kafka 4.x) or "log4j" (log4j 1.x / reload4j, Kafka <= 3.9).
    logging: str = "log4j"
    topic_command: str = "kafka.admin.TopicCommand"
    #: TopicCommand talks to ZooKeeper (``--zookeeper``) rather than ``--bootstrap-server``.
    topic_command_zk: bool = False
    #: Extra JVM flags. None was needed on JDK 17: each pinned release started, created and
    #: deleted a topic without any --add-opens.
    jvm_flags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def artifact(self) -> str:
        """The broker's Maven coordinates."""
        return f"org.apache.kafka:kafka_{self.scala}:{self.version}"

    @property
    def home(self) -> Path:
        """The folder ``ensure_kafka`` fills (``libs/`` inside it)."""
        return KAFKA_CACHE / self.version


#: The pinned releases, keyed by short name ("4.1") as well as reachable by exact version.
RELEASES: dict[str, Release] = {
    "4.1": Release(
        "4.1.1",
        "2.13",
        "kraft",
        # the distribution's slf4j 1.7 -> log4j2 binding, so broker logs reach a file
        extra=("org.apache.kafka:kafka-tools:4.1.1", "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"),
        logging="log4j2",
        topic_command="org.apache.kafka.tools.TopicCommand",
    ),
    "3.9": Release(
        "3.9.1",
        "2.13",
        "kraft",
        extra=("org.apache.kafka:kafka-tools:3.9.1",),
        topic_command="org.apache.kafka.tools.TopicCommand",
    ),
    # 2.8's pom names no log4j binding (its tarball ships one); reload4j is log4j 1.2's drop-in.
    "2.8": Release(
        "2.8.2",
        "2.12",
        "zk",
        extra=("ch.qos.reload4j:reload4j:1.2.25", "org.slf4j:slf4j-reload4j:1.7.36"),
    ),
    "0.10.2": Release("0.10.2.2", "2.11", "zk", extra=_JAXB, topic_command_zk=True),
    # 0.9's pom resolves slf4j-api 1.6.1 / log4j 1.2.15 (via ZooKeeper); its distribution ships these.
    "0.9": Release(
        "0.9.0.1",
        "2.11",
        "zk",
        extra=("org.slf4j:slf4j-api:1.7.6", "log4j:log4j:1.2.17"),
        topic_command_zk=True,
    ),
}


class KafkaFetchError(RuntimeError):
    """Maven could not fetch a release (message is one line)."""


def release(version: str) -> Release:
    """The pinned release for a short name ("4.1") or an exact version ("4.1.1")."""
    if version in RELEASES:
        return RELEASES[version]
    for rel in RELEASES.values():
        if rel.version == version:
            return rel
    known = ", ".join(f"{k} ({r.version})" for k, r in RELEASES.items())
    raise KeyError(f"unknown Kafka release {version!r}; pinned: {known}")


def _pom(rel: Release) -> str:
    deps = []
    for coord in (rel.artifact, *rel.extra):
        group, artifact, version = coord.split(":")
        deps.append(
            "    <dependency>"
            f"<groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}</artifactId>"
            f"<version>{escape(version)}</version></dependency>"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>kwire.lab</groupId>\n"
        f"  <artifactId>kafka-{rel.version}</artifactId>\n"
        "  <version>1</version>\n"
        "  <packaging>pom</packaging>\n"
        "  <dependencies>\n" + "\n".join(deps) + "\n  </dependencies>\n</project>\n"
    )


def _mvn_error(output: str) -> str:
    """The first meaningful ``[ERROR]`` line of Maven's output (colour codes stripped)."""
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("[ERROR]") and len(ln) > len("[ERROR] ")]
    picked = errors[0] if errors else (lines[-1] if lines else "no output")
    return picked.removeprefix("[ERROR] ")[:400]


def _lock(path: Path, timeout: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise KafkaFetchError(f"timed out after {timeout:.0f}s waiting for lock {path}") from None
            time.sleep(0.5)


def _fetched(libs: Path, fingerprint: str) -> bool:
    marker = libs / ".complete"
    return marker.exists() and marker.read_text().strip() == fingerprint


def ensure_kafka(version: str) -> Path:
    """Fetch a pinned Kafka release (once) and return its home; jars are in ``<home>/libs``.

    Raises KafkaFetchError with a one-line reason when Maven fails or is missing.
    """
    rel = release(version)
    home = rel.home
    libs = home / "libs"
    pom = _pom(rel)
    # The marker holds the pom it was fetched with: editing RELEASES refetches that release.
    fingerprint = hashlib.sha256(pom.encode()).hexdigest()
    if _fetched(libs, fingerprint):
        return home
    home.mkdir(parents=True, exist_ok=True)
    fd = _lock(KAFKA_CACHE / f"{rel.version}.lock", LOCK_TIMEOUT_S)
    try:
        if _fetched(libs, fingerprint):  # another caller fetched it while we waited
            return home
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaFetchError("mvn not found on PATH: install Maven to fetch Kafka releases")
        (home / "pom.xml").write_text(pom)
        staging = home / "libs.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            f"-Dmaven.repo.local={M2_REPO}",
            "-f",
            str(home / "pom.xml"),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise KafkaFetchError(
                f"mvn timed out after {FETCH_TIMEOUT_S:.0f}s fetching Kafka {rel.version}"
            ) from None
        if proc.returncode != 0:
            reason = _mvn_error(proc.stdout + "\n" + proc.stderr)
            raise KafkaFetchError(
                f"mvn failed fetching Kafka {rel.version} (exit {proc.returncode}): {reason}"
            )
        if not any(staging.glob(f"kafka_{rel.scala}-{rel.version}.jar")):
            raise KafkaFetchError(
                f"mvn succeeded but kafka_{rel.scala}-{rel.version}.jar is missing in {staging}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        (libs / ".complete").write_text(fingerprint + "\n")
        return home
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def dist_size(version: str) -> int:
    """Bytes taken by a fetched release's ``libs/`` (0 when not fetched)."""
    libs = release(version).home / "libs"
    return sum(p.stat().st_size for p in libs.glob("*.jar")) if libs.is_dir() else 0
