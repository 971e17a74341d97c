"""The lab's Go and Python client drivers (sarama 1.27.0 and 1.43.3, franz-go,
confluent-kafka, kafka-python, aiokafka) against real brokers.

Each driver produces 20 messages with acks=all and consumes them back as a group
member, on Tansu and on a one-broker Kafka 4.1 (KRaft) cluster; its events file must
be complete and consistent: every send has exactly one outcome, every acked id is
consumed at the partition and offset it was acked at, and the end counts match.

Tansu quirks the runs work around (real incompatibilities, seen here):
* it answers a JoinGroup v1 with MEMBER_ID_REQUIRED, which only v4+ clients expect:
  sarama 1.27.0 (JoinGroup v1) retries forever, so on Tansu it consumes without a group;
* it drops the connection on franz-go 1.22's ApiVersions request ("failed to fill whole
  buffer"), so on Tansu franz-go is capped at Kafka 3.7's versions (``--prop version=3.7``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab.go_driver import GO_DRIVERS, GO_SRC, GoDriverError, ensure_go_driver, error_names_go
from realkafka import TansuBroker

PY_DRIVER = Path(__file__).resolve().parent / "lab" / "drivers" / "py_driver.py"
PY_LIBRARIES = ("confluent-kafka", "kafka-python", "aiokafka")
DRIVERS = (*GO_DRIVERS, *PY_LIBRARIES)
MESSAGES = 20
PARTITIONS = 2
DURATION_S = 40
#: Kafka refuses sessions under group.min.session.timeout.ms (6 s); Tansu takes 2 s and
#: holds a JoinGroup for half the session timeout.
GROUP_PROPS = {
    "tansu": ["session.timeout.ms=2000", "heartbeat.interval.ms=500"],
    "kafka-4.1": ["session.timeout.ms=6000", "heartbeat.interval.ms=1000"],
}
TANSU_NO_GROUP = {"sarama-1.27.0"}
TANSU_PROPS = {"franz-go": ["version=3.7"]}
#: The error name each library gives an oversized message it refuses: sarama 1.43.3
#: calls it "invalid configuration" (no code), the others MESSAGE_TOO_LARGE (10).
TOO_LARGE_NAME = {name: "MESSAGE_TOO_LARGE" for name in DRIVERS} | {"sarama-1.43.3": None}


def driver_argv(name: str) -> list[str]:
    """The command prefix that runs driver *name* (Go drivers are built on first use)."""
    if name in PY_LIBRARIES:
        return [sys.executable, str(PY_DRIVER), "--library", name]
    if shutil.which("go") is None:
        pytest.skip("the go command is not installed")
    try:
        return ensure_go_driver(name)
    except GoDriverError as exc:
        pytest.fail(str(exc))


def run_driver(argv: list[str], timeout: float = DURATION_S + 20) -> subprocess.CompletedProcess[str]:
    """Run a driver in its own process group; kill the group if it outlives *timeout*."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        pytest.fail(f"driver did not exit within {timeout:.0f}s: {' '.join(argv)}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every line of an events file, each checked to carry ts and event."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for event in events:
        assert isinstance(event["ts"], float) and isinstance(event["event"], str), event
    return events


def check_round_trip(events: list[dict[str, Any]], client_id: str, topic: str, group: str | None) -> None:
    """The events of a healthy produce-and-consume run are complete and consistent."""
    kinds = Counter(e["event"] for e in events)
    assert events[0]["event"] == "start" and events[-1]["event"] == "end", kinds
    assert kinds["start"] == kinds["end"] == 1
    start = events[0]
    assert start["client_id"] == client_id and start["library_version"] not in ("", "unknown"), start

    sends = [e for e in events if e["event"] == "send"]
    assert [e["seq"] for e in sends] == list(range(MESSAGES))
    assert all(e["id"] == f"{client_id}:{e['seq']}" and e["topic"] == topic for e in sends)
    outcomes = [e for e in events if e["event"] in ("ack", "error")]
    assert Counter(e["seq"] for e in outcomes) == Counter(range(MESSAGES)), "one outcome per send"
    errors = [e for e in outcomes if e["event"] == "error"]
    assert errors == [], "a healthy broker failed messages"
    acks = {e["id"]: (e["partition"], e["offset"]) for e in outcomes}
    assert all(p in range(PARTITIONS) and isinstance(o, int) and o >= 0 for p, o in acks.values()), acks
    assert len(set(acks.values())) == MESSAGES, "two acks share a partition and offset"

    consumed = [e for e in events if e["event"] == "consume"]
    assert all(e["topic"] == topic and e["group"] == group for e in consumed)
    seen = {(e["id"], e["partition"], e["offset"]) for e in consumed}
    missing = [(mid, where) for mid, where in acks.items() if (mid, *where) not in seen]
    assert missing == [], "acked messages not consumed where they were acked"

    end = events[-1]
    assert end == {
        "ts": end["ts"],
        "event": "end",
        "sent": MESSAGES,
        "acked": MESSAGES,
        "failed": 0,
        "consumed": len({e["id"] for e in consumed}),
        "unresolved": 0,
    }


# --------------------------------------------------------------------------- brokers


@pytest.fixture(scope="module")
def kafka41(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A one-broker Kafka 4.1 KRaft cluster on 127.0.2.2 (controller 127.0.2.5)."""
    from lab.cluster import ClusterError, KRaftCluster
    from lab.kafka_dist import KafkaFetchError

    cluster = KRaftCluster(
        version="4.1",
        brokers=1,
        controllers=1,
        broker_ips=("127.0.2.2",),
        controller_ips=("127.0.2.5",),
        base_dir=tmp_path_factory.mktemp("kafka41"),
        broker_config={"group.initial.rebalance.delay.ms": 0},
    )
    try:
        cluster.start()
    except (ClusterError, KafkaFetchError) as exc:
        cluster.stop()
        pytest.skip(f"Kafka 4.1 cannot start: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _broker(request: pytest.FixtureRequest, broker: str, topic: str) -> str:
    """Start (once) the named broker, create *topic* with two partitions, return its bootstrap."""
    if broker == "tansu":
        tansu: TansuBroker = request.getfixturevalue("tansu")
        tansu.create_topics([topic], partitions=PARTITIONS)
        return tansu.bootstrap
    cluster = request.getfixturevalue("kafka41")
    cluster.create_topic(topic, partitions=PARTITIONS)
    return cluster.bootstrap


# --------------------------------------------------------------------------- tests


@pytest.mark.real
@pytest.mark.parametrize("broker", ["tansu", "kafka-4.1"])
@pytest.mark.parametrize("name", DRIVERS)
def test_driver_round_trip(request: pytest.FixtureRequest, tmp_path: Path, broker: str, name: str) -> None:
    argv = driver_argv(name)
    slug = name.replace(".", "_")
    topic = f"lab-{slug}-{broker.replace('.', '_')}"
    client_id = f"lab-{slug}"
    bootstrap = _broker(request, broker, topic)
    group: str | None = f"{topic}-group"
    props = list(GROUP_PROPS[broker])
    if broker == "tansu":
        props += TANSU_PROPS.get(name, [])
        if name in TANSU_NO_GROUP:
            group = None
    out, log = tmp_path / "events.jsonl", tmp_path / "library.log"
    command = [
        *argv,
        *("--bootstrap", bootstrap, "--client-id", client_id, "--topic", topic),
        *("--produce", str(MESSAGES), "--acks", "all", "--consume", "--expect", str(MESSAGES)),
        *("--idle-s", "5", "--duration-s", str(DURATION_S), "--out", str(out), "--log", str(log)),
        *(["--group", group] if group else []),
        *(arg for prop in props for arg in ("--prop", prop)),
    ]
    result = run_driver(command)
    assert result.returncode == 0, result.stderr
    check_round_trip(read_events(out), client_id, topic, group)
    assert log.stat().st_size > 0, "the library wrote no log"


@pytest.mark.real
@pytest.mark.parametrize("name", DRIVERS)
def test_driver_reports_refused_messages(tansu: TansuBroker, tmp_path: Path, name: str) -> None:
    """Messages over the 1 MiB default are refused by the library: each send gets one error."""
    argv = driver_argv(name)
    topic = "lab-too-large"
    tansu.create_topics([topic], partitions=PARTITIONS)
    out = tmp_path / "events.jsonl"
    props = [arg for prop in TANSU_PROPS.get(name, []) for arg in ("--prop", prop)]
    result = run_driver(
        [
            *argv,
            "--bootstrap",
            tansu.bootstrap,
            "--client-id",
            "big",
            "--topic",
            topic,
            "--produce",
            "2",
            "--size",
            str(2 * 1024 * 1024),
            "--duration-s",
            "20",
            "--out",
            str(out),
            *props,
        ],
        timeout=40,
    )
    assert result.returncode == 0, result.stderr
    events = read_events(out)
    errors = [e for e in events if e["event"] == "error"]
    assert sorted(e["seq"] for e in errors) == [0, 1], events
    assert {e["error_name"] for e in errors} == {TOO_LARGE_NAME[name]}, errors
    # franz-go partitions a record before it checks the size; the others refuse it first
    assert all(e["error"] and e["partition"] in (None, *range(PARTITIONS)) for e in errors), errors
    assert events[-1] | {"ts": 0} == {
        "ts": 0,
        "event": "end",
        "sent": 2,
        "acked": 0,
        "failed": 2,
        "consumed": 0,
        "unresolved": 0,
    }


@pytest.mark.parametrize("name", DRIVERS)
def test_driver_refuses_bad_arguments(tmp_path: Path, name: str) -> None:
    """A driver that cannot start exits non-zero (here: --acks 2) and says why on stderr."""
    argv = driver_argv(name)
    result = run_driver(
        [
            *argv,
            "--bootstrap",
            "127.0.0.1:1",
            "--client-id",
            "x",
            "--topic",
            "t",
            "--produce",
            "1",
            "--acks",
            "2",
            "--out",
            str(tmp_path / "events.jsonl"),
        ],
        timeout=30,
    )
    assert result.returncode != 0
    assert "acks" in result.stderr


def test_go_error_names_are_current() -> None:
    """labdriver/errnames.go is what ``go_driver.py errnames`` generates from the protocol table."""
    assert (GO_SRC / "labdriver" / "errnames.go").read_text() == error_names_go()


def test_ensure_go_driver_is_idempotent() -> None:
    """A second call finds the binary current and does not rebuild it."""
    first = driver_argv("sarama-1.43.3")
    mtime = Path(first[0]).stat().st_mtime_ns
    assert driver_argv("sarama-1.43.3") == first
    assert Path(first[0]).stat().st_mtime_ns == mtime
