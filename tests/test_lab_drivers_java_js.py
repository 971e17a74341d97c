"""Real-broker tests of the lab client drivers for Java kafka-clients and kafkajs.

Every driver (kafka-clients 0.10.2.2, 2.8.2, 3.9.2, 4.1.1 and kafkajs 2.2.4) runs against
one real Apache Kafka 3.9 KRaft cluster from ``lab.cluster`` (3.9 is the newest release
that still serves the 0.10.2 client's old Produce/Fetch versions; 4.0 removed them):

* a round trip: 20 messages produced with acks=all and consumed back in a group, and the
  events file checked to be complete and consistent;
* failure is data: a partition whose ISR is below min.insync.replicas makes every send end
  in an ``error`` event carrying NOT_ENOUGH_REPLICAS (19), while the library's retries show
  in its own log.

The newest Java client and kafkajs also run the round trip against the suite's Tansu
broker. kafka-clients 0.10.2.2 cannot work with Tansu: Tansu answers its Produce v2 with
UNKNOWN_PRODUCER_ID and its JoinGroup v1 with MEMBER_ID_REQUIRED, neither known to 0.10.2.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from lab.java_driver import JAVA_CLIENT_VERSIONS, JavaDriverError, ensure_java_driver
from lab.js_driver import KAFKAJS_VERSION, JsDriverError, ensure_js_driver

pytestmark = pytest.mark.real

KAFKAJS = "kafkajs"
DRIVERS = [*JAVA_CLIENT_VERSIONS, KAFKAJS]
#: This module's addresses (the cluster helper's own tests use 127.0.0.x, the Go/Python drivers' 127.0.2.x).
BROKER_IPS = ("127.0.1.2", "127.0.1.3")
CONTROLLER_IPS = ("127.0.1.5",)
MESSAGES = 20
DURATION_S = 60
#: Tansu holds a JoinGroup for about session_timeout/2: keep the session short there.
TANSU_GROUP_PROPS = ["--prop", "session.timeout.ms=6000", "--prop", "heartbeat.interval.ms=1000"]


def driver_argv(name: str) -> list[str]:
    """Build (once, cached under .cache/drivers) and return the driver's argv prefix."""
    try:
        return ensure_js_driver() if name == KAFKAJS else ensure_java_driver(name)
    except (JavaDriverError, JsDriverError) as exc:
        pytest.fail(f"cannot build the {name} driver: {exc}")


def slug(name: str) -> str:
    """A driver name usable in client ids and topic names ("4.1.1" -> "java411")."""
    return KAFKAJS if name == KAFKAJS else "java" + name.replace(".", "")


def run_driver(
    name: str, args: list[str], tmp_path: Path, timeout: float = DURATION_S + 30
) -> tuple[int, list[dict[str, Any]], str]:
    """Run one driver to completion in its own process group; return (exit code, events, log text).

    The group is killed if the driver outlives *timeout* or the test is interrupted.
    """
    out, log = tmp_path / "events.jsonl", tmp_path / "driver.log"
    argv = [*driver_argv(name), *args, "--out", str(out), "--log", str(log)]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    lines = out.read_text().splitlines() if out.exists() else []
    events = [json.loads(line) for line in lines]
    return code, events, log.read_text(errors="replace") if log.exists() else ""


def check_events(
    events: list[dict[str, Any]], client_id: str, produced: int
) -> dict[str, list[dict[str, Any]]]:
    """Assert the events file is complete and consistent; return the events by kind."""
    assert events, "no events written"
    for e in events:
        assert isinstance(e["ts"], float | int) and isinstance(e["event"], str), e
    kinds = Counter(e["event"] for e in events)
    assert events[0]["event"] == "start" and kinds["start"] == 1, kinds
    assert events[-1]["event"] == "end" and kinds["end"] == 1, kinds
    by: dict[str, list[dict[str, Any]]] = {k: [e for e in events if e["event"] == k] for k in kinds}
    sends = by.get("send", [])
    assert [e["seq"] for e in sends] == list(range(produced))
    assert all(e["id"] == f"{client_id}:{e['seq']}" for e in sends)
    # every send has exactly one outcome, and nothing has an outcome without a send
    outcomes = Counter(e["id"] for e in by.get("ack", []) + by.get("error", []))
    assert outcomes == Counter(e["id"] for e in sends), outcomes
    for e in by.get("error", []):
        assert e["error"], e
    end = events[-1]
    assert end["sent"] == len(sends)
    assert end["acked"] == len(by.get("ack", []))
    assert end["failed"] == len(by.get("error", []))
    assert end["consumed"] == len(by.get("consume", []))
    assert end["unresolved"] == end["sent"] - end["acked"] - end["failed"] == 0
    return by


def check_round_trip(
    name: str, code: int, events: list[dict[str, Any]], log: str, client_id: str, group: str
) -> None:
    """A healthy broker: every message acked once, consumed at the acked partition/offset, committed."""
    assert code == 0
    by = check_events(events, client_id, MESSAGES)
    start = by["start"][0]
    expected = ("kafkajs", KAFKAJS_VERSION) if name == KAFKAJS else ("kafka-clients", name)
    assert (start["library"], start["library_version"]) == expected
    assert start["client_id"] == client_id
    acks = {e["id"]: (e["partition"], e["offset"]) for e in by.get("ack", [])}
    assert len(acks) == MESSAGES, f"{len(acks)} of {MESSAGES} acked: {by.get('error', [])[:1]}"
    assert len(set(acks.values())) == MESSAGES, "two messages acked at the same partition/offset"
    assert {p for p, _ in acks.values()} == {0, 1}, "key-based partitioning used one partition only"
    consumed = {e["id"]: (e["partition"], e["offset"]) for e in by.get("consume", [])}
    assert consumed == acks, "consumed ids/positions differ from the acknowledged ones"
    assert all(e["group"] == group for e in by["consume"])
    commits = by.get("commit", [])
    assert commits and all(c["group"] == group and c["error"] is None for c in commits)
    last: dict[str, int] = {}
    for c in commits:
        last.update(c["offsets"])
    ends = {str(p): max(o for q, o in acks.values() if q == p) + 1 for p, _ in acks.values()}
    assert last == ends, "the last commits are not the offsets after the last records"
    assert log.strip(), "the library's log is empty"
    assert f"{client_id}:0:x" not in log, "a message value leaked into the log"


class Lab(NamedTuple):
    """The module's cluster and the bootstrap address drivers use (broker 1 only)."""

    cluster: Any
    bootstrap: str


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A Kafka 3.9 KRaft cluster: brokers 1 and 2 plus one controller; topic ``nrep``
    (replicas 1,2, min.insync.replicas=2) is created, then broker 2 stopped, so its ISR is {1}.
    Drivers bootstrap from broker 1 only."""
    from lab.cluster import ClusterError, KRaftCluster
    from lab.kafka_dist import KafkaFetchError

    cluster = KRaftCluster(
        "3.9",
        brokers=2,
        controllers=1,
        base_dir=tmp_path_factory.mktemp("kafka39"),
        broker_ips=BROKER_IPS,
        controller_ips=CONTROLLER_IPS,
    )
    try:
        try:
            cluster.start(timeout=180)
        except (ClusterError, KafkaFetchError) as exc:
            pytest.skip(f"Kafka 3.9 cluster cannot start: {exc}")
        cluster.create_topic("nrep", configs={"min.insync.replicas": 2}, assignments=[[1, 2]])
        cluster.stop_node(2)
        state = cluster.describe_topic("nrep", via=1)[0]
        assert state.isr == (1,), state
        yield Lab(cluster, f"{cluster.broker_ip(1)}:{cluster.port}")
    finally:
        cluster.stop()


@pytest.mark.parametrize("name", DRIVERS)
def test_round_trip_real_kafka(kafka: Lab, name: str, tmp_path: Path) -> None:
    """20 messages acks=all, consumed back in a group, against Kafka 3.9."""
    client_id, topic, group = f"rt-{slug(name)}", f"rt-{slug(name)}", f"g-{slug(name)}"
    kafka.cluster.create_topic(topic, assignments=[[1], [1]])
    code, events, log = run_driver(name, [
        "--bootstrap", kafka.bootstrap, "--client-id", client_id, "--topic", topic,
        "--produce", str(MESSAGES), "--acks", "all", "--consume", "--group", group,
        "--expect", str(MESSAGES), "--idle-s", "10", "--duration-s", str(DURATION_S),
    ], tmp_path)  # fmt: skip
    check_round_trip(name, code, events, log, client_id, group)


@pytest.mark.parametrize("name", DRIVERS)
def test_produce_errors_are_data(kafka: Lab, name: str, tmp_path: Path) -> None:
    """ISR below min.insync.replicas: each send ends in one error event with the Kafka error
    code and name, the run still exits 0, and the library's retries are in its log."""
    client_id = f"nrep-{slug(name)}"
    code, events, log = run_driver(name, [
        "--bootstrap", kafka.bootstrap, "--client-id", client_id, "--topic", "nrep",
        "--produce", "3", "--acks", "all", "--prop", "retries=2", "--prop", "retry.backoff.ms=100",
        "--prop", "no.such.knob=1", "--duration-s", "40",
    ], tmp_path)  # fmt: skip
    assert code == 0
    by = check_events(events, client_id, 3)
    errors = by.get("error", [])
    assert len(errors) == 3 and "ack" not in by, Counter(e["event"] for e in events)
    assert {(e["error_code"], e["error_name"]) for e in errors} == {(19, "NOT_ENOUGH_REPLICAS")}
    start = by["start"][0]
    assert start["ignored_props"] == ["no.such.knob"]
    if name == KAFKAJS:
        assert "fewer in-sync replicas" in log and "Failed to send messages" in log
    else:
        assert "Got error produce response" in log and "retrying" in log and "NOT_ENOUGH_REPLICAS" in log


@pytest.mark.parametrize("name", [JAVA_CLIENT_VERSIONS[-1], KAFKAJS])
def test_round_trip_tansu(tansu: Any, name: str, tmp_path: Path) -> None:
    """The same round trip against the suite's Tansu broker (newest Java client and kafkajs)."""
    client_id, topic, group = f"tansu-{slug(name)}", f"tansu-{slug(name)}", f"tg-{slug(name)}"
    tansu.create_topics([topic], partitions=2)
    code, events, log = run_driver(name, [
        "--bootstrap", tansu.bootstrap, "--client-id", client_id, "--topic", topic,
        "--produce", str(MESSAGES), "--consume", "--group", group, "--expect", str(MESSAGES),
        "--idle-s", "10", "--duration-s", str(DURATION_S), *TANSU_GROUP_PROPS,
    ], tmp_path)  # fmt: skip
    check_round_trip(name, code, events, log, client_id, group)


@pytest.mark.parametrize("name", [JAVA_CLIENT_VERSIONS[0], KAFKAJS])
def test_bad_arguments_exit_non_zero(name: str, tmp_path: Path) -> None:
    """A driver that cannot start (here: --out missing) exits non-zero and writes no events."""
    argv = [*driver_argv(name), "--bootstrap", "127.0.0.1:9", "--client-id", "x", "--topic", "t"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode != 0
    assert "--out" in proc.stderr
    assert not list(tmp_path.iterdir())
