"""Spark's generated code kept on disk (:mod:`spark_jobs.codegen_cache`): stored by one run,
defined from the stored bytes by a later one, with the same results; a damaged file is compiled
again, never fatal."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_fixtures import spark, spark_settings  # noqa: F401

from spark_jobs import codegen_cache

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_CODEGEN = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}


@pytest.fixture
def codegen_on(spark) -> Iterator[None]:  # noqa: F811
    """Code generation on in the shared (tiny-data) session for one test, and the session's
    disk cache pointed back at its own folder after it."""
    try:
        with spark_settings(spark, _CODEGEN):
            yield
    finally:
        codegen_cache.install(spark)


def _query(spark):  # noqa: F811
    """A query whose plan generates several classes: a window, an aggregate, a join, a sort."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = spark.range(3000).select(
        (F.col("id") % 11).alias("k"),
        F.col("id").alias("v"),
        F.timestamp_micros(F.col("id") * 997).alias("t"),
    )
    lagged = rows.withColumn("lag", F.lag("v").over(Window.partitionBy("k").orderBy("t")))
    per_key = lagged.groupBy("k").agg(
        F.count("*").alias("n"), F.sum("lag").alias("lags"), F.max("t").alias("last")
    )
    joined = per_key.join(rows.groupBy("k").agg(F.min("v").alias("first")), "k")
    return [tuple(r) for r in joined.orderBy("k").collect()]


def _counts(spark) -> dict[str, int]:  # noqa: F811
    return codegen_cache.counts(spark)


def test_classes_stored_by_one_run_are_loaded_by_the_next_with_the_same_rows(spark, codegen_on, tmp_path):  # noqa: F811
    folder = tmp_path / "classes"
    assert codegen_cache.install(spark, folder=folder)
    before = _counts(spark)
    first = _query(spark)
    after_first = _counts(spark)
    stored = after_first["stored"] - before["stored"]
    assert stored >= 3, after_first  # whole-stage code, projections, orderings
    assert len(list(folder.rglob("*.class-set"))) == stored

    assert codegen_cache.install(spark, folder=folder)  # a new run: nothing defined in this cache yet
    second = _query(spark)
    after_second = _counts(spark)
    assert after_second["hits"] - after_first["hits"] >= stored
    assert after_second["misses"] == after_first["misses"]
    assert after_second["failed"] == after_first["failed"]
    assert second == first
    assert first[0][1] == 273  # 3000 rows over 11 keys: key 0 has ids 0, 11, ..., 2992


def test_a_damaged_class_file_is_compiled_again(spark, codegen_on, tmp_path):  # noqa: F811
    folder = tmp_path / "classes"
    assert codegen_cache.install(spark, folder=folder)
    first = _query(spark)
    files = list(folder.rglob("*.class-set"))
    assert files
    for path in files:
        path.write_bytes(b"not a class set" * 3)

    assert codegen_cache.install(spark, folder=folder)
    before = _counts(spark)
    second = _query(spark)
    after = _counts(spark)
    assert after["failed"] - before["failed"] >= len(files)
    assert after["misses"] - before["misses"] >= len(files)
    assert second == first
    assert all(path.read_bytes() != b"not a class set" * 3 for path in files)  # stored again, whole


def test_off_switch_and_cluster_masters_leave_spark_alone(spark, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("KWIRE_SPARK_CODEGEN_CACHE", "0")
    assert not codegen_cache.install(spark, folder=tmp_path)
    monkeypatch.delenv("KWIRE_SPARK_CODEGEN_CACHE")

    class Cluster:
        class sparkContext:
            master = "spark://127.0.0.1:7077"

    assert not codegen_cache.install(Cluster(), folder=tmp_path)
    assert not tmp_path.joinpath("classes").exists()


def test_prune_keeps_the_recently_used_files_within_the_budget(tmp_path):
    folder = tmp_path / "classes"
    (folder / "ab").mkdir(parents=True)
    now = time.time()
    for i in range(6):
        path = folder / "ab" / f"{i}.class-set"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (now - 100 * (6 - i), now - 100 * (6 - i)))  # 5 is the most recent
    (folder / "ab" / ".x.tmp").write_bytes(b"partial")  # a killed run's
    removed = codegen_cache.prune(folder, 3000)
    assert removed == 4  # the temporary file and the three oldest
    assert sorted(p.name for p in (folder / "ab").iterdir()) == ["3.class-set", "4.class-set", "5.class-set"]
    assert codegen_cache.prune(folder, 3000) == 0


def test_the_hook_compiles_once_and_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("KWIRE_SPARK_CODEGEN_DIR", str(tmp_path))
    made = codegen_cache.hook_classes()
    if made is None:
        pytest.skip("no javac beside the driver's java")
    class_file = made / "kwire" / "spark" / "CodegenDiskCache.class"
    assert class_file.is_file()
    stamp = class_file.stat().st_mtime_ns
    assert codegen_cache.hook_classes() == made
    assert class_file.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [made.name]  # no partial folder left


def test_stored_classes_name_the_pyspark_they_were_made_against(monkeypatch, tmp_path):
    monkeypatch.setenv("KWIRE_SPARK_CODEGEN_DIR", str(tmp_path))
    import pyspark

    assert codegen_cache.cache_folder().parent == Path(tmp_path)
    assert codegen_cache.cache_folder().name.startswith(f"classes-{pyspark.__version__}-")


def test_the_class_archive_recorder_fills_the_cache_with_code_generation_on(spark, monkeypatch, tmp_path):  # noqa: F811
    """The recorder analyses the bundled capture twice: as tiny data (no generated code, as the
    demo runs), then with code generation as past the tiny size, so that a first analysis of
    such a dataset finds most of its classes compiled; then it puts the tiny settings back."""
    from spark_jobs import class_archive, submit
    from spark_jobs.session import session_sql_conf

    seen: list[tuple[str, str]] = []

    def analyse(session, dataset, out, **_):
        seen.append((session.conf.get("spark.sql.codegen.wholeStage"), out.name))

    monkeypatch.setattr(submit, "analyse", analyse)
    monkeypatch.setattr(codegen_cache, "install", lambda session: seen.append(("install", "")))
    monkeypatch.setattr(class_archive, "_warm_up_dataset", lambda work: work)
    with spark_settings(spark, {key: spark.conf.get(key, None) for key in session_sql_conf(0)}):
        class_archive._warm_up(spark, tmp_path)
        after = spark.conf.get("spark.sql.codegen.wholeStage")
    assert seen == [("false", "report"), ("install", ""), ("true", "report-codegen")]
    assert after == "false"


def test_a_compile_error_is_sparks_own(spark, codegen_on, tmp_path):  # noqa: F811
    """Source that does not compile fails as Spark's compiler fails (its fallback to
    interpreted rows catches that), not wrapped by the hook's reflection; nothing is stored."""
    from py4j.protocol import Py4JJavaError

    assert codegen_cache.install(spark, folder=tmp_path)
    jvm = spark.sparkContext._jvm
    codegen = jvm.org.apache.spark.sql.catalyst.expressions.codegen
    code = codegen.CodeAndComment(
        "public Object generate(Object[] references) { return undefined; }",
        jvm.scala.collection.mutable.HashMap(),
    )
    with pytest.raises(Py4JJavaError) as failed:
        codegen.CodeGenerator.compile(code)
    java = failed.value.java_exception
    assert "InvocationTargetException" not in java.getClass().getName()
    assert "compile" in str(java.getMessage()).lower()
    assert not list(tmp_path.rglob("*.class-set"))


def test_folders_of_another_pyspark_or_an_older_hook_go_once_unused_for_a_day(tmp_path, monkeypatch):
    monkeypatch.setenv("KWIRE_SPARK_CODEGEN_DIR", str(tmp_path))
    current = codegen_cache.cache_folder()
    hook = codegen_cache._hook_folder()
    old = time.time() - 3 * 86400
    for folder in (
        tmp_path / "classes-3.5.0-0123",
        tmp_path / "hook-0123",
        tmp_path / "classes-4.0.0-4567",
        hook,
    ):
        (folder / "ab").mkdir(parents=True)
        (folder / "ab" / "x.class-set").write_bytes(b"x")
        os.utime(folder, (old, old))
    (tmp_path / "classes-4.0.0-4567" / ".pruned").touch()  # another pyspark's run, this hour
    codegen_cache._prune_now_and_then(current)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [current.name, hook.name, "classes-4.0.0-4567"]
    )
    assert (current / ".pruned").is_file()


def test_code_compiled_against_a_loader_with_classes_of_its_own_is_left_to_spark(spark, tmp_path):  # noqa: F811
    """A class loader that adds classes (a REPL's, a Connect session's artifacts, added jars) may
    hold another class of the same name in a later run: its code is neither stored nor read."""
    assert codegen_cache.install(spark, folder=tmp_path)
    jvm = spark.sparkContext._jvm
    gateway = spark.sparkContext._gateway
    codegen = jvm.org.apache.spark.sql.catalyst.expressions.codegen
    thread = jvm.java.lang.Thread.currentThread()  # py4j runs this Python thread's calls on one JVM thread
    own = thread.getContextClassLoader()

    def compile_under(loader, marker: int) -> None:
        body = f"public Object generate(Object[] references) {{ return Integer.valueOf({marker}); }}"
        thread.setContextClassLoader(loader)
        try:
            codegen.CodeGenerator.compile(
                codegen.CodeAndComment(body, jvm.scala.collection.mutable.HashMap())
            )
        finally:
            thread.setContextClassLoader(own)

    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(tmp_path / "jars") + "/").toURI().toURL()
    with_jars = jvm.java.net.URLClassLoader(urls, jvm.org.apache.spark.util.Utils.getSparkClassLoader())
    before = codegen_cache.counts(spark)
    compile_under(with_jars, 7001)
    after_foreign = codegen_cache.counts(spark)
    compile_under(jvm.org.apache.spark.util.Utils.getSparkClassLoader(), 7002)
    after_plain = codegen_cache.counts(spark)
    assert after_foreign == before  # Spark compiled it; the folder was not asked
    assert after_plain["misses"] == before["misses"] + 1 and after_plain["stored"] == before["stored"] + 1
    assert len(list(tmp_path.rglob("*.class-set"))) == 1
