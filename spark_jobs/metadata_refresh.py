"""Job 3: how often each client refreshes metadata, and how long it stays stale after a change.

``metadata_refresh`` (one row per client): Metadata requests, the intervals between them (p50,
max), the longest stretch of the client's activity without one (before the first, between two,
after the last), and ``refreshes_periodically``: true when that stretch stays within
``periodic_max_s`` (default 900 s: 1.5 x sarama's 10 min; Java and librdkafka use 5 min), false
when it does not or the client never asked, null when the client was active too briefly to tell.

``metadata_stale_windows``: from a leadership change visible in the data to each affected
client's next Metadata request. A change is a Metadata response showing a new leader for a
partition (stale answers with an older leader epoch are ignored; affected: every other client
that used the topic before), or a NOT_LEADER_OR_FOLLOWER (6) / KAFKA_STORAGE_ERROR (56) result
(affected: the client that got it).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.common import (
    attach_software,
    broadcast,
    client_key,
    event_time,
    micros_between,
    next_time_after,
    ordered,
    partition_results,
    with_window_end,
)

__all__ = ["leadership_changes", "metadata_refresh", "run", "stale_windows"]

METADATA = 3


def _metadata_requests(exchanges: DataFrame) -> DataFrame:
    return exchanges.where((F.col("api_key") == METADATA) & (F.col("status") != "orphan_response")).select(
        client_key().alias("client_key"), event_time().alias("md_time")
    )


def metadata_refresh(exchanges: DataFrame, *, periodic_max_s: float = 900.0) -> DataFrame:
    """One row per client: metadata request count, interval p50/max, longest gap, verdict."""
    active = (
        exchanges.where(F.col("status") != "orphan_response")
        .select(client_key().alias("client_key"), event_time().alias("ts"))
        .groupBy("client_key")
        .agg(F.min("ts").alias("first_seen"), F.max("ts").alias("last_seen"))
    )
    md = _metadata_requests(exchanges)
    w = Window.partitionBy("client_key").orderBy("md_time")
    intervals = md.withColumn("interval_s", micros_between(F.lag("md_time").over(w), F.col("md_time")) / 1e6)
    per_client = intervals.groupBy("client_key").agg(
        F.count(F.lit(1)).alias("metadata_requests"),
        F.min("md_time").alias("first_metadata"),
        F.max("md_time").alias("last_metadata"),
        F.percentile_approx("interval_s", 0.5, 10000).alias("interval_p50_s"),
        F.max("interval_s").alias("interval_max_s"),
    )
    out = active.join(per_client, "client_key", "left")
    head = micros_between("first_seen", "first_metadata") / 1e6
    tail = micros_between("last_metadata", "last_seen") / 1e6
    active_s = micros_between("first_seen", "last_seen") / 1e6
    out = out.withColumn("active_s", active_s).withColumn(
        "longest_gap_s",
        F.when(F.col("metadata_requests").isNull(), active_s).otherwise(
            F.greatest(head, tail, F.coalesce(F.col("interval_max_s"), F.lit(0.0)))
        ),
    )
    periodic = (
        F.when(F.col("metadata_requests").isNull() & (F.col("active_s") > periodic_max_s), F.lit(False))
        .when(F.col("longest_gap_s") > periodic_max_s, F.lit(False))
        .when(F.col("active_s") < periodic_max_s, F.lit(None).cast("boolean"))
        .otherwise(F.lit(True))
    )
    out = out.select(
        "client_key",
        "first_seen",
        "last_seen",
        "active_s",
        F.coalesce(F.col("metadata_requests"), F.lit(0)).cast("long").alias("metadata_requests"),
        "first_metadata",
        "last_metadata",
        "interval_p50_s",
        "interval_max_s",
        "longest_gap_s",
        periodic.alias("refreshes_periodically"),
    )
    return attach_software(out, exchanges)


def leadership_changes(exchanges: DataFrame) -> DataFrame:
    """Leader changes seen in Metadata responses: source (each run on its own), topic, partition,
    change_time, old/new leader, and the client whose response showed it."""
    parts = exchanges.where(
        (F.col("api_key") == METADATA)
        & F.col("response_time").isNotNull()
        & (F.size("metadata_partitions") > 0)
    ).select(
        "source",
        client_key().alias("observer_key"),
        "response_time",
        F.explode("metadata_partitions").alias("p"),
    )
    parts = parts.select(
        "source",
        "observer_key",
        F.col("response_time").alias("change_time"),
        F.coalesce(F.col("p.topic"), F.col("p.topic_id")).alias("topic"),
        F.col("p.partition").alias("partition"),
        F.col("p.leader").alias("leader"),
        F.coalesce(F.col("p.leader_epoch"), F.lit(-1)).alias("epoch"),
    )
    w_all = Window.partitionBy("source", "topic", "partition").orderBy("change_time")
    seen = w_all.rowsBetween(Window.unboundedPreceding, -1)
    fresh = parts.withColumn("_max_epoch", F.max("epoch").over(seen)).where(
        (F.col("epoch") < 0) | F.col("_max_epoch").isNull() | (F.col("epoch") >= F.col("_max_epoch"))
    )
    return (
        fresh.withColumn("old_leader", F.lag("leader").over(w_all))
        .where(F.col("old_leader").isNotNull() & (F.col("old_leader") != F.col("leader")))
        .select(
            "source",
            "observer_key",
            "topic",
            "partition",
            "change_time",
            "old_leader",
            F.col("leader").alias("new_leader"),
        )
    )


def stale_windows(exchanges: DataFrame) -> DataFrame:
    """One row per (affected client, change): when it changed, when the client next asked."""
    changes = leadership_changes(exchanges)
    # Requests name topics, or topic ids (Fetch v13+): map ids to names with Metadata answers.
    ids = (
        exchanges.where(F.size("metadata_partitions") > 0)
        .select(F.explode("metadata_partitions").alias("p"))
        .where(F.col("p.topic_id").isNotNull() & F.col("p.topic").isNotNull())
        .select(F.col("p.topic_id").alias("used"), F.col("p.topic").alias("named"))
        .distinct()
    )
    # A client sends the same few topic lists over and over: take each list's first use (a
    # hash aggregate over all rows), then explode only those.
    touched_topics = (
        exchanges.where((F.col("status") != "orphan_response") & (F.size("topics") > 0))
        .groupBy("source", client_key().alias("client_key"), "topics")
        .agg(F.min(event_time()).alias("ts"))
        .select("source", "client_key", "ts", F.explode("topics").alias("used"))
        .join(broadcast(ids), "used", "left")
        .select("source", "client_key", "ts", F.coalesce("named", "used").alias("topic"))
        .groupBy("source", "client_key", "topic")
        .agg(F.min("ts").alias("first_use"))
    )
    from_metadata = (
        changes.join(touched_topics, ["source", "topic"])
        .where((F.col("first_use") < F.col("change_time")) & (F.col("client_key") != F.col("observer_key")))
        .select(
            "source",
            "client_key",
            "topic",
            "partition",
            "change_time",
            F.lit("metadata").alias("change_source"),
            "old_leader",
            "new_leader",
        )
    )
    from_errors = (
        partition_results(exchanges, [6, 56], carry=("source",))
        .select(
            "source",
            "client_key",
            "topic",
            F.when(F.col("partition") >= 0, F.col("partition")).alias("partition"),
            F.coalesce("response_time", "request_time").alias("change_time"),
            F.concat(F.lit("error:"), F.col("error_code").cast("string")).alias("change_source"),
            F.lit(None).cast("int").alias("old_leader"),
            F.lit(None).cast("int").alias("new_leader"),
        )
        # a storm of the same error is one change until the client refreshes: keep the first
        .dropDuplicates(["client_key", "topic", "partition", "change_source", "change_time"])
    )
    events = from_metadata.unionByName(from_errors)
    events = next_time_after(
        events, _metadata_requests(exchanges), ["client_key"], "change_time", "md_time", "next_refresh"
    )
    # One window per (client, partition, refresh): the earliest change it answers.
    first = Window.partitionBy("client_key", "topic", "partition", "next_refresh").orderBy(
        "change_time", "change_source"
    )
    events = events.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1).drop("_n")
    events = with_window_end(events, exchanges)
    out = events.select(
        "source",
        "client_key",
        "topic",
        "partition",
        "change_time",
        "change_source",
        "old_leader",
        "new_leader",
        F.col("next_refresh").alias("next_refresh_time"),
        (micros_between("change_time", F.coalesce(F.col("next_refresh"), F.col("window_end"))) / 1e6).alias(
            "stale_s"
        ),
        F.col("next_refresh").isNotNull().alias("refreshed"),
    )
    return attach_software(out, exchanges)


def run(tables, *, periodic_max_s=900.0, **_):
    return {
        "metadata_refresh": ordered(
            metadata_refresh(tables.exchanges, periodic_max_s=periodic_max_s),
            F.col("refreshes_periodically").asc_nulls_last(),
            F.col("longest_gap_s").desc(),
        ),
        "metadata_stale_windows": ordered(stale_windows(tables.exchanges), F.col("stale_s").desc()),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="metadata_refresh"))
