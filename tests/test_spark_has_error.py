"""``has_error`` (compiled array functions) against the lambda it replaces (``F.exists``)."""

from __future__ import annotations

from pyspark.sql import functions as F
from spark_fixtures import spark  # noqa: F401

from spark_jobs.common import has_error

LISTS = [
    None,
    [],
    [0],
    [0, 0],
    [0, 6],
    [56],
    [-1],
    [0, None],
    [None],
    [3, None],
    [74, 0, 5],
    [35],
]


def test_has_error_matches_the_lambda_on_every_shape_of_list(spark) -> None:  # noqa: F811
    rows = [
        (i, None if codes is None else [{"error_code": c} for c in codes]) for i, codes in enumerate(LISTS)
    ]
    df = spark.createDataFrame(rows, "i int, pe array<struct<error_code: smallint>>")
    watched = [56, 6, 5, 3, 74]
    cases = {
        "watched": (has_error("pe", watched), F.exists("pe", lambda p: p["error_code"].isin(watched))),
        "nonzero": (has_error("pe"), F.exists("pe", lambda p: p["error_code"] != 0)),
    }
    for name, (fast, reference) in cases.items():
        got = sorted(r.i for r in df.where(fast).collect())
        want = sorted(r.i for r in df.where(reference).collect())
        assert got == want, name
    assert sorted(r.i for r in df.where(cases["watched"][0]).collect()) == [4, 5, 9, 10]
    assert sorted(r.i for r in df.where(cases["nonzero"][0]).collect()) == [4, 5, 6, 9, 10, 11]
