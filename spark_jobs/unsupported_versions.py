"""Job 1: requests a broker does not support (incident 1: ApiVersions sent to a 0.9 broker).

References, each giving a ``reason``:

* ``not_advertised``: outside what that broker (ip, port) advertised in an ApiVersions response
  seen in the data (its latest one).
* ``not_in_release`` / ``advertised_but_rejected``: outside what an Apache Kafka release accepts
  (``releases`` + ``target_releases``); the second is 4.x's Produce v0-2, still advertised but
  rejected (KIP-896, KAFKA-18659).
* ``unsupported_version_error``: the broker answered UNSUPPORTED_VERSION (35).
* ``unanswered_then_closed`` / ``unanswered_then_silent``: the old-broker signature. A request
  never answered, after which the connection got no response at all, closed (fin/rst) or stayed
  silent for ``silence_s``, for an (api key, version) that broker never answered in the data,
  although it did answer other requests (a dead broker is connection_health's business).

ApiVersions above a broker's range is the protocol's own fallback (the broker answers
UNSUPPORTED_VERSION with its ranges and the client retries lower): ``severity`` is ``info``
for it, ``error`` for everything else.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from spark_jobs.common import (
    attach_software,
    broadcast,
    client_key,
    event_time,
    local_frame,
    materialize,
    ordered,
)
from spark_jobs.kafka_versions import API_VERSIONS_KEY, BrokerVersions

__all__ = ["audit_release", "release_table", "run", "unsupported_versions"]

UNSUPPORTED_VERSION = 35

_RELEASE_SCHEMA = StructType(
    [
        StructField("release", StringType()),
        StructField("api_key", IntegerType()),
        StructField("rel_min", IntegerType()),
        StructField("rel_max", IntegerType()),
        StructField("adv_min", IntegerType()),
        StructField("adv_max", IntegerType()),
    ]
)

_GROUP = [
    "client_key",
    "broker_ip",
    "broker_port",
    "api_key",
    "api_version",
    "reason",
    "reference",
    "severity",
]


def release_table(spark: SparkSession, versions: BrokerVersions, releases: list[str]) -> DataFrame:
    """The accepted (and advertised) ranges of ``releases`` as a small DataFrame."""
    return local_frame(spark, versions.rows(releases), _RELEASE_SCHEMA)


def _request_rows(exchanges: DataFrame) -> DataFrame:
    return exchanges.where(
        (F.col("status") != "orphan_response")
        & F.col("api_key").isNotNull()
        & F.col("api_version").isNotNull()
    ).select(
        client_key().alias("client_key"),
        "client_id",
        "client_ip",
        "source",
        "connection_id",
        "broker_ip",
        "broker_port",
        F.col("api_key").cast("int").alias("api_key"),
        "api_name",
        F.col("api_version").cast("int").alias("api_version"),
        "status",
        "error_code",
        "request_time",
        event_time().alias("ts"),
        F.lit(1).cast("long").alias("n"),
        event_time().alias("last_ts"),
    )


def _requests(exchanges: DataFrame) -> DataFrame:
    """Requests grouped by (client, broker, api, version, answered UNSUPPORTED_VERSION): the
    version checks run on these few thousand groups, not on every row."""
    return (
        _request_rows(exchanges)
        # string attributes ride along as keys: a string aggregate (first) would force a sort
        .groupBy(
            "client_key",
            "client_id",
            "client_ip",
            "source",
            "broker_ip",
            "broker_port",
            "api_key",
            "api_name",
            "api_version",
            F.coalesce(F.col("error_code") == UNSUPPORTED_VERSION, F.lit(False)).alias("is_35"),
        )
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("ts").alias("ts"),
            F.max("ts").alias("last_ts"),
        )
    )


def _severity_for_key(known_key: F.Column) -> F.Column:
    return F.when((F.col("api_key") == API_VERSIONS_KEY) & known_key, "info").otherwise("error")


def _versus_advertised(req: DataFrame, exchanges: DataFrame) -> DataFrame:
    # a broker is its address within one run: two runs may reuse an address for another release
    broker = ["source", "broker_ip", "broker_port"]
    latest = (
        exchanges.where((F.col("api_key") == API_VERSIONS_KEY) & (F.size("api_versions") > 0))
        .groupBy(*broker)
        .agg(F.max_by("api_versions", "response_time").alias("adv"))
    )
    ranges = latest.select(*broker, F.explode("adv").alias("a")).select(
        *broker,
        F.col("a.api_key").cast("int").alias("api_key"),
        F.col("a.min_version").cast("int").alias("adv_lo"),
        F.col("a.max_version").cast("int").alias("adv_hi"),
    )
    brokers = latest.select(*broker, F.lit(True).alias("has_adv"))
    joined = req.join(broadcast(brokers), broker).join(broadcast(ranges), [*broker, "api_key"], "left")
    bad = (
        F.col("adv_lo").isNull()
        | (F.col("api_version") < F.col("adv_lo"))
        | (F.col("api_version") > F.col("adv_hi"))
    )
    return (
        joined.where(bad)
        .withColumn("severity", _severity_for_key(F.col("adv_lo").isNotNull()))
        .withColumn(
            "reason", F.when(F.col("severity") == "info", "apiversions_fallback").otherwise("not_advertised")
        )
        .withColumn(
            "reference",
            F.concat(
                F.lit("advertised by "), F.col("broker_ip"), F.lit(":"), F.col("broker_port").cast("string")
            ),
        )
    )


def _versus_releases(req: DataFrame, releases: DataFrame) -> DataFrame:
    names = releases.select("release").distinct()
    joined = req.crossJoin(broadcast(names)).join(broadcast(releases), ["release", "api_key"], "left")
    inside = (F.col("api_version") >= F.col("rel_min")) & (F.col("api_version") <= F.col("rel_max"))
    advertised = (F.col("api_version") >= F.col("adv_min")) & (F.col("api_version") <= F.col("adv_max"))
    known = F.col("rel_min").isNotNull()
    return (
        joined.where(~known | ~inside)
        .withColumn("severity", _severity_for_key(known))
        .withColumn(
            "reason",
            F.when(F.col("severity") == "info", "apiversions_fallback")
            .when(known & advertised, "advertised_but_rejected")
            .otherwise("not_in_release"),
        )
        .withColumn("reference", F.concat(F.lit("kafka "), F.col("release")))
    )


def _error_35(req: DataFrame) -> DataFrame:
    return (
        req.where(F.col("is_35"))
        .withColumn("severity", F.when(F.col("api_key") == API_VERSIONS_KEY, "info").otherwise("error"))
        .withColumn(
            "reason",
            F.when(F.col("severity") == "info", "apiversions_fallback").otherwise(
                "unsupported_version_error"
            ),
        )
        .withColumn("reference", F.lit("broker answered UNSUPPORTED_VERSION"))
    )


def _old_broker_signature(exchanges: DataFrame, connections: DataFrame | None, silence_s: float) -> DataFrame:
    conn = ["source", "connection_id"]
    # One pass: per connection and api version, the last response and whether any was ok.
    seen = (
        exchanges.where(F.col("api_key").isNotNull())
        .groupBy(
            *conn,
            "broker_ip",
            "broker_port",
            F.col("api_key").cast("int").alias("api_key"),
            F.col("api_version").cast("int").alias("api_version"),
        )
        .agg(
            F.max("response_time").alias("last_response"),
            F.max(F.col("status") == "ok").alias("any_ok"),
            F.max(event_time()).alias("last_time"),
        )
    )
    seen = materialize(seen)
    last_response = seen.groupBy(*conn).agg(F.max("last_response").alias("last_response"))
    ok = seen.where(F.col("any_ok"))
    broker = ["source", "broker_ip", "broker_port"]  # an address within one run
    known_versions = ok.select(*broker, "api_key", "api_version").distinct()
    live_brokers = ok.select(*broker).distinct()
    cand = (
        _request_rows(exchanges.where(F.col("status") == "unanswered"))
        .join(last_response, conn, "left")
        .where(F.col("last_response").isNull() | (F.col("last_response") < F.col("request_time")))
        .join(known_versions, [*broker, "api_key", "api_version"], "left_anti")
        .join(broadcast(live_brokers), broker, "left_semi")
    )
    if connections is not None:
        ends = connections.select(*conn, "end_reason", "last_packet_time")
        cand = cand.join(ends, conn, "left")
    else:
        cand = cand.withColumn("end_reason", F.lit(None).cast("string")).withColumn(
            "last_packet_time", F.lit(None).cast("timestamp")
        )
    end = seen.groupBy("source").agg(
        F.greatest(F.max("last_response"), F.max("last_time")).alias("window_end")
    )
    cand = cand.join(broadcast(end), "source")
    closed = F.col("end_reason").isin("fin", "rst")
    silent_long = (F.unix_micros("window_end") - F.unix_micros("request_time")) >= int(silence_s * 1e6)
    return (
        cand.where(closed | silent_long)
        .withColumn("severity", F.lit("error"))
        .withColumn("reason", F.when(closed, "unanswered_then_closed").otherwise("unanswered_then_silent"))
        .withColumn(
            "reference",
            F.concat(F.lit("connection "), F.coalesce(F.col("end_reason"), F.lit("silent"))),
        )
    )


def unsupported_versions(
    exchanges: DataFrame,
    connections: DataFrame | None = None,
    *,
    releases: DataFrame | None = None,
    silence_s: float = 5.0,
) -> DataFrame:
    """Flagged (client, broker, api, version, reason) groups with count and first/last seen.

    ``releases``: a :func:`release_table` to compare against (none: only the references found
    in the data). ``silence_s``: how long an unanswered request's connection must stay silent
    before the end of the data to count as the old-broker signature (a close counts at once).
    """
    req = materialize(_requests(exchanges))  # a few thousand groups, read by up to three references
    parts = [
        _versus_advertised(req, exchanges),
        _error_35(req),
        _old_broker_signature(exchanges, connections, silence_s),
    ]
    if releases is not None:
        parts.append(_versus_releases(req, releases))
    cols = [*_GROUP, "client_id", "client_ip", "api_name", "n", "ts", "last_ts"]
    flagged = parts[0].select(*cols)
    for part in parts[1:]:
        flagged = flagged.unionByName(part.select(*cols))
    grouped = flagged.groupBy(*_GROUP).agg(
        F.first("client_id", ignorenulls=True).alias("client_id"),
        F.first("client_ip", ignorenulls=True).alias("client_ip"),
        F.first("api_name", ignorenulls=True).alias("api_name"),
        F.sum("n").alias("count"),
        F.min("ts").alias("first_seen"),
        F.max("last_ts").alias("last_seen"),
    )
    out = attach_software(grouped, exchanges)
    return out.select(
        "source",
        "client_id",
        "client_ip",
        "client_software_name",
        "client_software_version",
        "broker_ip",
        "broker_port",
        F.col("api_key").cast("short").alias("api_key"),
        "api_name",
        F.col("api_version").cast("short").alias("api_version"),
        "count",
        "first_seen",
        "last_seen",
        "reason",
        "reference",
        "severity",
    )


def audit_release(exchanges: DataFrame, releases: DataFrame) -> DataFrame:
    """Every (client, api, version) the release(s) would not accept, across all brokers."""
    flagged = _versus_releases(_requests(exchanges), releases)
    grouped = flagged.groupBy("client_key", "release", "api_key", "api_version", "reason", "severity").agg(
        F.first("client_id", ignorenulls=True).alias("client_id"),
        F.first("client_ip", ignorenulls=True).alias("client_ip"),
        F.first("api_name", ignorenulls=True).alias("api_name"),
        F.sum("n").alias("count"),
        F.min("ts").alias("first_seen"),
        F.max("last_ts").alias("last_seen"),
        F.first("rel_min").alias("release_min_version"),
        F.first("rel_max").alias("release_max_version"),
    )
    return ordered(
        attach_software(grouped, exchanges), "severity", "client_id", "client_ip", "api_key", "api_version"
    )


def run(
    tables,
    *,
    spark: SparkSession,
    versions: BrokerVersions | None = None,
    target_releases=(),
    silence_s: float = 5.0,
    **_,
):
    releases = release_table(spark, versions, list(target_releases)) if versions and target_releases else None
    return {
        "unsupported_versions": ordered(
            unsupported_versions(
                tables.exchanges, tables.connections, releases=releases, silence_s=silence_s
            ),
            F.col("severity"),
            F.col("count").desc(),
        )
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="unsupported_versions"))
