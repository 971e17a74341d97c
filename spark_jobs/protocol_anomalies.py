"""Job ``protocol_anomalies``: brokers that break the protocol, and clients that cannot read a
broker's answers (issue 17, item 7).

``protocol_anomalies``: one row per source, broker, kind and API:

* ``answered_acks0``: the broker answered a Produce request sent with acks=0, which expects no
  response (Tansu does). A client that reads no answer to such requests leaves them in its
  socket buffer, or takes them for the answer to its next request;
* ``malformed_response``: a response that does not decode against the layout of the version
  its request asked for (kwire reads it with Kafka's own definitions; a client reading it
  fails the same way).

``client_parse_failures``: one row per source, client, broker and API for connections the
client closed right after a broker's answer (within ``close_within_s``), where that answer was
either malformed or the end of the handshake: the connection carried ApiVersions (and SASL)
only. A client that gets past the handshake always sends something more; one that closes
there, again and again, could not use what the broker said (librdkafka's "Read underflow" on a
broker's ApiVersions v3). A connection the broker closed, or one still in use, does not count;
nor does an answered connection the client used for real requests (admin tools, probes).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import attach_software, client_key, event_time, ordered

__all__ = ["broker_violations", "client_parse_failures", "run"]

PRODUCE, API_VERSIONS = 0, 18
#: APIs of the connection handshake: ApiVersions, SaslHandshake, SaslAuthenticate.
HANDSHAKE = (18, 17, 36)
DEFAULT_CLOSE_WITHIN_S = 1.0
_EXAMPLES = 5
_BROKER = ["source", "broker_ip", "broker_port"]


def _examples(value: Column) -> Column:
    return F.slice(F.array_sort(F.collect_list(value)), 1, _EXAMPLES)


def broker_violations(exchanges: DataFrame, connections: DataFrame) -> DataFrame:
    """Per source, broker, kind and API (its versions listed): answers to acks=0 Produce requests and responses that
    do not decode against their version's layout, with the clients they went to.

    A malformed response counts only on a connection seen from its SYN, with no resync: on a
    connection picked up mid-stream, kwire hunts for frame boundaries and may take a piece of
    a frame for one, which says nothing about the broker."""
    answered_acks0 = (F.col("status") == "orphan_response") & (F.col("api_key") == PRODUCE)
    malformed_response = (F.col("status") == "malformed") & F.col("response_time").isNotNull()
    whole = connections.where(F.col("syn_seen") & (F.coalesce(F.col("resyncs"), F.lit(0)) == 0)).select(
        "source", "connection_id", F.lit(True).alias("_whole")
    )
    kind = F.when(answered_acks0, "answered_acks0").when(malformed_response, "malformed_response")
    rows = (
        exchanges.where(answered_acks0 | malformed_response)
        .join(whole, ["source", "connection_id"], "left")
        .where(answered_acks0 | F.coalesce(F.col("_whole"), F.lit(False)))
        .withColumn("kind", kind)
    )
    return ordered(
        rows.groupBy(*_BROKER, "kind", "api_name").agg(
            F.sort_array(F.collect_set("api_version")).alias("api_versions"),
            F.count(F.lit(1)).alias("responses"),
            F.countDistinct("connection_id").alias("connections"),
            F.array_sort(F.collect_set("client_id")).alias("client_ids"),
            F.min(event_time()).alias("first_time"),
            F.max(event_time()).alias("last_time"),
            _examples(F.col("correlation_id")).alias("example_correlation_ids"),
            F.first("decode_error", ignorenulls=True).alias("example_error"),
        ),
        "source",
        "broker_ip",
        "broker_port",
        "kind",
        "api_name",
    )


def client_parse_failures(
    exchanges: DataFrame, connections: DataFrame, *, close_within_s: float = DEFAULT_CLOSE_WITHIN_S
) -> DataFrame:
    """Per source, client, broker and API: connections the client closed right after an answer
    it could not have used (see the module docstring)."""
    ex = exchanges.where(F.col("status") != "orphan_response").select(
        "source",
        "connection_id",
        client_key().alias("client_key"),
        "client_id",
        "broker_ip",
        "broker_port",
        "api_key",
        "api_name",
        "api_version",
        "correlation_id",
        "status",
        "response_time",
        event_time().alias("ts"),
    )
    per_conn = ex.groupBy("source", "connection_id").agg(
        F.max_by(
            F.struct("api_name", "api_version", "status", "response_time", "correlation_id"), "ts"
        ).alias("last"),
        F.bool_and(F.col("api_key").isin(*HANDSHAKE)).alias("handshake_only"),
        F.bool_or(F.col("api_key") == API_VERSIONS).alias("sent_api_versions"),
        F.first("client_key", ignorenulls=True).alias("client_key"),
        F.first("broker_ip").alias("broker_ip"),
        F.first("broker_port").alias("broker_port"),
    )
    closed = connections.where(F.col("ended_by").isin("client_fin", "client_rst")).select(
        "source", "connection_id", "ended_by", "end_time"
    )
    joined = per_conn.join(closed, ["source", "connection_id"])
    last = F.col("last")
    answered = last["response_time"].isNotNull()
    soon = (F.col("end_time").cast("double") - last["response_time"].cast("double")) <= close_within_s
    unusable = (last["status"] == "malformed") | (F.col("handshake_only") & F.col("sent_api_versions"))
    failures = joined.where(answered & soon & unusable).select(
        "source",
        "client_key",
        "broker_ip",
        "broker_port",
        last["api_name"].alias("api_name"),
        last["api_version"].alias("api_version"),
        F.when(last["status"] == "malformed", "malformed_response")
        .otherwise("closed_after_handshake")
        .alias("reason"),
        "connection_id",
        "ended_by",
        "end_time",
        (F.col("end_time").cast("double") - last["response_time"].cast("double")).alias("close_after_s"),
        last["correlation_id"].alias("correlation_id"),
    )
    grouped = failures.groupBy(
        "source", "client_key", "broker_ip", "broker_port", "api_name", "api_version", "reason"
    ).agg(
        F.count(F.lit(1)).alias("connections"),
        F.min("end_time").alias("first_time"),
        F.max("end_time").alias("last_time"),
        F.max("close_after_s").alias("max_close_after_s"),
        F.sort_array(F.collect_set("ended_by")).alias("ended_by"),
        _examples(F.col("connection_id")).alias("example_connections"),
    )
    # did the client ever get further with this broker (a connection past the handshake)?
    useful = (
        per_conn.where(~F.col("handshake_only"))
        .groupBy("source", "client_key", "broker_ip", "broker_port")
        .agg(F.count(F.lit(1)).alias("connections_used"))
    )
    out = grouped.join(useful, ["source", "client_key", "broker_ip", "broker_port"], "left").fillna(
        0, ["connections_used"]
    )
    return ordered(attach_software(out, exchanges), "source", "client_id", "broker_ip", "api_name")


def run(tables, *, close_within_s: float = DEFAULT_CLOSE_WITHIN_S, **_context) -> dict[str, DataFrame]:
    return {
        "protocol_anomalies": broker_violations(tables.exchanges, tables.connections),
        "client_parse_failures": client_parse_failures(
            tables.exchanges, tables.connections, close_within_s=close_within_s
        ),
    }
