"""``bench/analyze_profile.py --operators``: Spark's per-operator time metrics read from an event
log, summed over tasks and named by the kwire job whose Spark job ran them.

The lines are shaped as Spark 4's event log writes them (seen in ``--operators`` runs); the log
of a real run is what the option reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from analyze_profile import read_operator_times, read_stage_times


def _plan(execution: int) -> dict:
    sort = {
        "nodeName": "Sort",
        "simpleString": "Sort [source#0 ASC NULLS FIRST, connection_id#1 ASC NULLS FIRST], false, 0",
        "children": [],
        "metrics": [
            {"name": "sort time", "accumulatorId": 10 * execution + 1, "metricType": "timing"},
            {"name": "peak memory", "accumulatorId": 10 * execution + 2, "metricType": "size"},
        ],
    }
    agg = {
        "nodeName": "HashAggregate",
        "simpleString": "HashAggregate(keys=[source#0], functions=[count(1)])",
        "children": [sort],
        "metrics": [
            {"name": "time in aggregation build", "accumulatorId": 10 * execution + 3, "metricType": "timing"}
        ],
    }
    return {
        "Event": "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart",
        "executionId": execution,
        "sparkPlanInfo": agg,
    }


def _job(job: int, execution: int, label: str) -> dict:
    props = {"spark.sql.execution.id": str(execution), "spark.job.description": label}
    return {"Event": "SparkListenerJobStart", "Job ID": job, "Stage IDs": [job], "Properties": props}


def _task(stage: int, updates: dict[int, int], run_ms: int = 0) -> dict:
    accumulables = [{"ID": acc, "Update": str(ms), "Value": str(ms)} for acc, ms in updates.items()]
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage,
        "Task Info": {"Accumulables": accumulables},
        "Task Metrics": {"Executor Run Time": run_ms},
    }


def _write_log(folder: Path, events: list[dict]) -> None:
    log = folder / "eventlog_v2_local-1"
    log.mkdir()
    (log / "events_1_local-1").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_operator_times_are_summed_over_tasks_and_named_by_job(tmp_path: Path) -> None:
    events = [
        _plan(1),
        _job(0, 1, "outages"),
        _task(0, {11: 300, 12: 4096, 13: 50}),
        _task(0, {11: 200, 13: 25}),
        _plan(2),
        _job(1, 2, "delivery"),
        _task(1, {21: 0, 23: 900}),  # a sort that took no time is left out
        _task(1, {999: 7}),  # an accumulator no plan names
    ]
    _write_log(tmp_path, events)
    rows = sorted(read_operator_times(tmp_path))
    assert rows == [
        (
            "delivery",
            "time in aggregation build",
            "HashAggregate(keys=[source#0], functions=[count(1)])",
            900.0,
        ),
        (
            "outages",
            "sort time",
            "Sort [source#0 ASC NULLS FIRST, connection_id#1 ASC NULLS FIRST], false, 0",
            500.0,
        ),
        (
            "outages",
            "time in aggregation build",
            "HashAggregate(keys=[source#0], functions=[count(1)])",
            75.0,
        ),
    ]


def test_stage_times_are_summed_over_tasks_with_the_operators_their_tasks_updated(tmp_path: Path) -> None:
    events = [
        _plan(1),
        _job(0, 1, "outages: broker gaps"),
        _task(0, {11: 300, 13: 50}, run_ms=1200),
        _task(0, {13: 25}, run_ms=800),
        _plan(2),
        _job(1, 2, "delivery"),
        _task(1, {23: 900}, run_ms=300),  # only its aggregate reported
    ]
    _write_log(tmp_path, events)
    rows = sorted(read_stage_times(tmp_path), key=lambda r: r[1])
    assert rows == [
        (
            "outages",
            0,
            2000.0,
            2,
            [
                "HashAggregate(keys=[source#0], functions=[count(1)])",  # the plan's root first
                "Sort [source#0 ASC NULLS FIRST, connection_id#1 ASC NULLS FIRST], false, 0",
            ],
        ),
        ("delivery", 1, 300.0, 1, ["HashAggregate(keys=[source#0], functions=[count(1)])"]),
    ]
