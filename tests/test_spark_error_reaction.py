"""error_reaction and delivery on hand-made rows: what a client did after a partition error,
read from the batches it sent (issue 17 items 2 and 3). The lab's real captures are in
``test_spark_delivery.py``; here each rule is pinned on the smallest rows that show it."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import at, conn, ex, spark, tables  # noqa: F401

from spark_jobs.delivery import batch_fates, delivery
from spark_jobs.error_reaction import (
    HEALTHY,
    error_reaction,
    error_reaction_headline,
    reaction_events,
)

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _uncache(spark):  # noqa: F811
    """The jobs cache what they read twice; the session is shared, so let it go after each test."""
    yield
    spark.catalog.clearCache()


B1, B2 = "10.0.0.1", "10.0.0.2"  # brokers 1 and 2


def batch(topic: str | None, partition: int, crc: int, **fields: Any) -> dict[str, Any]:
    """One batches entry: magic 2, one record, not idempotent unless ``producer_id`` is given."""
    row = {
        "topic": topic,
        "topic_id": None,
        "partition": partition,
        "base_offset": None,
        "last_offset_delta": 0,
        "partition_leader_epoch": -1,
        "magic": 2,
        "crc": crc,
        "compression": "none",
        "transactional": False,
        "control": False,
        "producer_id": -1,
        "producer_epoch": -1,
        "base_sequence": -1,
        "record_count": 1,
        "first_timestamp_ms": crc,  # distinct batches, distinct timestamps
        "max_timestamp_ms": crc,
        "message_crcs": None,
    }
    row.update(fields)
    if row["record_count"] > 1 and "last_offset_delta" not in fields:
        row["last_offset_delta"] = row["record_count"] - 1
    return row


def result(
    topic: str | None, partition: int, code: int, offset: int = -1, topic_id: str | None = None
) -> dict:
    return {
        "topic": topic,
        "topic_id": topic_id,
        "partition": partition,
        "resource": None,
        "error_code": code,
        "base_offset": offset,
        "log_start_offset": None,
    }


def produce(
    t: float, who: dict, b: dict, code: int = 0, offset: int = -1, *, broker: str = B1, **columns: Any
) -> dict[str, Any]:
    """A Produce request carrying batch ``b``, answered with ``code`` (and ``offset``)."""
    columns.setdefault("acks", -1)
    answered = columns.get("status", "ok") == "ok" and columns["acks"] != 0
    row = ex(
        t, "Produce", broker_ip=broker, batches=[b], topics=[b["topic"] or b["topic_id"]], **who, **columns
    )
    row["partition_errors"] = (
        [result(b["topic"], b["partition"], code, offset, b["topic_id"])] if answered else None
    )
    if columns["acks"] == 0:
        row.update(status="no_response_expected", response_time=None, latency_us=None, error_code=None)
    return row


def metadata(t: float, who: dict, leaders: dict[tuple[str, int], str], topic_ids: dict | None = None) -> dict:
    """A Metadata exchange naming the leader (a broker address) of each (topic, partition)."""
    nodes = {B1: 1, B2: 2}
    return ex(
        t,
        "Metadata",
        **who,
        metadata_brokers=[{"node_id": n, "host": h, "port": 9092, "rack": None} for h, n in nodes.items()],
        metadata_partitions=[
            {
                "topic": topic,
                "topic_id": (topic_ids or {}).get(topic),
                "partition": partition,
                "error_code": 0,
                "leader": nodes[host],
                "leader_epoch": 0,
                "replicas": [1, 2],
                "isr": [1, 2],
            }
            for (topic, partition), host in leaders.items()
        ],
    )


def fetch(t: float, batches: list[dict], *, broker: str = B1) -> dict[str, Any]:
    """A consumer's Fetch exchange returning ``batches`` (give each a base_offset)."""
    return ex(t, "Fetch", client_id="reader", client_ip="10.0.9.9", broker_ip=broker, batches=batches)


def who(name: str, ip: str = "10.0.1.1") -> dict[str, str]:
    return {"client_id": name, "client_ip": ip}


JAVA, KIP951, KPY, OLD, NEW, LATE = (
    who(n, f"10.0.1.{i}")
    for i, n in enumerate(("java", "kip951", "kafka-python", "sarama-old", "sarama-new", "late"), start=1)
)


def _reaction_rows() -> list[dict[str, Any]]:
    rows = []
    # idempotent: error, Metadata, the same producer id/sequence to the new leader
    idem = batch("orders", 0, 11, producer_id=7, producer_epoch=0, base_sequence=0)
    rows += [
        produce(1.0, JAVA, idem, 56),
        metadata(1.1, JAVA, {("orders", 0): B2}),
        produce(1.2, JAVA, idem, 0, 100, broker=B2),
    ]
    # the same batch to another broker with no Metadata request between (KIP-951)
    idem2 = batch("orders", 1, 12, producer_id=8, producer_epoch=0, base_sequence=5)
    rows += [produce(1.0, KIP951, idem2, 6), produce(1.1, KIP951, idem2, 0, 50, broker=B2)]
    # not idempotent: the same CRC to the same broker, three times, then acked
    same = batch("orders", 2, 21)
    rows += [produce(1.0 + 0.2 * i, KPY, same, 56) for i in range(3)] + [produce(1.6, KPY, same, 0, 7)]
    # never sent again: new batches keep failing on the same broker, no Metadata request
    rows += [produce(1.0 + 0.3 * i, OLD, batch("orders", 3, 300 + i), 56) for i in range(3)]
    # ... and on NOT_LEADER_OR_FOLLOWER it refreshes and re-sends the batch to the new leader
    b6 = batch("orders", 3, 399)
    rows += [
        produce(20.0, OLD, b6, 6),
        metadata(20.1, OLD, {("orders", 3): B2}),
        produce(20.2, OLD, b6, 0, 90, broker=B2),
    ]
    # re-encoded retry (new timestamps, new CRC): Metadata, then the next batch to the leader named
    rows += [
        produce(1.0, NEW, batch("orders", 4, 401), 56),
        metadata(1.1, NEW, {("orders", 4): B2}),
        produce(1.2, NEW, batch("orders", 4, 402), 0, 33, broker=B2),
    ]
    # an error in the last seconds of the data: too soon to tell
    rows += [produce(59.0, LATE, batch("orders", 5, 501), 56)]
    # a consumer told NOT_LEADER_OR_FOLLOWER on Fetch, refreshing, fetching from the new leader
    reader = who("consumer", "10.0.2.1")
    rows += [
        ex(5.0, "Fetch", errors=[("orders", 0, 6)], **reader),
        metadata(5.1, reader, {("orders", 0): B2}),
        ex(5.2, "Fetch", errors=[("orders", 0, 0)], broker_ip=B2, **reader),
    ]
    rows.append(ex(60.0, "Heartbeat", client_id="other", client_ip="10.0.3.3"))  # the data ends at 60 s
    return rows


def test_verdicts_follow_what_the_client_did_with_the_batch(spark) -> None:  # noqa: F811
    t = tables(spark, _reaction_rows())
    events = reaction_events(t.exchanges, t.connections).cache()
    by_client: dict[str, list[Any]] = {}
    for e in sorted(events.collect(), key=lambda e: (e.client_id, e.error_time)):
        by_client.setdefault(e.client_id, []).append(e)

    java = by_client["java"]
    assert [(e.error_code, e.verdict, e.retry_identity, e.retry_same_broker) for e in java] == [
        (56, "refresh_then_retry", "producer_id_sequence", False)
    ]
    assert java[0].refresh_delay_ms == pytest.approx(95.0)  # answered at 1.005, Metadata at 1.1
    assert [(e.verdict, e.retry_identity) for e in by_client["kip951"]] == [
        ("retry_on_new_leader", "producer_id_sequence")
    ]
    kpy = by_client["kafka-python"]
    assert [(e.verdict, e.retry_identity, e.retry_same_broker) for e in kpy] == [
        ("retry_without_refresh", "crc", True)
    ] * 3
    old = by_client["sarama-old"]
    assert [(e.error_code, e.verdict, e.batch_fate) for e in old] == [
        (56, "drop_without_retry", "dropped")
    ] * 3 + [(6, "refresh_then_retry", "acked")]
    assert [(e.verdict, e.retry_identity, e.retry_broker_ip) for e in by_client["sarama-new"]] == [
        ("refresh_then_retry", "inferred", B2)
    ]
    assert [(e.verdict, e.batch_fate) for e in by_client["late"]] == [("unknown", "unknown")]
    assert [(e.api_name, e.verdict) for e in by_client["consumer"]] == [("Fetch", "refresh_then_retry")]

    summary = error_reaction(events, t.exchanges).cache()
    rows = {(r.client_id, r.error_code): r for r in summary.collect()}
    kp = rows[("kafka-python", 56)]
    assert (kp.verdict, kp.errors, kp.retries, kp.retries_same_broker, kp.refreshes, kp.batches_dropped) == (
        "retry_without_refresh",
        3,
        3,
        3,
        0,
        0,
    )
    so = rows[("sarama-old", 56)]
    assert (so.verdict, so.errors, so.retries, so.batches_dropped, so.records_dropped) == (
        "drop_without_retry",
        3,
        0,
        3,
        3,
    )
    assert "never sent again" in so.wire_shows and "application" in so.wire_cannot_show
    sn = rows[("sarama-new", 56)]
    assert (sn.verdict, sn.retries_inferred, sn.batches_dropped) == ("refresh_then_retry", 1, 0)
    assert "re-encoded" in sn.wire_cannot_show
    assert rows[("java", 56)].refresh_p50_ms == pytest.approx(95.0)

    head = {r.client_id: r for r in error_reaction_headline(summary).collect()}
    assert (head["sarama-old"].reaction_56, head["sarama-old"].reaction_6) == (
        "drop_without_retry",
        "refresh_then_retry",
    )
    assert head["sarama-old"].reactions_differ is True and head["sarama-old"].dropped_56 == 3
    assert head["sarama-new"].reaction_56 in HEALTHY and head["sarama-new"].reaction_6 is None
    assert head["java"].reactions_differ is False
    assert "consumer" not in head, head["consumer"]  # the headline is about producers


def test_a_client_id_shared_by_two_hosts_is_two_clients(spark) -> None:  # noqa: F811
    a, b = who("shared", "10.0.4.1"), who("shared", "10.0.4.2")
    rows = [
        produce(1.0, a, batch("orders", 0, 1), 56),
        metadata(1.1, a, {("orders", 0): B2}),  # host A's refresh is not host B's
        produce(1.2, a, batch("orders", 0, 1), 0, 5, broker=B2),
        produce(1.0, b, batch("orders", 0, 2), 56),
        produce(1.3, b, batch("orders", 0, 2), 56),
        ex(60.0, "Heartbeat"),
    ]
    events = reaction_events(tables(spark, rows).exchanges)
    got = {(e.client_ip, e.verdict) for e in events.collect()}
    assert got == {
        ("10.0.4.1", "refresh_then_retry"),
        ("10.0.4.2", "retry_without_refresh"),
        ("10.0.4.2", "drop_without_retry"),
    }


def test_delivery_follows_batches_from_produce_to_fetch(spark) -> None:  # noqa: F811
    p = who("producer", "10.0.5.1")
    x = batch("pay", 0, 1001, record_count=2)  # acked at 10, fetched there: fetched
    y = batch("pay", 0, 1002)  # acked at 12; the new leader holds another batch there: lost
    z = batch("pay", 0, 1003)  # acked at 14, inside a batch the new leader wrote: lost
    w = batch("pay", 0, 1004)  # acked at 30, no fetch ever covered it: unconfirmed
    dup = batch("pay", 1, 1005)  # acked at 3, sent again (same CRC) and acked at 4: duplicated
    acks0 = batch("pay", 1, 1006)  # acks=0: nothing says
    hanging = batch("pay", 1, 1007)  # unanswered, connection still open at the end: unknown
    by_id = batch(None, 2, 1008, topic_id="PAYid")  # Produce v13: topic id only
    rows = [
        metadata(0.5, p, {("pay", 0): B1, ("pay", 1): B1, ("pay", 2): B1}, topic_ids={"pay": "PAYid"}),
        produce(1.0, p, x, 0, 10),
        produce(1.1, p, y, 0, 12),
        produce(1.2, p, z, 0, 14),
        produce(1.3, p, w, 0, 30),
        produce(1.4, p, dup, 0, 3),
        produce(1.5, p, dup, 0, 4),
        produce(1.6, p, acks0, acks=0),
        produce(59.9, p, hanging, status="unanswered", connection_id="c2"),
        produce(1.7, p, by_id, 0, 0),
        # old leader (epoch 0) served x, y, z; the new leader (epoch 1) truncated after x
        fetch(
            2.0,
            [
                {**x, "base_offset": 10, "partition_leader_epoch": 0, "max_timestamp_ms": 1},
                {**y, "base_offset": 12, "partition_leader_epoch": 0},
                {**z, "base_offset": 14, "partition_leader_epoch": 0},
            ],
        ),
        fetch(
            5.0,
            [
                {**x, "base_offset": 10, "partition_leader_epoch": 0},
                {**batch("pay", 0, 2001), "base_offset": 12, "partition_leader_epoch": 1},
                {**batch("pay", 0, 2002, record_count=5), "base_offset": 13, "partition_leader_epoch": 1},
            ],
            broker=B2,
        ),
        fetch(5.0, [{**by_id, "base_offset": 0, "partition_leader_epoch": 0}]),
        ex(60.0, "Heartbeat", client_id="other", client_ip="10.0.3.3"),
    ]
    t = tables(
        spark,
        rows,
        [
            conn(connection_id="c1", client_id="producer", client_ip="10.0.5.1"),
            conn(connection_id="c2", client_id="producer", client_ip="10.0.5.1", end_reason="open_at_end"),
        ],
    )
    fates = batch_fates(t.exchanges, t.connections).cache()
    rows_out = {
        (r.topic, r.partition): r for r in delivery(t.exchanges, t.connections, fates=fates).collect()
    }
    p0, p1, p2 = rows_out[("pay", 0)], rows_out[("pay", 1)], rows_out[("pay", 2)]
    assert (p0.batches_sent, p0.records_sent, p0.records_acked) == (4, 5, 5)
    assert (p0.batches_fetched, p0.batches_lost, p0.records_lost, p0.batches_unconfirmed) == (1, 2, 2, 1)
    assert sorted(p0.lost_offsets) == [12, 14] and p0.records_dropped == 0
    assert "never covered by a Fetch" in p0.wire_cannot_show
    assert (p1.batches_sent, p1.batches_acked, p1.batches_retried, p1.batches_duplicated) == (3, 1, 1, 1)
    assert (p1.records_unacknowledged, p1.records_unknown, p1.records_dropped) == (1, 1, 0)
    assert "acks=0" in p1.wire_cannot_show and "too near the end" in p1.wire_cannot_show
    assert (p2.records_acked, p2.batches_fetched, p2.records_lost) == (1, 1, 0)  # the id named by Metadata


def test_dominant_verdict_takes_the_most_errors_and_the_worse_on_a_tie(spark) -> None:  # noqa: F811
    from spark_jobs.error_reaction import _WORST_FIRST, _dominant

    drop, no_refresh, new_leader, refresh = _WORST_FIRST
    counts = [  # (counts by verdict, expected)
        ({refresh: 3, drop: 1}, refresh),
        ({refresh: 2, drop: 2}, drop),
        ({new_leader: 1, refresh: 1}, new_leader),
        ({no_refresh: 5, new_leader: 5, refresh: 7}, refresh),
        ({refresh: None, drop: None}, "unknown"),
        ({}, "unknown"),
        ({no_refresh: 0, refresh: 1}, refresh),
    ]
    schema = ", ".join(f"n_{name} long" for name in _WORST_FIRST)
    rows = [tuple(given.get(name, 0) for name in _WORST_FIRST) for given, _ in counts]
    got = spark.createDataFrame(rows, schema).select(_dominant().alias("v")).collect()
    assert [r.v for r in got] == [want for _, want in counts]


def test_each_batch_gets_its_own_partitions_result_and_place(spark) -> None:  # noqa: F811
    """A request of several partitions answered in another order (brokers answer in their own
    order): each batch takes its partition's result. Legacy messages of one partition land one
    after another from the result's base offset; a v2 batch takes the base offset as is."""
    from spark_jobs.delivery import produce_attempts

    v2 = [batch("t", p, 100 + p) for p in range(3)]
    many = produce(1, JAVA, v2[0])
    many.update(
        batches=v2,
        partition_errors=[result("t", 2, 6), result("t", 1, 0, 20), result("t", 0, 0, 10)],
    )
    legacy = [batch("old", 0, 7, magic=1, last_offset_delta=None), batch("old", 1, 8, magic=1)]
    legacy += [batch("old", 0, 9, magic=1, last_offset_delta=None)]
    old = produce(2, OLD, legacy[0])
    old.update(batches=legacy, partition_errors=[result("old", 1, 0, 50), result("old", 0, 0, 30)])
    rows = produce_attempts(tables(spark, [many, old]).exchanges).collect()
    got = {(r["topic"], r["partition"], r["crc"]): (r["outcome"], r["error_code"], r["offset"]) for r in rows}
    assert got == {
        ("t", 0, 100): ("acked", 0, 10),
        ("t", 1, 101): ("acked", 0, 20),
        ("t", 2, 102): ("failed", 6, None),
        ("old", 0, 7): ("acked", 0, 30),
        ("old", 1, 8): ("acked", 0, 50),
        ("old", 0, 9): ("acked", 0, 31),
    }
