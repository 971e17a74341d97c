"""Job 5: coordinator error storms per group and broker (incident 1's aftermath: offsets
partitions loading for minutes, consumers answered NOT_COORDINATOR / LOAD_IN_PROGRESS).

Events: a response whose top-level error code is NOT_COORDINATOR (16),
COORDINATOR_LOAD_IN_PROGRESS (14) or COORDINATOR_NOT_AVAILABLE (15) (group: ``group_id``, else
the FindCoordinator key), a ``partition_errors`` entry with one of them (group: its
``resource``, else the exchange's group), or a FindCoordinator v4+ ``coordinators`` entry (its
key). A storm: consecutive events for one (group, broker) of one run (``source``) less than
``gap_s`` apart; storms of fewer than ``min_errors`` events are left out.

``coordinator_errors``: one row per storm. ``coordinator_errors_timeline``: events per
``bucket_s`` bucket, group, broker and error (for charts and SQL).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.common import client_key, error_name, has_error, micros_between, ordered

__all__ = ["COORDINATOR_ERRORS", "coordinator_events", "coordinator_storms", "coordinator_timeline", "run"]

COORDINATOR_ERRORS = (14, 15, 16)


def coordinator_events(exchanges: DataFrame, codes: tuple[int, ...] = COORDINATOR_ERRORS) -> DataFrame:
    """(source, group_id, broker_ip, broker_port, error_code, ts, client_key), one per exchange and
    group and code."""
    base = exchanges.where(F.col("response_time").isNotNull()).select(
        "source",
        "connection_id",
        "correlation_id",
        "broker_ip",
        "broker_port",
        "response_time",
        client_key().alias("client_key"),
        "group_id",
        "coordinator_key",
        "error_code",
        "partition_errors",
        "coordinators",
    )
    wanted = list(codes)
    top = base.where(F.col("error_code").isin(wanted)).select(
        "*", F.coalesce("group_id", "coordinator_key").alias("group"), F.col("error_code").alias("code")
    )
    per_part = (
        base.where(has_error("partition_errors", wanted))
        .select("*", F.explode("partition_errors").alias("p"))
        .where(F.col("p.error_code").isin(wanted))
        .select(
            "*",
            F.coalesce("p.resource", "group_id", "coordinator_key").alias("group"),
            F.col("p.error_code").alias("code"),
        )
    )
    per_coord = (
        base.where(has_error("coordinators", wanted))
        .select("*", F.explode("coordinators").alias("c"))
        .where(F.col("c.error_code").isin(wanted))
        .select("*", F.col("c.key").alias("group"), F.col("c.error_code").alias("code"))
    )
    cols = [
        "source",
        "connection_id",
        "correlation_id",
        "broker_ip",
        "broker_port",
        "response_time",
        "client_key",
        "group",
        "code",
    ]
    events = top.select(*cols).unionByName(per_part.select(*cols)).unionByName(per_coord.select(*cols))
    return events.dropDuplicates(
        ["source", "connection_id", "correlation_id", "response_time", "group", "code"]
    ).select(
        "source",
        F.col("group").alias("group_id"),
        "broker_ip",
        "broker_port",
        F.col("code").cast("short").alias("error_code"),
        F.col("response_time").alias("ts"),
        "client_key",
    )


def coordinator_storms(events: DataFrame, *, gap_s: float = 30.0, min_errors: int = 2) -> DataFrame:
    key = ["source", "group_id", "broker_ip", "broker_port"]
    w = Window.partitionBy(*key).orderBy("ts")
    gap = micros_between(F.lag("ts").over(w), F.col("ts"))
    numbered = events.withColumn(
        "_new", F.when(gap.isNull() | (gap >= int(gap_s * 1e6)), 1).otherwise(0)
    ).withColumn("storm", F.sum("_new").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    storms = numbered.groupBy(*key, "storm").agg(
        F.min("ts").alias("storm_start"),
        F.max("ts").alias("storm_end"),
        F.count(F.lit(1)).alias("errors"),
        F.sum(F.when(F.col("error_code") == 16, 1).otherwise(0)).alias("not_coordinator"),
        F.sum(F.when(F.col("error_code") == 14, 1).otherwise(0)).alias("load_in_progress"),
        F.sum(F.when(F.col("error_code") == 15, 1).otherwise(0)).alias("not_available"),
        F.countDistinct("client_key").alias("clients"),
        F.min_by("error_code", "ts").alias("first_error_code"),
        F.max_by("error_code", "ts").alias("last_error_code"),
    )
    return (
        storms.where(F.col("errors") >= min_errors)
        .withColumn("duration_s", micros_between("storm_start", "storm_end") / 1e6)
        .withColumn("first_error", error_name(F.col("first_error_code")))
        .withColumn("last_error", error_name(F.col("last_error_code")))
        .select(
            *key,
            "storm_start",
            "storm_end",
            "duration_s",
            "errors",
            "not_coordinator",
            "load_in_progress",
            "not_available",
            "clients",
            "first_error",
            "last_error",
        )
    )


def coordinator_timeline(events: DataFrame, *, bucket_s: int = 60) -> DataFrame:
    bucket = F.timestamp_seconds(F.floor(F.unix_seconds("ts") / bucket_s) * bucket_s)
    return (
        events.withColumn("bucket", bucket)
        .groupBy("bucket", "source", "group_id", "broker_ip", "broker_port", "error_code")
        .agg(F.count(F.lit(1)).alias("errors"), F.countDistinct("client_key").alias("clients"))
        .withColumn("error_name", error_name(F.col("error_code")))
    )


def run(tables, *, gap_s=30.0, min_errors=2, bucket_s=60, **_):
    events = coordinator_events(tables.exchanges)
    return {
        "coordinator_errors": ordered(
            coordinator_storms(events, gap_s=gap_s, min_errors=min_errors),
            F.col("duration_s").desc(),
            F.col("errors").desc(),
        ),
        "coordinator_errors_timeline": ordered(coordinator_timeline(events, bucket_s=bucket_s), "bucket"),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="coordinator_errors"))
