"""Job 4, producer_acks: acks per producer and the data-loss flag."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import ex, spark, tables  # noqa: F401

from spark_jobs.producer_acks import producer_acks

pytestmark = pytest.mark.spark


def test_acks_counts_and_risk(spark):  # noqa: F811
    rows = [
        ex(0, "Produce", client_id="safe", acks=-1, records=10, record_batches=1, topics=["a"]),
        ex(1, "Produce", client_id="safe", acks=-1, records=5, record_batches=1, topics=["b"]),
        ex(2, "Produce", client_id="leader-only", acks=1, records=7, record_batches=2, topics=["a"]),
        ex(
            3,
            "Produce",
            client_id="fire-forget",
            acks=0,
            records=3,
            status="no_response_expected",
            topics=["a"],
        ),
        ex(4, "Fetch", client_id="safe"),
    ]
    got = {(r.client_id, r.acks_label): r for r in producer_acks(tables(spark, rows).exchanges).collect()}
    assert set(got) == {("safe", "all"), ("leader-only", "1"), ("fire-forget", "0")}
    safe = got[("safe", "all")]
    assert (safe.requests, safe.records, safe.record_batches, safe.topics) == (2, 15, 2, ["a", "b"])
    assert safe.data_loss_risk is False and safe.risk_note is None
    assert got[("leader-only", "1")].data_loss_risk is True
    assert got[("fire-forget", "0")].data_loss_risk is True and got[("fire-forget", "0")].records == 3
