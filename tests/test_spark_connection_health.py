"""Job 6, connection_health: unanswered requests, broken connections, churn, latency."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import at, conn, ex, spark, tables  # noqa: F401

from spark_jobs.connection_health import broken_connections, client_connection_health, latency, per_connection

pytestmark = pytest.mark.spark


def test_broken_connections_churn_and_latency(spark):  # noqa: F811
    rows = [
        ex(0, "Fetch", connection_id="k1", latency_ms=10),
        ex(1, "Fetch", connection_id="k1", latency_ms=30),
        ex(2, "Fetch", connection_id="k1", status="unanswered"),  # then the broker resets it
        ex(3, "Produce", connection_id="k2", latency_ms=20),
        ex(4, "Produce", connection_id="k3", latency_ms=40),
        ex(13, "Produce", connection_id="k4", latency_ms=40),  # after the broker reset k1
        ex(5, "Metadata", connection_id="q1", client_id="quiet", client_ip="10.0.0.5", latency_ms=2),
    ]
    connections = [
        conn(connection_id="k1", end_reason="rst", ended_by="broker_rst", last_packet_time=at(12)),
        conn(connection_id="k4", end_reason="fin", first_packet_time=at(13), last_packet_time=at(14)),
        conn(connection_id="k2", end_reason="fin", first_packet_time=at(3), last_packet_time=at(3.5)),
        conn(connection_id="k3", end_reason="open_at_end", first_packet_time=at(4), last_packet_time=at(100)),
        conn(connection_id="q1", client_id="quiet", client_ip="10.0.0.5", end_reason="fin"),
        conn(
            connection_id="x1", client_id="idle-only", client_ip="10.0.0.6", end_reason="idle"
        ),  # no exchanges
    ]
    t = tables(spark, rows, connections)
    conns = per_connection(t.exchanges, t.connections)
    broken = broken_connections(conns, t.exchanges).collect()
    assert [(r.connection_id, r.end_reason, r.unanswered, r.last_unanswered_api) for r in broken] == [
        ("k1", "rst", 1, "Fetch")
    ]
    assert broken[0].waited_s == pytest.approx(10.0)
    health = {r.client_id: r for r in client_connection_health(conns, t.exchanges, short_s=10).collect()}
    app = health["app"]
    # k2 and k3 opened while k1 was still open: more connections, not reconnects; k4 came after the
    # broker reset k1
    assert (app.source, app.connections, app.brokers, app.reconnects) == ("test.pcap", 4, 1, 1)
    assert (app.ended_rst, app.ended_fin, app.open_at_end, app.ended_mid_request) == (1, 2, 1, 1)
    assert (app.ended_by_broker, app.requests, app.unanswered, app.short_connections) == (1, 6, 1, 2)
    assert app.unanswered_pct == pytest.approx(100 / 6)
    assert health["idle-only"].connections == 1 and health["idle-only"].ended_idle == 1
    lat = {(r.scope, r.api_name, r.client_id): r for r in latency(t.exchanges).collect()}
    fetch = lat[("api", "Fetch", None)]
    assert (fetch.requests, fetch.max_ms) == (2, 30.0)
    assert fetch.p50_ms == pytest.approx(10.0)
    assert lat[("api_broker_client", "Metadata", "quiet")].p99_ms == pytest.approx(2.0)
    assert ("api_broker", "Produce", None) in lat


def test_probes_and_refused_connections_are_not_churn_or_clients(spark):  # noqa: F811
    """A command-line tool run every 10 s (each run one clean session: asked, answered, closed by
    the client) and SYNs refused by a dead broker: no reconnects, no client without an id."""
    rows, connections = [], []
    for i in range(12):
        cid = f"p{i}"
        rows += [
            ex(10 * i, "ApiVersions", connection_id=cid, client_id="adminclient-1"),
            ex(10 * i + 0.01, "Metadata", connection_id=cid, client_id="adminclient-1"),
        ]
        connections.append(
            conn(
                connection_id=cid,
                client_id="adminclient-1",
                first_packet_time=at(10 * i),
                last_packet_time=at(10 * i + 0.1),
                ended_by="client_fin",
            )
        )
    for i in range(20):  # refused: no Kafka, no client id
        connections.append(
            conn(
                connection_id=f"r{i}",
                client_id=None,
                protocol="other",
                end_reason="rst",
                ended_by="refused",
                first_packet_time=at(i),
                last_packet_time=at(i),
            )
        )
    t = tables(spark, rows, connections)
    conns = per_connection(t.exchanges, t.connections)
    health = client_connection_health(conns, t.exchanges).collect()
    assert [(r.client_id, r.connections, r.reconnects, r.clean_sessions) for r in health] == [
        ("adminclient-1", 12, 0, 12)
    ]
    assert health[0].connections_per_min > 1.0  # frequent, and still not churn
