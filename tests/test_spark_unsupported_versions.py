"""Job 1, unsupported_versions: advertised ranges, Kafka releases, error 35, old-broker signature."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import conn, ex, spark, tables  # noqa: F401

from spark_jobs.kafka_versions import load_broker_versions
from spark_jobs.unsupported_versions import audit_release, release_table, unsupported_versions

pytestmark = pytest.mark.spark

ADV = [
    {"api_key": 0, "min_version": 3, "max_version": 9},
    {"api_key": 3, "min_version": 0, "max_version": 12},
    {"api_key": 18, "min_version": 0, "max_version": 3},
]


def _flags(df):
    return {(r.client_id, r.client_ip, r.api_name, r.api_version, r.reason): r for r in df.collect()}


def test_against_advertised_versions_error_35_and_shared_client_ids(spark):  # noqa: F811
    rows = [
        ex(0, "ApiVersions", api_version=3, api_versions=ADV),
        ex(1, "Produce", api_version=9, errors=[("orders", 0, 0)]),  # inside: not flagged
        ex(2, "Produce", api_version=10, client_ip="10.0.0.1", errors=[("orders", 0, 0)]),
        ex(3, "Produce", api_version=10, client_ip="10.0.0.2", connection_id="c2", errors=[("orders", 0, 0)]),
        ex(4, "Produce", api_version=10, client_ip="10.0.0.2", connection_id="c2", errors=[("orders", 0, 0)]),
        ex(5, "ApiVersions", api_version=4, connection_id="c3", error_code=35),
        ex(6, "Metadata", api_version=13, connection_id="c3", error_code=35),
        ex(7, "Metadata", api_version=12),
    ]
    got = _flags(unsupported_versions(tables(spark, rows).exchanges))
    # one client id on two hosts: two clients, each with its own count
    assert got[("app", "10.0.0.1", "Produce", 10, "not_advertised")]["count"] == 1
    assert got[("app", "10.0.0.2", "Produce", 10, "not_advertised")]["count"] == 2
    assert (
        got[("app", "10.0.0.2", "Produce", 10, "not_advertised")]["reference"]
        == "advertised by 10.0.0.9:9092"
    )
    assert got[("app", "10.0.0.1", "Metadata", 13, "unsupported_version_error")]["severity"] == "error"
    assert got[("app", "10.0.0.1", "Metadata", 13, "not_advertised")]["count"] == 1
    # ApiVersions above the range is the protocol's own fallback: info, not error
    assert got[("app", "10.0.0.1", "ApiVersions", 4, "apiversions_fallback")]["severity"] == "info"
    assert not any(k[2] == "Produce" and k[3] == 9 for k in got)
    assert not any(k[2] == "Metadata" and k[3] == 12 for k in got)


def test_against_kafka_releases(spark):  # noqa: F811
    versions = load_broker_versions()
    rows = [
        ex(0, "Produce", api_version=2, client_id="old-producer"),
        ex(1, "Produce", api_version=9, client_id="new-producer"),
        ex(2, "ApiVersions", api_version=3, client_id="new-producer"),
    ]
    t = tables(spark, rows)
    got = _flags(
        unsupported_versions(t.exchanges, releases=release_table(spark, versions, ["4.0", "0.9.0", "2.4"]))
    )
    ref = {k: r["reference"] for k, r in got.items()}
    # Kafka 4.0 still advertises Produce v0-2 but rejects them (KIP-896)
    assert (
        got[("old-producer", "10.0.0.1", "Produce", 2, "advertised_but_rejected")]["reference"] == "kafka 4.0"
    )
    # 0.9 knows no ApiVersions at all: an error
    assert ref[("new-producer", "10.0.0.1", "ApiVersions", 3, "not_in_release")] == "kafka 0.9.0"
    assert got[("new-producer", "10.0.0.1", "ApiVersions", 3, "not_in_release")]["severity"] == "error"
    assert ("new-producer", "10.0.0.1", "Produce", 9, "not_in_release") in got  # 0.9 accepts Produce v0-1
    # 2.4 accepts ApiVersions v0-3 and Produce v0-8: only Produce v9 is too new for it
    assert [(k[2], k[3]) for k, r in got.items() if r["reference"] == "kafka 2.4"] == [("Produce", 9)]


def test_audit_release_groups_per_client_across_brokers(spark):  # noqa: F811
    versions = load_broker_versions()
    rows = [
        ex(0, "Produce", api_version=2, broker_ip="10.0.0.7"),
        ex(1, "Produce", api_version=2, broker_ip="10.0.0.8"),
        ex(2, "ApiVersions", api_version=5),
    ]
    got = audit_release(tables(spark, rows).exchanges, release_table(spark, versions, ["3.9"])).collect()
    by = {(r.api_name, r.api_version): r for r in got}
    assert set(by) == {("ApiVersions", 5)}  # 3.9 accepts Produce v2
    assert by[("ApiVersions", 5)].severity == "info"
    got = audit_release(tables(spark, rows).exchanges, release_table(spark, versions, ["4.0"])).collect()
    produce = [r for r in got if r.api_name == "Produce"]
    assert len(produce) == 1 and produce[0]["count"] == 2 and produce[0].release_min_version == 3


def test_old_broker_signature(spark):  # noqa: F811
    rows = [
        # the broker answers Metadata v0 (it is alive) ...
        ex(0, "Metadata", connection_id="m1", client_id="legacy"),
        # ... but never ApiVersions: a new client's ApiVersions hangs, the connection goes silent
        ex(1, "ApiVersions", api_version=3, status="unanswered", connection_id="n1", client_id="new-lib"),
        ex(1.5, "Metadata", api_version=1, status="unanswered", connection_id="n1", client_id="new-lib"),
        # on another connection it is closed by the broker (0.8.2 behaviour)
        ex(
            2,
            "ApiVersions",
            api_version=3,
            status="unanswered",
            connection_id="n2",
            client_id="new-lib",
            client_ip="10.0.0.3",
        ),
        # unanswered, but the broker answered Metadata v0 elsewhere: not the signature
        ex(3, "Metadata", status="unanswered", connection_id="m2", client_id="legacy"),
        # unanswered while the capture ended 1 s later: too soon to tell
        ex(39, "ApiVersions", api_version=3, status="unanswered", connection_id="n3", client_id="late"),
        ex(40, "Heartbeat", connection_id="h1", client_id="legacy"),
    ]
    connections = [
        conn(connection_id="n1", end_reason="open_at_end", client_id="new-lib"),
        conn(connection_id="n2", end_reason="fin", client_id="new-lib", client_ip="10.0.0.3"),
        conn(connection_id="n3", end_reason="open_at_end", client_id="late"),
    ]
    t = tables(spark, rows, connections)
    got = _flags(unsupported_versions(t.exchanges, t.connections, silence_s=5.0))
    assert (
        got[("new-lib", "10.0.0.1", "ApiVersions", 3, "unanswered_then_silent")]["reference"]
        == "connection open_at_end"
    )
    assert got[("new-lib", "10.0.0.1", "Metadata", 1, "unanswered_then_silent")]["count"] == 1
    assert (
        got[("new-lib", "10.0.0.3", "ApiVersions", 3, "unanswered_then_closed")]["reference"]
        == "connection fin"
    )
    assert not any(k[0] in ("legacy", "late") for k in got)
