"""Benchmark: kwire's Spark jobs on a standalone cluster against a local master, in the same run.

    python bench/analyze_cluster.py [DATASET] [--synthetic N] [--runs 2] [--workers 2] [--no-decode]

Starts a Spark standalone master and ``--workers`` workers (one core each) on loopback from the
pyspark installation (``tests/spark_cluster.py``, as ``tests/test_spark_cluster.py`` does), then
times, alternating in each round, each command a JVM of its own as a user runs it:

* the analysis: the README's ``spark-submit --master spark://... spark_jobs/submit.py DATASET OUT``
  against the local line ``python -m spark_jobs.submit DATASET OUT --master local[2]``;
* the parallel decode job (unless ``--no-decode``): ``spark-submit ... spark_jobs/decode_job.py
  CAPTURES -o OUT`` against ``python -m spark_jobs.decode_job CAPTURES -o OUT --master local[2]``,
  on the two small Tansu captures the cluster test decodes (one task per capture).

Prints each command's min/median/max wall time, the cluster/local ratio of the medians, and
whether the cluster's results equal the local ones row for row (``bench/compare_reports.py``).
Without a DATASET the demo capture is decoded into one; ``--synthetic N`` makes one of N
exchanges instead (``bench/analyze_scale.synthesize``). Every daemon listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from analyze_small import _timed  # noqa: E402 - after the path setup
from compare_reports import differences, read_results  # noqa: E402
from spark_cluster import StandaloneCluster  # noqa: E402

#: The captures the decode job reads: two small ones, one task each (as tests/test_spark_cluster.py)
CAPTURES = [ROOT / "captures" / "tansu-kcat.pcap", ROOT / "captures" / "tansu-kafka-python.pcap"]
LOCAL = "local[2]"


def _dataset(args: argparse.Namespace, work: Path) -> Path:
    if args.dataset is not None:
        return args.dataset
    dataset = work / "dataset.kwire"
    if args.synthetic:
        from analyze_scale import synthesize

        synthesize(dataset, args.synthetic)
    else:
        demo = ROOT / "captures" / "tansu-mixed.pcap"
        cmd = [sys.executable, "-m", "kwire.cli", "decode", str(demo), "-o", str(dataset), "--quiet"]
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300)
    return dataset


def _timed_local(args: list[str], timeout: float) -> float:
    """Seconds ``python ARGS`` took, run from the checkout as ``bench/analyze_small.py`` runs
    its commands."""
    return _timed([sys.executable, *args], timeout)


def _timed_cluster(cluster: StandaloneCluster, args: list[str], timeout: float) -> float:
    start = time.perf_counter()
    cluster.submit(args, cwd=ROOT, timeout=timeout)
    return time.perf_counter() - start


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


def _summary(name: str, values: list[float]) -> str:
    return (
        f"  {name:<28} min {min(values):7.2f}s  median {statistics.median(values):7.2f}s  "
        f"max {max(values):7.2f}s  ({len(values)} runs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", type=Path, help="a kwire dataset (default: the demo, decoded)")
    parser.add_argument(
        "--synthetic", type=int, default=0, help="synthesize a dataset of N exchanges instead"
    )
    parser.add_argument("--runs", type=int, default=2, help="rounds; each times every command once")
    parser.add_argument("--workers", type=int, default=2, help="standalone workers, one core each")
    parser.add_argument("--no-decode", action="store_true", help="time the analysis only")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one command may take")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="kwire-cluster-bench-"))
    try:
        dataset = _dataset(args, work)
        captures = work / "captures"
        captures.mkdir()
        for capture in CAPTURES:
            (captures / capture.name).symlink_to(capture)
        load = os.getloadavg()
        print(f"dataset {dataset}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        times: dict[str, list[float]] = {}
        with StandaloneCluster(work / "cluster", workers=args.workers) as cluster:
            print(f"cluster {cluster.url}: {args.workers} workers of 1 core; local reference {LOCAL}")
            for round_ in range(args.runs):
                # alternate which goes first, so neither always meets the other's leftovers
                order = ("cluster", "local") if round_ % 2 == 0 else ("local", "cluster")
                for where in order:
                    out = _fresh(work / f"{where}.out")
                    if where == "cluster":
                        seconds = _timed_cluster(
                            cluster, ["spark_jobs/submit.py", str(dataset), str(out)], args.timeout
                        )
                    else:
                        seconds = _timed_local(
                            ["-m", "spark_jobs.submit", str(dataset), str(out), "--master", LOCAL],
                            args.timeout,
                        )
                    times.setdefault(f"analysis, {where}", []).append(seconds)
                    if not args.no_decode:
                        decoded = _fresh(work / f"{where}.kwire")
                        job = ["spark_jobs/decode_job.py", str(captures), "-o", str(decoded)]
                        if where == "cluster":
                            seconds = _timed_cluster(cluster, job, args.timeout)
                        else:
                            seconds = _timed_local(
                                [
                                    "-m",
                                    "spark_jobs.decode_job",
                                    str(captures),
                                    "-o",
                                    str(decoded),
                                    "--master",
                                    LOCAL,
                                ],
                                args.timeout,
                            )
                        times.setdefault(f"decode job, {where}", []).append(seconds)
                print(
                    f"round {round_ + 1}/{args.runs}: "
                    + ", ".join(f"{name} {values[-1]:.1f}s" for name, values in times.items())
                )
        load = os.getloadavg()
        print(f"wall time per command (load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}):")
        for name, values in times.items():
            print(_summary(name, values))
        for what in ("analysis", "decode job"):
            cluster_s, local_s = times.get(f"{what}, cluster"), times.get(f"{what}, local")
            if cluster_s and local_s:
                ratio = statistics.median(cluster_s) / statistics.median(local_s)
                print(f"{what}: cluster / local (medians) {ratio:.2f}x")
        found = differences(read_results(work / "local.out"), read_results(work / "cluster.out"))
        print(
            "results: the same on the cluster as on the local master"
            if not found
            else "results DIFFER:\n" + "\n".join(found[:5])
        )
        return 1 if found else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
