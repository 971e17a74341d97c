"""Real Apache Kafka clusters on loopback (``lab.cluster``), fetched from Maven Central.

The 4.1 KRaft test runs by default; every other pinned release (one broker each) runs
only with ``KWIRE_LAB_ALL_RELEASES=1``. Addresses: brokers 127.0.0.2-4, controllers
127.0.0.5-7, ZooKeeper 127.0.0.10; ports 9092 / 9093 / 2181.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.cluster import (
    ClusterError,
    KRaftCluster,
    PortInUseError,
    ZkCluster,
    api_versions,
    metadata,
)
from lab.kafka_dist import KafkaFetchError, ensure_kafka, release

pytestmark = pytest.mark.real

ALL_RELEASES = os.environ.get("KWIRE_LAB_ALL_RELEASES") == "1"


def _need_tools() -> None:
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def _fetch(version: str) -> None:
    _need_tools()
    try:
        ensure_kafka(version)
    except KafkaFetchError as exc:
        pytest.fail(str(exc))


def _processes_under(base: Path) -> list[str]:
    """Command lines of live processes that mention ``base`` (a cluster's JVMs)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if str(base) in line and "ps -eo" not in line]


def _assert_all_gone(cluster: KRaftCluster | ZkCluster, pids: list[int]) -> None:
    assert cluster.running() == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _processes_under(cluster.base_dir) == []


def _wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture
def kraft41(tmp_path: Path) -> Iterator[KRaftCluster]:
    _fetch("4.1")
    cluster = KRaftCluster("4.1", brokers=3, controllers=3, base_dir=tmp_path / "kraft41")
    try:
        cluster.start(timeout=180)
        yield cluster
    finally:
        cluster.stop()


def test_kraft_41_leader_moves_when_a_broker_dies(kraft41: KRaftCluster) -> None:
    c = kraft41
    assert c.brokers == [1, 2, 3]
    assert c.controllers == [101, 102, 103]
    assert c.bootstrap == "127.0.0.2:9092,127.0.0.3:9092,127.0.0.4:9092"

    # Every broker answers on its own IP and advertises that IP with the shared port.
    for b in c.brokers:
        ip = c.broker_ip(b)
        apis = api_versions(ip, 9092)
        assert 3 in apis and 18 in apis  # Metadata, ApiVersions
        md = metadata(ip, 9092)
        assert md.brokers == {1: ("127.0.0.2", 9092), 2: ("127.0.0.3", 9092), 3: ("127.0.0.4", 9092)}
        assert md.controller_id in c.brokers  # KRaft reports a broker as "controller" to clients
        assert c.log_path(b).stat().st_size > 0
        assert c.log_dirs(b) == [c.base_dir / f"broker-{b}" / "data"]

    leaders = c.create_topic("lab", partitions=3, rf=3, configs={"min.insync.replicas": 2})
    assert sorted(leaders) == [0, 1, 2]
    state = c.describe_topic("lab")
    assert all(sorted(s.replicas) == [1, 2, 3] for s in state.values())

    victim = leaders[0]
    killed_pid = c.pid(victim)
    c.kill(victim)
    assert c.pid(victim) is None
    with pytest.raises(ProcessLookupError):
        os.kill(killed_pid, 0)  # type: ignore[arg-type]
    moved = c.wait_for_leaders("lab", timeout=60, exclude=[victim])
    assert victim not in moved.values()
    assert moved[0] != victim
    # The new leader is on another broker's IP: ask it directly.
    assert c.describe_leaders("lab", via=moved[0])[0] == moved[0]
    # The new leader's own log (state.change.logger) records that it took over; the line may
    # reach the file a moment after the new leader answers (seen once in CI: not there yet).
    took_over = rf"\[Broker id={moved[0]}\] Leader lab-0 .* starts at leader epoch [1-9]"
    _wait_until(
        lambda: re.search(took_over, c.log_path(moved[0]).read_text()) is not None,
        30,
        f"broker {moved[0]}'s log saying it leads lab-0",
    )

    c.restart(victim, timeout=90)
    assert c.pid(victim) is not None
    _wait_until(
        lambda: all(victim in s.isr for s in c.describe_topic("lab").values()),
        60,
        f"broker {victim} back in every ISR",
    )
    assert api_versions(c.broker_ip(victim), 9092)

    # A paused (SIGSTOP) broker keeps its socket but answers nothing until resumed.
    hung = next(b for b in c.brokers if b != victim)
    c.pause(hung)
    try:
        with pytest.raises(TimeoutError):
            api_versions(c.broker_ip(hung), 9092, timeout=2.0)
    finally:
        c.resume(hung)
    assert api_versions(c.broker_ip(hung), 9092, timeout=10.0)

    pids = [p for p in (c.pid(n) for n in [*c.brokers, *c.controllers]) if p]
    assert len(pids) == 6
    c.stop()
    _assert_all_gone(c, pids)


def test_start_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT from earlier tests
        squatter.bind(("127.0.0.3", 9092))
        squatter.listen()
        cluster = KRaftCluster("4.1", brokers=3, controllers=1, base_dir=tmp_path / "busy")
        with pytest.raises(PortInUseError, match=r"127\.0\.0\.3:9092"):
            cluster.start(timeout=30)
        assert cluster.running() == []
        assert not (tmp_path / "busy" / "broker-1").exists()  # refused before writing anything


def test_unknown_nodes_and_releases_fail_loudly(tmp_path: Path) -> None:
    c = KRaftCluster("4.1", brokers=1, controllers=1, base_dir=tmp_path)
    with pytest.raises(KeyError, match="no node 7"):
        c.pause(7)
    with pytest.raises(ValueError, match="use ZkCluster"):
        KRaftCluster("2.8")
    with pytest.raises(ValueError, match="use KRaftCluster"):
        ZkCluster("4.1")
    with pytest.raises(KeyError, match="unknown Kafka release"):
        release("1.1")
    assert release("4.1.1") is release("4.1")


OTHER_RELEASES = ["3.9", "2.8", "0.10.2", "0.9"]


@pytest.mark.skipif(not ALL_RELEASES, reason="set KWIRE_LAB_ALL_RELEASES=1 to try every release")
@pytest.mark.parametrize("version", OTHER_RELEASES)
def test_single_broker_release(version: str, tmp_path: Path) -> None:
    _fetch(version)
    rel = release(version)
    if rel.mode == "kraft":
        cluster: KRaftCluster | ZkCluster = KRaftCluster(
            version, brokers=1, controllers=1, base_dir=tmp_path / version
        )
    else:
        cluster = ZkCluster(version, brokers=1, base_dir=tmp_path / version)
    pids: list[int] = []
    try:
        cluster.start(timeout=180)
        pids = [p for p in (cluster.pid(n) for n in cluster.nodes) if p]
        leaders = cluster.create_topic("lab", partitions=2, rf=1)
        assert leaders == {0: 1, 1: 1}
        md = metadata("127.0.0.2", 9092, ["lab"], version=cluster._metadata_version())
        assert md.brokers == {1: ("127.0.0.2", 9092)}
        if rel.version != "0.9.0.1":  # ApiVersions arrived in 0.10.0
            assert 18 in api_versions("127.0.0.2", 9092)
        log = cluster.log_path(1).read_text()
        assert "lab-0" in log
    except ClusterError as exc:
        pytest.fail(f"Kafka {rel.version}: {exc}")
    finally:
        cluster.stop()
    _assert_all_gone(cluster, pids)
