"""Run kwire's Spark jobs over a dataset and write each result as Parquet.

    python -m spark_jobs.submit DATASET OUT [--jobs a,b] [--master URL]
        [--kafka-versions PATH] [--broker-version 4.0 ...]
    python -m spark_jobs.producer_acks DATASET OUT          # one job
    PYSPARK_PYTHON=.venv/bin/python spark-submit --master spark://host:7077 \
        spark_jobs/submit.py hdfs:///kwire/ds hdfs:///kwire/out           # from a kwire checkout

Results land in ``OUT/<result>/`` (the job's name for its main result). The driver runs from a
kwire checkout or install (it reads kwire's data files); the jobs use no Python UDFs, so
executors need no Python packages.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs.common import Tables, combine_runs, load_tables, materialize
from spark_jobs.driver_warmup import dataset_warm_up
from spark_jobs.jobs import JOBS, parse_job_list, run_jobs, scheduled
from spark_jobs.kafka_versions import BrokerVersions, load_broker_versions
from spark_jobs.session import (
    build_session,
    dataset_bytes,
    inputs_in_memory,
    is_connect,
    one_partition,
    small_data,
)

__all__ = ["analyse", "main", "only_sources", "write_results"]


def only_sources(tables: Tables, sources: list[str]) -> Tables:
    """The tables cut down to the runs whose ``source`` is one of ``sources``."""
    keep = F.col("source").isin(list(sources))
    return Tables(tables.exchanges.where(keep), tables.connections.where(keep))


def write_results(results: dict[str, DataFrame], out: str | Path, *, log=None) -> dict[str, float]:
    """Write each result to ``out/<name>/`` (one Parquet file each; results are small).
    Returns seconds spent per result.

    A small-data session (:func:`one_partition`) writing to a local folder collects each result
    as Arrow and writes its file with pyarrow: a Spark write is a Spark job plus Hadoop's commit
    protocol (temporary folders, renames, ``_SUCCESS``, a checksum file per file), and without
    Hadoop's native library every file and folder it creates is a forked ``chmod``: 233 of them
    in the demo dataset's analysis. A one-row Spark write took 60-85 ms in a warm session, a
    collect 20 ms. Large data and cluster paths keep Spark's writer (a result may then be too
    big for the driver)."""
    timings = {}
    first = next(iter(results.values()), None)
    local_small = first is not None and "://" not in str(out) and one_partition(first.sparkSession)
    for name, df in results.items():
        start = time.perf_counter()
        if local_small:
            write_arrow(collect_arrow(df), Path(out) / name)
        else:
            df.coalesce(1).write.mode("overwrite").parquet(f"{str(out).rstrip('/')}/{name}")
        timings[name] = time.perf_counter() - start
        if log:
            log(f"{name}: {timings[name]:.1f}s")
    return timings


def collect_arrow(df: DataFrame) -> pa.Table:
    """``df``'s rows as an Arrow table with the schema Spark's writer would give its file: the
    nullability of the planned columns (``toArrow`` keeps the declared one, and the optimiser
    proves some columns never null), and the metadata with which Spark reads its own files back
    with their exact types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    table = df.toArrow()
    if is_connect(df.sparkSession):
        # A Connect client sees only the analysed schema (in the JVM's key order here): where the
        # optimiser proved a column never null and the analysis did not, a served run's file
        # would say nullable and a local run's required. No result of the demo dataset or the
        # lab captures does (tests/test_sql_command.py compares every file both ways).
        planned = json.dumps(df.schema.jsonValue(), separators=(",", ":"))
    else:
        _relabel_after_action(df.sparkSession)
        planned = df._jdf.queryExecution().executedPlan().schema().json()
    schema = to_arrow_schema(StructType.fromJson(json.loads(planned)), timezone="UTC")
    spark_metadata = {
        "org.apache.spark.version": df.sparkSession.version,
        "org.apache.spark.sql.parquet.row.metadata": planned,
    }
    return table.cast(schema).replace_schema_metadata(spark_metadata)


_CALL_SITE_SHORT, _CALL_SITE_LONG = "callSite.short", "callSite.long"


def label_call_sites(spark: SparkSession, label: str) -> None:
    """Give the RDDs and Spark jobs this thread makes ``label`` as their call site (UI, event
    log). Unlabelled, Spark works one out for every RDD, job and SQL execution by walking the
    JVM thread's stack and matching each frame against its internal-class patterns: 3.4% of the
    driver JVM's CPU samples in an analysis of the demo dataset (JFR, 1 ms)."""
    sc = spark.sparkContext
    sc.setLocalProperty(_CALL_SITE_SHORT, label)
    sc.setLocalProperty(_CALL_SITE_LONG, label)


def _relabel_after_action(spark: SparkSession) -> None:
    # PySpark's actions (toArrow, collect) set the short call site to the Python line for their
    # run and then clear it, which would bring the stack walks back for this thread
    sc = spark.sparkContext
    label = sc.getLocalProperty(_CALL_SITE_LONG)
    if label is not None and sc.getLocalProperty(_CALL_SITE_SHORT) is None:
        sc.setLocalProperty(_CALL_SITE_SHORT, label)


def write_arrow(table: pa.Table, folder: Path) -> None:
    """``table`` as the one Parquet file of ``folder``, replacing what was there (as Spark's
    ``mode("overwrite")``, the old result is removed first). The file is written under a hidden
    name and then renamed: readers (pyarrow, Spark) skip dot files, so none sees half a file."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tmp = folder / ".part-00000.parquet.tmp"
    # As Spark's files: Spark's metadata and no Arrow schema (which pyarrow would read back
    # instead of the Parquet types; without it both files read back the same)
    with pq.ParquetWriter(tmp, table.schema, compression="snappy", store_schema=False) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata(table.schema.metadata or {})
    os.replace(tmp, folder / "part-00000.parquet")


def analyse(
    spark: SparkSession,
    dataset: str | Path,
    out: str | Path,
    *,
    jobs: list[str] | None = None,
    versions: BrokerVersions | None = None,
    target_releases: list[str] = (),
    options: dict | None = None,
    parallel: int | None = None,
    combined: bool = False,
    sources: list[str] | None = None,
    log=None,
) -> tuple[Tables, dict[str, DataFrame], dict[str, float]]:
    """Run ``jobs`` (default: all) over ``dataset`` and write their results under ``out``.

    Each run (``source``: one capture file, one proxy) is analysed on its own: a client id seen
    in two runs is two clients. ``combined`` makes them one run (``common.combine_runs``).

    ``parallel`` jobs (default 2, 3 on a Connect session) run at once, longest first
    (``jobs.SCHEDULE``), each writing its own results in order: much of a job's time is driver
    work and single-task stages, and Spark runs another job's tasks on the idle cores.
    ``sources``: analyse only these runs (``source`` values) of the dataset.
    """
    # Each job scans the Parquet for its own columns: caching the whole table in memory first
    # was measured slower (decoding every column into the cache costs more than the scans),
    # except on small data (``session.inputs_in_memory``), where the scans' fixed costs win.
    tables = load_tables(spark, dataset)
    if sources:
        tables = only_sources(tables, sources)
    if combined:
        tables = combine_runs(tables)
    if inputs_in_memory(spark):
        tables = Tables(materialize(tables.exchanges), materialize(tables.connections))
    context = {
        "spark": spark,
        "versions": versions,
        "target_releases": list(target_releases),
        "small_data": small_data(dataset_bytes(dataset)),  # a job may plan differently for it
    }

    def run_one(name: str) -> tuple[dict[str, DataFrame], dict[str, float]]:
        if not is_connect(spark):  # a Connect server labels each client's jobs by session
            spark.sparkContext.setJobDescription(name)  # labels its Spark jobs (UI, event log)
            label_call_sites(spark, f"kwire job {name}")
        results = run_jobs(tables, [name], options, **context)
        return results, write_results(results, out, log=log)

    if parallel is None:
        # On a Connect server a job's thread mostly waits for the server: three at once kept
        # its two cores busier (the demo dataset on a warm server: 5.50-5.72 s against
        # 6.34-6.74 s with two, 5.81-6.09 s with four, alternating).
        parallel = 3 if is_connect(spark) else 2
    names = list(jobs or JOBS)
    with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="kwire-job") as pool:
        # started longest first (jobs.SCHEDULE); the results keep the order asked for
        running = {name: pool.submit(run_one, name) for name in scheduled(names)}
        done = [running[name].result() for name in names]
    results: dict[str, DataFrame] = {}
    timings: dict[str, float] = {}
    for job_results, job_timings in done:
        results.update(job_results)
        timings.update(job_timings)
    if "://" not in str(out):  # the findings read the results back with pyarrow from a local folder
        from spark_jobs.findings import build_findings, write_findings
        from spark_jobs.report import load_results

        write_findings(build_findings(load_results(out)), out)
    return tables, results, timings


def main(argv: list[str] | None = None, *, job: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m spark_jobs.{job or 'submit'}",
        description="Run kwire Spark jobs, write Parquet results.",
    )
    parser.add_argument("dataset", help="dataset directory (exchanges/, connections/)")
    parser.add_argument("out", help="output directory: one subdirectory per result")
    parser.add_argument(
        "--master", default=None, help="Spark master URL (default: spark-submit's, else local[*])"
    )
    if job is None:
        parser.add_argument("--jobs", default=None, help=f"comma-separated subset of: {', '.join(JOBS)}")
    parser.add_argument(
        "--kafka-versions",
        default=None,
        help="broker_api_versions.json (default: shared copy or bundled table)",
    )
    parser.add_argument(
        "--broker-version", action="append", default=[], help="also compare against this Kafka release"
    )
    parser.add_argument(
        "--combine-runs",
        action="store_true",
        help="analyse all sources (capture files, proxies) as one run: one client id is one client",
    )
    parser.add_argument(
        "--source", action="append", default=[], help="analyse only this source of the dataset (repeatable)"
    )
    args = parser.parse_args(argv)
    try:
        names = [job] if job else parse_job_list(args.jobs)
        versions = load_broker_versions(args.kafka_versions)
        releases = []
        for v in args.broker_version:
            rel = versions.resolve(v)
            if rel is None:
                raise ValueError(f"unknown Kafka release {v!r} (known: {', '.join(versions.releases)})")
            releases.append(rel)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "://" not in args.dataset and not Path(args.dataset).is_dir():
        print(f"error: no dataset at {args.dataset}", file=sys.stderr)
        return 2
    spark = build_session(
        args.master,
        "kwire-jobs",
        data_bytes=dataset_bytes(args.dataset),
        warm_up=dataset_warm_up(args.dataset),
    )
    start = time.perf_counter()
    analyse(
        spark,
        args.dataset,
        args.out,
        jobs=names,
        versions=versions,
        target_releases=releases,
        combined=args.combine_runs,
        sources=args.source or None,
        log=print,
    )
    print(f"done in {time.perf_counter() - start:.1f}s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
