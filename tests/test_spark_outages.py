"""Job ``outages``: broker outages and old-broker drops, on hand-made rows and against the truth
of the incident lab's real captures (decoded together, so each keeps its own source)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

pytest.importorskip("pyspark")
from spark_fixtures import T0, at, conn, ex, spark, tables  # noqa: F401

from kwire.dataset import DatasetWriter
from kwire.decode_command import decode_captures
from spark_jobs import connection_health
from spark_jobs.common import Tables, combine_runs, load_tables
from spark_jobs.outages import analyse

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "captures" / "lab"
HEALTHY = [LAB / "002-skew" / "capture.pcap.gz", *sorted((REPO / "captures").glob("tansu-*.pcap"))]
INCIDENTS = ["001-broker-drops-out", "004-acks1-loss", "000-old-broker"]


def rows_of(df) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def secs(*values: datetime | None) -> tuple[float | None, ...]:
    """Seconds after T0, rounded to the microsecond (Spark hands back naive local datetimes)."""
    return tuple(None if v is None else round(v.timestamp() - T0.timestamp(), 6) for v in values)


# ------------------------------------------------------------------------------------- hand-made


def _frozen_then_dead() -> tuple[list[dict], list[dict]]:
    """Broker 10.0.0.9 answers until t=10, is silent (3 requests waiting on open connections),
    resets its connections at 40, refuses SYNs until 44 and answers again at 45. Broker 10.0.0.8
    answers all along; a consumer there closes with a long poll pending (not a failure)."""
    rows, conns = [], []
    for t in range(10):
        rows.append(ex(t, "Produce", connection_id="p1"))
    rows += [ex(10.5 + i, "Produce", connection_id="p1", status="unanswered") for i in range(2)]
    rows.append(ex(12, "Heartbeat", connection_id="h1", client_id="grp", status="unanswered"))
    rows.append(ex(45, "Metadata", connection_id="p2", latency_ms=1))  # answered at 45.001
    conns += [
        conn(
            connection_id="p1",
            last_packet_time=at(40),
            end_reason="rst",
            ended_by="broker_rst",
            end_time=at(40),
        ),
        conn(
            connection_id="h1",
            client_id="grp",
            first_packet_time=at(1),
            last_packet_time=at(40.001),
            end_reason="rst",
            ended_by="broker_rst",
            end_time=at(40.001),
        ),
        conn(connection_id="p2", first_packet_time=at(45), last_packet_time=at(46), ended_by="client_fin"),
    ]
    for i in range(4):  # refused: no Kafka on them, no client id
        t = 40.5 + i
        conns.append(
            conn(
                connection_id=f"r{i}",
                client_id=None,
                protocol="other",
                first_packet_time=at(t),
                last_packet_time=at(t),
                end_reason="rst",
                ended_by="refused",
                end_time=at(t),
            )
        )
    healthy = {"broker_ip": "10.0.0.8", "client_id": "reader"}
    rows += [ex(0.5 * t, "Fetch", connection_id="f1", **healthy) for t in range(100)]
    rows.append(ex(50, "Fetch", connection_id="f1", status="unanswered", **healthy))  # closed 0.2 s later
    conns.append(conn(connection_id="f1", last_packet_time=at(50.2), ended_by="client_fin", **healthy))
    # a port scan of 10.0.0.7, where no Kafka ever ran
    conns.append(
        conn(connection_id="scan", broker_ip="10.0.0.7", client_id=None, protocol="other", ended_by="refused")
    )
    return rows, conns


def test_frozen_then_dead_broker_on_hand_made_rows(spark):  # noqa: F811
    rows, conns = _frozen_then_dead()
    t = tables(spark, rows, conns)
    result = analyse(t.exchanges, t.connections)
    [o] = rows_of(result.outages)
    assert (o["broker_ip"], o["kind"], o["ongoing"]) == ("10.0.0.9", "frozen_then_dead", False)
    # its last answer at 9.005; failing from the first request it left waiting, until it answered again
    assert secs(o["last_answer"], o["start"], o["end"]) == (9.005, 10.5, 45.001)
    assert o["frozen_s"] == pytest.approx(40.0 - 10.5)  # then it reset its connections
    assert (o["requests_unanswered"], o["clients_affected"], o["client_ids"]) == (3, 2, ["app", "grp"])
    assert o["unanswered_by_api"] == {"Heartbeat": 1, "Produce": 2}
    assert (o["connections_closed"], *secs(o["first_closed"], o["last_closed"])) == (2, 40, 40.001)
    assert (o["connections_refused"], *secs(o["first_refused"], o["last_refused"])) == (4, 40.5, 43.5)
    assert [e["correlation_id"] for e in o["examples"]] == sorted(e["correlation_id"] for e in o["examples"])
    assert len(rows_of(result.outage_requests)) == 3
    assert rows_of(result.drops) == []


def test_dead_broker_slow_broker_and_probe_are_told_apart(spark):  # noqa: F811
    rows, conns = [], []
    # 10.0.0.9 killed at 10: connections reset within 3 ms, SYNs refused, back at 30
    rows += [ex(t, "Produce", connection_id="a") for t in range(10)]
    rows.append(ex(30, "Produce", connection_id="b"))
    for name, end in (("a", 10.0), ("c", 10.003)):
        conns.append(
            conn(connection_id=name, last_packet_time=at(end), ended_by="broker_rst", end_time=at(end))
        )
    conns.append(conn(connection_id="b", first_packet_time=at(30), last_packet_time=at(31)))
    conns += [
        conn(
            connection_id=f"r{i}",
            client_id=None,
            protocol="other",
            ended_by="refused",
            first_packet_time=at(11 + i),
        )
        for i in range(3)
    ]
    # 10.0.0.8, acks=all waiting on a follower: silent 20 s, then answers the 8 requests late
    slow = {"broker_ip": "10.0.0.8", "client_id": "slow", "connection_id": "s"}
    rows += [ex(t, "Produce", latency_ms=1, **slow) for t in range(5)]
    rows += [ex(5 + i, "Produce", latency_ms=(25 - i) * 1000, **slow) for i in range(8)]
    rows.append(ex(13, "Produce", status="unanswered", **slow))  # its connection closed at the end
    conns.append(conn(last_packet_time=at(60), ended_by="client_fin", **slow))
    t = tables(spark, rows, conns)
    result = analyse(t.exchanges, t.connections)
    [o] = rows_of(result.outages)
    assert (o["broker_ip"], o["kind"], o["frozen_s"]) == ("10.0.0.9", "dead", None)
    assert secs(o["last_answer"], o["start"], o["end"]) == (9.005, 10, 30.005)
    assert (o["connections_closed"], o["connections_refused"], o["requests_unanswered"]) == (2, 3, 0)


def test_old_broker_drops_with_and_without_silence(spark):  # noqa: F811
    """An ApiVersions read in the same poll as a Produce of another client: both never answered,
    while the broker answers others. The Produce's connection goes on (a later request answered);
    a third connection, dropped in another poll, goes silent until its client gives up. A consumer
    closing with a 5 s long-poll Fetch pending (kafkajs, franz-go) dropped nothing."""
    rows, conns = [], []
    rows += [ex(0.1 * i, "Fetch", connection_id="busy", client_id="reader") for i in range(400)]
    rows.append(ex(10.0, "ApiVersions", connection_id="new", client_id="rdkafka", status="unanswered"))
    rows.append(
        ex(
            10.001,
            "Produce",
            connection_id="old",
            status="unanswered",
            decode_error="no response (later response)",
            records=5,
        )
    )
    rows.append(ex(10.2, "Produce", connection_id="old"))  # answered: the connection went on
    rows += [
        ex(25 + i, "Produce", connection_id="mute", client_id="mute", status="unanswered", records=2)
        for i in range(3)
    ]
    rows.append(ex(30, "Fetch", connection_id="poll", client_id="kafkajs", status="unanswered"))
    conns += [
        conn(connection_id="poll", client_id="kafkajs", last_packet_time=at(33), ended_by="client_fin"),
        conn(connection_id="busy", client_id="reader", last_packet_time=at(60)),
        conn(
            connection_id="new",
            client_id="rdkafka",
            first_packet_time=at(10),
            last_packet_time=at(20),
            ended_by="client_fin",
        ),
        conn(connection_id="old", last_packet_time=at(60)),
        conn(connection_id="mute", client_id="mute", last_packet_time=at(35), ended_by="client_fin"),
    ]
    t = tables(spark, rows, conns)
    result = analyse(t.exchanges, t.connections)
    assert rows_of(result.outages) == []
    first, second = sorted(rows_of(result.drops), key=lambda r: r["first_request"])
    assert (first["cause"], first["requests_dropped"], first["apiversions_dropped"]) == (
        "unsupported_apiversions",
        2,
        1,
    )
    assert (first["client_ids"], first["apiversions_client_ids"]) == (["app", "rdkafka"], ["rdkafka"])
    assert (first["connections_continued"], first["connections_silent"], first["records_dropped"]) == (
        1,
        1,
        5,
    )
    assert (second["cause"], second["requests_dropped"], second["requests_on_silent_connections"]) == (
        None,
        3,
        3,
    )
    assert second["records_dropped"] == 6


def test_runs_are_kept_apart(spark):  # noqa: F811
    """The same broker and client in two runs: an outage in one run says nothing about the other."""
    rows, conns = _frozen_then_dead()
    other = [dict(r, source="other.pcap") for r in rows if r["status"] == "ok"]
    t = tables(spark, rows + other, conns)
    [o] = rows_of(analyse(t.exchanges, t.connections).outages)
    assert o["source"] == "test.pcap"


# ------------------------------------------------------------------------------- the lab's runs


def _decode(paths: list[Path], out: Path) -> Path:
    writer = DatasetWriter(out)
    try:
        result = decode_captures(paths, writer.exchanges.append, writer.connections.append)
    finally:
        writer.close()
    assert result.error is None
    return out


@pytest.fixture(scope="module")
def incidents(spark, tmp_path_factory):  # noqa: F811
    """The incident captures decoded together (one source each), analysed once."""
    missing = [n for n in INCIDENTS if not (LAB / n / "capture.pcap.gz").is_file()]
    if missing:
        pytest.skip(f"lab captures missing: {missing}")
    dataset = _decode([LAB / n / "capture.pcap.gz" for n in INCIDENTS], tmp_path_factory.mktemp("incidents"))
    t = load_tables(spark, dataset)
    result = analyse(t.exchanges, t.connections)
    return {
        "dataset": dataset,
        "tables": t,
        "outages": rows_of(result.outages),
        "drops": rows_of(result.drops),
        "truth": {n: json.loads((LAB / n / "truth.json").read_text()) for n in INCIDENTS},
    }


def _source(name: str) -> str:
    return f"{name}/capture.pcap.gz"


def _at(truth: dict[str, Any], kind: str) -> float:
    return next(e["ts"] for e in truth["timeline"] if e["kind"] == kind)


def _ts(value: datetime) -> float:
    return value.timestamp()


def _rows(dataset: Path, table: str, source: str) -> list[dict[str, Any]]:
    data = pads.dataset(dataset / table, format="parquet", partitioning="hive").to_table()
    return [r for r in data.to_pylist() if r["source"] == source]


def test_001_frozen_then_killed_broker_against_truth(incidents):
    name = "001-broker-drops-out"
    truth, source = incidents["truth"][name], _source(name)
    victim = truth["brokers"][str(truth["victim"])]["ip"]
    paused, killed, started = (_at(truth, k) for k in ("broker_paused", "broker_killed", "broker_started"))
    [o] = [o for o in incidents["outages"] if o["source"] == source]
    assert (o["broker_ip"], o["broker_port"], o["kind"]) == (victim, 9092, "frozen_then_dead")
    assert abs(_ts(o["start"]) - paused) < 1.0
    assert abs(_ts(o["end"]) - started) < 1.0
    assert killed <= _ts(o["first_refused"]) <= _ts(o["last_refused"]) <= started
    assert o["frozen_s"] == pytest.approx(killed - paused, abs=1.0)
    assert killed <= _ts(o["first_closed"]) <= _ts(o["last_closed"]) < killed + 1.0
    # every request the frozen broker never answered, by the dataset's own count
    exchanges = _rows(incidents["dataset"], "exchanges", source)
    unanswered = [r for r in exchanges if r["broker_ip"] == victim and r["status"] == "unanswered"]
    assert all(paused - 1.0 <= _ts(r["request_time"]) <= killed + 1.0 for r in unanswered)
    assert o["requests_unanswered"] == len(unanswered) > 100
    connections = _rows(incidents["dataset"], "connections", source)
    refused = [c for c in connections if c["broker_ip"] == victim and c["ended_by"] == "refused"]
    assert o["connections_refused"] == len(refused) > 0
    assert all(c["protocol"] == "other" and c["client_id"] is None for c in refused)
    assert not [d for d in incidents["drops"] if d["source"] == source]


def test_004_killed_leader_against_truth(incidents):
    name = "004-acks1-loss"
    truth, source = incidents["truth"][name], _source(name)
    victim = truth["brokers"][str(truth["victim"])]["ip"]
    killed, started = _at(truth, "broker_killed"), _at(truth, "broker_started")
    [o] = [o for o in incidents["outages"] if o["source"] == source]
    assert (o["broker_ip"], o["kind"], o["frozen_s"], o["ongoing"]) == (victim, "dead", None, False)
    assert abs(_ts(o["start"]) - killed) < 1.0 and abs(_ts(o["end"]) - started) < 1.0
    assert killed <= _ts(o["first_closed"]) < killed + 1.0 and o["connections_closed"] >= 2
    assert killed <= _ts(o["first_refused"]) <= _ts(o["last_refused"]) <= started
    assert not [d for d in incidents["drops"] if d["source"] == source]


def test_000_old_broker_drops_against_truth(incidents):
    """Every ArrayIndexOutOfBounds the 0.9 broker logged (one per poll holding an ApiVersions) is
    inside a drop event kwire found, and every event holds one; the clients whose ApiVersions was
    dropped are the lab's probing clients; other clients' requests were dropped with them."""
    name = "000-old-broker"
    truth, source = incidents["truth"][name], _source(name)
    drops = [d for d in incidents["drops"] if d["source"] == source]
    assert not [o for o in incidents["outages"] if o["source"] == source]
    stopped = _at(truth, "capture_stopped")
    thrown = [
        t for m in truth["broker_errors"]["by_message"] for t in m["times"] if "Processor" in m["message"]
    ]
    thrown = [t for t in thrown if t < stopped - 1.0]  # a request needs a second of waiting to count
    events = [d for d in drops if d["cause"] == "unsupported_apiversions"]

    def window(d: dict[str, Any]) -> tuple[float, float]:
        return _ts(d["first_request"]) - 0.01, max(_ts(d["answered_again"]), _ts(d["last_request"])) + 0.05

    for t in thrown:
        assert any(lo <= t <= hi for lo, hi in map(window, events)), t
    for d in events:
        lo, hi = window(d)
        assert any(lo <= t <= hi for t in thrown), d["first_request"]
    probing = {c for c, role in truth["client_roles"].items() if role["probe"]}
    assert set().union(*(d["apiversions_client_ids"] for d in events)) == probing
    exchanges = _rows(incidents["dataset"], "exchanges", source)
    apiversions = [r for r in exchanges if r["api_key"] == 18 and _ts(r["request_time"]) < stopped - 1.0]
    assert sum(d["apiversions_dropped"] for d in events) == len(apiversions)
    pinned = {c for c, role in truth["client_roles"].items() if not role["probe"]}
    others = [d for d in events if set(d["client_ids"]) & pinned and d["other_requests_dropped"]]
    assert others  # the incident: requests of clients that never sent an ApiVersions
    assert any(d["connections_continued"] for d in events)  # found though the connection went on


def test_the_small_data_plan_finds_the_same_as_the_bucketed_one(incidents):
    """``thin=False`` (a small-data run) sorts every response; the default stands for most of
    them with time buckets. On the incidents both give the same outages, drops and requests."""
    t = incidents["tables"]
    plain, thinned = analyse(t.exchanges, t.connections, thin=False), analyse(t.exchanges, t.connections)
    for name in ("outages", "outage_requests", "drops", "dropped_requests"):
        want = sorted(rows_of(getattr(plain, name)), key=repr)
        assert sorted(rows_of(getattr(thinned, name)), key=repr) == want, name
        assert len(want) >= 2, name


def test_runs_decoded_together_keep_their_clients_apart(incidents):
    t: Tables = incidents["tables"]
    apart = rows_of(connection_health.run(t)["connection_health"])
    fetcher = [r for r in apart if r["client_id"] == "broker-1-fetcher-0"]
    assert sorted(r["source"] for r in fetcher) == sorted(_source(n) for n in INCIDENTS[:2])
    assert all(r["client_id"] is not None for r in apart)  # refused connections are no client
    together = rows_of(connection_health.run(combine_runs(t))["connection_health"])
    [one] = [r for r in together if r["client_id"] == "broker-1-fetcher-0"]
    assert one["connections"] == sum(r["connections"] for r in fetcher)


def test_healthy_runs_have_no_outage_no_drop_no_phantom_client(spark, tmp_path):  # noqa: F811
    dataset = _decode([p for p in HEALTHY if p.is_file()], tmp_path / "healthy")
    t = load_tables(spark, dataset)
    result = analyse(t.exchanges, t.connections)
    assert rows_of(result.outages) == [] and rows_of(result.drops) == []
    health = rows_of(connection_health.run(t)["connection_health"])
    assert len({r["source"] for r in health}) == len([p for p in HEALTHY if p.is_file()])
    assert all(r["client_id"] is not None for r in health)
    assert all(r["reconnects"] < 5 for r in health), [(r["client_id"], r["reconnects"]) for r in health]
