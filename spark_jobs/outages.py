"""Job ``outages``: brokers that stopped answering (incident 2), and brokers that dropped requests
while answering others (incident 1: Kafka 0.9 and an ApiVersions it does not know).

A broker is one ``(source, broker_ip, broker_port)`` that carried Kafka. Its *silences* are the
gaps of at least ``min_silence_s`` between the times it sent responses (on any connection), the
stretch before its first response and the one after its last included. A silence is an outage
when the wire shows the broker failing in it, not only idle or slow:

* requests left unanswered: on a connection the broker closed in the silence (however long they
  had waited: an acks=all Produce waits for the followers), or sent in the silence (or up to
  ``in_flight_s`` before it began) on a connection that then stayed open at least ``min_wait_s``
  (a Fetch, a long poll: ``fetch_wait_s``) and had been answered until then; at least as many
  as the requests sent in the silence that were answered after it (a broker answering them late
  was slow, not gone);
* refused connections (a SYN answered by a RST) or SYNs never answered;
* at least ``min_closed`` connections closed by the broker (FIN or RST) within ``burst_s``.

``outages``, one row per outage: ``start`` is the later of the broker's last answer and the
first sign of failure (a broker idle for an hour before it died starts failing when the failing
shows), ``end`` its first answer after it (null and ``ongoing``: still silent when the data
ends). ``kind``: ``frozen`` (requests unanswered while the connections stayed open, for
``min_silence_s`` or more before any close or refusal: a stopped or hung process; the kernel
still accepts connections), ``dead`` (connections closed by it or refused, with no frozen stretch
before: the process is gone), ``frozen_then_dead``, or ``unreachable`` (only SYNs never
answered). Connections that never carried Kafka (refused SYNs, port probes) count here, as
refused connections, and nowhere as clients; a port that never carried Kafka is not a broker.
``outage_requests``: the requests each outage left unanswered.

``old_broker_drops``, one row per drop event: requests a broker never answered while it went on
serving. A request is dropped when a later request on its connection was answered (the decoder's
"no response (later response)"), or when a request sent after it on another connection was
answered while its own connection, still open at least ``min_wait_s`` (a Fetch, a long poll the
broker may hold for its max wait: ``fetch_wait_s``), waited; requests an
outage counts are not drops, nor requests on a connection the broker closed (cut off, as a
0.8.2 broker closes the offending socket). A connection never answered again after a drop
(``connections_silent``) adds its later requests to that drop's event. Drops whose connections
stopped within ``same_poll_s`` of each other, or with no answer from the broker between them,
make one event: requests read in one poll of a broker's network thread. An event holding an
unanswered ApiVersions is what a 0.9 broker does when an ApiVersions (api key 18, unknown to it)
is read in the same poll as other requests: it throws, and the other requests of that poll, from
any client, are never dispatched (``cause`` = ``unsupported_apiversions``; null when the wire
shows no cause). ``dropped_requests``: the requests of each event.

What the wire cannot show: whether a silent broker was paused, swapping or cut off by the
network, or why a request was dropped; it shows when, on which connections, and which requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from spark_jobs.common import broadcast, client_key, materialize, ordered

__all__ = ["OutageResults", "analyse", "run", "unanswered_requests"]

_BROKER = ["source", "broker_ip", "broker_port"]
_REQUEST = ["source", "connection_id", "correlation_id", "request_time"]
_US = 1_000_000
_BROKER_CLOSE = ("broker_fin", "broker_rst")
_NOT_ACCEPTED = ("refused", "syn_unanswered")
_API_VERSIONS = 18
_FETCH = 1
_LATER_RESPONSE = "no response (later response)"
_EXAMPLES = 5


@dataclass(frozen=True)
class OutageResults:
    """The job's DataFrames (lazy; the shared parts are cached)."""

    outages: DataFrame  # one row per broker outage
    outage_requests: DataFrame  # the requests each outage left unanswered
    drops: DataFrame  # one row per drop event
    dropped_requests: DataFrame  # the requests of each drop event


def _us(column: str | Column) -> Column:
    return F.unix_micros(F.col(column) if isinstance(column, str) else column)


def _flag(condition: Column) -> Column:
    return F.coalesce(condition, F.lit(False))


# A broker's responses (and answered requests) are many; the rows a question is asked about (the
# unanswered requests, drop anchors) and the silences are few. Windows that sorted every response
# per broker (one task per broker) answered those questions: on 10M synthetic exchanges on
# local[2] the job took 101 s (176 s of task time); with the buckets below, 46 s (68 s). A hash
# aggregate stands for every bucket no question falls in, with the same answers
# (tests/test_spark_outages_buckets.py checks them against a plain pass over every response).
# On a small dataset the buckets' joins and aggregates cost more than the sorts they spare (the
# job on the 242-exchange demo: 14.2 s against 12.0 s), so a small-data run goes without.
#: Width of the buckets that stand for the responses no unanswered request or anchor is near.
_NEAR_US = 100_000
#: Width of the buckets a silence is covered by, to find the requests sent in it.
_COVER_US = 1_000_000
#: At most this many cover buckets (one per second of silence) are broadcast: a broker silent
#: for weeks (decommissioned, on a long proxy recording) would make millions; then every request
#: is sorted as without buckets.
_MAX_COVER_BUCKETS = 2_000_000


def _bucket(time: Column, width_us: int) -> Column:
    """The start (microseconds) of the ``width_us`` bucket ``time`` falls in."""
    us = _us(time)
    return us - F.pmod(us, F.lit(width_us))


def _ends(rows: DataFrame, time_col: str, width_us: int) -> DataFrame:
    """(broker..., ``t``): the first and the last ``time_col`` of ``rows`` in every bucket of
    ``width_us``, per broker. For any instant outside a bucket, the latest of the bucket's rows
    before it and the earliest after it are among these two."""
    ends = rows.groupBy(*_BROKER, _bucket(F.col(time_col), width_us).alias("_b")).agg(
        F.min(time_col).alias("_first"), F.max(time_col).alias("_last")
    )
    return ends.select(*_BROKER, F.explode(F.array_distinct(F.array("_first", "_last"))).alias("t"))


def _thinned(many: DataFrame, probes: DataFrame, probe_time: str, *aggs: Column) -> DataFrame:
    """``many`` (broker..., ``_t``, ...) grouped, with ``aggs`` over each group: one group per time
    ``_t`` in a ``_NEAR_US`` bucket that holds a probe (a row of ``probes`` at ``probe_time``), and
    one per bucket elsewhere (such a bucket lies wholly before or wholly after every probe of its
    broker). One hash aggregate; the rows a window then sorts are the groups."""
    held = (
        probes.select(*_BROKER, _bucket(F.col(probe_time), _NEAR_US).alias("_b"))
        .where(F.col("_b").isNotNull())
        .distinct()
        .withColumn("_near", F.lit(True))
    )
    tagged = many.withColumn("_b", _bucket(F.col("_t"), _NEAR_US)).join(
        broadcast(held), [*_BROKER, "_b"], "left"
    )
    return tagged.groupBy(*_BROKER, "_b", F.when(F.col("_near"), F.col("_t")).alias("_at")).agg(*aggs)


def _examples() -> Column:
    request = F.struct("request_time", "client_id", "api_name", "correlation_id", "connection_id")
    return F.slice(F.array_sort(F.collect_list(request)), 1, _EXAMPLES).alias("examples")


def unanswered_requests(exchanges: DataFrame, connections: DataFrame) -> DataFrame:
    """Every unanswered request with its connection's end: ``conn_end`` (the first FIN/RST, else the
    last packet), ``ended_by``; ``later_answered`` when a later request on its connection was;
    ``tail_start``: when its connection stopped being answered (its first request that no later
    answer followed; null for a request with ``later_answered``)."""
    un = exchanges.where(F.col("status") == "unanswered").select(
        *_BROKER,
        "connection_id",
        client_key().alias("client_key"),
        "client_id",
        "client_ip",
        "api_key",
        "api_name",
        "correlation_id",
        "request_time",
        "records",
        (F.coalesce(F.col("decode_error"), F.lit("")) == _LATER_RESPONSE).alias("later_answered"),
    )
    co = connections.select(
        "source",
        "connection_id",
        F.coalesce("end_time", "last_packet_time").alias("conn_end"),
        "ended_by",
    )
    tail = F.min(F.when(~F.col("later_answered"), F.col("request_time"))).over(
        Window.partitionBy("source", "connection_id")
    )
    return un.join(co, ["source", "connection_id"], "left").withColumn(
        "tail_start", F.when(~F.col("later_answered"), tail)
    )


def _connection_points(exchanges: DataFrame, connections: DataFrame) -> DataFrame:
    """Per broker that carried Kafka, the connection events that matter to an outage, as
    (broker..., t, kind): ``refused``, ``syn_unanswered``, ``closed`` (by the broker),
    ``abandoned`` (closed by the client with requests unanswered)."""
    brokers = exchanges.select(*_BROKER).distinct()
    waiting = exchanges.where(F.col("status") == "unanswered").select("source", "connection_id").distinct()
    co = connections.join(waiting.withColumn("_waiting", F.lit(True)), ["source", "connection_id"], "left")
    not_accepted = F.col("ended_by").isin(*_NOT_ACCEPTED)
    events = co.select(
        *_BROKER,
        F.when(not_accepted, F.col("first_packet_time")).otherwise(F.col("end_time")).alias("t"),
        F.when(not_accepted, F.col("ended_by"))
        .when(F.col("ended_by").isin(*_BROKER_CLOSE), F.lit("closed"))
        .when(F.col("ended_by").startswith("client_") & F.col("_waiting"), F.lit("abandoned"))
        .alias("kind"),
    ).where(F.col("kind").isNotNull() & F.col("t").isNotNull())
    # only brokers that carried Kafka: a refused SYN to a port nothing ever answered on is a probe
    return events.join(brokers, _BROKER, "left_semi")


def _spans(exchanges: DataFrame, connections: DataFrame) -> DataFrame:
    """Per source: the first and last instant the data covers."""
    ex = exchanges.select(
        "source",
        F.coalesce("request_time", "response_time").alias("lo"),
        F.coalesce("response_time", "request_time").alias("hi"),
    )
    co = connections.select(
        "source", F.col("first_packet_time").alias("lo"), F.col("last_packet_time").alias("hi")
    )
    return (
        ex.unionByName(co)
        .groupBy("source")
        .agg(F.min("lo").alias("span_start"), F.max("hi").alias("span_end"))
    )


def _response_edges(exchanges: DataFrame, min_silence_s: float, thin: bool) -> DataFrame:
    """The response times of each broker that can begin or end a silence, as (broker..., t):
    the first and the last of every ``min_silence_s`` bucket. Two responses in one bucket are
    less than ``min_silence_s`` apart, so the long gaps between consecutive responses are exactly
    the long gaps between these."""
    answered = exchanges.where(F.col("response_time").isNotNull())
    if not thin or min_silence_s <= 0:  # (every gap counts: every response time)
        return answered.select(*_BROKER, F.col("response_time").alias("t")).distinct()
    return _ends(answered, "response_time", int(min_silence_s * _US) or 1)


def _silences(
    exchanges: DataFrame, brokers: DataFrame, spans: DataFrame, min_silence_s: float, *, thin: bool = True
) -> DataFrame:
    """Gaps of at least ``min_silence_s`` between a broker's responses (and before the first,
    after the last): ``silence_start`` (its last answer; the data's start when none), ``silence_end``
    (its next answer; the data's end when none), ``last_answer``/``next_answer`` (null when none)."""
    responses = _response_edges(exchanges, min_silence_s, thin).withColumn("_r", F.lit(1))
    edges = brokers.join(broadcast(spans), "source")
    edges = edges.select(*_BROKER, F.col("span_start").alias("t"), F.lit(0).alias("_r")).unionByName(
        edges.select(*_BROKER, F.col("span_end").alias("t"), F.lit(2).alias("_r"))
    )
    w = Window.partitionBy(*_BROKER).orderBy("t", "_r")
    gaps = responses.unionByName(edges).select(
        *_BROKER,
        F.col("t").alias("silence_start"),
        F.col("_r").alias("_from"),
        F.lead("t").over(w).alias("silence_end"),
        F.lead("_r").over(w).alias("_to"),
    )
    long = gaps.where(
        F.col("silence_end").isNotNull()
        & (F.col("_from") < 2)
        & (_us("silence_end") - _us("silence_start") >= int(min_silence_s * _US))
    )
    return long.select(
        *_BROKER,
        "silence_start",
        "silence_end",
        F.when(F.col("_from") == 1, F.col("silence_start")).alias("last_answer"),
        F.when(F.col("_to") == 1, F.col("silence_end")).alias("next_answer"),
    )


def _upto(*order: Column) -> WindowSpec:
    """Per broker, in this order, from the first row to the current one. (The latest value before
    a row is a running ``last``; the next one after it is the same over the reversed order: a
    frame up to the partition's end would cost a pass over the rest for every row.)"""
    return Window.partitionBy(*_BROKER).orderBy(*order).rowsBetween(Window.unboundedPreceding, 0)


def _assign(events: DataFrame, silences: DataFrame, time_col: str, *, ahead_s: float = 0.0) -> DataFrame:
    """Add the silence each event falls in (silence_start <= t < silence_end), or, with ``ahead_s``,
    the one starting at most ``ahead_s`` after it; events in none are left out. One sort per
    broker over events and silences, no range join."""
    marks = silences.select(
        *_BROKER,
        F.col("silence_start").alias("_t"),
        F.lit(0).alias("_k"),
        F.struct("silence_start", "silence_end", "last_answer", "next_answer").alias("_s"),
    )
    rows = events.withColumn("_t", F.col(time_col)).withColumn("_k", F.lit(1))
    both = rows.unionByName(marks, allowMissingColumns=True)
    before = F.last("_s", ignorenulls=True).over(_upto(F.col("_t"), F.col("_k")))
    after = F.last("_s", ignorenulls=True).over(_upto(F.col("_t").desc(), F.col("_k").desc()))
    tagged = both.withColumn("_in", before).withColumn("_next", after).where(F.col("_k") == 1)
    t = _us("_t")
    inside = F.col("_in").isNotNull() & (t < _us("_in.silence_end"))
    near = F.col("_next").isNotNull() & (_us("_next.silence_start") - t <= int(ahead_s * _US))
    chosen = F.when(inside, F.col("_in")).when(F.lit(ahead_s > 0) & near, F.col("_next"))
    return tagged.withColumn("_s", chosen).where(F.col("_s").isNotNull()).select(*events.columns, "_s.*")


def _left_unanswered(
    unanswered: DataFrame, silences: DataFrame, *, in_flight_s: float, min_wait_s: float, fetch_wait_s: float
) -> DataFrame:
    """The unanswered requests each silence left unanswered (see the module's rules). A connection
    that had stopped being answered more than ``in_flight_s`` before the broker's last answer, while
    it answered others, was silenced by a dropped request, not by the silence."""
    candidates = unanswered.where(~F.col("later_answered"))
    by_broker = _flag(F.col("ended_by").isin(*_BROKER_CLOSE))
    cut = _assign(candidates.where(by_broker), silences, "conn_end", ahead_s=in_flight_s)
    placed = _assign(candidates.where(~by_broker), silences, "request_time", ahead_s=in_flight_s)
    waited = _us("conn_end") - _us("request_time")
    enough = _enough_wait(min_wait_s, fetch_wait_s)
    fresh = _us("tail_start") >= _us("silence_start") - int(in_flight_s * _US)
    waiting = placed.where(fresh & (F.col("conn_end").isNull() | (waited >= enough)))
    return cut.unionByName(waiting)


def _enough_wait(min_wait_s: float, fetch_wait_s: float) -> Column:
    """How long (us) a request's connection must have waited for its missing answer to mean
    anything: a Fetch is a long poll the broker may hold for its max wait (5 s by default for
    kafkajs and franz-go, 500 ms for most clients; the Fetch's own max wait is not in the data)."""
    return F.when(F.col("api_key") == _FETCH, int(fetch_wait_s * _US)).otherwise(int(min_wait_s * _US))


def _answered_late(exchanges: DataFrame, silences: DataFrame, *, thin: bool = True) -> DataFrame:
    """Per silence: requests sent in it and answered after it (``thin``: only those in the
    ``_COVER_US`` buckets a silence covers are sorted)."""
    sent = exchanges.where(F.col("response_time").isNotNull() & F.col("request_time").isNotNull()).select(
        *_BROKER, "request_time", "response_time"
    )
    if thin and _cover_buckets(silences) <= _MAX_COVER_BUCKETS:
        sent = _covered(sent, silences)
    return (
        _assign(sent, silences, "request_time")
        .where(F.col("response_time") >= F.col("silence_end"))
        .groupBy(*_BROKER, "silence_start")
        .agg(F.count(F.lit(1)).alias("requests_answered_late"))
    )


def _cover_buckets(silences: DataFrame) -> int:
    """How many ``_COVER_US`` buckets the silences cover (one small Spark job)."""
    span = _bucket(F.col("silence_end"), _COVER_US) - _bucket(F.col("silence_start"), _COVER_US)
    return int(silences.select(F.sum(span / _COVER_US + 1)).first()[0] or 0)


def _covered(sent: DataFrame, silences: DataFrame) -> DataFrame:
    """The rows of ``sent`` whose ``request_time`` is in a ``_COVER_US`` bucket a silence covers."""
    covered = silences.select(
        *_BROKER,
        F.explode(
            F.sequence(
                _bucket(F.col("silence_start"), _COVER_US),
                _bucket(F.col("silence_end"), _COVER_US),
                F.lit(_COVER_US).cast("long"),
            )
        ).alias("_b"),
    ).distinct()
    return (
        sent.withColumn("_b", _bucket(F.col("request_time"), _COVER_US))
        .join(broadcast(covered), [*_BROKER, "_b"], "left_semi")
        .drop("_b")
    )


#: Counts of an outage that are 0, not null, where no row of their kind fell in the silence.
_COUNTS_FILLED = (
    "requests_unanswered",
    "clients_affected",
    "connections_waiting",
    "connections_refused",
    "syns_unanswered",
    "connections_closed",
    "connections_abandoned",
    "requests_answered_late",
)


def _outages(
    silences: DataFrame,
    left: DataFrame,
    conn_points: DataFrame,
    exchanges: DataFrame,
    *,
    min_silence_s: float,
    min_closed: int,
    burst_s: float,
    thin: bool,
) -> DataFrame:
    key = [*_BROKER, "silence_start"]
    produce = F.col("api_key") == 0
    per_requests = left.groupBy(*key).agg(
        F.count(F.lit(1)).alias("requests_unanswered"),
        F.sum(F.when(produce, F.col("records"))).alias("records_unanswered"),
        F.min("request_time").alias("first_unanswered"),
        F.countDistinct("client_key").alias("clients_affected"),
        F.array_sort(F.collect_set("client_id")).alias("client_ids"),
        F.countDistinct("connection_id").alias("connections_waiting"),
        _examples(),
    )
    by_api = (
        left.groupBy(*key, "api_name")
        .agg(F.count(F.lit(1)).alias("n"))
        .groupBy(*key)
        .agg(
            F.map_from_entries(F.array_sort(F.collect_list(F.struct("api_name", "n")))).alias(
                "unanswered_by_api"
            )
        )
    )
    conn_events = _assign(conn_points, silences, "t")
    closed, refused = F.col("kind") == "closed", F.col("kind").isin(*_NOT_ACCEPTED)
    per_conns = conn_events.groupBy(*key).agg(
        F.sum(F.when(F.col("kind") == "refused", 1).otherwise(0)).alias("connections_refused"),
        F.sum(F.when(F.col("kind") == "syn_unanswered", 1).otherwise(0)).alias("syns_unanswered"),
        F.min(F.when(refused, F.col("t"))).alias("first_refused"),
        F.min(F.when(F.col("kind") == "refused", F.col("t"))).alias("_first_reset"),
        F.max(F.when(refused, F.col("t"))).alias("last_refused"),
        F.sum(F.when(closed, 1).otherwise(0)).alias("connections_closed"),
        F.min(F.when(closed, F.col("t"))).alias("first_closed"),
        F.max(F.when(closed, F.col("t"))).alias("last_closed"),
        F.sum(F.when(F.col("kind") == "abandoned", 1).otherwise(0)).alias("connections_abandoned"),
    )
    joined = (
        silences.join(per_requests, key, "left")
        .join(by_api, key, "left")
        .join(per_conns, key, "left")
        .join(_answered_late(exchanges, silences, thin=thin), key, "left")
        # coalesce, not fillna: a Connect server plans fillna as never null, classic PySpark's
        # JVM call as nullable, and the result files are to be the same either way
        .withColumns({c: F.coalesce(F.col(c), F.lit(0)) for c in _COUNTS_FILLED})
    )
    burst = (F.col("connections_closed") >= min_closed) & (
        _us("last_closed") - _us("first_closed") <= int(burst_s * _US)
    )
    # A broker that answered most of what it was sent in the silence, late, was slow (an acks=all
    # Produce waiting for a follower that lost its disk), not unreachable.
    unreachable = (F.col("requests_unanswered") > 0) & (
        F.col("requests_unanswered") >= F.col("requests_answered_late")
    )
    failing = unreachable | (F.col("connections_refused") > 0) | (F.col("syns_unanswered") > 0) | burst
    first_sign = F.least("first_unanswered", "first_refused", "first_closed")
    went = F.least("_first_reset", F.when(burst, F.col("first_closed")))  # the process went away here
    frozen_until = F.coalesce(went, F.col("silence_end"))
    frozen = unreachable & (_us(frozen_until) - _us("start") >= int(min_silence_s * _US))
    dead = went.isNotNull()
    out = (
        joined.where(failing)
        .withColumn("start", F.greatest(F.coalesce("last_answer", first_sign), first_sign))
        .withColumn(
            "kind",
            F.when(frozen & dead, "frozen_then_dead")
            .when(frozen, "frozen")
            .when(dead, "dead")
            .otherwise("unreachable"),
        )
        .withColumn("frozen_s", F.when(frozen, (_us(frozen_until) - _us("start")) / _US))
        .withColumn("duration_s", (_us("silence_end") - _us("start")) / _US)
    )
    return out.select(
        *_BROKER,
        "kind",
        "start",
        F.col("next_answer").alias("end"),
        "duration_s",
        F.col("next_answer").isNull().alias("ongoing"),
        "frozen_s",
        "last_answer",
        "first_unanswered",
        "requests_unanswered",
        "records_unanswered",
        "unanswered_by_api",
        "requests_answered_late",
        "clients_affected",
        "client_ids",
        "connections_waiting",
        "connections_closed",
        "first_closed",
        "last_closed",
        "connections_refused",
        "syns_unanswered",
        "first_refused",
        "last_refused",
        "connections_abandoned",
        "examples",
        "silence_start",
        "silence_end",
    )


def _alive_after(unanswered: DataFrame, exchanges: DataFrame, *, thin: bool = True) -> DataFrame:
    """Add ``answered_after``: the earliest response to a request sent to the same broker after this
    one (on any connection). One sort per broker: a running minimum over request time, descending
    (``thin``: over the answered requests near an unanswered one, and one row, its first request
    and its earliest response, for each bucket of the others)."""
    answered = exchanges.where(F.col("response_time").isNotNull() & F.col("request_time").isNotNull()).select(
        *_BROKER, F.col("request_time").alias("_t"), F.col("response_time").alias("_r")
    )
    if thin:
        answered = _thinned(
            answered, unanswered, "request_time", F.min("_t").alias("_t"), F.min("_r").alias("_r")
        ).drop("_b", "_at")
    answered = answered.withColumn("_k", F.lit(1))
    probes = unanswered.withColumn("_t", F.col("request_time")).withColumn("_k", F.lit(0))
    # time descending; at equal times the probe sorts first: a request sent at the same instant
    # is not after it
    w = (
        Window.partitionBy(*_BROKER)
        .orderBy(F.col("_t").desc(), F.col("_k"))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    both = probes.unionByName(answered, allowMissingColumns=True)
    return (
        both.withColumn("answered_after", F.min("_r").over(w))
        .where(F.col("_k") == 0)
        .select(*unanswered.columns, "answered_after")
    )


def _gap_of(rows: DataFrame, exchanges: DataFrame, time_col: str, *, thin: bool = True) -> DataFrame:
    """Add ``gap_start``/``gap_end``: the broker's last response at or before ``time_col`` and its
    next one after (null when none). ``thin``: the responses near a row are all kept; of the
    others, each bucket's first and last."""
    responses = exchanges.where(F.col("response_time").isNotNull()).select(
        *_BROKER, F.col("response_time").alias("_t")
    )
    if thin:
        ends = _thinned(responses, rows, time_col, F.min("_t").alias("_first"), F.max("_t").alias("_last"))
        responses = ends.select(*_BROKER, F.explode(F.array_distinct(F.array("_first", "_last"))).alias("_t"))
    responses = responses.distinct().withColumn("_k", F.lit(0)).withColumn("_r", F.col("_t"))
    probes = rows.withColumn("_t", F.col(time_col)).withColumn("_k", F.lit(1))
    both = probes.unionByName(responses, allowMissingColumns=True)
    return (
        both.withColumn("gap_start", F.last("_r", ignorenulls=True).over(_upto(F.col("_t"), F.col("_k"))))
        .withColumn(
            "gap_end", F.last("_r", ignorenulls=True).over(_upto(F.col("_t").desc(), F.col("_k").desc()))
        )
        .where(F.col("_k") == 1)
        .select(*rows.columns, "gap_start", "gap_end")
    )


def _drops(
    unanswered: DataFrame,
    counted: DataFrame,
    exchanges: DataFrame,
    *,
    min_wait_s: float,
    fetch_wait_s: float,
    same_poll_s: float,
    thin: bool,
) -> tuple[DataFrame, DataFrame]:
    """(drop events, their requests); ``counted``: the requests outages already count."""
    rest = unanswered.join(counted.select(*_REQUEST), _REQUEST, "left_anti")
    # cut off by the broker's close, not dropped
    rest = rest.where(F.col("later_answered") | ~_flag(F.col("ended_by").isin(*_BROKER_CLOSE)))
    waited = _us("conn_end") - _us("request_time")
    enough = _enough_wait(min_wait_s, fetch_wait_s)
    dropped = _alive_after(rest, exchanges, thin=thin).where(
        F.col("later_answered")
        | (
            F.col("answered_after").isNotNull()
            & (F.col("conn_end").isNull() | (F.col("answered_after") < F.col("conn_end")))
            & (F.col("conn_end").isNull() | (waited >= enough))
        )
    )
    # a connection never answered again after a drop: its later requests belong to that drop
    tails = (
        dropped.where(~F.col("later_answered"))
        .groupBy("source", "connection_id")
        .agg(F.min("request_time").alias("_tail"))
    )
    anchored = dropped.join(tails, ["source", "connection_id"], "left").withColumn(
        "anchor", F.when(F.col("later_answered"), F.col("request_time")).otherwise(F.col("_tail"))
    )
    # anchors one poll apart make one event: no answer from the broker between them, or closer
    # than same_poll_s (a poll's reads and its writes interleave within a few milliseconds)
    anchors = _gap_of(anchored.select(*_BROKER, "anchor").distinct(), exchanges, "anchor", thin=thin)
    w = Window.partitionBy(*_BROKER).orderBy("anchor")
    prev = F.lag("anchor").over(w)
    apart = (_us("anchor") - _us(prev) > int(same_poll_s * _US)) & _flag(F.col("gap_start") > prev)
    numbered = anchors.withColumn("_new", F.when(prev.isNull() | apart, 1).otherwise(0)).withColumn(
        "event", F.sum("_new").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    )
    requests = materialize(anchored.drop("_tail").join(numbered.drop("_new"), [*_BROKER, "anchor"]))
    is_av, silent = F.col("api_key") == _API_VERSIONS, ~F.col("later_answered")
    events = requests.groupBy(*_BROKER, "event").agg(
        F.min_by("gap_start", "anchor").alias("last_answer_before"),
        F.min_by("gap_end", "anchor").alias("answered_again"),
        F.min("request_time").alias("first_request"),
        F.max("request_time").alias("last_request"),
        F.count(F.lit(1)).alias("requests_dropped"),
        F.sum(F.when(is_av, 1).otherwise(0)).alias("apiversions_dropped"),
        F.sum(F.when(~is_av, 1).otherwise(0)).alias("other_requests_dropped"),
        F.sum(F.when(F.col("api_key") == 0, F.col("records"))).alias("records_dropped"),
        F.countDistinct("client_key").alias("clients"),
        F.array_sort(F.collect_set("client_id")).alias("client_ids"),
        F.array_sort(F.collect_set(F.when(is_av, F.col("client_id")))).alias("apiversions_client_ids"),
        F.countDistinct("connection_id").alias("connections"),
        F.countDistinct(F.when(~silent, F.col("connection_id"))).alias("connections_continued"),
        F.countDistinct(F.when(silent, F.col("connection_id"))).alias("connections_silent"),
        F.sum(F.when(silent, 1).otherwise(0)).alias("requests_on_silent_connections"),
        _examples(),
    )
    out = events.select(
        *_BROKER,
        F.when(F.col("apiversions_dropped") > 0, F.lit("unsupported_apiversions")).alias("cause"),
        "first_request",
        "last_request",
        "last_answer_before",
        "answered_again",
        "requests_dropped",
        "apiversions_dropped",
        "other_requests_dropped",
        "records_dropped",
        "clients",
        "client_ids",
        "apiversions_client_ids",
        "connections",
        "connections_continued",
        "connections_silent",
        "requests_on_silent_connections",
        "examples",
        "event",
    )
    return out, requests


def analyse(
    exchanges: DataFrame,
    connections: DataFrame,
    *,
    min_silence_s: float = 5.0,
    in_flight_s: float = 0.6,
    min_wait_s: float = 1.0,
    min_closed: int = 2,
    burst_s: float = 1.0,
    same_poll_s: float = 0.1,
    fetch_wait_s: float = 6.0,
    thin: bool = True,
) -> OutageResults:
    """Outages and drop events (see the module docstring for the rules). ``in_flight_s`` covers a
    Fetch's long poll (fetch.max.wait.ms, 500 ms by default) pending as the broker went silent.
    ``thin``: time buckets stand for the responses far from what is asked about (the same
    results; worth it from about a million exchanges, a cost below: see ``_NEAR_US``)."""
    spans = _spans(exchanges, connections)
    points = materialize(_connection_points(exchanges, connections))
    brokers = exchanges.select(*_BROKER).distinct()
    silences = materialize(_silences(exchanges, brokers, spans, min_silence_s, thin=thin))
    unanswered = materialize(unanswered_requests(exchanges, connections))
    left = materialize(
        _left_unanswered(
            unanswered, silences, in_flight_s=in_flight_s, min_wait_s=min_wait_s, fetch_wait_s=fetch_wait_s
        )
    )
    outages = materialize(
        _outages(
            silences,
            left,
            points,
            exchanges,
            min_silence_s=min_silence_s,
            min_closed=min_closed,
            burst_s=burst_s,
            thin=thin,
        )
    )
    counted = left.join(outages.select(*_BROKER, "silence_start"), [*_BROKER, "silence_start"], "left_semi")
    drops, dropped = _drops(
        unanswered,
        counted,
        exchanges,
        min_wait_s=min_wait_s,
        fetch_wait_s=fetch_wait_s,
        same_poll_s=same_poll_s,
        thin=thin,
    )
    return OutageResults(outages, counted, drops, dropped)


def run(
    tables,
    *,
    min_silence_s=5.0,
    in_flight_s=0.6,
    min_wait_s=1.0,
    min_closed=2,
    burst_s=1.0,
    same_poll_s=0.1,
    fetch_wait_s=6.0,
    small_data=False,
    **_,
):
    results = analyse(
        tables.exchanges,
        tables.connections,
        min_silence_s=min_silence_s,
        in_flight_s=in_flight_s,
        min_wait_s=min_wait_s,
        min_closed=min_closed,
        burst_s=burst_s,
        same_poll_s=same_poll_s,
        fetch_wait_s=fetch_wait_s,
        thin=not small_data,
    )
    return {
        "outages": ordered(results.outages, "source", "start"),
        "old_broker_drops": ordered(results.drops.drop("event"), "source", "first_request"),
    }


if __name__ == "__main__":
    from spark_jobs.submit import main

    raise SystemExit(main(job="outages"))
