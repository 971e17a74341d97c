"""Job ``incident_timeline``: what the report's summary and incident timeline draw, computed once.

* ``incident_sources``, one row per run (``source``): its first and last instant, the bucket
  width its timeline uses (``bucket_s``: the finest of ``BUCKET_STEPS_S`` that keeps the run
  within ``max_buckets`` buckets, so a 12 s incident in a 10 min capture spans 12 buckets),
  exchanges, connections, clients, brokers, error results, and what the data lacks:
  ``bytes_not_seen`` (the connections' gap bytes: packets the capture lost, or bytes a proxy's
  recorder skipped when it fell behind) on ``connections_with_gaps`` connections, ``gap_rows``
  (exchanges that gap left unknown) and ``dropped_rows`` (rows a proxy's writer dropped).
* ``incident_lanes``, one row per lane: a client (``source``, ``client_id``, ``client_ip``, its
  software) or a broker (``source``, ``broker_ip``, ``broker_port``, the ``node_id`` Metadata
  responses gave it), with its requests, unanswered requests, error results, Metadata requests,
  connections ended, first and last time seen.
* ``incident_timeline``, one row per (lane, bucket, event, detail) with a ``count``: events
  ``requests``, ``unanswered`` (requests never answered, at their request time), ``error``
  (``detail`` the error name, ``code`` its code: a response's top-level error plus each
  per-partition error), ``metadata`` (Metadata requests), ``disconnect`` (``detail`` the
  connections table's ``ended_by``: who ended it, or ``refused``), ``leader_in`` / ``leader_out``
  (a broker lane: partitions whose leadership Metadata responses show moving to or away from it;
  ``detail`` the topic). Buckets with nothing in them have no row: a gap in the data stays a gap.

Outages are not repeated here: the report draws them from the ``outages`` result.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import (
    broadcast,
    client_key,
    client_software,
    error_name,
    has_error,
    local_frame,
    materialize,
    ordered,
)
from spark_jobs.metadata_refresh import leadership_changes

__all__ = ["BUCKET_STEPS_S", "bucket_width", "run"]

#: Bucket widths a timeline may use, finest first.
BUCKET_STEPS_S = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
_METADATA = 3
_CLIENT = ["source", "client_id", "client_ip"]
_BROKER = ["source", "broker_ip", "broker_port"]


def bucket_width(span_s: float, max_buckets: int) -> float:
    """The finest of ``BUCKET_STEPS_S`` that cuts ``span_s`` into at most ``max_buckets``."""
    for step in BUCKET_STEPS_S:
        if span_s / step <= max_buckets:
            return float(step)
    return float(BUCKET_STEPS_S[-1])


def _sources(exchanges: DataFrame, connections: DataFrame, max_buckets: int) -> DataFrame:
    ex = exchanges.select(
        "source",
        F.coalesce("request_time", "response_time").alias("lo"),
        F.coalesce("response_time", "request_time").alias("hi"),
        F.lit(1).alias("_ex"),
        F.lit(None).cast("int").alias("_co"),
        F.lit(0).cast("long").alias("_not_seen"),
        F.lit(None).cast("int").alias("_gapped"),
        F.when(F.col("status") == "gap", 1).alias("_gap_row"),
        F.lit(0).cast("long").alias("_dropped"),
        F.when(F.col("status") != "orphan_response", client_key()).alias("_client"),
        F.concat_ws(":", "broker_ip", F.col("broker_port").cast("string")).alias("_broker"),
        (
            F.when(F.coalesce(F.col("error_code"), F.lit(0)) != 0, 1).otherwise(0)
            + F.when(
                has_error("partition_errors"),  # lambdas run row by row: only where there is one
                F.size(F.filter("partition_errors", lambda p: p["error_code"] != 0)).cast("long"),
            ).otherwise(F.lit(0).cast("long"))
        ).alias("_errors"),
    )
    not_seen = (
        F.coalesce(F.col("gap_bytes_to_broker"), F.lit(0))
        + F.coalesce(F.col("gap_bytes_to_client"), F.lit(0))
    ).cast("long")
    co = connections.select(
        "source",
        F.col("first_packet_time").alias("lo"),
        F.col("last_packet_time").alias("hi"),
        F.lit(None).cast("int").alias("_ex"),
        F.lit(1).alias("_co"),
        not_seen.alias("_not_seen"),
        F.when(not_seen > 0, 1).alias("_gapped"),
        F.lit(None).cast("int").alias("_gap_row"),
        F.coalesce(F.col("dropped_rows"), F.lit(0)).cast("long").alias("_dropped"),
        F.lit(None).cast("long").alias("_client"),
        F.lit(None).cast("string").alias("_broker"),
        F.lit(0).cast("long").alias("_errors"),
    )
    spans = (
        ex.unionByName(co)
        .groupBy("source")
        .agg(
            F.min("lo").alias("first_time"),
            F.max("hi").alias("last_time"),
            F.count("_ex").alias("exchanges"),
            F.count("_co").alias("connections"),
            F.countDistinct("_client").alias("clients"),
            F.countDistinct("_broker").alias("brokers"),
            F.sum("_errors").alias("error_results"),
            F.sum("_not_seen").alias("bytes_not_seen"),
            F.count("_gapped").alias("connections_with_gaps"),
            F.count("_gap_row").alias("gap_rows"),
            F.sum("_dropped").alias("dropped_rows"),
        )
    )
    # computed once: the collect below and the join after it would each run the aggregate (two
    # distinct counts over every exchange, all in one task per run)
    spans = materialize(spans)
    rows = spans.collect()  # one row per run
    widths = [
        (
            r["source"],
            bucket_width(
                (r["last_time"] - r["first_time"]).total_seconds()
                if r["first_time"] and r["last_time"]
                else 0,
                max_buckets,
            ),
        )
        for r in rows
    ]
    spark = exchanges.sparkSession
    width_df = local_frame(spark, widths or [("", 1.0)], "source string, bucket_s double")
    return spans.join(width_df, "source")


def _bucketed(df: DataFrame, time_col: str, widths: DataFrame) -> DataFrame:
    us = (F.col("bucket_s") * 1_000_000).cast("long")
    return (
        df.join(broadcast(widths), "source")
        .withColumn("bucket", F.timestamp_micros(F.floor(F.unix_micros(F.col(time_col)) / us) * us))
        .drop(time_col)
    )


_LANE = ["lane_kind", "source", "client_id", "client_ip", "broker_ip", "broker_port"]


def _no_codes() -> F.Column:
    return F.array().cast("array<int>")


def _lane_structs(client: F.Column | None = None) -> F.Column:
    """Both lanes of a row, as an array of structs over ``_LANE``: its client's (when ``client``
    holds; always when None) and its broker's."""
    as_client = F.struct(
        F.lit("client").alias("lane_kind"),
        F.col("source").alias("source"),
        F.col("client_id").alias("client_id"),
        F.col("client_ip").alias("client_ip"),
        F.lit(None).cast("string").alias("broker_ip"),
        F.lit(None).cast("int").alias("broker_port"),
    )
    as_broker = F.struct(
        F.lit("broker").alias("lane_kind"),
        F.col("source").alias("source"),
        F.lit(None).cast("string").alias("client_id"),
        F.lit(None).cast("string").alias("client_ip"),
        F.col("broker_ip").alias("broker_ip"),
        F.col("broker_port").alias("broker_port"),
    )
    if client is not None:
        as_client = F.when(client, as_client)
    return F.array_compact(F.array(as_client, as_broker))


def _event(t: str | F.Column, name: str, code: F.Column | None = None) -> F.Column:
    t = F.col(t) if isinstance(t, str) else t
    return F.struct(
        t.alias("t"),
        F.lit(name).alias("event"),
        (code if code is not None else F.lit(None)).cast("int").alias("code"),
    )


def _exchange_events(exchanges: DataFrame) -> DataFrame:
    """(lane..., t, event, detail, code) for every exchange event, in one scan: each request is
    ``requests`` (and ``unanswered``, ``metadata`` when it is one) at its request time, each
    error result ``error`` at its response time; on the client's lane (not for an orphan
    response: no request, no client) and on the broker's."""
    asked = (F.col("status") != "orphan_response") & F.col("request_time").isNotNull()
    request_events = F.when(
        asked,
        F.array_compact(
            F.array(
                _event("request_time", "requests"),
                F.when(F.col("status") == "unanswered", _event("request_time", "unanswered")),
                F.when(F.col("api_key") == _METADATA, _event("request_time", "metadata")),
            )
        ),
    ).otherwise(F.array().cast("array<struct<t:timestamp,event:string,code:int>>"))
    top = F.when(
        F.coalesce(F.col("error_code"), F.lit(0)) != 0, F.array(F.col("error_code").cast("int"))
    ).otherwise(_no_codes())
    # lambdas run row by row: only over the few rows that have a partition error
    per_part = F.when(
        has_error("partition_errors"),
        F.filter(F.col("partition_errors.error_code").cast("array<int>"), lambda c: c != 0),
    ).otherwise(_no_codes())
    error_events = F.when(
        F.col("response_time").isNotNull(),
        F.transform(F.concat(top, per_part), lambda c: _event("response_time", "error", c)),
    ).otherwise(F.array().cast("array<struct<t:timestamp,event:string,code:int>>"))
    rows = exchanges.select(
        F.explode(_lane_structs(F.col("status") != "orphan_response")).alias("lane"),
        F.explode(F.concat(request_events, error_events)).alias("e"),
    )
    return rows.select(
        *[F.col(f"lane.{c}").alias(c) for c in _LANE],
        F.col("e.t").alias("t"),
        F.col("e.event").alias("event"),
        F.when(F.col("e.event") == "error", error_name(F.col("e.code"))).alias("detail"),
        F.col("e.code").alias("code"),
    )


def _disconnect_events(connections: DataFrame) -> DataFrame:
    """Every connection that ended (or was refused), on its client's lane and its broker's."""
    ended = connections.where(F.col("ended_by").isNotNull()).select(
        F.explode(_lane_structs()).alias("lane"),
        F.coalesce("end_time", "first_packet_time").alias("t"),
        F.col("ended_by").alias("detail"),
    )
    return ended.select(
        *[F.col(f"lane.{c}").alias(c) for c in _LANE],
        "t",
        F.lit("disconnect").alias("event"),
        "detail",
        F.lit(None).cast("int").alias("code"),
    )


def _node_addresses(exchanges: DataFrame) -> DataFrame:
    """(source, node_id, broker_ip, broker_port) as Metadata responses list the brokers."""
    listed = exchanges.where(F.size("metadata_brokers") > 0).select(
        "source", F.explode("metadata_brokers").alias("b")
    )
    return (
        listed.select(
            "source",
            F.col("b.node_id").alias("node_id"),
            F.col("b.host").alias("broker_ip"),
            F.col("b.port").alias("broker_port"),
        )
        .where(F.col("node_id") >= 0)
        .dropDuplicates(["source", "node_id"])
    )


def _leader_events(exchanges: DataFrame, nodes: DataFrame) -> DataFrame:
    """Partition leadership moving to (``leader_in``) or away from (``leader_out``) a broker, on
    its lane, as Metadata responses show it (``detail``: the topic)."""
    moves = leadership_changes(exchanges).select(
        "source",
        "change_time",
        "topic",
        F.explode(
            F.array(
                F.struct(F.col("new_leader").alias("node_id"), F.lit("leader_in").alias("event")),
                F.struct(F.col("old_leader").alias("node_id"), F.lit("leader_out").alias("event")),
            )
        ).alias("m"),
    )
    return (
        moves.select("source", "change_time", "topic", "m.node_id", "m.event")
        .join(nodes, ["source", "node_id"])
        .select(
            F.lit("broker").alias("lane_kind"),
            "source",
            F.lit(None).cast("string").alias("client_id"),
            F.lit(None).cast("string").alias("client_ip"),
            "broker_ip",
            "broker_port",
            F.col("change_time").alias("t"),
            "event",
            F.col("topic").alias("detail"),
            F.lit(None).cast("int").alias("code"),
        )
    )


def _counted(events: DataFrame, widths: DataFrame) -> DataFrame:
    return (
        _bucketed(events.where(F.col("t").isNotNull()), "t", widths.select("source", "bucket_s"))
        .groupBy(*_LANE, "bucket", "bucket_s", "event", "detail", "code")
        .agg(F.count(F.lit(1)).alias("count"))
    )


def _on_lanes(counted: DataFrame, lanes: DataFrame) -> DataFrame:
    """Only the rows of lanes the exchanges have (null-safe: a client may have no client id):
    a refused connection's client, a port that never carried Kafka, are no lane."""
    cond = [counted[c].eqNullSafe(lanes[c]) for c in _LANE]
    return counted.join(broadcast(lanes), cond, "left_semi")


def _lanes(timeline: DataFrame, exchanges: DataFrame, nodes: DataFrame) -> DataFrame:
    def total(event: str) -> F.Column:
        return F.sum(F.when(F.col("event") == event, F.col("count")).otherwise(0)).alias(
            {"error": "error_results", "disconnect": "disconnects", "metadata": "metadata_requests"}.get(
                event, event
            )
        )

    per_lane = timeline.groupBy(
        "lane_kind", "source", "client_id", "client_ip", "broker_ip", "broker_port"
    ).agg(
        total("requests"),
        total("unanswered"),
        total("error"),
        total("metadata"),
        total("disconnect"),
        F.min("bucket").alias("first_bucket"),
        F.timestamp_micros(
            F.max(F.unix_micros("bucket") + (F.col("bucket_s") * 1_000_000).cast("long"))
        ).alias("last_bucket_end"),
    )
    software = client_software(exchanges).select(
        "source", "client_id", "client_ip", "client_software_name", "client_software_version"
    )
    # client_software() is keyed on (source, client_id, client_ip); a null client id joins null-safe
    cond = [per_lane[c].eqNullSafe(software[c]) for c in _CLIENT]
    with_sw = per_lane.join(broadcast(software), cond, "left").select(
        per_lane["*"], "client_software_name", "client_software_version"
    )
    return with_sw.join(broadcast(nodes), _BROKER, "left")


def run(tables, *, max_buckets: int = 600, **_) -> dict[str, DataFrame]:
    exchanges, connections = tables.exchanges, tables.connections
    sources = materialize(_sources(exchanges, connections, max_buckets))
    nodes = materialize(_node_addresses(exchanges))
    from_exchanges = materialize(_counted(_exchange_events(exchanges), sources))
    lanes_seen = from_exchanges.select(*_LANE).distinct()
    others = _counted(_disconnect_events(connections).unionByName(_leader_events(exchanges, nodes)), sources)
    columns = [
        "source",
        "lane_kind",
        "client_id",
        "client_ip",
        "broker_ip",
        "broker_port",
        "bucket",
        "bucket_s",
        "event",
        "detail",
        "code",
        "count",
    ]
    timeline = materialize(
        from_exchanges.select(*columns).unionByName(_on_lanes(others, lanes_seen).select(*columns))
    )
    lanes = _lanes(timeline, exchanges, nodes)
    return {
        "incident_timeline": ordered(timeline, "source", "lane_kind", "bucket"),
        "incident_lanes": ordered(lanes, "source", "lane_kind", "broker_ip", "broker_port", "client_id"),
        "incident_sources": ordered(sources, "source"),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="incident_timeline"))
