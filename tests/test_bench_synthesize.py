"""The analysis benchmark's synthetic dataset (``bench/analyze_scale.py``) carries Produce record
batches shaped like a real producer's: one per partition, the answered request's partitions,
and retries that keep the failed batch's identity."""

from __future__ import annotations

import itertools
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.dataset as pads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from analyze_scale import synthesize


def _exchanges(root: Path) -> list[dict]:
    synthesize(root, 40_000)
    columns = [
        "api_key",
        "status",
        "request_time",
        "client_ip",
        "batches",
        "partition_errors",
        "record_batches",
    ]
    return (
        pads.dataset(root / "exchanges", format="parquet", partitioning="hive")
        .to_table(columns=columns)
        .to_pylist()
    )


def test_every_produce_request_has_its_batches_and_no_other_request_has_any(tmp_path):
    rows = _exchanges(tmp_path / "ds")
    produce = [r for r in rows if r["api_key"] == 0]
    assert produce and all(r["batches"] and r["record_batches"] == len(r["batches"]) for r in produce)
    assert not [r for r in rows if r["api_key"] != 0 and r["batches"]]
    answered = [r for r in produce if r["partition_errors"]]
    assert answered
    for r in answered:
        assert [(b["topic"], b["partition"]) for b in r["batches"]] == [
            (p["topic"], p["partition"]) for p in r["partition_errors"]
        ]


def test_a_failed_batch_is_sent_again_with_its_identity(tmp_path):
    rows = _exchanges(tmp_path / "ds")
    sent = defaultdict(list)  # (client, topic, partition) -> [(time, identity, failed)]
    for r in sorted((r for r in rows if r["api_key"] == 0), key=lambda r: r["request_time"]):
        codes = [p["error_code"] for p in r["partition_errors"] or []]  # one per batch, in order
        for i, b in enumerate(r["batches"]):
            identity = (
                b["producer_id"],
                b["producer_epoch"],
                b["base_sequence"],
                b["crc"],
                b["record_count"],
            )
            failed = i < len(codes) and codes[i] != 0
            sent[(r["client_ip"], b["topic"], b["partition"])].append((identity, failed))
    retried = fresh = 0
    for batches in sent.values():
        for (before, failed), (after, _) in itertools.pairwise(batches):
            if failed:
                assert after == before  # the next batch of the partition is the retry
                retried += 1
            else:
                assert after != before
                fresh += 1
    assert retried > 10 and fresh > 1000
    idempotent = [i for batches in sent.values() for i, _ in batches if i[0] >= 0]
    assert idempotent and len(idempotent) < sum(len(b) for b in sent.values())  # both kinds of producer
