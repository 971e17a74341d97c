"""Series for the report's charts (and for SQL): latency and errors over time.

* ``latency_timeline``: per ``bucket_s`` bucket and api, answered requests and latency
  p50/p99/max in ms.
* ``error_timeline``: per bucket, client and error, error results seen (a response's non-zero
  top-level error code, plus each non-zero ``partition_errors`` entry).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import (
    api_name,
    client_key,
    error_name,
    has_error,
    histogram_quantiles,
    latency_histogram,
    ordered,
)

__all__ = ["error_timeline", "latency_timeline", "run"]


def _bucket(col: str, bucket_s: int) -> F.Column:
    return F.timestamp_seconds(F.floor(F.unix_seconds(col) / bucket_s) * bucket_s).alias("bucket")


def latency_timeline(exchanges: DataFrame, *, bucket_s: int = 60) -> DataFrame:
    ok = exchanges.where((F.col("status") == "ok") & F.col("latency_us").isNotNull())
    per_bucket = ok.select(_bucket("request_time", bucket_s), "api_key", "latency_us")
    keys = ["bucket", "api_key"]
    stats = histogram_quantiles(
        latency_histogram(per_bucket, keys), keys, {"p50_ms": 0.5, "p99_ms": 0.99}, scale=1e-3
    )
    return stats.select(
        "bucket",
        api_name(F.col("api_key")).alias("api_name"),
        "requests",
        "p50_ms",
        "p99_ms",
        F.col("max").alias("max_ms"),
    )


def error_timeline(exchanges: DataFrame, *, bucket_s: int = 60) -> DataFrame:
    answered = exchanges.where(F.col("response_time").isNotNull()).select(
        _bucket("response_time", bucket_s),
        client_key().alias("client_key"),
        "client_id",
        "client_ip",
        "error_code",
        "error_name",
        "partition_errors",
    )
    top = answered.where(F.col("error_code") != 0).select(
        "bucket",
        "client_key",
        "client_id",
        "client_ip",
        "error_code",
        F.coalesce("error_name", error_name(F.col("error_code"))).alias("name"),
    )
    per_part = (
        answered.where(has_error("partition_errors"))
        .select("bucket", "client_key", "client_id", "client_ip", F.explode("partition_errors").alias("p"))
        .where(F.col("p.error_code") != 0)
        .select("bucket", "client_key", "client_id", "client_ip", F.col("p.error_code").alias("error_code"))
        .withColumn("name", error_name(F.col("error_code")))
    )
    return (
        top.unionByName(per_part)
        .groupBy(
            "bucket", "client_key", "client_id", "client_ip", "error_code", F.col("name").alias("error_name")
        )
        .agg(F.count(F.lit(1)).alias("errors"))
        .select("bucket", "client_id", "client_ip", "error_code", "error_name", "errors")
    )


def run(tables, *, bucket_s=60, **_):
    return {
        "latency_timeline": ordered(
            latency_timeline(tables.exchanges, bucket_s=bucket_s), "bucket", "api_name"
        ),
        "error_timeline": ordered(error_timeline(tables.exchanges, bucket_s=bucket_s), "bucket"),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="timelines"))
