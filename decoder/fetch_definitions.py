"""Fetch the kafka-clients jar whose ``common/message/*.json`` the protocol table is built from.

The jar lands in the project's git-ignored Maven cache (``.cache/m2``) and is never committed.
A second call finds it there and touches no network::

    python -m decoder.fetch_definitions            # prints the jar's path

The jar holds every API message definition Kafka itself speaks: client-facing APIs, the
controller/broker APIs (BrokerRegistration, BrokerHeartbeat, AlterPartition, ...), KRaft's
(Vote, BeginQuorumEpoch, FetchSnapshot, AddRaftVoter, ...) and the share coordinator's state
APIs. Kafka's other artifacts carry record schemas (kafka-metadata) or on-disk state
(kafka-raft's QuorumStateData), not wire messages.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["KAFKA_CLIENTS_VERSION", "FetchError", "fetch_kafka_clients", "kafka_clients_jar"]

#: The release the committed table is generated from (the newest on Maven Central when pinned).
KAFKA_CLIENTS_VERSION = "4.4.0"
M2_REPOSITORY = Path(__file__).resolve().parent.parent / ".cache" / "m2"
_DEPENDENCY_GET = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:get"


class FetchError(RuntimeError):
    """The jar is not in the cache and Maven could not bring it."""


def kafka_clients_jar(version: str = KAFKA_CLIENTS_VERSION, m2: Path = M2_REPOSITORY) -> Path:
    """Where the kafka-clients jar of ``version`` sits in the Maven cache (present or not)."""
    return m2 / "org" / "apache" / "kafka" / "kafka-clients" / version / f"kafka-clients-{version}.jar"


def fetch_kafka_clients(
    version: str = KAFKA_CLIENTS_VERSION, m2: Path = M2_REPOSITORY, timeout: float = 300.0
) -> Path:
    """The kafka-clients jar, downloaded with Maven into ``m2`` if it is not there yet.

    Raises FetchError if Maven is missing, fails, or takes longer than ``timeout`` seconds.
    """
    jar = kafka_clients_jar(version, m2)
    if jar.is_file():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError(f"{jar} is missing and Maven (mvn) is not installed")
    command = [
        mvn,
        "-B",
        "-q",
        f"-Dmaven.repo.local={m2}",
        _DEPENDENCY_GET,
        f"-Dartifact=org.apache.kafka:kafka-clients:{version}",
        "-Dtransitive=false",
    ]
    # own process group, so a timeout ends Maven's JVM and anything it started
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise FetchError(f"Maven did not fetch kafka-clients {version} within {timeout:.0f} s") from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if process.returncode != 0 or not jar.is_file():
        plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Maven colours even in batch mode
        errors = [line for line in plain.splitlines() if line.startswith("[ERROR] ") and line[8:].strip()]
        reason = errors[0] if errors else output.strip()[-300:]
        raise FetchError(
            f"Maven could not fetch kafka-clients {version} (exit {process.returncode}): {reason}"
        )
    return jar


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=KAFKA_CLIENTS_VERSION)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds Maven may take")
    args = parser.parse_args(argv)
    try:
        print(fetch_kafka_clients(args.version, timeout=args.timeout))
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
