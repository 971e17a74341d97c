"""The committed release table equals what the generator makes from the shared facts file."""

from __future__ import annotations

import json

import pytest

from spark_jobs.gen_broker_versions import generate
from spark_jobs.kafka_versions import COMPACT_TABLE, DEFAULT_SOURCE, load_broker_versions


@pytest.mark.skipif(not DEFAULT_SOURCE.is_file(), reason=f"shared facts file not present at {DEFAULT_SOURCE}")
def test_committed_table_matches_generator():
    assert COMPACT_TABLE.read_text() == generate(DEFAULT_SOURCE)
    assert load_broker_versions(DEFAULT_SOURCE) == load_broker_versions(COMPACT_TABLE)


def test_committed_table_facts_and_version_resolution():
    table = json.loads(COMPACT_TABLE.read_text())
    assert next(iter(table["releases"])) == "0.8.0" and "3.9-kraft" in table["releases"]
    v = load_broker_versions(COMPACT_TABLE)
    assert not v.accepts_request("4.0", 0, 2) and v.advertises["4.0"][0] == (0, 12)  # KIP-896
    assert v.accepts_request("3.9", 0, 2)
    assert 18 not in v.accepts["0.9.0"] and v.accepts_request("0.10.0", 18, 0)
    assert (v.resolve("0.9"), v.resolve("4.0.1"), v.resolve("2.8.2"), v.resolve("3.9-kraft")) == (
        "0.9.0",
        "4.0",
        "2.8",
        "3.9-kraft",
    )
    assert v.resolve("5.7") is None and v.resolve("0") is None
