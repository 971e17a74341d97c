"""Result files: a small-data session writes each result with pyarrow (``submit.write_results``),
and the file must be the one Spark's writer makes: the same rows in the same order, the same
Parquet schema (nullability included) and the same Spark metadata, read back the same by pyarrow
and by Spark. Also the size tiers that choose a session's settings (``session.data_profile``)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from spark_fixtures import session_settings, spark  # noqa: F401

from spark_jobs.session import (
    FIRST_TIER_DATA_BYTES,
    INPUTS_IN_MEMORY_CONF,
    ONE_PARTITION_CONF,
    SMALL_DATA_BYTES,
    TINY_DATA_BYTES,
    data_profile,
    session_sql_conf,
    small_data,
    small_data_sql_conf,
    small_sql_at_run_time,
)


@contextmanager
def _one_partition(spark, on: bool):  # noqa: F811
    before = spark.conf.get(ONE_PARTITION_CONF, None)
    spark.conf.set(ONE_PARTITION_CONF, "true" if on else "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(ONE_PARTITION_CONF)
        else:
            spark.conf.set(ONE_PARTITION_CONF, before)


def _results(spark):  # noqa: F811
    """Results of the shapes the jobs write: nested lists of structs, maps, timestamps, columns
    the optimiser proves never null (count, coalesce, a filtered column), empty results."""
    from pyspark.sql import functions as F

    rows = spark.createDataFrame(
        [
            ("c1", "Produce", 3, "2026-11-29 10:00:00.123456", None),
            ("c1", "Fetch", None, "2026-11-29 10:00:01", "NOT_LEADER_OR_FOLLOWER"),
            ("c2", "Produce", 7, "2026-11-29 10:00:02", "KAFKA_STORAGE_ERROR"),
            ("c2", None, 1, "2026-11-29 10:00:03", None),
        ],
        "client string, api string, n int, t string, err string",
    ).withColumn("t", F.to_timestamp("t"))
    per_client = rows.groupBy("client").agg(
        F.count("*").alias("exchanges"),
        F.max("t").alias("last"),
        F.collect_list(F.struct("api", "n", "t")).alias("examples"),
        F.map_from_entries(F.collect_list(F.struct(F.coalesce("api", F.lit("?")), F.col("n")))).alias(
            "by_api"
        ),
        F.sort_array(F.collect_set(F.coalesce("err", F.lit("NONE")))).alias("errors"),
    )
    failed = rows.where(F.col("err").isNotNull()).groupBy("client").agg(F.count("*").alias("failed"))
    # fillna after a left join: declared nullable, proved never null by the optimiser
    per_client = per_client.join(failed, "client", "left").fillna(0, subset=["failed"])
    return {
        "per_client": per_client.orderBy("client"),
        "errors_only": rows.where(F.col("err").isNotNull()).select("client", "err", "t").orderBy("t"),
        "nothing": rows.where(F.lit(False)).select("client", F.col("n").cast("byte").alias("small")),
        "widths": rows.select(F.col("n").cast("short").alias("s"), F.col("n").cast("long").alias("l"), "t"),
    }


@pytest.mark.spark
def test_arrow_written_results_are_the_files_spark_writes(spark, tmp_path: Path) -> None:  # noqa: F811
    from spark_jobs.submit import write_results

    with _one_partition(spark, False):
        write_results(_results(spark), tmp_path / "spark")
    with _one_partition(spark, True):
        write_results(_results(spark), tmp_path / "arrow")
    arrow_files = sorted((tmp_path / "arrow").rglob("*.parquet"))
    assert [p.relative_to(tmp_path / "arrow").as_posix() for p in arrow_files] == [
        f"{name}/part-00000.parquet" for name in ("errors_only", "nothing", "per_client", "widths")
    ]
    assert not list((tmp_path / "arrow").rglob(".*")), "no temporary or checksum file is left"
    compared = 0
    for name in ("per_client", "errors_only", "nothing", "widths"):
        (spark_file,) = (tmp_path / "spark" / name).glob("*.parquet")
        ours = pq.ParquetFile(tmp_path / "arrow" / name / "part-00000.parquet")
        theirs = pq.ParquetFile(spark_file)
        assert ours.metadata.metadata == theirs.metadata.metadata, name  # Spark's keys, no Arrow schema
        assert ours.schema_arrow == theirs.schema_arrow, name
        assert ours.read().to_pylist() == theirs.read().to_pylist(), name
        back_ours = spark.read.parquet(str(tmp_path / "arrow" / name))
        back_theirs = spark.read.parquet(str(tmp_path / "spark" / name))
        assert back_ours.schema == back_theirs.schema, name
        assert back_ours.collect() == back_theirs.collect(), name
        compared += 1
    assert compared == 4
    per_client = pq.read_table(tmp_path / "arrow" / "per_client")
    assert not per_client.schema.field("failed").nullable  # proved by the plan, not declared
    assert _results(spark)["per_client"].schema["failed"].nullable
    assert per_client.num_rows == 2 and pq.read_table(tmp_path / "arrow" / "nothing").num_rows == 0


@pytest.mark.spark
def test_a_labelled_thread_keeps_its_call_site_across_actions(spark) -> None:  # noqa: F811
    """A job thread's RDDs and Spark jobs are named by its label, so Spark never walks the stack
    for a call site: before an action, during it, and after PySpark's action cleared its own."""
    from concurrent.futures import ThreadPoolExecutor

    from spark_jobs.submit import collect_arrow, label_call_sites

    def in_a_job_thread() -> tuple:
        sc = spark.sparkContext
        label_call_sites(spark, "kwire job test")
        before = (sc.getLocalProperty("callSite.short"), sc.getLocalProperty("callSite.long"))
        table = collect_arrow(spark.range(3).toDF("n"))
        after = (sc.getLocalProperty("callSite.short"), sc.getLocalProperty("callSite.long"))
        return before, table.num_rows, after

    with ThreadPoolExecutor(1) as pool:  # as submit.analyse runs jobs: its own thread
        before, rows, after = pool.submit(in_a_job_thread).result()
    assert before == after == ("kwire job test", "kwire job test") and rows == 3
    # the label stays in that thread
    assert spark.sparkContext.getLocalProperty("callSite.long") != "kwire job test"


@pytest.mark.spark
def test_an_arrow_write_replaces_the_result_it_finds(spark, tmp_path: Path) -> None:  # noqa: F811
    from spark_jobs.submit import write_results

    old = tmp_path / "out" / "per_client"
    old.mkdir(parents=True)
    (old / "part-00000-old.snappy.parquet").write_bytes(b"left by an earlier run")
    (old / "_SUCCESS").write_bytes(b"")
    with _one_partition(spark, True):
        write_results({"per_client": _results(spark)["per_client"]}, tmp_path / "out")
    assert sorted(p.name for p in old.iterdir()) == ["part-00000.parquet"]


def test_size_tiers(monkeypatch) -> None:
    monkeypatch.delenv("KWIRE_SPARK_PROFILE", raising=False)
    assert data_profile(0) == "tiny" and data_profile(TINY_DATA_BYTES) == "tiny"
    assert data_profile(TINY_DATA_BYTES + 1) == "small" and data_profile(SMALL_DATA_BYTES) == "small"
    assert data_profile(SMALL_DATA_BYTES + 1) == "large" and data_profile(None) == "large"
    assert small_data(TINY_DATA_BYTES) and small_data(SMALL_DATA_BYTES) and not small_data(None)
    tiny, small = small_data_sql_conf(1), small_data_sql_conf(TINY_DATA_BYTES + 1)
    assert small_data_sql_conf(None) == {}
    for conf in (tiny, small):  # both run plans of one partition without adaptive re-planning
        assert conf[ONE_PARTITION_CONF] == "true" and conf["spark.sql.adaptive.enabled"] == "false"
    for conf in (tiny, small):  # and keep their inputs in memory
        assert conf[INPUTS_IN_MEMORY_CONF] == "true"
    # tiny data interprets its rows; small data compiles code
    assert tiny["spark.sql.codegen.wholeStage"] == "false" and "spark.sql.codegen.wholeStage" not in small
    # a session on a long-lived server states every setting the size decides, whatever the size
    large = session_sql_conf(None)
    assert set(session_sql_conf(1)) == set(session_sql_conf(TINY_DATA_BYTES + 1)) == set(large)
    assert set(tiny) <= set(large) and session_sql_conf(1) == {**large, **tiny}
    assert large[ONE_PARTITION_CONF] == large[INPUTS_IN_MEMORY_CONF] == "false"
    assert large["spark.sql.codegen.wholeStage"] == "true" and large["spark.sql.adaptive.enabled"] == "true"
    monkeypatch.setenv("KWIRE_SPARK_PROFILE", "small")
    assert data_profile(1) == "small" and data_profile(None) == "small"
    monkeypatch.setenv("KWIRE_SPARK_PROFILE", "LARGE")
    assert data_profile(1) == "large" and small_data_sql_conf(1) == {}
    monkeypatch.setenv("KWIRE_SPARK_PROFILE", "tiny")
    assert small_data_sql_conf(None) == tiny


def test_a_jvm_spark_submit_started_gets_the_small_settings_on_a_local_master_too() -> None:
    # build_session gives a local JVM it starts its settings at start; any other JVM (a
    # cluster's driver, or spark-submit's, local master or not) gets them once it runs
    assert small_sql_at_run_time(under_submit=True, master="local[2]")
    assert small_sql_at_run_time(under_submit=True, master="spark://127.0.0.1:7077")
    assert small_sql_at_run_time(under_submit=False, master="spark://127.0.0.1:7077")
    assert not small_sql_at_run_time(under_submit=False, master="local[*]")


@pytest.mark.parametrize("profile", ["tiny", "small"])
def test_a_small_session_gets_its_tier(monkeypatch, profile: str) -> None:
    """The settings ``build_session`` gives a local session of each tier."""
    monkeypatch.setenv("KWIRE_SPARK_PROFILE", profile)
    captured = session_settings(monkeypatch)
    assert captured[ONE_PARTITION_CONF] == "true"
    assert "-XX:TieredStopAtLevel=1" in captured["spark.driver.extraJavaOptions"]
    assert "-XX:ReservedCodeCacheSize=240m" in captured["spark.driver.extraJavaOptions"]
    assert (captured.get("spark.sql.codegen.wholeStage") == "false") == (profile == "tiny")
    assert captured[INPUTS_IN_MEMORY_CONF] == "true"


def test_large_data_gets_the_first_jit_tier_until_many_rows_earn_back_the_second(monkeypatch) -> None:
    """A large local dataset up to FIRST_TIER_DATA_BYTES keeps the large-data settings but runs
    the JIT's first tier only; a larger one, or one of unknown size, gets both tiers."""
    monkeypatch.delenv("KWIRE_SPARK_PROFILE", raising=False)
    for data_bytes, first_tier_only in (
        (SMALL_DATA_BYTES + 1, True),
        (FIRST_TIER_DATA_BYTES, True),
        (FIRST_TIER_DATA_BYTES + 1, False),
        (None, False),
    ):
        captured = session_settings(monkeypatch, data_bytes=data_bytes)
        options = captured["spark.driver.extraJavaOptions"]
        assert captured.get(ONE_PARTITION_CONF) != "true" and "-XX:+UseParallelGC" in options
        assert ("-XX:TieredStopAtLevel=1" in options) == first_tier_only, data_bytes
