"""Warm the driver JVM's cold paths on the idle core while the main thread builds the session.

A local session starts one step after another on one thread: the JVM, the SparkContext, then
the SparkSession (some 0.65 s of Scala reflection, Hadoop configuration and catalog set-up),
and the command's first query then pays for every class and code path it is the first to
use (a cold ``kwire sql`` GROUP BY: 0.55 s, against 0.1 s for a second query). Meanwhile the
machine's other core has little to do. Once the SparkContext exists, :func:`warming` starts a
thread that makes the JVM do, beside the SparkSession's construction, what the first query
would otherwise do cold: parse the dataset tables' schemas and one SQL query, list the tables'
folders through Hadoop's local file system, open one Parquet file's footer, and run a one-task
Spark job.

The thread only calls into the JVM: no Python import (the main thread may be importing the
same modules, and a module seen half-imported by another thread fails), no Python worker.
Whatever fails there is ignored: none of it changes what the run computes. Set
``KWIRE_SPARK_WARM_UP=0`` to turn it off.

Measured (``farm-bench --vs``, alternating pairs against ``KWIRE_SPARK_WARM_UP=0``, 2026-12-07):
``kwire sql`` of one GROUP BY over the demo dataset 0.925x (16 pairs, 0.87-1.01) and 0.929x
(12 pairs); ``kwire analyze`` on it 0.993x (6 pairs, noise). The warm-up's 0.8 s beside the
SparkSession's construction make that 0.15-0.3 s slower, the first table and query 0.45 s faster.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["WarmUp", "dataset_warm_up", "warming"]

_SWITCH = "KWIRE_SPARK_WARM_UP"
#: A query of the shape users type into ``kwire sql``, parsed (not run) to warm the grammar.
_QUERY = "SELECT a, count(*) AS n FROM t WHERE b = 1 AND c IS NOT NULL GROUP BY a ORDER BY n DESC LIMIT 10"


class WarmUp:
    """The steps of one warm-up, made in the calling thread: ``schemas`` (JSON of Spark
    ``StructType``), ``folders`` (local dataset tables; the first holding a Parquet file
    gives the footer to open). ``run(sc)`` does them in the JVM; ``done`` is set after."""

    def __init__(self, schemas: Sequence[str], folders: Sequence[Path]) -> None:
        self.schemas = list(schemas)
        self.folders = [Path(f).resolve() for f in folders if Path(f).is_dir()]
        self.footer = next(
            (p for f in self.folders for p in f.rglob("*.parquet") if not p.name.startswith(".")), None
        )
        self.done = threading.Event()
        self.failed: list[str] = []

    def run(self, sc: Any) -> None:
        """Each step in the driver JVM, one after the other; a step that fails is recorded in
        ``failed`` (not raised) and the next one runs."""
        jvm = sc._jvm

        def hadoop_path(path: Path) -> Any:  # by URI object: Path(String) would not decode %3D
            return jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(path.as_uri()))

        def schemas() -> None:
            for text in self.schemas:
                jvm.org.apache.spark.sql.types.DataType.fromJson(text)

        def grammar() -> None:  # the SQL grammar's first use (its ANTLR tables), shared by all parsers
            parser = getattr(
                getattr(jvm.org.apache.spark.sql.catalyst.parser, "CatalystSqlParser$"), "MODULE$"
            )
            parser.parsePlan(_QUERY)

        def listing() -> None:
            fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(sc._jsc.hadoopConfiguration())
            for folder in self.folders:
                fs.listStatus(hadoop_path(folder))

        def footer() -> None:
            if self.footer is not None:
                opened = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(
                    hadoop_path(self.footer), sc._jsc.hadoopConfiguration()
                )
                jvm.org.apache.parquet.hadoop.ParquetFileReader.open(opened).close()

        def job() -> None:
            sc._jsc.parallelize([1, 2], 1).count()  # JVM objects only: no Python worker

        try:
            for step in (schemas, grammar, listing, footer, job):
                try:
                    step()
                except Exception as exc:  # an optimisation: never a run's failure
                    self.failed.append(f"{step.__name__}: {type(exc).__name__}: {exc}")
        finally:
            self.done.set()


def dataset_warm_up(dataset: str | Path | None) -> WarmUp | None:
    """The warm-up for a run over a local ``dataset``'s tables (None for a cluster path)."""
    if dataset is None or "://" in str(dataset):
        return None
    from spark_jobs.common import connections_spark_schema, exchanges_spark_schema

    root = Path(dataset)
    return WarmUp(
        [exchanges_spark_schema().json(), connections_spark_schema().json()],
        [root / "exchanges", root / "connections"],
    )


def enabled() -> bool:
    return os.environ.get(_SWITCH, "1") != "0"


@contextlib.contextmanager
def warming(warm_up: WarmUp | None) -> Iterator[WarmUp | None]:
    """While inside, a SparkContext that pyspark creates starts ``warm_up`` in a daemon thread
    as soon as it exists (nothing when ``warm_up`` is None or ``KWIRE_SPARK_WARM_UP=0``)."""
    if warm_up is None or not enabled():
        yield None
        return
    from pyspark.core.context import SparkContext

    original = SparkContext.__dict__["getOrCreate"]

    def get_or_create(cls: type[SparkContext], conf: Any = None) -> SparkContext:
        created = SparkContext._active_spark_context is None
        sc = original.__func__(cls, conf)
        if created:
            threading.Thread(target=warm_up.run, args=(sc,), name="kwire-warm-up", daemon=True).start()
        return sc

    SparkContext.getOrCreate = classmethod(get_or_create)  # type: ignore[method-assign]
    try:
        yield warm_up
    finally:
        SparkContext.getOrCreate = original  # type: ignore[method-assign]
