"""Job ``error_reaction``: what each client *did* after a partition error, read from its batches
(issue 17 item 3; incident 4: KAFKA_STORAGE_ERROR on a JBOD broker).

Every failed Produce result (one per request and partition) is followed by the batch it
failed (:mod:`spark_jobs.delivery`: the same producer id/epoch/base sequence, or the same
CRC): was it sent again, where, and did the client ask for metadata first? Verdicts:

* ``refresh_then_retry``: the batch was sent again, with a Metadata request of the client
  between the error and the re-send;
* ``retry_on_new_leader``: sent again to another broker without a Metadata request between
  (the client learnt the new leader otherwise, e.g. from the error response, KIP-951);
* ``retry_without_refresh``: sent again to the same broker, no Metadata request between;
* ``drop_without_retry``: never sent again, though the client had time to (the data goes on
  ``resend_within_s`` after the error, or the client closed all its connections);
* ``unknown``: the data ends too soon after the error to tell.

When a client re-encodes a batch to retry it (sarama stamps records when it builds a batch,
so the retry has new timestamps and a new CRC), the identity cannot show the re-send; the
re-send is then read from the client's behaviour: it asked for metadata and sent its next
batch for the partition to the leader that metadata named (``retry_identity = inferred``;
``delivery`` calls such batches ``resent_unlinked``). Errors on other APIs (Fetch,
ListOffsets, ...) in ``watched``, and Produce errors of requests without batch identity
(datasets decoded before kwire kept it, frames cut by the capture), follow the partition
instead: the client's next request of that API naming the partition stands for the retry
(``retry_identity = next_request``), which cannot tell a retry from new data.

Results: ``error_reaction`` (one row per source, client, API and error code, with the
dominant verdict and its counts: errors, retries, refreshes, time to refresh, batches
dropped), ``error_reaction_events`` (one row per error) and ``error_reaction_headline`` (per
client, its reaction to 56 next to its reaction to 6: sarama < 1.43.3 drops on 56 and
refreshes on 6). Each row says what the wire shows and what it cannot (``wire_cannot_show``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.common import (
    attach_software,
    broadcast,
    client_key,
    error_name,
    event_time,
    materialize,
    next_time_after,
    ordered,
    partition_results,
    topic_names,
)
from spark_jobs.delivery import (
    DEFAULT_RESEND_WITHIN_S,
    batch_fates,
    client_closed,
    produce_attempts,
    shared_fates,
)

__all__ = [
    "DEFAULT_WATCHED",
    "VERDICTS",
    "error_reaction",
    "error_reaction_headline",
    "reaction_events",
    "run",
]

#: Errors followed on APIs other than Produce (every Produce error is followed):
#: KAFKA_STORAGE_ERROR, NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION,
#: FENCED_LEADER_EPOCH.
DEFAULT_WATCHED = (56, 6, 5, 3, 74)
VERDICTS = (
    "refresh_then_retry",
    "retry_on_new_leader",
    "retry_without_refresh",
    "drop_without_retry",
    "unknown",
)
#: Verdicts of a client that moved on from a broker that failed it.
HEALTHY = ("refresh_then_retry", "retry_on_new_leader")
#: Worst first: the order ties are broken in when one verdict is picked for many errors.
_WORST_FIRST = ("drop_without_retry", "retry_without_refresh", "retry_on_new_leader", "refresh_then_retry")
PRODUCE, METADATA = 0, 3
_EXAMPLES = 5


def _produce_errors(attempts: DataFrame, fates: DataFrame) -> DataFrame:
    """Failed Produce attempts with their re-send: the next attempt of the same batch, else
    (last attempt) the re-send :func:`spark_jobs.delivery.inferred_resends` reads off the
    client's behaviour."""
    failed = attempts.where(F.col("outcome") == "failed")
    fate = fates.select(
        "batch_key",
        "fate",
        F.col("resend_time").alias("_inf_time"),
        F.col("resend_broker_ip").alias("_inf_ip"),
        F.col("resend_broker_port").alias("_inf_port"),
    )
    linked = F.col("next_request_time").isNotNull()
    inferred = ~linked & (F.col("fate") == "resent_unlinked")
    keys = ["source", "client_key", "topic", "partition"]
    sends = attempts.select(*keys, F.col("request_time").alias("_sent")).join(
        broadcast(failed.select(*keys).distinct()), keys, "left_semi"
    )
    failed = failed.withColumn("error_time", F.coalesce("response_time", "request_time"))
    failed = next_time_after(failed, sends, keys, "error_time", "_sent", "next_send_time")
    return failed.join(fate, "batch_key", "left").select(
        "source",
        "client_key",
        "client_id",
        "client_ip",
        "broker_ip",
        "broker_port",
        "connection_id",
        "correlation_id",
        F.lit("Produce").alias("api_name"),
        "topic",
        "partition",
        "error_code",
        "error_time",
        "next_send_time",
        "batch_key",
        "record_count",
        "fate",
        F.when(linked, F.col("next_request_time")).when(inferred, F.col("_inf_time")).alias("retry_time"),
        F.when(linked, F.col("next_broker_ip")).when(inferred, F.col("_inf_ip")).alias("retry_broker_ip"),
        F.when(linked, F.col("next_broker_port"))
        .when(inferred, F.col("_inf_port"))
        .alias("retry_broker_port"),
        F.when(linked & F.col("idempotent"), "producer_id_sequence")
        .when(linked, "crc")
        .when(inferred, "inferred")
        .alias("retry_identity"),
    )


def _partition_errors(
    exchanges: DataFrame, watched: tuple[int, ...], codes: tuple[int, ...] | None
) -> DataFrame:
    """The errors no batch can be followed from, each with the client's next request of that
    API naming the partition as its retry: ``watched`` errors of APIs other than Produce and
    Metadata, and Produce errors (``codes``, None: all) of requests without batch identity
    (decoded before kwire kept it, or cut by the capture)."""
    names = topic_names(exchanges)
    no_identity = (F.col("api_key") == PRODUCE) & (F.coalesce(F.size("batches"), F.lit(0)) <= 0)
    results = partition_results(
        exchanges.where(F.col("api_key") != METADATA).withColumn("_no_identity", no_identity),
        carry=("source", "connection_id", "correlation_id", "_no_identity"),
    ).where(F.col("partition") >= 0)
    # Produce and Fetch v13+ name topics by id: one topic must have one name on both sides
    results = (
        results.join(broadcast(names), F.col("topic") == F.col("topic_id"), "left")
        .withColumns(
            {
                "topic": F.coalesce("topic_name", "topic"),
                "error_time": F.coalesce("response_time", "request_time"),
            }
        )
        .drop("topic_id", "topic_name")
    )
    keys = ["source", "client_key", "api_key", "topic", "partition"]
    code = F.col("error_code")
    produce_code = (code != 0) if codes is None else code.isin(*codes)
    errors = results.where(
        F.when(F.col("api_key") == PRODUCE, F.col("_no_identity") & produce_code).otherwise(
            code.isin(*watched)
        )
    )
    later = results.join(broadcast(errors.select(*keys).distinct()), keys, "left_semi")
    # the retry is the next request, and its broker that of the first such request at that time
    errors = next_time_after(
        errors,
        later,
        keys,
        "error_time",
        "request_time",
        "retry_time",
        carry={"broker_ip": "retry_broker_ip", "broker_port": "retry_broker_port"},
    )
    return errors.select(
        "source",
        "client_key",
        "client_id",
        "client_ip",
        "broker_ip",
        "broker_port",
        "connection_id",
        "correlation_id",
        "api_name",
        "topic",
        "partition",
        "error_code",
        "error_time",
        F.col("retry_time").alias("next_send_time"),
        F.lit(None).cast("long").alias("batch_key"),
        F.lit(None).cast("long").alias("record_count"),
        F.lit(None).cast("string").alias("fate"),
        "retry_time",
        "retry_broker_ip",
        "retry_broker_port",
        F.when(F.col("retry_time").isNotNull(), "next_request").alias("retry_identity"),
    )


def reaction_events(
    exchanges: DataFrame,
    connections: DataFrame | None = None,
    *,
    watched: tuple[int, ...] = DEFAULT_WATCHED,
    codes: tuple[int, ...] | None = None,
    resend_within_s: float = DEFAULT_RESEND_WITHIN_S,
    attempts: DataFrame | None = None,
    fates: DataFrame | None = None,
) -> DataFrame:
    """One row per failed partition result (Produce: every error, or those in ``codes``;
    other APIs: ``watched``), with the retry, the refresh and the ``verdict``."""
    if attempts is None:
        attempts = materialize(produce_attempts(exchanges))
    if fates is None:
        fates = batch_fates(exchanges, connections, attempts=attempts, resend_within_s=resend_within_s)
    produce = _produce_errors(attempts, fates)
    if codes is not None:
        produce = produce.where(F.col("error_code").isin(*codes))
    errors = produce.unionByName(_partition_errors(exchanges, watched, codes))

    metadata = exchanges.where(
        (F.col("api_key") == METADATA) & (F.col("status") != "orphan_response")
    ).select("source", client_key().alias("client_key"), event_time().alias("md_time"))
    errors = next_time_after(
        errors, metadata, ["source", "client_key"], "error_time", "md_time", "refresh_time"
    )
    window_end = exchanges.groupBy("source").agg(
        F.greatest(F.max("request_time"), F.max("response_time")).alias("_window_end")
    )
    errors = errors.join(broadcast(window_end), "source", "left")
    if connections is not None:
        errors = errors.join(client_closed(connections), ["source", "client_key"], "left")
    else:
        errors = errors.withColumn("closed_time", F.lit(None).cast("timestamp"))

    within_us = int(resend_within_s * 1e6)
    retried = F.col("retry_time").isNotNull()
    # a refresh counts when the client asked for metadata before it next wrote to the partition
    # (the retry, or a new batch), or within the horizon when it never did
    refreshed = F.col("refresh_time").isNotNull() & F.when(
        F.col("next_send_time").isNotNull(), F.col("refresh_time") < F.col("next_send_time")
    ).otherwise(F.unix_micros("refresh_time") <= F.unix_micros("error_time") + within_us)
    same_broker = (F.col("retry_broker_ip") == F.col("broker_ip")) & (
        F.col("retry_broker_port") == F.col("broker_port")
    )
    decided = F.coalesce(
        (F.unix_micros("_window_end") >= F.unix_micros("error_time") + within_us)
        | (F.col("closed_time") >= F.col("error_time")),
        F.lit(False),
    )
    verdict = (
        F.when(retried & (F.col("refresh_time") < F.col("retry_time")), "refresh_then_retry")
        .when(retried & ~same_broker, "retry_on_new_leader")
        .when(retried, "retry_without_refresh")
        .when(F.col("fate") == "unknown", "unknown")
        .when(F.col("fate").isNull() & ~decided, "unknown")
        .otherwise("drop_without_retry")
    )
    out = errors.select(
        "source",
        "client_key",
        "client_id",
        "client_ip",
        "broker_ip",
        "broker_port",
        "api_name",
        "topic",
        "partition",
        F.col("error_code").cast("short").alias("error_code"),
        error_name(F.col("error_code")).alias("error_name"),
        "error_time",
        "connection_id",
        "correlation_id",
        "batch_key",
        "record_count",
        "retry_time",
        "retry_broker_ip",
        "retry_broker_port",
        "retry_identity",
        F.when(retried, same_broker).alias("retry_same_broker"),
        "refresh_time",
        ((F.unix_micros("refresh_time") - F.unix_micros("error_time")) / 1000.0).alias("refresh_delay_ms"),
        refreshed.alias("refreshed"),
        F.col("fate").alias("batch_fate"),
        verdict.alias("verdict"),
    )
    return out


def _n(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0)).cast("long")


def _dominant(prefix: str = "n_") -> Column:
    """The verdict with the most errors (ties: the worse one); ``unknown`` if none is known."""
    # The greatest of (count, worseness, verdict) structs. As one nested SQL CASE it was 3 KB of
    # text that Spark's parser read again wherever a DataFrame used it (see common._lookup).
    zero = F.lit(0).cast("long")
    ranked = [
        F.struct(
            F.coalesce(F.col(f"{prefix}{name}"), zero).alias("n"),
            F.lit(worse).alias("worse"),
            F.lit(name).alias("verdict"),
        )
        for worse, name in enumerate(_WORST_FIRST[::-1])
    ]
    top = F.greatest(*ranked)
    return F.when(top["n"] > 0, top["verdict"]).otherwise(F.lit("unknown"))


def _counted(count: str, text: str) -> Column:
    """``"<n><text>"`` when the row's ``count`` column is positive."""
    return F.when(F.col(count) > 0, F.concat(F.col(count).cast("string"), F.lit(text)))


def _wire_text(verdict: Column) -> tuple[Column, Column]:
    """(``wire_shows``, ``wire_cannot_show``) for a summary row, from its counts."""
    shows = F.concat_ws(
        "; ",
        F.concat(
            F.col("errors").cast("string"),
            F.lit(" failed results ("),
            F.col("error_name"),
            F.lit(") from "),
            F.array_join("brokers", ", "),
        ),
        F.when(
            F.col("retries") > 0,
            F.concat(
                F.col("retries").cast("string"),
                F.lit(" sent again ("),
                F.col("retries_same_broker").cast("string"),
                F.lit(" to the same broker), "),
                F.col("refreshes").cast("string"),
                F.lit(" after a Metadata request"),
            ),
        ),
        F.when(
            F.col("batches_dropped") > 0,
            F.concat(
                F.col("batches_dropped").cast("string"),
                F.lit(" batches ("),
                F.col("records_dropped").cast("string"),
                F.lit(" records) never sent again"),
            ),
        ),
    )
    cannot = F.concat_ws(
        "; ",
        _counted(
            "retries_inferred",
            " re-sends inferred, not seen: the client re-encoded the batch (new timestamps and CRC), so "
            "the wire shows only that it refreshed and wrote its next batch to the leader named",
        ),
        _counted(
            "retries_by_partition",
            " retries are the client's next request for the partition: without batch identity "
            "(not a Produce batch, or none decoded) a retry cannot be told from new data",
        ),
        F.when(
            F.col("batches_dropped") > 0,
            F.lit("whether the library told the application that these records failed"),
        ),
        F.when(
            F.col("n_unknown") > 0, F.lit("what the client did after errors too close to the end of the data")
        ),
        F.when(
            verdict == "retry_on_new_leader",
            F.lit("how the client learnt the new leader without a Metadata request"),
        ),
    )
    return shows, F.when(cannot != "", cannot)


def error_reaction(events: DataFrame, exchanges: DataFrame) -> DataFrame:
    """One row per source, client, API and error code: the dominant ``verdict`` and the counts
    behind it (errors, retries, refreshes, time to refresh, batches and records dropped)."""
    keys = ["client_key", "source", "api_name", "error_code", "error_name"]
    dropped = F.col("batch_fate") == "dropped"
    grouped = events.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("errors"),
        F.countDistinct("connection_id", "correlation_id").alias("error_responses"),
        F.countDistinct("batch_key").alias("batches"),
        F.sum("record_count").alias("records"),
        _n(F.col("retry_time").isNotNull()).alias("retries"),
        _n(F.col("retry_identity") == "inferred").alias("retries_inferred"),
        _n(F.col("retry_identity") == "next_request").alias("retries_by_partition"),
        _n(F.col("retry_same_broker")).alias("retries_same_broker"),
        _n(F.col("refreshed")).alias("refreshes"),
        F.percentile_approx(F.when(F.col("refreshed"), F.col("refresh_delay_ms")), 0.5).alias(
            "refresh_p50_ms"
        ),
        F.max(F.when(F.col("refreshed"), F.col("refresh_delay_ms"))).alias("refresh_max_ms"),
        # a batch dropped after several errors counts under the error it last got
        F.countDistinct(F.when(dropped & F.col("retry_time").isNull(), F.col("batch_key"))).alias(
            "batches_dropped"
        ),
        F.coalesce(
            F.sum(F.when(dropped & F.col("retry_time").isNull(), F.col("record_count"))),
            F.lit(0).cast("long"),
        ).alias("records_dropped"),
        *[_n(F.col("verdict") == v).alias(f"n_{v}") for v in VERDICTS],
        F.array_sort(
            F.collect_set(F.concat_ws(":", F.col("broker_ip"), F.col("broker_port").cast("string")))
        ).alias("brokers"),
        F.min("error_time").alias("first_error_time"),
        F.max("error_time").alias("last_error_time"),
        F.slice(F.array_sort(F.collect_list("correlation_id")), 1, _EXAMPLES).alias(
            "example_correlation_ids"
        ),
    )
    verdict = _dominant()
    shows, cannot = _wire_text(verdict)
    out = grouped.select(
        "*", verdict.alias("verdict"), shows.alias("wire_shows"), cannot.alias("wire_cannot_show")
    )
    lead = ["client_key", "api_name", "error_code", "error_name", "verdict"]
    return attach_software(
        out.select(*lead, *[c for c in out.columns if c not in lead]), exchanges, keep_key=True
    )


def error_reaction_headline(summary: DataFrame, *, codes: tuple[int, int] = (56, 6)) -> DataFrame:
    """One row per producer that got one of ``codes`` on Produce: its reaction to each side by
    side, with the errors and the batches it dropped. ``reactions_differ``: both known and not
    both healthy (a retry after new metadata or on the new leader)."""
    keys = [
        "client_key",
        "source",
        "client_id",
        "client_ip",
        "client_software_name",
        "client_software_version",
    ]
    rows = summary.where(F.col("error_code").isin(*codes) & (F.col("api_name") == "Produce"))
    aggs = []
    for code in codes:
        hit = F.col("error_code") == code
        aggs += [
            F.sum(F.when(hit, F.col("errors"))).alias(f"errors_{code}"),
            F.sum(F.when(hit, F.col("batches_dropped"))).alias(f"dropped_{code}"),
            F.sum(F.when(hit, F.col("refreshes"))).alias(f"refreshes_{code}"),
            *[F.sum(F.when(hit, F.col(f"n_{v}"))).alias(f"_{code}_{v}") for v in VERDICTS],
        ]
    grouped = rows.groupBy(*keys).agg(*aggs)
    for code in codes:
        grouped = grouped.withColumn(
            f"reaction_{code}", F.when(F.col(f"errors_{code}") > 0, _dominant(f"_{code}_"))
        ).drop(*[f"_{code}_{v}" for v in VERDICTS])
    a, b = codes
    ra, rb = F.col(f"reaction_{a}"), F.col(f"reaction_{b}")
    known = ra.isNotNull() & rb.isNotNull() & (ra != "unknown") & (rb != "unknown")
    differs = known & (ra != rb) & ~(ra.isin(*HEALTHY) & rb.isin(*HEALTHY))
    return ordered(
        grouped.withColumn("reactions_differ", differs).drop("client_key"),
        F.col("reactions_differ").desc(),
        F.col(f"errors_{a}").desc(),
    )


def run(
    tables,
    *,
    watched=DEFAULT_WATCHED,
    resend_within_s: float = DEFAULT_RESEND_WITHIN_S,
    **_,
):
    attempts, fates = shared_fates(tables, resend_within_s)
    events = reaction_events(
        tables.exchanges,
        tables.connections,
        watched=tuple(watched),
        resend_within_s=resend_within_s,
        attempts=attempts,
        fates=fates,
    )
    events = materialize(attach_software(events, tables.exchanges, keep_key=True))
    summary = materialize(error_reaction(events.drop(*_SOFTWARE_COLUMNS), tables.exchanges))
    return {
        "error_reaction": ordered(summary.drop("client_key"), "source", "client_id", "error_code"),
        "error_reaction_events": ordered(events.drop("client_key", "batch_key"), "error_time"),
        "error_reaction_headline": error_reaction_headline(summary),
    }


_SOFTWARE_COLUMNS = ("client_software_name", "client_software_version")


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="error_reaction"))
