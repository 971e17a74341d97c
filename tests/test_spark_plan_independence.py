"""The analysis gives the same results, row for row and in the same order, whatever plan Spark picks.

A result must not depend on how Spark splits and joins the rows: which attempt ``first()`` reads
first, which of two tied rows ``max_by`` keeps, the order of a map's entries or of rows equal in
a result's sort columns. The analysis runs twice over one synthetic dataset (the benchmark's: many
clients, retries, batches sent in one request, errors of several kinds per partition), once as
``kwire analyze`` runs it and once with 3 shuffle partitions, adaptive execution off and no
broadcast joins, and every result folder must be the same.

On the code before this test, 12 of 27 results differed on 50k exchanges: 10 in row order only
(ties in the sort), and two in content (a batch's fetch-checked copy, the order of
``failed_by_error``'s entries).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from spark_fixtures import spark  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from analyze_scale import synthesize
from compare_reports import differences, read_results

pytestmark = pytest.mark.spark

#: settings that make Spark choose other joins and partitionings than it does by default
OTHER_PLAN = {
    "spark.sql.shuffle.partitions": "3",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
}


def test_results_do_not_depend_on_the_plan(spark, tmp_path: Path) -> None:  # noqa: F811
    from spark_jobs.submit import analyse

    synthesize(tmp_path / "ds", 20_000)
    analyse(spark, tmp_path / "ds", tmp_path / "as-usual")
    before = {key: spark.conf.get(key, None) for key in OTHER_PLAN}
    try:
        for key, value in OTHER_PLAN.items():
            spark.conf.set(key, value)
        analyse(spark, tmp_path / "ds", tmp_path / "other-plan")
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    usual, other = read_results(tmp_path / "as-usual"), read_results(tmp_path / "other-plan")
    assert len(usual) >= 25 and sum(len(rows) for _, rows in usual.values()) > 10_000
    assert not differences(usual, other), "\n".join(d[:600] for d in differences(usual, other))
