"""kwire's Spark jobs on a real standalone cluster: a master and two workers on loopback.

The parallel decode job and the full analysis are run with ``spark-submit --master spark://...``
as the README shows them, and their output is compared row for row with the same work done on a
local master (the session fixture, ``local[2]``: every core of a 2-core machine).
``KWIRE_SPARK_CLUSTER=0`` skips it (it takes minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

pytest.importorskip("pyspark")
from spark_cluster import StandaloneCluster
from spark_fixtures import spark  # noqa: F401

from spark_jobs.decode_job import run_decode
from spark_jobs.submit import analyse

ROOT = Path(__file__).resolve().parent.parent
#: two small captures: two decode tasks, one per worker's executor
CAPTURES = [ROOT / "captures" / "tansu-kcat.pcap", ROOT / "captures" / "tansu-kafka-python.pcap"]
pytestmark = [
    pytest.mark.spark,
    pytest.mark.real,
    pytest.mark.skipif(os.environ.get("KWIRE_SPARK_CLUSTER") == "0", reason="KWIRE_SPARK_CLUSTER=0"),
]


def _value(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return tuple(sorted((k, _value(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_value(x) for x in v)
    return v


def _rows(folder: Path) -> list[tuple]:
    """Every row under ``folder`` (Parquet, Hive partitions), as sorted comparable tuples."""
    table = pads.dataset(folder, format="parquet", partitioning="hive").to_table()
    rows = [tuple((k, _value(v)) for k, v in sorted(r.items())) for r in table.to_pylist()]
    return sorted(rows, key=repr)


def _results(out: Path) -> dict[str, list[tuple]]:
    return {d.name: _rows(d) for d in sorted(out.iterdir()) if d.is_dir() and any(d.glob("*.parquet"))}


def test_decode_and_analysis_on_a_standalone_cluster(spark, tmp_path: Path) -> None:  # noqa: F811
    inputs = tmp_path / "captures"
    inputs.mkdir()
    for capture in CAPTURES:
        (inputs / capture.name).symlink_to(capture)

    clock = time.perf_counter()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        nonlocal clock
        phases[name] = time.perf_counter() - clock
        clock = time.perf_counter()

    with StandaloneCluster(tmp_path / "cluster", workers=2) as cluster:
        phase("cluster up")
        # README: spark-submit spark_jobs/decode_job.py hdfs:///captures/ -o hdfs:///kwire/dataset
        decoded = cluster.submit(
            ["spark_jobs/decode_job.py", str(inputs), "-o", str(tmp_path / "cluster.kwire")], cwd=ROOT
        )
        assert "decoded 2 captures" in decoded, decoded[-2000:]
        phase("decode on cluster")
        # README: spark-submit --master spark://host:7077 spark_jobs/submit.py DATASET OUT
        cluster.submit(
            ["spark_jobs/submit.py", str(tmp_path / "cluster.kwire"), str(tmp_path / "cluster.out")],
            cwd=ROOT,
        )
        phase("analysis on cluster")
        launched = cluster.executors_launched()
    # both workers ran an executor for each of the two applications
    assert launched == [2, 2], launched

    phase("cluster down")
    run_decode(spark, [str(inputs)], str(tmp_path / "local.kwire"))
    for table in ("exchanges", "connections"):
        local = _rows(tmp_path / "local.kwire" / table)
        assert local, table
        assert _rows(tmp_path / "cluster.kwire" / table) == local, table

    analyse(spark, tmp_path / "local.kwire", tmp_path / "local.out")
    phase("decode and analysis on local[2]")
    print(", ".join(f"{name} {seconds:.1f}s" for name, seconds in phases.items()))
    local_results = _results(tmp_path / "local.out")
    cluster_results = _results(tmp_path / "cluster.out")
    assert sorted(cluster_results) == sorted(local_results)
    assert {"findings", "delivery", "error_reaction", "incident_timeline"} <= set(local_results)
    assert sum(len(rows) for rows in local_results.values()) > 50
    for name, rows in local_results.items():
        assert cluster_results[name] == rows, name
