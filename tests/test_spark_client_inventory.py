"""Job 8, client_inventory: clients, software and protocol fingerprints."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import ex, spark, tables  # noqa: F401

from spark_jobs.client_inventory import client_inventory

pytestmark = pytest.mark.spark


def _client(who: dict, produce_v: int, metadata_v: int, t0: float = 0.0) -> list[dict]:
    return [
        ex(t0, "ApiVersions", api_version=3, **who),
        ex(t0 + 1, "Metadata", api_version=metadata_v - 1, **who),
        ex(t0 + 2, "Metadata", api_version=metadata_v, **who),
        ex(t0 + 3, "Produce", api_version=produce_v, **who),
    ]


def test_fingerprints_group_unnamed_clients_with_named_ones(spark):  # noqa: F811
    named = {
        "client_id": "rd1",
        "client_ip": "10.0.0.1",
        "client_software_name": "librdkafka",
        "client_software_version": "2.3.0",
    }
    unnamed = {"client_id": "rd2", "client_ip": "10.0.0.2", "client_port": 41000}
    other = {
        "client_id": "j1",
        "client_ip": "10.0.0.3",
        "client_software_name": "apache-kafka-java",
        "client_software_version": "3.7.0",
    }
    rows = _client(named, 9, 12) + _client(unnamed, 9, 12, t0=5) + _client(other, 10, 12)
    rows.append(ex(20, "Fetch", api_version=11, broker_ip="10.0.0.8", **other))
    got = {r.client_id: r for r in client_inventory(tables(spark, rows).exchanges).collect()}
    assert got["rd1"].fingerprint == "0:9,3:12,18:3"
    assert got["j1"].fingerprint == "0:10,1:11,3:12,18:3"  # sorted by api key as numbers
    assert got["rd2"].fingerprint_id == got["rd1"].fingerprint_id != got["j1"].fingerprint_id
    assert got["rd2"].client_software_name is None
    assert got["rd2"].same_fingerprint_clients == 2
    assert got["rd2"].fingerprint_software == "librdkafka 2.3.0"
    assert got["j1"].brokers == ["10.0.0.8:9092", "10.0.0.9:9092"]
    assert got["j1"].requests == 5
    assert (got["rd2"].last_seen - got["rd2"].first_seen).total_seconds() == pytest.approx(3.0)
