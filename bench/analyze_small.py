"""Benchmark: what a user waits for on a small dataset, cold (a new JVM each time).

    python bench/analyze_small.py [DATASET] [--runs 3] [--query SQL] [--no-analyze] [--warm]

Runs ``kwire analyze DATASET --local`` and ``kwire sql DATASET QUERY --local`` (each its own JVM)
``--runs`` times each as the command line does, and the same query on DuckDB over the same files,
and prints the min/median/max wall time of each with the machine's load average at the start.
``--warm`` then starts a warm server (``kwire sql DATASET --serve``) and times the same two
commands on it: its first analysis apart (the server's JVM compiles Spark's planner then), and
``--runs`` more. Without a DATASET, decodes ``captures/tansu-mixed.pcap`` (the demo) into a
temporary one; ``--synthetic N`` synthesizes N exchanges instead (``bench/analyze_scale.py``'s
mix: issue 22.2 asks for 10 s on up to 100k).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # warm_server
KWIRE = [sys.executable, "-m", "kwire.cli"]
QUERY = "SELECT api_name, count(*) AS n FROM exchanges GROUP BY 1 ORDER BY 2 DESC"


def _timed(cmd: list[str], timeout: float = 600.0) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed


def _duckdb(dataset: Path, query: str) -> float:
    import duckdb

    start = time.perf_counter()
    con = duckdb.connect()
    files = str(dataset / "exchanges" / "*" / "*.parquet")
    con.execute(f"CREATE VIEW exchanges AS SELECT * FROM read_parquet('{files}', hive_partitioning=true)")
    con.execute(query).fetchall()
    return time.perf_counter() - start


def _line(name: str, times: list[float]) -> str:
    return (
        f"{name:20s} min {min(times):6.2f}s  median {statistics.median(times):6.2f}s  "
        f"max {max(times):6.2f}s  ({len(times)} runs)"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _warm(dataset: Path, tmp: Path, runs: int, query: str, figures: dict[str, list[float]]) -> None:
    """Time ``kwire analyze`` and ``kwire sql`` on a warm server serving ``dataset``."""
    from warm_server import warm_server

    popen = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": ROOT}
    with warm_server(dataset, _free_port(), **popen):
        first = _timed([*KWIRE, "analyze", str(dataset), "-o", str(tmp / "report-warm-first")])
        figures["analyze, new server"] = [first]
        figures["analyze, warm"], figures["sql, warm"] = [], []
        for run in range(runs):
            out = tmp / f"report-warm-{run}"
            figures["analyze, warm"].append(_timed([*KWIRE, "analyze", str(dataset), "-o", str(out)]))
            figures["sql, warm"].append(_timed([*KWIRE, "sql", str(dataset), query]))
            print(
                f"warm: analyze={figures['analyze, warm'][-1]:.2f}s sql={figures['sql, warm'][-1]:.2f}s",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--query", default=QUERY)
    parser.add_argument("--no-analyze", action="store_true", help="time kwire sql and DuckDB only")
    parser.add_argument("--warm", action="store_true", help="also time both commands on a warm server")
    parser.add_argument(
        "--synthetic",
        type=int,
        default=0,
        metavar="N",
        help="no DATASET: synthesize N exchanges (not the demo)",
    )
    args = parser.parse_args(argv)
    if args.dataset is not None and args.synthetic:
        parser.error("give a DATASET or --synthetic N, not both")
    with tempfile.TemporaryDirectory(prefix="kwire-bench-") as tmp:
        dataset = args.dataset
        if dataset is None and args.synthetic:
            sys.path.insert(0, str(ROOT / "bench"))
            from analyze_scale import synthesize

            dataset = Path(tmp) / f"synthetic-{args.synthetic}.kwire"
            synthesize(dataset, args.synthetic)
        elif dataset is None:
            dataset = Path(tmp) / "demo.kwire"
            _timed([*KWIRE, "decode", str(ROOT / "captures" / "tansu-mixed.pcap"), "-o", str(dataset)])
        load = os.getloadavg()
        print(f"dataset {dataset}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        figures: dict[str, list[float]] = {"kwire sql": [], "duckdb": []}
        if not args.no_analyze:
            figures["kwire analyze"] = []
        for run in range(args.runs):
            if not args.no_analyze:
                out = Path(tmp) / f"report-{run}"
                figures["kwire analyze"].append(
                    _timed([*KWIRE, "analyze", str(dataset), "-o", str(out), "--local"])
                )
            figures["kwire sql"].append(_timed([*KWIRE, "sql", str(dataset), args.query, "--local"]))
            figures["duckdb"].append(_duckdb(dataset, args.query))
            print(" ".join(f"{k}={v[-1]:.2f}s" for k, v in figures.items()), flush=True)
        if args.warm:
            _warm(dataset, Path(tmp), args.runs, args.query, figures)
        for name, times in figures.items():
            print(_line(name, times))
        sql_median = statistics.median(figures["kwire sql"])
        print(f"kwire sql / duckdb (median): {sql_median / statistics.median(figures['duckdb']):.0f}x")
        load = os.getloadavg()
        print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
