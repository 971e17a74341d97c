"""Job 2: how each client reacts to a partition error (incident 4: KAFKA_STORAGE_ERROR on JBOD).

For every watched error a client saw for a topic-partition (from ``partition_errors``):

* ``metadata_delay_ms``: until that client's next Metadata request, on any connection;
* ``requests_before_refresh``: requests for that partition it sent to the same broker after the
  error and before that refresh (or before the end of the data when it never refreshed);
* ``first_success_ms``: until its first error-free result for that partition, from any broker;
* ``verdict``: ``refreshes_metadata`` (a Metadata request within ``refresh_within_s``, with at
  most ``max_requests_before_refresh`` requests for the partition to that broker before it: a
  request or two may already be on their way), ``retries_without_refresh`` (more requests for
  the partition to the same broker before any refresh), ``gives_up`` (neither, and the data goes
  on for ``refresh_within_s``), ``unknown`` (neither, and the data ends too soon to tell).

The headline puts, per client, its reaction to KAFKA_STORAGE_ERROR (56) next to its reaction to
NOT_LEADER_OR_FOLLOWER (6): the Java client refreshes on both, sarama < 1.43.3 only on 6.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.common import (
    attach_software,
    client_key,
    event_time,
    micros_between,
    next_time_after,
    ordered,
    partition_results,
    with_window_end,
)

__all__ = ["DEFAULT_WATCHED", "VERDICTS", "error_reaction", "error_reaction_headline", "run"]

#: KAFKA_STORAGE_ERROR, NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION,
#: FENCED_LEADER_EPOCH.
DEFAULT_WATCHED = (56, 6, 5, 3, 74)
VERDICTS = ("refreshes_metadata", "retries_without_refresh", "gives_up", "unknown")

_TP = ["client_key", "topic", "partition"]
_BTP = ["client_key", "broker_ip", "broker_port", "topic", "partition"]
#: Time bucket for thinning successes and requests before they are sorted (any size gives the
#: same results; this one keeps few rows on the synthetic 10M-row benchmark).
_BUCKET_US = 10_000_000


def _probes(errors: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The instants :func:`_count_requests_between` counts between, per ``btp_id``: error times
    (``_ord`` 2: an exclusive start) and horizons (``_ord`` 0: an exclusive end)."""
    starts = errors.select("btp_id", "error_id", F.col("error_time").alias("_t"), F.lit(2).alias("_ord"))
    ends = errors.select("btp_id", "error_id", F.col("horizon").alias("_t"), F.lit(0).alias("_ord"))
    return starts, ends


def _count_requests_between(errors: DataFrame, requests: DataFrame) -> DataFrame:
    """Per ``error_id``: ``requests_before_refresh``, the requests in (error_time, horizon) with
    the error's ``btp_id`` (client, broker, topic, partition), by a running count over the
    errors' start/end probes and the ``requests`` (``btp_id``, ``request_time``, ``_w``: how
    many requests the row stands for, see :func:`_thin`)."""
    starts, ends = _probes(errors)
    reqs = requests.select(
        "btp_id",
        F.lit(None).cast("long").alias("error_id"),
        F.col("request_time").alias("_t"),
        F.lit(1).alias("_ord"),
        "_w",
    )
    # Order: at one instant, an end probe before the requests (exclusive end), a start probe after
    # them (exclusive start).
    w = (
        Window.partitionBy("btp_id")
        .orderBy("_t", "_ord")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    counted = (
        starts.unionByName(ends)
        .unionByName(reqs, allowMissingColumns=True)
        .withColumn("_n", F.sum(F.when(F.col("_ord") == 1, F.col("_w")).otherwise(0)).over(w))
        .where(F.col("_ord") != 1)
    )
    return counted.groupBy("error_id").agg(
        (
            F.max(F.when(F.col("_ord") == 0, F.col("_n"))) - F.max(F.when(F.col("_ord") == 2, F.col("_n")))
        ).alias("requests_before_refresh")
    )


def _watched_errors(exchanges: DataFrame, watched: list[int]) -> DataFrame:
    """The watched partition errors, each with an ``error_id`` and two dense integer keys:
    ``tp_id`` for its (client, topic, partition), ``btp_id`` for its (client, broker, topic,
    partition). The window sorts below then sort and shuffle one long, not strings."""
    return (
        partition_results(exchanges, watched)
        .withColumn("error_time", F.coalesce("response_time", "request_time"))
        .withColumn("error_id", F.monotonically_increasing_id())
        .select("error_id", *_BTP, "client_id", "client_ip", "api_name", "error_code", "error_time")
        # errors are few: one ranking sort each on a single partition is cheap
        .withColumn("tp_id", F.dense_rank().over(Window.orderBy(*_TP)))
        .withColumn("btp_id", F.dense_rank().over(Window.orderBy(*_BTP)))
    )


def _bucket(time: str) -> F.Column:
    return F.floor(F.unix_micros(time) / _BUCKET_US)


def _thin(rows: DataFrame, probed: DataFrame, keys: list[str], time: str) -> DataFrame:
    """``rows`` (``keys``, ``time``) reduced to (``keys``, ``time``: the earliest, ``_w``: how
    many rows it stands for): per distinct ``time`` in the (``keys``, bucket) pairs of
    ``probed``, per (``keys``, bucket) elsewhere. Between two probes every row of an unprobed
    bucket counts or not together, and only its earliest can be a first; one hash aggregate
    instead of sorting every row (any bucket size gives the same results)."""
    flagged = rows.withColumn("_b", _bucket(time)).join(F.broadcast(probed), [*keys, "_b"], "left")
    exact = F.when(F.col("_probed"), F.col(time)).alias("_exact")
    return (
        flagged.groupBy(*keys, "_b", exact)
        .agg(F.min(time).alias(time), F.count(F.lit(1)).alias("_w"))
        .drop("_b", "_exact")
    )


def _keyed(kind: int, key: str, time: str | F.Column) -> F.Column:
    """One thinning row: ``_kind``, ``_key`` (a tp_id or btp_id), ``_t``."""
    t = F.col(time) if isinstance(time, str) else time
    return F.struct(F.lit(kind).alias("_kind"), F.col(key).cast("long").alias("_key"), t.alias("_t"))


def _request_buckets(errors: DataFrame) -> DataFrame:
    """(``btp_id``, ``_b``): the distinct time buckets holding a probe of
    :func:`_count_requests_between`."""
    starts, ends = _probes(errors)
    return starts.unionByName(ends).select("btp_id", _bucket("_t").alias("_b")).distinct()


def _thinned_results(
    errors: DataFrame, touched: DataFrame, in_play: DataFrame, request_buckets: DataFrame
) -> DataFrame:
    """The ``touched`` partition results, thinned (:func:`_thin`) in one pass for both uses:
    ``_kind`` 0, the successes per ``_key`` = ``tp_id`` (time: when answered); ``_kind`` 1,
    the requests per ``_key`` = ``btp_id`` after the first error there (``in_play``'s
    ``_from``; time: when sent)."""
    events = F.array(
        F.when(F.col("error_code") == 0, _keyed(0, "tp_id", F.coalesce("response_time", "request_time"))),
        F.when(F.col("request_time") > F.col("_from"), _keyed(1, "btp_id", "request_time")),
    )
    rows = (
        touched.join(F.broadcast(in_play), _BTP, "left")
        .select(F.explode(events).alias("e"))
        .where(F.col("e").isNotNull())
        .select("e.*")
    )
    success_buckets = errors.select(
        F.lit(0).alias("_kind"), F.col("tp_id").cast("long").alias("_key"), _bucket("error_time").alias("_b")
    )
    probed = (
        success_buckets.unionByName(
            request_buckets.select(F.lit(1).alias("_kind"), F.col("btp_id").cast("long").alias("_key"), "_b")
        )
        .distinct()
        .withColumn("_probed", F.lit(True))
    )
    return _thin(rows, probed, ["_kind", "_key"], "_t")


def _first_success(errors: DataFrame, successes: DataFrame) -> DataFrame:
    """Per ``error_id``: ``success_time``, the first error-free result for the error's
    partition after it, from any broker (``successes``: ``tp_id``, ``ok_time``)."""
    probes = errors.select("error_id", "tp_id", "error_time")
    return next_time_after(probes, successes, ["tp_id"], "error_time", "ok_time", "success_time").select(
        "error_id", "success_time"
    )


def _unlisted_requests(exchanges: DataFrame, in_play: DataFrame, request_buckets: DataFrame) -> DataFrame:
    """(``btp_id``, ``request_time``, ``_w``) of the requests without partition results
    (unanswered, acks=0) naming an errored partition's topic, to its broker after its first
    error there, fanned out to the partitions that had errors and thinned like the listed ones."""
    no_result = exchanges.where(
        ((F.size("partition_errors") <= 0) | F.col("partition_errors").isNull()) & (F.size("topics") > 0)
    ).select(
        client_key().alias("client_key"),
        "broker_ip",
        "broker_port",
        "request_time",
        F.explode("topics").alias("topic"),
    )
    by_topic = (
        no_result.join(F.broadcast(in_play), ["client_key", "broker_ip", "broker_port", "topic"])
        .where(F.col("request_time") > F.col("_from"))
        .select("btp_id", "request_time")
    )
    return _thin(by_topic, request_buckets.withColumn("_probed", F.lit(True)), ["btp_id"], "request_time")


def error_reaction(
    exchanges: DataFrame,
    *,
    watched: tuple[int, ...] = DEFAULT_WATCHED,
    refresh_within_s: float = 10.0,
    max_requests_before_refresh: int = 2,
) -> DataFrame:
    """One row per watched partition error a client saw, with its reaction (see module doc)."""
    errors = _watched_errors(exchanges, list(watched)).cache()  # used several times; ids drawn once
    metadata = exchanges.where((F.col("api_key") == 3) & (F.col("status") != "orphan_response")).select(
        client_key().alias("client_key"), event_time().alias("md_time")
    )
    errors = next_time_after(errors, metadata, ["client_key"], "error_time", "md_time", "refresh_time")
    errors = with_window_end(errors, exchanges).withColumn(
        "horizon", F.coalesce(F.col("refresh_time"), F.col("window_end") + F.expr("INTERVAL 1 MICROSECOND"))
    )
    errors = errors.cache()
    # Only partitions that had errors matter, and only from their first error on: one pass over
    # all partition results keeps those, for the successes and the requests below.
    spans = errors.groupBy("tp_id", *_TP).agg(F.min("error_time").alias("_first_err"))
    touched = (
        partition_results(exchanges)
        .join(F.broadcast(spans), _TP)
        .where(F.coalesce("response_time", "request_time") > F.col("_first_err"))
        .select("tp_id", *_BTP, "request_time", "response_time", "error_code")
    )
    in_play = errors.groupBy("btp_id", *_BTP).agg(F.min("error_time").alias("_from"))
    request_buckets = _request_buckets(errors)
    thinned = _thinned_results(errors, touched, in_play, request_buckets).cache()  # read twice
    successes = thinned.where(F.col("_kind") == 0).select(
        F.col("_key").alias("tp_id"), F.col("_t").alias("ok_time")
    )
    listed = thinned.where(F.col("_kind") == 1).select(
        F.col("_key").alias("btp_id"), F.col("_t").alias("request_time"), "_w"
    )
    requests = listed.unionByName(_unlisted_requests(exchanges, in_play, request_buckets))
    errors = errors.join(_first_success(errors, successes), "error_id", "left").join(
        _count_requests_between(errors, requests), "error_id", "left"
    )

    delay_us = micros_between("error_time", "refresh_time")
    within = int(refresh_within_s * 1e6)
    ended_early = micros_between("error_time", "window_end") < within
    retried = F.coalesce(F.col("requests_before_refresh"), F.lit(0))
    verdict = (
        F.when((delay_us <= within) & (retried <= max_requests_before_refresh), "refreshes_metadata")
        .when(F.col("requests_before_refresh") > 0, "retries_without_refresh")
        .when(ended_early, "unknown")
        .otherwise("gives_up")
    )
    out = errors.select(
        "client_key",
        "broker_ip",
        "broker_port",
        "topic",
        F.when(F.col("partition") >= 0, F.col("partition")).alias("partition"),
        "api_name",
        F.col("error_code").cast("short").alias("error_code"),
        "error_time",
        "refresh_time",
        (delay_us / 1000.0).alias("metadata_delay_ms"),
        F.coalesce(F.col("requests_before_refresh"), F.lit(0)).cast("long").alias("requests_before_refresh"),
        "success_time",
        (micros_between("error_time", "success_time") / 1000.0).alias("first_success_ms"),
        verdict.alias("verdict"),
    )
    return attach_software(out, exchanges, keep_key=True)


def _count_of(values: F.Column, name: str) -> F.Column:
    return F.size(F.filter(values, lambda v: v == F.lit(name)))


def _dominant_verdict(verdicts: F.Column) -> F.Column:
    """Most frequent known verdict of a collected list (ties: the worse one); ``unknown`` if none."""
    best, best_n = F.lit("unknown"), F.lit(0)
    for name in ("retries_without_refresh", "gives_up", "refreshes_metadata"):  # earlier wins ties
        n = _count_of(verdicts, name)
        best = F.when(n > best_n, F.lit(name)).otherwise(best)
        best_n = F.greatest(n, best_n)
    return best


def error_reaction_headline(reactions: DataFrame, *, codes: tuple[int, int] = (56, 6)) -> DataFrame:
    """One row per client that saw one of ``codes``: its dominant reaction to each, side by side."""
    aggs = []
    for code in codes:
        hit = F.col("error_code") == code
        aggs += [
            F.sum(F.when(hit, 1).otherwise(0)).alias(f"errors_{code}"),
            _dominant_verdict(F.collect_list(F.when(hit, F.col("verdict")))).alias(f"reaction_{code}"),
            F.percentile_approx(F.when(hit, F.col("metadata_delay_ms")), 0.5).alias(f"refresh_p50_ms_{code}"),
            F.max(F.when(hit, F.col("requests_before_refresh"))).alias(f"max_requests_before_refresh_{code}"),
        ]
    a, b = codes
    grouped = (
        reactions.where(F.col("error_code").isin(list(codes)))
        .groupBy("client_key", "client_id", "client_ip", "client_software_name", "client_software_version")
        .agg(*aggs)
    )
    for code in codes:  # a code the client never saw has no reaction
        grouped = grouped.withColumn(
            f"reaction_{code}", F.when(F.col(f"errors_{code}") > 0, F.col(f"reaction_{code}"))
        )
    ra, rb = F.col(f"reaction_{a}"), F.col(f"reaction_{b}")
    differs = ra.isNotNull() & rb.isNotNull() & (ra != "unknown") & (rb != "unknown") & (ra != rb)
    return ordered(
        grouped.withColumn("reactions_differ", differs).drop("client_key"),
        F.col("reactions_differ").desc(),
        F.col(f"errors_{a}").desc(),
    )


def run(tables, *, watched=DEFAULT_WATCHED, refresh_within_s=10.0, max_requests_before_refresh=2, **_):
    reactions = error_reaction(
        tables.exchanges,
        watched=tuple(watched),
        refresh_within_s=refresh_within_s,
        max_requests_before_refresh=max_requests_before_refresh,
    ).cache()  # both results derive from it
    return {
        "error_reaction": ordered(reactions.drop("client_key"), "error_time"),
        "error_reaction_headline": error_reaction_headline(reactions),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="error_reaction"))
