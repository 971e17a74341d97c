"""``common._lookup``: a code-to-name table as one JSON map literal, names kept as written."""

from __future__ import annotations

from pyspark.sql import functions as F
from spark_fixtures import spark  # noqa: F401

from spark_jobs import common


def test_names_with_quotes_and_backslashes_come_back_as_written(spark) -> None:  # noqa: F811
    table = {1: "it's", 2: "a\\b", 3: "c\\'d", 4: "UNKNOWN_SERVER_ERROR", 5: "\\"}
    got = spark.range(0, 7).select(common._lookup(table, F.col("id")).alias("name")).collect()
    assert [row.name for row in got] == [None, *table.values(), None]


def test_error_and_api_names_match_the_protocol_table(spark) -> None:  # noqa: F811
    from decoder.protocol import api_name, error_name

    rows = spark.createDataFrame([(c,) for c in (-1, 0, 6, 56, 10_000)], "code int")
    errors = [r.name for r in rows.select(common.error_name(F.col("code")).alias("name")).collect()]
    assert errors == [error_name(c) for c in (-1, 0, 6, 56, 10_000)]
    apis = spark.createDataFrame([(k,) for k in (0, 3, 18, 999)], "key int")
    names = [r.name for r in apis.select(common.api_name(F.col("key")).alias("name")).collect()]
    assert names == [api_name(k) for k in (0, 3, 18, 999)]
