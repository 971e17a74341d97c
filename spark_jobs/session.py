"""The one place that builds a SparkSession for kwire: quiet, UTC, sized for the machine.

Every job entry point, the ``kwire analyze``/``audit``/``sql`` commands, the benchmark and the
test fixture call :func:`build_session`. Under ``spark-submit`` the master comes from the
submit command; otherwise it is ``local[*]`` unless a ``--master`` URL is given.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs import codegen_cache, driver_launch, numpy_probe, py4j_cache
from spark_jobs.class_archive import archive_classpath, archive_options, note_driver_pid
from spark_jobs.driver_java import launch_env
from spark_jobs.driver_warmup import WarmUp, warming
from spark_jobs.jvm_stderr import launching

__all__ = [
    "FIRST_TIER_DATA_BYTES",
    "SMALL_DATA_BYTES",
    "TINY_DATA_BYTES",
    "build_session",
    "data_profile",
    "dataset_bytes",
    "inputs_in_memory",
    "is_local_master",
    "small_data",
    "small_data_sql_conf",
    "small_sql_at_run_time",
]

_LOG4J = Path(__file__).with_name("log4j2.properties")

#: A local dataset up to this many bytes of Parquet is "small" (some 450k exchanges): its run is
#: dominated by fixed costs (JVM warm-up, query planning, Spark jobs) more than by rows, and gets
#: the small-data settings below. ``kwire analyze`` on synthetic datasets
#: (``bench/analyze_scale.synthesize``), small-data settings against large-data ones: 300k
#: exchanges (22 MB) 40.7 s against 50.3 s; 600k (41 MB) 61.6 against 61.1 s; 900k (59 MB)
#: 84.5-86.0 against 70.2 s (the full JIT's compiled code then earns back its 35-44 s of compiler
#: CPU). It was 64 MiB, before the small-data runs compiled code (:data:`TINY_DATA_BYTES`).
SMALL_DATA_BYTES = 32 << 20
#: A small dataset up to this many bytes of Parquet is "tiny" (up to some 10k exchanges; the demo
#: capture's is 60 kB): its rows cost less to interpret than to compile code for, and it gets
#: the tiny-data settings on top of the small-data ones. Measured on synthetic datasets
#: (``bench/analyze_scale.synthesize``), ``kwire analyze`` with code generation against without:
#: 10k exchanges (0.9 MB) 23.4 s against 17.8 s; 30k (2.5 MB) 27.7 against 25.5 s; 100k (7.4 MB)
#: 34.4 against 48.4 s. That was 4 MiB until the compiled classes were kept across runs
#: (:mod:`spark_jobs.codegen_cache`); with them (``farm-bench --vs``, 3 alternating pairs each,
#: 2026-12-08): 10k 1.05x (0.98-1.10), 20k (1.6 MB) 0.84x, 30k 0.78x, the eight lab captures
#: decoded together (1.75 MB of real traffic) 0.75x (22.9 against 31.1 s, the same 27 results).
TINY_DATA_BYTES = 1 << 20

#: Set to "true" on a session whose plans are one partition (small data): see
#: :func:`one_partition`. Spark itself does not read it; ``spark.conf.set`` takes it at any time.
ONE_PARTITION_CONF = "spark.kwire.onePartition"
#: Set to "true" on a session whose analysis first keeps the input tables in memory (small
#: data): see :func:`inputs_in_memory`.
INPUTS_IN_MEMORY_CONF = "spark.kwire.inputsInMemory"

#: Small data: one shuffle partition (a few thousand rows fit one task); no adaptive execution
#: (it re-plans after every shuffle, one more Spark job each). The plan each action describes for
#: the SQL UI and listeners is the one-line-per-operator form: Spark's default ("formatted",
#: every operator's expressions) was 22% of the driver thread's CPU samples (JFR) in a
#: demo-dataset analysis, whose UI is off.
_SMALL_SQL_CONF = {
    # The input tables kept in memory once, rather than read from Parquet by every job: the demo
    # dataset's analysis 9.3 and 8.7 s against 9.9 and 9.5 s; 100k exchanges 23.6 and 23.8 s
    # against 24.5 and 24.5 s; 900k 79.3 against 80.8 s (so it did not hurt past this tier).
    INPUTS_IN_MEMORY_CONF: "true",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.ui.explainMode": "simple",
    # Plans of one partition (ONE_PARTITION_CONF): the tables are read as one partition that
    # Spark knows is the only one, so aggregates, windows, sorts and sort-merge joins on them
    # need no shuffle; a broadcast join would still be a Spark job of its own for its small
    # side, so there are none. On the demo dataset: 125 Spark jobs and 311 stages -> 52 and 108.
    ONE_PARTITION_CONF: "true",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # No constraint propagation: the optimiser then infers no filters from a plan's constraints
    # (IS NOT NULL on join keys, say), which pay off on many rows, and no longer works out every
    # operator's constraints, which it did for each of the analysis' 53 actions. The demo
    # dataset's analysis: 10.9 and 11.0 s, 17.2-17.4 s of driver JVM CPU, against 11.8 and 12.1 s,
    # 18.8-19.2 s (2026-12-07, alternating). The results are the same: only plans change.
    "spark.sql.constraintPropagation.enabled": "false",
}
#: Tiny data, on top of the small-data settings: no code generation (compiling a Java class per
#: stage and expression costs more CPU than interpreting a few rows). These are the settings the
#: job tests run every job with (tests/spark_fixtures.py).
_TINY_SQL_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
#: Small data: the JIT's first tier only (C2 compiles Spark's planner for seconds of CPU that a
#: short run never earns back) and the serial collector (a heap of a few hundred MB). The code
#: cache is the size tiered compilation would have (240 MB; the first tier alone gets 48 MB): with
#: generated code, 100k exchanges filled 48 MB, and the JVM then stopped compiling (40.0 s
#: against 34.4 s).
_SMALL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"
#: Large data up to this many bytes of Parquet (some 1.2M exchanges) still gets the JIT's first
#: tier only, with the large-data SQL settings and collector. The second tier (C2) compiles the
#: code Spark generates for each stage, and Janino, for a fixed 50-70 s of CPU that only many
#: rows earn back. Full analysis of synthetic datasets (``bench/analyze_profile.py``, large-data
#: settings, ``local[2]``, 2026-12-07), first tier only against both: 600k exchanges (41 MB)
#: 58.5 and 59.4 s against 75.2 and 76.6 s (the small-data settings: 61.6 s); 1M (65 MB) 75.1
#: against 85.4 s wall, 136 against 159 s of driver JVM CPU (compilers 3.3 against 54.3 s,
#: tasks 83.3 against 63.9 s); 2M (129 MB) 130.3 against 125.2 s; 10M (637 MB) 565.4 against
#: 343.9-366.1 s. Raising C2's thresholds instead (``CompileThresholdScaling=5``, or the tier 4
#: thresholds x10) left its CPU at 46-47 s and the 1M run at 88 s.
FIRST_TIER_DATA_BYTES = 80 << 20
_FIRST_TIER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
#: Small data, local master: 1 MB memory pages for sorts and hash aggregates. Spark sizes them
#: from the heap (64 MB for a 4 GB driver), and every sorting or aggregating task allocated and
#: zeroed at least one: analysing the demo dataset, the driver's heap held 0.9-1.6 GB after its
#: collections and the collector (the VM thread) used 4.1 s of CPU, 1.5 s with 1 MB pages. A
#: record larger than a page gets a page of its own size. A core setting: set at start only.
_SMALL_CORE_CONF = {"spark.buffer.pageSize": "1m"}


def one_partition(spark: SparkSession) -> bool:
    """Whether ``spark`` runs plans of one partition (``ONE_PARTITION_CONF``, small data):
    tables are read as one partition (``common.load_tables``), results are ordered without a
    shuffle (``common.ordered``) and a join's marked small side is hashed, not broadcast
    (``common.broadcast``)."""
    return spark.conf.get(ONE_PARTITION_CONF, "false") == "true"


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (a warm server's, see
    ``kwire sql --serve``) rather than one driving its own JVM through py4j. Told apart by
    class module, so a classic run never imports the Connect client (gRPC)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def is_local_master(master: str | None) -> bool:
    return master is None or master.startswith("local")


def dataset_bytes(dataset: str | Path) -> int | None:
    """Bytes of Parquet under a local dataset folder (None for a cluster path like hdfs://)."""
    if "://" in str(dataset):
        return None
    root = Path(dataset)
    return sum(p.stat().st_size for p in root.rglob("*.parquet") if p.is_file()) if root.is_dir() else 0


def data_profile(data_bytes: int | None) -> str:
    """``tiny``, ``small`` or ``large``: which settings a local run over ``data_bytes`` of Parquet
    gets (:data:`TINY_DATA_BYTES`, :data:`SMALL_DATA_BYTES`; None, a cluster path, is large).
    ``$KWIRE_SPARK_PROFILE`` = ``tiny``, ``small`` or ``large`` overrides the size rule (``auto``)."""
    forced = os.environ.get("KWIRE_SPARK_PROFILE", "auto").lower()
    if forced in ("tiny", "small", "large"):
        return forced
    if data_bytes is None or data_bytes > SMALL_DATA_BYTES:
        return "large"
    return "tiny" if data_bytes <= TINY_DATA_BYTES else "small"


def small_data(data_bytes: int | None) -> bool:
    """Whether a local run over ``data_bytes`` of Parquet gets the small-data settings (tiny
    data gets them too): :func:`data_profile` is not ``large``."""
    return data_profile(data_bytes) != "large"


def small_data_sql_conf(data_bytes: int | None = 0) -> dict[str, str]:
    """The Spark SQL settings of a small-data run over ``data_bytes`` (with the tiny-data ones
    when it is tiny; the default, 0, is); empty for large data. A long-lived session may want
    these without the JVM options, which suit short runs."""
    profile = data_profile(data_bytes)
    if profile == "large":
        return {}
    return {**_SMALL_SQL_CONF, **(_TINY_SQL_CONF if profile == "tiny" else {})}


#: Spark's own values (kwire's for the shuffle partitions of a local master) of every key the
#: small and tiny settings change: :func:`session_sql_conf` states each one.
_LARGE_SQL_CONF = {
    INPUTS_IN_MEMORY_CONF: "false",
    ONE_PARTITION_CONF: "false",
    "spark.sql.shuffle.partitions": str(max(2, 2 * (os.cpu_count() or 2))),
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.ui.explainMode": "formatted",
    "spark.sql.autoBroadcastJoinThreshold": "10MB",
    "spark.sql.constraintPropagation.enabled": "true",
    "spark.sql.codegen.wholeStage": "true",
    "spark.sql.codegen.factoryMode": "FALLBACK",
}


def session_sql_conf(data_bytes: int | None) -> dict[str, str]:
    """Every SQL setting the size of the data decides, with its value for ``data_bytes``: what
    a session on a long-lived server (started for a dataset of another size) sets for one run."""
    return {**_LARGE_SQL_CONF, **small_data_sql_conf(data_bytes)}


def inputs_in_memory(spark: SparkSession) -> bool:
    """Whether ``spark``'s analysis keeps the input tables in memory first
    (``INPUTS_IN_MEMORY_CONF``, small data): ``submit.analyse`` does."""
    return spark.conf.get(INPUTS_IN_MEMORY_CONF, "false") == "true"


def build_session(
    master: str | None = None,
    app_name: str = "kwire",
    *,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    ui: bool = False,
    extra_conf: dict[str, str] | None = None,
    data_bytes: int | None = None,
    warm_up: WarmUp | None = None,
) -> SparkSession:
    """Return a SparkSession (a new one, or the active one if it already runs).

    ``master``: a Spark master URL; None means the one given by ``spark-submit``, else
    ``local[*]``. ``shuffle_partitions``: defaults to 2 per local core (local masters only;
    a cluster keeps its own setting). ``driver_memory`` only applies to a local master,
    whose JVM this call starts (default 4g, or ``$KWIRE_SPARK_DRIVER_MEMORY``).
    ``data_bytes``: the input's size (:func:`dataset_bytes`); a small input on a local master
    gets settings for small data (:func:`small_data`), measured to halve the CPU of a run.
    ``warm_up``: what a new local driver does on its idle core while the session is built
    (:mod:`spark_jobs.driver_warmup`).
    """
    active = SparkSession.getActiveSession()
    if active is not None:  # already running (a test fixture, a notebook): use it as it is
        return active
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ and master is None
    recording = None
    builder = SparkSession.builder.appName(app_name)
    if not under_submit:
        master = master or "local[*]"
        builder = builder.master(master)
    conf: dict[str, str] = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
        "spark.sql.legacy.timeParserPolicy": "CORRECTED",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # percentile_approx buffers are small: keep them in the hash aggregate, not a sort
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "16384",
        # PySpark's DataFrame debugging records each API call's Python call site in the JVM for
        # error messages: five more py4j commands and a stack walk per call (F.col 0.98 ms
        # against 0.23 ms, a withColumn 11.8 against 7.8 ms). kwire's jobs build some 900
        # DataFrames an analysis; a failing job still names its Spark error and Python traceback.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    local_driver = not under_submit and is_local_master(master)  # its JVM, started here, is ours to set
    if local_driver:
        cores = os.cpu_count() or 2
        if master and master.startswith("local[") and master[6:-1].isdigit():
            cores = int(master[6:-1])
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions or max(2, 2 * cores))
        conf["spark.default.parallelism"] = str(max(2, cores))
        conf["spark.driver.memory"] = driver_memory or os.environ.get("KWIRE_SPARK_DRIVER_MEMORY", "4g")
        conf["spark.ui.enabled"] = "true" if ui else "false"
        if small_data(data_bytes):
            jit_gc = _SMALL_JVM_OPTIONS
            conf.update(small_data_sql_conf(data_bytes))
            conf.update(_SMALL_CORE_CONF)
            if shuffle_partitions:
                conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
        elif data_bytes is not None and data_bytes <= FIRST_TIER_DATA_BYTES:
            jit_gc = f"-XX:+UseParallelGC {_FIRST_TIER_JVM_OPTIONS}"
        else:  # the parallel (throughput) collector: a batch run wants the least GC CPU, not short pauses
            jit_gc = "-XX:+UseParallelGC"
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={_LOG4J.as_uri()} {jit_gc}"
        archive, recording = archive_options()  # this JVM's classes, loaded once for all runs
        if archive:
            conf["spark.driver.extraJavaOptions"] += f" {archive}"
            classpath = archive_classpath()  # the archive was made with these first
            if classpath:
                conf["spark.driver.extraClassPath"] = classpath
        # Shuffle files stay on this machine's disk (mostly its page cache): compressing them is
        # CPU spent for nothing. A cluster keeps compression (the files cross the network).
        conf["spark.shuffle.compress"] = "false"
        conf["spark.shuffle.spill.compress"] = "false"
        conf["spark.sql.execution.arrow.pyspark.enabled"] = "false"
        # Local Python workers run this interpreter (the venv with kwire), not whatever `python3` is;
        # pyspark reads the variable when the SparkContext starts.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    elif shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    for key, value in {**conf, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    numpy_probe.install()  # no pandas import behind py4j's first call
    with contextlib.ExitStack() as launch:
        if local_driver:  # this call starts that JVM: its JDK, its standard error
            launch.enter_context(launch_env())
            launch.enter_context(driver_launch.launching())  # its java command, no scripts
            launch.enter_context(launching())  # (this one wraps it: the JVM's standard error)
            launch.enter_context(warming(warm_up))
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    py4j_cache.install()  # two of every three calls into the JVM while the jobs build
    if local_driver and data_profile(data_bytes) != "tiny":  # tiny data generates almost no code
        codegen_cache.install(spark)  # classes compiled by earlier runs
    if recording is not None:
        note_driver_pid(recording, spark)
    if small_sql_at_run_time(under_submit, spark.sparkContext.master) and small_data(data_bytes):
        mine = (
            set(conf)
            - set(extra_conf or {})
            - ({"spark.sql.shuffle.partitions"} if shuffle_partitions else set())
        )
        _set_small_sql_at_run_time(spark, small_data_sql_conf(data_bytes), ours=mine)
    return spark


def small_sql_at_run_time(under_submit: bool, master: str) -> bool:
    """Whether a small run's SQL settings are set on the running session rather than given to
    the JVM at its start: on a cluster, and whenever ``spark-submit`` started the JVM (a local
    master included). ``spark-submit --master local[2] spark_jobs/submit.py`` on the demo
    dataset ran with Spark's defaults before (200 shuffle partitions, adaptive execution, code
    generation): 53.7 s against 26.7 s with them (2026-12-07; the same 27 results)."""
    return under_submit or not is_local_master(master)


def _set_small_sql_at_run_time(spark: SparkSession, wanted: dict[str, str], ours: set[str]) -> None:
    """Small data on a cluster (``spark-submit --master spark://...``), or on a local master
    whose JVM ``spark-submit`` started (its settings were not this module's to choose): the
    same SQL settings as a local small run (``wanted``), set on the running session, except
    those the submit command set.
    On a two-worker loopback cluster, the default 200 shuffle partitions took the analysis of
    73 exchanges past 10 minutes. ``ours``: keys this module set (not the user's)."""
    given = spark.sparkContext.getConf()
    for key, value in wanted.items():
        if key in ours or not given.contains(key):
            spark.conf.set(key, value)
