"""Job 7, leader_skew: partitions and leaders per broker, kafka-manager topic metrics."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import ex, spark, tables  # noqa: F401

from spark_jobs.leader_skew import run

pytestmark = pytest.mark.spark

BROKERS = [{"node_id": n, "host": f"10.0.0.{n}", "port": 9092, "rack": None} for n in (1, 2, 3)]


def _p(topic, partition, leader, replicas):
    return {
        "topic": topic,
        "topic_id": None,
        "partition": partition,
        "error_code": 0,
        "leader": leader,
        "leader_epoch": 0,
        "replicas": replicas,
        "isr": replicas,
    }


def test_incident_3_single_partition_topics_all_led_by_broker_1(spark):  # noqa: F811
    old = [_p(f"t{i}", 0, 2, [2]) for i in range(4)]
    latest = [_p(f"t{i}", 0, 1, [1]) for i in range(4)]
    # "wide": 6 partitions, RF 2, brokers 1,2,3; broker 1 holds 5 replicas and leads 4 partitions
    wide = [
        _p("wide", 0, 1, [1, 2]),
        _p("wide", 1, 1, [1, 3]),
        _p("wide", 2, 1, [1, 2]),
        _p("wide", 3, 1, [1, 3]),
        _p("wide", 4, 2, [2, 1]),
        _p("wide", 5, 3, [3, 2]),
    ]
    rows = [
        ex(0, "Metadata", metadata_brokers=BROKERS, metadata_partitions=old),
        ex(10, "Metadata", metadata_brokers=BROKERS, metadata_partitions=latest + wide),
    ]
    out = run(tables(spark, rows))
    brokers = {r.node_id: r for r in out["leader_skew_brokers"].collect()}
    assert brokers[1].leaders == 8 and brokers[1].topics_led == 5
    assert brokers[1].leader_share_pct == pytest.approx(80.0) and brokers[1].fair_share_pct == pytest.approx(
        100 / 3
    )
    assert brokers[2].leaders == 1 and brokers[3].leaders == 1  # the older answer (all on 2) is superseded
    topics = {r.topic: r for r in out["leader_skew"].collect()}
    t0 = topics["t0"]
    assert (t0.partitions, t0.brokers_used, t0.brokers_in_cluster, t0.brokers_spread_pct) == (1, 1, 3, 33)
    assert (t0.brokers_skew_pct, t0.brokers_leader_skew_pct) == (0, 0)
    w = topics["wide"]
    # replicas per broker 5/3/4, average ceil(6*2/3)=4: broker 1 is skewed -> 1/3 = 33 %
    # leaders per broker 4/1/1, average ceil(6/3)=2: broker 1 -> 33 %
    assert (w.replication_factor, w.brokers_used, w.brokers_spread_pct) == (2, 3, 100)
    assert (w.brokers_skew_pct, w.brokers_leader_skew_pct) == (33, 33)
    assert w.leaders == [1, 2, 3]
