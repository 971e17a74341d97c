"""Percentiles from the one-pass latency histogram, against exact percentiles computed here."""

from __future__ import annotations

import math
import random

import pytest
from spark_fixtures import spark  # noqa: F401

from spark_jobs.common import histogram_quantiles, latency_histogram


def exact(values: list[int], q: float) -> int:
    """The smallest value with at least ``q`` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def quantiles(spark, rows: list[tuple[str, int]], qs: dict[str, float]) -> dict[str, dict]:  # noqa: F811
    df = spark.createDataFrame(rows, "grp string, latency_us long")
    out = histogram_quantiles(latency_histogram(df, ["grp"]), ["grp"], qs).collect()
    return {r["grp"]: r.asDict() for r in out}


def test_within_two_percent_of_exact_on_skewed_latencies(spark) -> None:  # noqa: F811
    rnd = random.Random(5)
    groups = {
        "fast": [int(rnd.lognormvariate(7, 0.6)) for _ in range(3000)],  # ~1 ms
        "slow": [int(rnd.lognormvariate(12, 1.5)) for _ in range(2000)],  # ~160 ms, long tail
        "bimodal": [rnd.choice((300, 250_000)) + rnd.randint(0, 50) for _ in range(1000)],
    }
    qs = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    got = quantiles(spark, [(g, v) for g, vs in groups.items() for v in vs], qs)
    for group, values in groups.items():
        row = got[group]
        assert row["requests"] == len(values) and row["max"] == max(values)
        for name, q in qs.items():
            want = exact(values, q)
            assert row[name] in values, "a quantile is always a value that was seen"
            assert want / 1.0201 <= row[name] <= want * 1.0201, (group, name, row[name], want)


def test_exact_when_values_are_few(spark) -> None:  # noqa: F811
    got = quantiles(
        spark,
        [("a", 10_000), ("a", 30_000), ("b", 2_000), ("c", 0), ("c", 0), ("c", 7)],
        {"p50": 0.5, "p99": 0.99},
    )
    assert (got["a"]["p50"], got["a"]["p99"], got["a"]["max"]) == (10_000, 30_000, 30_000)
    assert (got["b"]["p50"], got["b"]["p99"]) == (2_000, 2_000)
    assert (got["c"]["p50"], got["c"]["p99"], got["c"]["requests"]) == (0, 7, 3)


@pytest.mark.parametrize("q", [0.01, 0.25, 0.5, 0.75, 0.999])
def test_rank_rule_matches_exact_on_distinct_buckets(spark, q: float) -> None:  # noqa: F811
    values = [2**i for i in range(20)]  # each in its own bucket: exact
    assert quantiles(spark, [("g", v) for v in values], {"q": q})["g"]["q"] == exact(values, q)
