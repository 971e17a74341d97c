"""The Spark decode job writes the same rows as `kwire decode` on the same files."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from kwire.decode_command import decode_captures
from spark_jobs.decode_job import CAPTURE_SUFFIXES, expand_inputs, run_decode

pytest.importorskip("pyspark")
from spark_fixtures import spark  # noqa: F401

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
pytestmark = pytest.mark.spark


def _key(row: dict) -> tuple:
    return (
        row["source"],
        row["connection_id"],
        row.get("correlation_id") or -1,
        row.get("status") or "",
        row.get("request_time") or 0,
        row.get("response_time") or 0,
    )


def _normalise(row: dict) -> dict:
    out = {}
    for name, value in row.items():
        if hasattr(value, "timestamp"):
            value = round(value.timestamp() * 1e6)
        elif isinstance(value, float) and math.isnan(value):
            value = None
        out[name] = value
    return out


def test_same_rows_as_kwire_decode(spark, tmp_path: Path) -> None:  # noqa: F811
    files = sorted(str(p) for p in CAPTURES.glob("tansu-*.pcap"))
    results = run_decode(spark, files, str(tmp_path / "out"))
    assert sorted(Path(r["file"]).name for r in results) == sorted(Path(f).name for f in files)
    assert all(r["error"] is None for r in results)

    for table in ("exchanges", "connections"):
        expected: list[dict] = []
        for file in files:
            exchanges: list[dict] = []
            connections: list[dict] = []
            decode_captures([file], exchanges.append, connections.append)
            expected += exchanges if table == "exchanges" else connections
        written = ds.dataset(tmp_path / "out" / table, partitioning="hive").to_table().to_pylist()
        got = sorted((_normalise(r) for r in written), key=_key)
        want = sorted(({**{k: None for k in got[0]}, **r} for r in expected), key=_key)
        assert len(got) == len(want) > 0
        for have, should in zip(got, want, strict=True):
            assert have == should


def test_inputs_expand_folders_and_globs(tmp_path: Path) -> None:
    # a folder is searched recursively (captures/lab/*/capture.pcap.gz too)
    everything = sorted(str(p) for p in CAPTURES.rglob("*") if p.name.endswith(CAPTURE_SUFFIXES))
    assert any(p.endswith(".pcap.gz") for p in everything)
    assert expand_inputs([str(CAPTURES)]) == everything
    assert expand_inputs([str(CAPTURES / "tansu-k*.pcap")]) == sorted(
        str(p) for p in CAPTURES.glob("tansu-k*.pcap")
    )
    with pytest.raises(FileNotFoundError):
        expand_inputs([str(tmp_path / "missing.pcap")])
