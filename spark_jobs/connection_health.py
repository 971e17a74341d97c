"""Job 6: unanswered requests, connections broken mid-request, reconnect churn, latency
(incidents 1 and 2: requests that never get an answer, half-open connections, reconnect storms).

* ``connection_health`` (one row per client of a run): connections, brokers, reconnects,
  connections per active minute, short-lived connections (under ``short_s``), how connections
  ended (fin/rst/idle/open) and who ended them (``ended_by_client``, ``ended_by_broker``),
  ``clean_sessions`` (closed by the client with every request answered: a command-line tool, a
  probe, a short-lived process), connections ended mid-request, requests, unanswered requests
  and their share. A *reconnect* is a connection opened after the client's previous connection
  to the same broker ended badly: closed or reset by the broker, reset by the client, or given
  up with requests unanswered. Clean sessions one after another are not reconnects: a tool run
  every minute is not churning.

A connection that never carried Kafka (a refused SYN, a SYN never answered, a port probe, other
traffic) has no client: it is left out here (the ``outages`` job counts refused connections).
* ``connection_broken``: each connection that ended by RST or FIN with requests still
  unanswered, with what it was waiting for and for how long.
* ``connection_latency``: latency p50/p99/max in ms per api (``scope`` api), per api and broker
  (api_broker), per api, broker and client (api_broker_client).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.common import (
    api_name,
    attach_software,
    broadcast,
    client_key,
    client_software,
    event_time,
    histogram_quantiles,
    latency_histogram,
    materialize,
    micros_between,
    ordered,
)

__all__ = ["broken_connections", "client_connection_health", "latency", "per_connection", "run"]

_CONN = ["source", "connection_id"]


def per_connection(exchanges: DataFrame, connections: DataFrame) -> DataFrame:
    """One row per connection: its client, broker, end, requests and unanswered requests."""
    ex = exchanges.select(
        *_CONN,
        client_key().alias("client_key"),
        "client_id",
        "client_ip",
        "broker_ip",
        "broker_port",
        "status",
        "api_name",
        "request_time",
        event_time().alias("ts"),
    )
    unanswered = F.col("status") == "unanswered"
    request = F.col("status") != "orphan_response"
    who = ["client_key", "client_id", "client_ip", "broker_ip", "broker_port"]
    # One hash aggregate over all rows, keyed by the connection and its (constant) identity
    # strings: about one group per connection. A string aggregate over all rows would sort.
    groups = ex.groupBy(*_CONN, *who).agg(
        F.sum(F.when(request, 1).otherwise(0)).alias("requests"),
        F.sum(F.when(unanswered, 1).otherwise(0)).alias("unanswered"),
        F.min(F.when(unanswered, F.col("request_time"))).alias("first_unanswered_time"),
        F.min("ts").alias("ex_first"),
        F.max("ts").alias("ex_last"),
    )
    # The identity comes from groups with requests (an orphan response may lack it).
    counts = groups.groupBy(*_CONN).agg(
        F.sum("requests").alias("requests"),
        F.sum("unanswered").alias("unanswered"),
        F.min("first_unanswered_time").alias("first_unanswered_time"),
        F.min("ex_first").alias("ex_first"),
        F.max("ex_last").alias("ex_last"),
        *[F.first(F.when(F.col("requests") > 0, F.col(c)), ignorenulls=True).alias(f"ex_{c}") for c in who],
    )
    waiting = (
        ex.where(unanswered)
        .groupBy(*_CONN)
        .agg(F.max_by("api_name", "request_time").alias("last_unanswered_api"))
    )
    from_ex = counts.join(waiting, _CONN, "left")
    co = connections.where(F.coalesce(F.col("protocol"), F.lit("kafka")) != "other").select(
        *_CONN,
        client_key().alias("co_client_key"),
        F.col("client_id").alias("co_client_id"),
        F.col("client_ip").alias("co_client_ip"),
        F.col("broker_ip").alias("co_broker_ip"),
        F.col("broker_port").alias("co_broker_port"),
        "first_packet_time",
        "last_packet_time",
        "end_reason",
        "ended_by",
        "end_time",
    )
    both = co.join(from_ex, _CONN, "full")
    return both.select(
        *_CONN,
        F.coalesce("ex_client_key", "co_client_key").alias("client_key"),
        F.coalesce("ex_client_id", "co_client_id").alias("client_id"),
        F.coalesce("ex_client_ip", "co_client_ip").alias("client_ip"),
        F.coalesce("co_broker_ip", "ex_broker_ip").alias("broker_ip"),
        F.coalesce("co_broker_port", "ex_broker_port").alias("broker_port"),
        F.coalesce("first_packet_time", "ex_first").alias("opened"),
        F.coalesce("last_packet_time", "ex_last").alias("closed"),
        "end_reason",
        "ended_by",
        "end_time",
        F.coalesce("requests", F.lit(0)).alias("requests"),
        F.coalesce("unanswered", F.lit(0)).alias("unanswered"),
        "first_unanswered_time",
        "last_unanswered_api",
    )


def broken_connections(conns: DataFrame, exchanges: DataFrame) -> DataFrame:
    broken = conns.where(F.col("end_reason").isin("rst", "fin") & (F.col("unanswered") > 0)).select(
        "client_key",
        *_CONN,
        "broker_ip",
        "broker_port",
        "opened",
        "closed",
        "end_reason",
        "ended_by",
        "end_time",
        "requests",
        "unanswered",
        "last_unanswered_api",
        "first_unanswered_time",
        (micros_between("first_unanswered_time", "closed") / 1e6).alias("waited_s"),
    )
    return attach_software(broken, exchanges)


def _ended_badly() -> Column:
    """Closed or reset by the broker, reset by the client, or given up with requests unanswered
    (without ``ended_by``, from an older dataset: ended by a RST)."""
    by = F.col("ended_by")
    return F.coalesce(by.isin("broker_fin", "broker_rst", "client_rst"), F.col("end_reason") == "rst") | (
        by.startswith("client_") & (F.col("unanswered") > 0)
    )


def _reconnects(clients: DataFrame) -> DataFrame:
    """Per client: connections that were the first it opened to a broker after one of its
    connections to that broker ended badly. One sort per (client, broker) over the bad ends and
    the opens: the latest bad end before each open, and the latest open before it."""
    key = ["client_key", "broker_ip", "broker_port"]
    ends = clients.where(_ended_badly()).select(*key, F.col("closed").alias("_t"), F.lit(0).alias("_k"))
    opens = clients.select(*key, F.col("opened").alias("_t"), F.lit(1).alias("_k"))
    before = Window.partitionBy(*key).orderBy("_t", "_k").rowsBetween(Window.unboundedPreceding, -1)
    last_bad = F.max(F.when(F.col("_k") == 0, F.col("_t"))).over(before)
    last_open = F.max(F.when(F.col("_k") == 1, F.col("_t"))).over(before)
    first_after = last_bad.isNotNull() & (last_open.isNull() | (last_open < last_bad))
    return (
        ends.unionByName(opens)
        .withColumn("_reconnect", (F.col("_k") == 1) & first_after)
        .groupBy("client_key")
        .agg(F.sum(F.when(F.col("_reconnect"), 1).otherwise(0)).alias("reconnects"))
    )


def client_connection_health(conns: DataFrame, exchanges: DataFrame, *, short_s: float = 10.0) -> DataFrame:
    lifetime_s = micros_between("opened", "closed") / 1e6
    ends = {
        reason: F.sum(F.when(F.col("end_reason") == reason, 1).otherwise(0))
        for reason in ("fin", "rst", "idle", "open_at_end")
    }
    by_client = F.col("ended_by").isin("client_fin", "client_rst")
    clean = (F.col("ended_by") == "client_fin") & (F.col("unanswered") == 0)
    clients = conns.where(F.col("client_key").isNotNull())
    per_client = clients.groupBy("client_key", "client_id", "client_ip").agg(
        F.count(F.lit(1)).alias("connections"),
        F.countDistinct("broker_ip", "broker_port").alias("brokers"),
        F.sum(F.when(lifetime_s < short_s, 1).otherwise(0)).alias("short_connections"),
        ends["fin"].alias("ended_fin"),
        ends["rst"].alias("ended_rst"),
        ends["idle"].alias("ended_idle"),
        ends["open_at_end"].alias("open_at_end"),
        F.sum(F.when(by_client, 1).otherwise(0)).alias("ended_by_client"),
        F.sum(F.when(F.col("ended_by").isin("broker_fin", "broker_rst"), 1).otherwise(0)).alias(
            "ended_by_broker"
        ),
        F.sum(F.when(clean, 1).otherwise(0)).alias("clean_sessions"),
        F.sum(
            F.when(F.col("end_reason").isin("fin", "rst") & (F.col("unanswered") > 0), 1).otherwise(0)
        ).alias("ended_mid_request"),
        F.sum("requests").alias("requests"),
        F.sum("unanswered").alias("unanswered"),
        F.min("opened").alias("first_seen"),
        F.max("closed").alias("last_seen"),
    )
    per_client = per_client.join(_reconnects(clients), "client_key", "left").fillna(0, subset=["reconnects"])
    active_min = F.greatest(micros_between("first_seen", "last_seen") / 6e7, F.lit(1.0))
    out = per_client.select(
        "client_key",
        "client_id",
        "client_ip",
        "connections",
        "brokers",
        "reconnects",
        (F.col("connections") / active_min).alias("connections_per_min"),
        "short_connections",
        "ended_fin",
        "ended_rst",
        "ended_idle",
        "open_at_end",
        "ended_by_client",
        "ended_by_broker",
        "clean_sessions",
        "ended_mid_request",
        "requests",
        "unanswered",
        F.when(F.col("requests") > 0, 100.0 * F.col("unanswered") / F.col("requests")).alias(
            "unanswered_pct"
        ),
        "first_seen",
        "last_seen",
    )
    return attach_software(out, exchanges)


def latency(exchanges: DataFrame) -> DataFrame:
    """Latency per api, per api and broker, per api, broker and client: p50/p99 (within 2%, see
    :func:`histogram_quantiles`) and max, from one histogram pass over the answered requests."""
    ok = exchanges.where(F.col("latency_us").isNotNull() & (F.col("status") == "ok")).select(
        "api_key", "broker_ip", "broker_port", client_key().alias("client_key"), "latency_us"
    )
    api_keys = ["api_key"]
    broker_keys = [*api_keys, "broker_ip", "broker_port"]
    histogram = materialize(latency_histogram(ok, [*broker_keys, "client_key"]))  # three scopes read it

    def stats(keys: list[str]) -> DataFrame:
        out = histogram_quantiles(histogram, keys, {"p50_ms": 0.5, "p99_ms": 0.99}, scale=1e-3)
        return out.withColumnRenamed("max", "max_ms").withColumn("api_name", api_name(F.col("api_key")))

    names = client_software(exchanges).select("client_key", "source", "client_id", "client_ip")
    api, api_broker = stats(api_keys), stats(broker_keys)
    api_client = stats([*broker_keys, "client_key"]).join(broadcast(names), "client_key", "left")
    cols = [
        "scope",
        "api_key",
        "api_name",
        "broker_ip",
        "broker_port",
        "source",
        "client_id",
        "client_ip",
        "requests",
        "p50_ms",
        "p99_ms",
        "max_ms",
    ]
    none_s, none_i = F.lit(None).cast("string"), F.lit(None).cast("int")
    return (
        api.select(
            F.lit("api").alias("scope"),
            "*",
            none_s.alias("broker_ip"),
            none_i.alias("broker_port"),
            none_s.alias("source"),
            none_s.alias("client_id"),
            none_s.alias("client_ip"),
        )
        .select(*cols)
        .unionByName(
            api_broker.select(
                F.lit("api_broker").alias("scope"),
                "*",
                none_s.alias("source"),
                none_s.alias("client_id"),
                none_s.alias("client_ip"),
            ).select(*cols)
        )
        .unionByName(api_client.select(F.lit("api_broker_client").alias("scope"), "*").select(*cols))
    )


def run(tables, *, short_s=10.0, **_):
    conns = materialize(per_connection(tables.exchanges, tables.connections))  # two results use it
    return {
        "connection_health": ordered(
            client_connection_health(conns, tables.exchanges, short_s=short_s),
            F.col("unanswered").desc(),
            F.col("reconnects").desc(),
        ),
        "connection_broken": ordered(broken_connections(conns, tables.exchanges), "closed"),
        "connection_latency": ordered(latency(tables.exchanges), "scope", F.col("p99_ms").desc()),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="connection_health"))
