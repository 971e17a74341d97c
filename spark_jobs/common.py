"""Helpers shared by every kwire Spark job: reading the dataset, the client identity, time.

The dataset layout and its columns come from :mod:`kwire.schema`; nothing here restates a
column list. A *client* is ``(source, client_id, client_ip)``: :func:`client_key` is the one key
every job groups and joins on, :func:`client_software` the software name/version attached to it.
Runs decoded together keep their own ``source``, so one client id in two runs is two clients;
:func:`combine_runs` makes the tables one run when that is what is wanted.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, _parse_datatype_string

from decoder.protocol import API_NAMES, ERRORS
from kwire.schema import CONNECTIONS_SCHEMA, EXCHANGES_SCHEMA
from spark_jobs.session import is_connect, one_partition

__all__ = [
    "CLIENT_COLUMNS",
    "ERROR_NAMES",
    "Tables",
    "api_name",
    "attach_software",
    "broadcast",
    "client_key",
    "client_software",
    "combine_runs",
    "connections_spark_schema",
    "empty_exchanges",
    "error_name",
    "event_time",
    "exchanges_spark_schema",
    "has_error",
    "histogram_quantiles",
    "latency_histogram",
    "load_table",
    "load_tables",
    "local_frame",
    "materialize",
    "micros_between",
    "name_topics",
    "next_time_after",
    "ordered",
    "partition_results",
    "release",
    "topic_names",
    "with_window_end",
]

#: Columns that identify a client, then the software columns attached to it, in output order.
CLIENT_COLUMNS = ("source", "client_id", "client_ip", "client_software_name", "client_software_version")

#: ``source`` of every row once :func:`combine_runs` has merged the runs.
COMBINED_SOURCE = "(all runs)"

#: Every error code's name, from the decoder's table (generated from Kafka's error codes).
ERROR_NAMES: dict[int, str] = {code: entry[0] for code, entry in ERRORS.items()}

_NULL_ID = "\u0000"


def exchanges_spark_schema() -> StructType:
    return from_arrow_schema(EXCHANGES_SCHEMA)


def connections_spark_schema() -> StructType:
    return from_arrow_schema(CONNECTIONS_SCHEMA)


@dataclass(frozen=True)
class Tables:
    """The two dataset tables as DataFrames (the ``date`` partition column a string)."""

    exchanges: DataFrame
    connections: DataFrame


def local_frame(spark: SparkSession, rows: list[tuple], schema: StructType | str) -> DataFrame:
    """A small DataFrame of ``rows`` (tuples in the order of ``schema``'s fields), made in the
    JVM from one JSON literal. ``createDataFrame`` sends local rows through a Python worker: a
    run's first one started the worker daemon, 1-10 s of wall time on a loaded 2-core machine."""
    if isinstance(schema, str):
        schema = _parse_datatype_string(schema)
    text = json.dumps([dict(zip(schema.fieldNames(), row, strict=True)) for row in rows])
    return spark.range(1).select(F.inline(F.from_json(F.lit(text), ArrayType(schema))))


def _read_table(spark: SparkSession, root: Path, name: str, schema: StructType) -> DataFrame:
    base = root / name
    if not base.is_dir() or not any(base.rglob("*.parquet")):
        return local_frame(spark, [], schema)
    # An explicit schema keeps every type (and the string `date`) the same whatever the files hold.
    return spark.read.schema(schema).option("basePath", str(base)).parquet(str(base))


def load_table(spark: SparkSession, dataset: str | Path, name: str) -> DataFrame:
    """Read ``DATASET/<name>``, ``exchanges`` or ``connections`` (a missing table reads as empty).
    In a session of one-partition plans (``spark_jobs.session.one_partition``) the table is one
    partition that Spark knows is the only one: no aggregate, window, sort or join on it needs
    a shuffle."""
    schema = {"exchanges": exchanges_spark_schema, "connections": connections_spark_schema}[name]()
    if "://" in str(dataset):  # a cluster path (hdfs://, s3a://): let Spark list it
        base = f"{str(dataset).rstrip('/')}/{name}"
        df = spark.read.option("basePath", base).schema(schema).parquet(base)
    else:
        df = _read_table(spark, Path(dataset), name, schema)
    return df.coalesce(1) if one_partition(spark) else df


def load_tables(spark: SparkSession, dataset: str | Path) -> Tables:
    """Read ``DATASET/exchanges`` and ``DATASET/connections`` (a missing table reads as empty)."""
    return Tables(load_table(spark, dataset, "exchanges"), load_table(spark, dataset, "connections"))


def combine_runs(tables: Tables) -> Tables:
    """The tables as one run: every ``source`` becomes :data:`COMBINED_SOURCE` (so a client id
    seen in several runs is one client), and ``connection_id`` is prefixed with the run's
    source (``<source>/<id>``) so that connections of different runs stay apart."""

    def one(df: DataFrame) -> DataFrame:
        return df.withColumns(
            {
                "connection_id": F.concat_ws("/", F.col("source"), F.col("connection_id")),
                "source": F.lit(COMBINED_SOURCE),
            }
        )

    return Tables(one(tables.exchanges), one(tables.connections))


def broadcast(df: DataFrame) -> DataFrame:
    """``df`` marked as a join's small side: to broadcast, or where the session's plans are one
    partition (``spark_jobs.session.one_partition``), to hash. There a join needs no shuffle and a
    broadcast would be a Spark job of its own; a hash join of the small side streams the large
    one as it comes, where the sort-merge join Spark plans otherwise sorts it. On 100k synthetic
    exchanges (``bench/analyze_profile.py``, alternating, 6 pairs): the analysis 0.96x, task
    CPU 2-9% less in every pair; on the demo dataset the same within the noise (4 pairs); the
    results the same row for row (those two and the lab captures). Where Spark cannot hash the
    marked side for a join (a cross join), it ignores the hint."""
    return df.hint("shuffle_hash") if one_partition(df.sparkSession) else F.broadcast(df)


def materialize(df: DataFrame) -> DataFrame:
    """``df`` computed now and kept (in memory, else on local disk), as a DataFrame whose plan
    is one leaf: for an intermediate that several results read.

    ``cache()`` keeps the rows but not the plan: a DataFrame built on a cached one still carries
    its whole plan, once per use, and Spark analyses that plan again at every step that builds
    on it (PySpark analyses each DataFrame as it is made) and optimises it for every action.
    Built on cached intermediates, ``error_reaction``'s results had 1,700 plan nodes and
    ``old_broker_drops`` 3,400; analysing and planning them was most of a small run's time.
    A local checkpoint cuts the plan where the rows are kept."""
    return df.localCheckpoint(eager=True)


def release(df: DataFrame) -> None:
    """Drop the rows :func:`materialize` kept for ``df`` (else they go when the JVM collects
    the DataFrame; a Connect client's checkpoint goes when its DataFrame does)."""
    if is_connect(df.sparkSession):
        return
    plan = df._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def empty_exchanges(spark: SparkSession) -> DataFrame:
    return local_frame(spark, [], exchanges_spark_schema())


def client_key() -> Column:
    """The client identity as one non-null 64-bit key over ``(source, client_id, client_ip)``.

    A hash (xxhash64) rather than a string: every job groups, joins and sorts on it, and a long
    is several times cheaper than a concatenated string at 10M rows. A null client id and an
    empty one stay distinct. The source is part of it: separate runs are separate clients (see
    :func:`combine_runs`). Carry ``source``/``client_id``/``client_ip`` alongside for display.
    """
    return F.xxhash64(
        F.coalesce(F.col("source"), F.lit("")),
        F.coalesce(F.col("client_id"), F.lit(_NULL_ID)),
        F.coalesce(F.col("client_ip"), F.lit("")),
    )


def client_software(exchanges: DataFrame) -> DataFrame:
    """Per ``client_key``: source, client_id, client_ip and the software name(s)/version(s) it
    announced.

    Several processes can share one (client_id, host); their distinct names and versions are
    comma-joined. Null when the client never sent ApiVersions v3+. Computed once per
    ``exchanges`` DataFrame and cached (every job attaches it).
    """
    with _SOFTWARE_LOCK:  # jobs run in threads: the first one computes it, the others wait
        cached = _SOFTWARE.get(id(exchanges))
        if cached is not None and cached[0] is exchanges:
            return cached[1]

        def joined(column: str) -> Column:
            values = F.array_sort(F.collect_set(column))
            return F.when(F.size(values) > 0, F.array_join(values, ","))

        distinct = (
            exchanges.where(F.col("status") != "orphan_response")
            .select(
                client_key().alias("client_key"),
                "source",
                "client_id",
                "client_ip",
                "client_software_name",
                "client_software_version",
            )
            .distinct()
        )
        software = distinct.groupBy("client_key").agg(
            F.first("source", ignorenulls=True).alias("source"),
            F.first("client_id", ignorenulls=True).alias("client_id"),
            F.first("client_ip", ignorenulls=True).alias("client_ip"),
            joined("client_software_name").alias("client_software_name"),
            joined("client_software_version").alias("client_software_version"),
        )
        software = materialize(software)
        _SOFTWARE[id(exchanges)] = (exchanges, software)
        return software


_SOFTWARE: dict[int, tuple[DataFrame, DataFrame]] = {}
_SOFTWARE_LOCK = threading.Lock()


def forget_cached_software() -> None:
    """Drop the per-``exchanges`` software tables :func:`client_software` keeps (and the
    DataFrames they hold on to), e.g. between analyses in one long-lived session."""
    for _exchanges, software in _SOFTWARE.values():
        release(software)
    _SOFTWARE.clear()


def attach_software(df: DataFrame, exchanges: DataFrame, *, keep_key: bool = False) -> DataFrame:
    """Put the client columns first in ``df`` (which has ``client_key``): its own source,
    client_id and client_ip if it has them, else those seen in ``exchanges``, and the software
    announced there. Drops ``client_key`` unless ``keep_key``."""
    own_ids = ("source", "client_id", "client_ip")
    software = client_software(exchanges).withColumnsRenamed(
        {"source": "_sw_source", "client_id": "_sw_client_id", "client_ip": "_sw_client_ip"}
    )
    rest = [c for c in df.columns if c not in CLIENT_COLUMNS and c != "client_key"]
    own = df.withColumnsRenamed({c: f"_own_{c}" for c in own_ids if c in df.columns})
    own = own.drop(*[c for c in CLIENT_COLUMNS if c in own.columns])
    out = own.join(broadcast(software), "client_key", "left")
    ids = [
        F.coalesce(*[F.col(f"_own_{c}") for c in (name,) if c in df.columns], F.col(f"_sw_{name}")).alias(
            name
        )
        for name in own_ids
    ]
    lead = ["client_key"] if keep_key else []
    return out.select(*lead, *ids, "client_software_name", "client_software_version", *rest)


def event_time() -> Column:
    """When an exchange happened: its request time, else (orphan response) its response time."""
    return F.coalesce(F.col("request_time"), F.col("response_time"))


def micros_between(start: str | Column, end: str | Column) -> Column:
    s = F.col(start) if isinstance(start, str) else start
    e = F.col(end) if isinstance(end, str) else end
    return F.unix_micros(e) - F.unix_micros(s)


def with_window_end(df: DataFrame, exchanges: DataFrame, name: str = "window_end") -> DataFrame:
    """Add the end of the observed window: the last request or response time of the row's run
    (``source``), or of the whole dataset when ``df`` has no ``source`` column."""
    last = F.greatest(F.max("request_time"), F.max("response_time")).alias(name)
    if "source" in df.columns:
        return df.join(broadcast(exchanges.groupBy("source").agg(last)), "source", "left")
    return df.crossJoin(broadcast(exchanges.agg(last)))


def has_error(entries: str, codes: list[int] | None = None) -> Column:
    """Whether any entry of the struct array column ``entries`` has an ``error_code`` in
    ``codes`` (None: any non-zero code). Built from array functions, which Spark compiles: a
    lambda (``F.exists``) is interpreted row by row and made a 10M-row filter twice as slow."""
    found = F.col(f"{entries}.error_code")
    if codes is None:
        return (F.array_max(found) > 0) | (F.array_min(found) < 0)
    return F.arrays_overlap(found, F.array(*[F.lit(c).cast("short") for c in codes]))


def partition_results(
    exchanges: DataFrame, codes: list[int] | None = None, *, carry: tuple[str, ...] = ()
) -> DataFrame:
    """One row per entry of ``partition_errors`` (error code 0 included), with the exchange's
    client key, broker, api, times; ``topic`` falls back to the topic id, ``partition`` to -1.
    ``codes``: only the entries with one of these error codes (the exchanges without any are
    skipped before their lists are exploded: most have none). ``carry``: more exchange columns
    to keep (``source``, ...)."""
    if codes is not None:
        exchanges = exchanges.where(has_error("partition_errors", codes))
    results = (
        exchanges.where(F.size("partition_errors") > 0)
        .select(
            *carry,
            client_key().alias("client_key"),
            "client_id",
            "client_ip",
            "broker_ip",
            "broker_port",
            "api_key",
            "api_name",
            "request_time",
            "response_time",
            "group_id",
            "coordinator_key",
            F.explode("partition_errors").alias("pe"),
        )
        .select(
            "*",
            F.coalesce(F.col("pe.topic"), F.col("pe.topic_id")).alias("topic"),
            F.coalesce(F.col("pe.partition"), F.lit(-1)).alias("partition"),
            F.col("pe.resource").alias("resource"),
            F.col("pe.error_code").alias("error_code"),
        )
        .drop("pe")
    )
    return results if codes is None else results.where(F.col("error_code").isin(codes))


def next_time_after(
    probes: DataFrame,
    targets: DataFrame,
    keys: list[str],
    probe_time: str,
    target_time: str,
    out: str,
    carry: dict[str, str] | None = None,
) -> DataFrame:
    """Add column ``out`` to ``probes``: the earliest ``target_time`` of a ``targets`` row with the
    same ``keys`` strictly after the probe's ``probe_time`` (null if none). ``carry``: more
    columns of that target row to add, ``{target column: name in the output}`` (of several
    targets at that instant, the one whose carried columns sort first).

    Done with one sort per key (a running minimum over time descending), not a range join, so a
    client with a million errors and a million requests costs O(n log n), not O(n^2).
    """
    carry = carry or {}
    p = probes.withColumns({"_t": F.col(probe_time), "_kind": F.lit(0)})
    target = F.struct(F.col(target_time).alias("at"), *[F.col(c).alias(f"c{i}") for i, c in enumerate(carry)])
    # a target without a time is none: no struct, which the minimum below skips
    t = targets.select(
        *keys,
        F.col(target_time).alias("_t"),
        F.when(F.col(target_time).isNotNull(), target).alias("_target"),
        F.lit(1).alias("_kind"),
    )
    both = p.unionByName(t, allowMissingColumns=True)
    # Time descending; at equal times the probe sorts first so a target at the same instant
    # is not "after" it.
    w = (
        Window.partitionBy(*keys)
        .orderBy(F.col("_t").desc_nulls_last(), F.col("_kind"))
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    added = {out: F.col("_target.at")} | {
        name: F.col(f"_target.c{i}") for i, name in enumerate(carry.values())
    }
    return (
        both.withColumn("_target", F.min("_target").over(w))
        .where(F.col("_kind") == 0)
        .withColumns(added)
        .drop("_t", "_kind", "_target")
    )


def _lookup(table: dict[int, str], code: Column) -> Column:
    # The map is one JSON string literal that Spark folds to a map constant once per plan. A
    # Column per key and value was ~300 calls into the JVM per use; the same map as SQL text,
    # map(k, v, ...), was parsed again wherever a DataFrame used it (with the dominant verdict's
    # SQL text, 30 of ~540 JFR samples of a demo analysis's driver; 1 after).
    text = json.dumps({str(int(k)): v for k, v in table.items()})
    return F.from_json(F.lit(text), "map<string,string>")[code.cast("int").cast("string")]


def error_name(code: Column) -> Column:
    """Name of an error code column, as the decoder names it (``UNKNOWN_CODE_<n>`` if undefined)."""
    return F.coalesce(_lookup(ERROR_NAMES, code), F.concat(F.lit("UNKNOWN_CODE_"), code.cast("string")))


def api_name(key: Column) -> Column:
    """Kafka's name for an api key column (null for a key Kafka never defined)."""
    return _lookup(API_NAMES, key)


def ordered(df: DataFrame, *cols: str | Column) -> DataFrame:
    """A small result as one sorted partition: one shuffle (none in a session of one-partition
    plans), no range sampling (``orderBy`` would compute the whole plan twice to sample it).

    Rows equal in ``cols`` are then ordered by the other columns (those Spark can order: not
    maps), so that the file's order never depends on the plan: two batches sent in one
    request share their ``first_sent``, and came out in either order."""
    named = {c for c in cols if isinstance(c, str)}
    ties = [f.name for f in df.schema.fields if f.name not in named and _orderable(f.dataType)]
    one = df.coalesce(1) if one_partition(df.sparkSession) else df.repartition(1)  # no shuffle there
    return one.sortWithinPartitions(*cols, *ties)


def _orderable(kind: DataType) -> bool:
    """Whether Spark can sort by a column of this type (maps it cannot, nor what holds one)."""
    if isinstance(kind, MapType):
        return False
    if isinstance(kind, ArrayType):
        return _orderable(kind.elementType)
    if isinstance(kind, StructType):
        return all(_orderable(f.dataType) for f in kind.fields)
    return True


#: Latency histogram buckets per doubling: 2 ** (1 / 35) = 1.0200, so one bucket spans 2%.
_BUCKETS_PER_DOUBLING = 35


def latency_histogram(rows: DataFrame, keys: list[str], value: str = "latency_us") -> DataFrame:
    """Per ``keys`` and log-scale bucket of ``value`` (2% wide): the count (``_n``) and the
    largest value in the bucket (``_max``). One hash aggregate over the rows, however many,
    whose small result :func:`histogram_quantiles` turns into percentiles at any coarser grain."""
    v = F.greatest(F.col(value).cast("double"), F.lit(0.0))
    bucket = F.floor(F.log2(v + 1.0) * _BUCKETS_PER_DOUBLING).cast("int")
    return rows.groupBy(*keys, bucket.alias("_bucket")).agg(
        F.count(F.lit(1)).alias("_n"), F.max(value).alias("_max")
    )


def histogram_quantiles(
    histogram: DataFrame, keys: list[str], quantiles: dict[str, float], *, scale: float = 1.0
) -> DataFrame:
    """Per ``keys``: ``requests``, ``max`` and each named quantile of a :func:`latency_histogram`
    (merged over its other keys), times ``scale``. A quantile is the largest value seen in the
    bucket holding its rank (the smallest value with at least that share of values at or below
    it, as ``percentile_approx``): within 2% of the exact value, exact when the bucket holds one
    distinct value. Keep ``keys`` few and numeric where possible: the histogram's size, not the
    row count, is what costs."""
    merged = histogram.groupBy(*keys, "_bucket").agg(F.sum("_n").alias("_n"), F.max("_max").alias("_max"))
    upto = (
        Window.partitionBy(*keys).orderBy("_bucket").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    ranked = merged.withColumn("_cum", F.sum("_n").over(upto)).withColumn(
        "_total", F.sum("_n").over(Window.partitionBy(*keys))
    )
    # _max grows with the bucket, so the first bucket reaching the rank has the smallest _max
    at_rank = {
        name: F.min(F.when(F.col("_cum") >= q * F.col("_total"), F.col("_max"))) * scale
        for name, q in quantiles.items()
    }
    return ranked.groupBy(*keys).agg(
        F.sum("_n").alias("requests"),
        *[col.alias(name) for name, col in at_rank.items()],
        (F.max("_max") * scale).alias("max"),
    )


#: The null topic id (all zero bytes) that versions without topic ids carry, as decoded.
ZERO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def topic_names(exchanges: DataFrame) -> DataFrame:
    """``(topic_id, topic_name)`` from every Metadata response that lists both: Produce v13+
    and Fetch v13+ name their topics by id only. Small: one row per topic."""
    listed = exchanges.where((F.col("api_key") == 3) & (F.size("metadata_partitions") > 0)).select(
        F.explode("metadata_partitions").alias("p")
    )
    return (
        listed.where(
            F.col("p.topic_id").isNotNull()
            & F.col("p.topic").isNotNull()
            & (F.col("p.topic_id") != ZERO_TOPIC_ID)
        )
        .groupBy(F.col("p.topic_id").alias("topic_id"))
        .agg(F.min("p.topic").alias("topic_name"))
    )


def name_topics(
    df: DataFrame, names: DataFrame, topic: str = "topic", topic_id: str = "topic_id"
) -> DataFrame:
    """``df`` with ``topic`` filled from ``topic_id`` through ``names`` (:func:`topic_names`)
    where it is null; the id itself when no Metadata response named it."""
    joined = df.join(
        broadcast(names.withColumnRenamed("topic_id", "_tid")), F.col(topic_id) == F.col("_tid"), "left"
    )
    return joined.withColumn(topic, F.coalesce(F.col(topic), F.col("topic_name"), F.col(topic_id))).drop(
        "_tid", "topic_name"
    )
