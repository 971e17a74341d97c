"""Job 3, metadata_refresh: refresh intervals and stale windows after leadership changes."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import ex, spark, tables  # noqa: F401

from spark_jobs.metadata_refresh import metadata_refresh, stale_windows

pytestmark = pytest.mark.spark


def _md(t, who, leader=1, epoch=0, **kw):
    parts = [
        {
            "topic": "orders",
            "topic_id": None,
            "partition": 0,
            "error_code": 0,
            "leader": leader,
            "leader_epoch": epoch,
            "replicas": [1, 2],
            "isr": [1, 2],
        }
    ]
    return ex(t, "Metadata", client_id=who, metadata_partitions=parts, **kw)


def test_intervals_and_periodic_verdicts(spark):  # noqa: F811
    rows = [_md(t, "periodic") for t in (0, 300, 600, 900, 1200)] + [
        ex(1250, "Heartbeat", client_id="periodic")
    ]
    rows += [_md(0, "once"), ex(1250, "Produce", client_id="once", errors=[("orders", 0, 0)])]
    rows += [
        ex(0, "Produce", client_id="never"),
        ex(1250, "Produce", client_id="never"),
    ]  # no Metadata request ever
    rows += [ex(0, "Produce", client_id="brief"), ex(30, "Produce", client_id="brief")]  # too short to tell
    got = {
        r.client_id: r for r in metadata_refresh(tables(spark, rows).exchanges, periodic_max_s=900).collect()
    }
    assert got["periodic"].metadata_requests == 5
    assert got["periodic"].interval_p50_s == pytest.approx(300.0)
    assert got["periodic"].interval_max_s == pytest.approx(300.0)
    assert got["periodic"].refreshes_periodically is True
    assert got["once"].refreshes_periodically is False and got["once"].longest_gap_s == pytest.approx(1250.0)
    assert got["never"].metadata_requests == 0 and got["never"].interval_p50_s is None
    assert got["never"].refreshes_periodically is False
    assert got["brief"].refreshes_periodically is None


def test_stale_windows_from_new_leader_and_from_errors(spark):  # noqa: F811
    rows = [
        _md(0, "a", leader=1, epoch=5),
        _md(0, "b", leader=1, epoch=5, client_ip="10.0.0.2"),
        ex(1, "Produce", client_id="b", client_ip="10.0.0.2", errors=[("orders", 0, 0)]),
        ex(1, "Produce", client_id="a", errors=[("orders", 0, 0)]),
        _md(10, "a", leader=2, epoch=6),  # a sees the new leader
        _md(11, "c", leader=1, epoch=5, client_ip="10.0.0.3"),  # a stale answer: older epoch, not a change
        _md(40, "b", leader=2, epoch=6, client_ip="10.0.0.2"),  # b refreshes 30 s later
        ex(
            50, "Produce", client_id="d", client_ip="10.0.0.4", errors=[("orders", 0, 56)]
        ),  # d never refreshes
        ex(60, "Heartbeat", client_id="d", client_ip="10.0.0.4"),
    ]
    got = {(r.client_id, r.change_source): r for r in stale_windows(tables(spark, rows).exchanges).collect()}
    b = got[("b", "metadata")]
    assert (b.old_leader, b.new_leader, b.refreshed) == (1, 2, True)
    assert b.stale_s == pytest.approx(30.0, abs=0.01)
    assert ("a", "metadata") not in got  # a saw the change itself
    assert not any(k[0] == "c" for k in got)  # c only used the topic after the change
    d = got[("d", "error:56")]
    assert d.refreshed is False and d.stale_s == pytest.approx(10.0, abs=0.01)  # until the end of the data
    assert sum(1 for k in got if k[1] == "metadata") == 1


def test_a_later_run_is_not_an_earlier_runs_refresh(spark):  # noqa: F811
    """Two captures of one client decoded together: in the first it got NOT_LEADER and never asked
    for metadata; the second run starts with a Metadata request 10.9 s later. That is not a
    refresh of the first run, and the first run's window ends with the first run's data."""
    first = [
        ex(0, "Produce", client_id="app", errors=[("orders", 0, 6)], source="run-1.pcap"),
        ex(5, "Heartbeat", client_id="app", source="run-1.pcap"),
    ]
    second = [_md(10.9, "app", source="run-2.pcap"), ex(30, "Produce", client_id="app", source="run-2.pcap")]
    got = stale_windows(tables(spark, first + second).exchanges).collect()
    assert [(r.source, r.client_id, r.refreshed) for r in got] == [("run-1.pcap", "app", False)]
    assert got[0].stale_s == pytest.approx(5.0, abs=0.01)
    intervals = {r.source: r for r in metadata_refresh(tables(spark, first + second).exchanges).collect()}
    assert (intervals["run-1.pcap"].metadata_requests, intervals["run-2.pcap"].metadata_requests) == (0, 1)
