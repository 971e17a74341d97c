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
        ex(5, "Metadata", connection_id="q1", client_id="quiet", client_ip="10.0.0.5", latency_ms=2),
    ]
    connections = [
        conn(connection_id="k1", end_reason="rst", last_packet_time=at(12)),
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
    assert (app.connections, app.brokers, app.reconnects) == (3, 1, 2)
    assert (app.ended_rst, app.ended_fin, app.open_at_end, app.ended_mid_request) == (1, 1, 1, 1)
    assert (app.requests, app.unanswered, app.short_connections) == (5, 1, 1)
    assert app.unanswered_pct == pytest.approx(20.0)
    assert health["idle-only"].connections == 1 and health["idle-only"].ended_idle == 1
    lat = {(r.scope, r.api_name, r.client_id): r for r in latency(t.exchanges).collect()}
    fetch = lat[("api", "Fetch", None)]
    assert (fetch.requests, fetch.max_ms) == (2, 30.0)
    assert fetch.p50_ms == pytest.approx(10.0)
    assert lat[("api_broker_client", "Metadata", "quiet")].p99_ms == pytest.approx(2.0)
    assert ("api_broker", "Produce", None) in lat
