"""Job 5, coordinator_errors: storms of NOT_COORDINATOR / LOAD_IN_PROGRESS per group and broker."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import ex, spark, tables  # noqa: F401

from spark_jobs.coordinator_errors import coordinator_events, coordinator_storms, coordinator_timeline

pytestmark = pytest.mark.spark


def test_storms_split_by_gap_and_sources_of_errors(spark):  # noqa: F811
    rows = [ex(t, "Heartbeat", group_id="g1", error_code=16) for t in (0, 10, 20)]  # storm 1: 0-20 s
    rows += [
        ex(t, "OffsetFetch", group_id="g1", error_code=14) for t in (100, 105)
    ]  # storm 2 after a 80 s gap
    rows.append(ex(200, "Heartbeat", group_id="g1", error_code=16))  # alone: below min_errors
    # per-group results (OffsetFetch v8+, DescribeGroups): the group is the resource
    rows += [ex(t, "OffsetFetch", errors=[(None, None, 15, "g2")], client_id=f"c{t}") for t in (0, 1)]
    rows.append(ex(5, "Heartbeat", group_id="g3", error_code=0))
    events = coordinator_events(tables(spark, rows).exchanges)
    storms = sorted(
        coordinator_storms(events, gap_s=30, min_errors=2).collect(),
        key=lambda r: (r.group_id, r.storm_start),
    )
    assert [(r.group_id, r.errors) for r in storms] == [("g1", 3), ("g1", 2), ("g2", 2)]
    first, second, g2 = storms
    assert (
        first.duration_s == pytest.approx(20.0)
        and first.not_coordinator == 3
        and first.first_error == "NOT_COORDINATOR"
    )
    assert second.load_in_progress == 2 and second.last_error == "COORDINATOR_LOAD_IN_PROGRESS"
    assert g2.not_available == 2 and g2.clients == 2
    timeline = coordinator_timeline(events, bucket_s=60).collect()
    assert sum(r.errors for r in timeline) == 8
