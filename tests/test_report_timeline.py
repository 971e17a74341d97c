"""Job ``incident_timeline`` on hand-made rows: lanes, buckets, and the events on each lane."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import T0, at, conn, ex, spark, tables  # noqa: F401

from spark_jobs.report_timeline import run

pytestmark = pytest.mark.spark

BROKER = {"broker_ip": "10.0.0.9", "broker_port": 9092}


def _metadata(t: float, leader: int, epoch: int) -> dict:
    return ex(
        t,
        "Metadata",
        metadata_brokers=[
            {"node_id": 1, "host": "10.0.0.9", "port": 9092, "rack": None},
            {"node_id": 2, "host": "10.0.0.8", "port": 9092, "rack": None},
        ],
        metadata_partitions=[
            {
                "topic": "orders",
                "topic_id": None,
                "partition": 0,
                "error_code": 0,
                "leader": leader,
                "leader_epoch": epoch,
                "replicas": [1, 2],
                "isr": [1, 2],
            }
        ],
    )


def _utc(row: dict) -> dict:
    """Spark returns naive datetimes (the session is in UTC)."""
    return {
        k: v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v
        for k, v in row.items()
    }


def test_lanes_buckets_and_events(spark):  # noqa: F811
    rows = [_metadata(0, leader=2, epoch=1)]
    rows += [ex(1 + 0.1 * i, "Produce") for i in range(5)]  # 5 requests in the 1.0-1.5 s buckets
    rows += [
        ex(2, "Produce", errors=[("orders", 0, 6), ("orders", 1, 0), ("orders", 2, 6)]),  # 2 error results
        ex(3, "Fetch", status="unanswered", connection_id="c2"),
        ex(4, "Heartbeat", status="orphan_response", error_code=27, client_id=None),  # broker lane only
        ex(5, "Produce", client_id="other", broker_ip="10.0.0.8"),
        _metadata(50, leader=1, epoch=2),  # leadership moves from node 2 to node 1
    ]
    connections = [
        conn(last_packet_time=at(50)),
        conn(connection_id="c2", ended_by="broker_rst", end_time=at(30), last_packet_time=at(30)),
        # refused: no client id, no exchange: no client lane, but the broker's lane shows it
        conn(
            connection_id="c3",
            client_id=None,
            ended_by="refused",
            first_packet_time=at(40),
            last_packet_time=at(40),
        ),
        conn(
            connection_id="c4", client_id=None, broker_port=9999, ended_by="refused", first_packet_time=at(41)
        ),
    ]
    out = run(tables(spark, rows, connections))
    src = out["incident_sources"].collect()
    assert len(src) == 1
    s = src[0]
    # a 50 s span: the finest step within 600 buckets is 0.1 s
    assert s["bucket_s"] == 0.1 and s["exchanges"] == len(rows) and s["connections"] == 4
    assert s["error_results"] == 3 and s["clients"] == 2 and s["brokers"] == 2

    events = [_utc(r.asDict()) for r in out["incident_timeline"].collect()]

    def count(kind, event, **who):
        return sum(
            r["count"]
            for r in events
            if r["lane_kind"] == kind and r["event"] == event and all(r[k] == v for k, v in who.items())
        )

    app = {"client_id": "app", "client_ip": "10.0.0.1"}
    assert count("client", "requests", **app) == 9  # 2 Metadata, 6 Produce, 1 Fetch
    assert count("broker", "requests", **BROKER) == 9
    assert count("client", "metadata", **app) == 2 and count("client", "unanswered", **app) == 1
    assert count("client", "error", **app, detail="NOT_LEADER_OR_FOLLOWER", code=6) == 2
    assert count("broker", "error", **BROKER, detail="REBALANCE_IN_PROGRESS") == 1  # the orphan's
    assert count("client", "error", detail="REBALANCE_IN_PROGRESS") == 0
    assert count("client", "disconnect", **app, detail="broker_rst") == 1
    assert count("broker", "disconnect", **BROKER, detail="refused") == 1
    assert count("client", "disconnect", detail="refused") == 0
    assert not [r for r in events if r["broker_port"] == 9999]  # a port that never carried Kafka
    assert count("broker", "leader_in", **BROKER, detail="orders") == 1
    assert count("broker", "leader_out", broker_ip="10.0.0.8", detail="orders") == 1
    produce = sorted(
        r["bucket"]
        for r in events
        if r["lane_kind"] == "client"
        and r["event"] == "requests"
        and r["bucket"] < at(1.5)
        and r["bucket"] >= at(1)
    )
    assert produce == [at(1 + 0.1 * i) for i in range(5)]  # one bucket each: 0.1 s apart

    lanes = {
        (r["lane_kind"], r["client_id"] or r["broker_ip"]): _utc(r.asDict())
        for r in out["incident_lanes"].collect()
    }
    assert set(lanes) == {
        ("client", "app"),
        ("client", "other"),
        ("broker", "10.0.0.9"),
        ("broker", "10.0.0.8"),
    }
    assert lanes[("broker", "10.0.0.9")]["node_id"] == 1 and lanes[("broker", "10.0.0.8")]["node_id"] == 2
    assert lanes[("client", "app")]["error_results"] == 2 and lanes[("client", "app")]["disconnects"] == 1
    assert lanes[("client", "app")]["first_bucket"] == T0


def test_each_run_counts_what_its_data_lacks(spark):  # noqa: F811
    """Gap bytes (a capture's lost packets, or what a proxy's recorder skipped), the connections
    they are on, the exchanges they left unknown and the rows a proxy's writer dropped: per run,
    and nothing for a run that lacks nothing."""
    rows = [ex(1, "Produce"), ex(2, "Produce", status="gap"), ex(3, "Fetch", connection_id="c2")]
    rows += [ex(1, "Produce", source="whole.pcap")]
    connections = [
        conn(gap_bytes_to_broker=236, gap_bytes_to_client=171, dropped_rows=0),
        conn(connection_id="c2", gap_bytes_to_client=58, dropped_rows=3),
        conn(connection_id="c3", gap_bytes_to_broker=0, gap_bytes_to_client=0),
        conn(source="whole.pcap"),  # null counts (a capture's decode before the proxy's columns)
    ]
    out = run(tables(spark, rows, connections))
    lacks = {
        r["source"]: (r["bytes_not_seen"], r["connections_with_gaps"], r["gap_rows"], r["dropped_rows"])
        for r in out["incident_sources"].collect()
    }
    assert lacks == {"test.pcap": (465, 2, 1, 3), "whole.pcap": (0, 0, 0, 0)}
