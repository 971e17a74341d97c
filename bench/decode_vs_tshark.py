"""Benchmark: ``kwire decode`` against tshark's Kafka dissector on real captures, in the same run.

    python bench/decode_vs_tshark.py [--only bulk,chatty,batch2mb] [--bulk FILE] [--chatty FILE]
                                     [--batch2mb FILE] [--repeat 3] [--jobs N] [--json FILE]

The captures are real traffic made by ``bench/decode_captures.py`` (real clients, a Tansu broker,
tcpdump on lo) and kept in ``.cache/bench`` (recorded on first use, reused afterwards):

* bulk: ordinary bulk traffic, one confluent-kafka producer on one busy connection, 100 records
  of 200 B per batch, linger 5 ms (about 1.25 GB, 60k Produce requests of 20 kB);
* chatty: many small requests: two producers sending one record per Produce request, a consumer
  fetching with a 1 ms wait, and a client asking for Metadata every 5 ms (about 80k exchanges);
* batch2mb: two aiokafka producers with batches up to 1 MB (about 2 MB requests): the case that
  flatters kwire, kept for comparison.

Each capture is decoded by ``kwire decode FILE -o DIR --overwrite --quiet`` and by ``tshark -r FILE
-d tcp.port==PORT,kafka -T fields -e kafka.request_key -e kafka.response_key -e
kafka.correlation_id -e kafka.error``, alternately, ``--repeat`` times each, every run a child
process timed on its own: wall time, CPU time (children included) and peak RSS of the biggest process
(``wait4``). The peak of kwire's worker processes' summed PSS (``/proc/*/smaps_rollup``, sampled
every 20 ms) is taken in one more kwire run of its own, not in the timed ones: reading a
process's smaps_rollup walks its page tables under its memory lock, and sampled that way tshark
(1.4 GB RSS on bulk) took 9.1-10.0 s against 7.6 s alone (``farm-bench``, 2026-12-06), which
made kwire's ratio 5.0-5.8x where it was 4.6x. The kwire/tshark ratio is taken run pair by run
pair and the median printed, so a machine whose speed drifts during the run still compares fairly
(the capture is read once first, so both tools read it from the page cache).
Targets (issue 22): >= 5x tshark's speed on bulk, >= 3x on chatty, peak RSS <= 500 MB. tshark 4.0
lacks the Produce/Fetch versions confluent-kafka speaks (v10+/v16): it reads their headers and
skips their bodies, which only makes it faster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import decode_captures  # noqa: E402 - bench/ is the script's own folder

KINDS = ("bulk", "chatty", "batch2mb")
TARGETS: dict[str, float | None] = {"bulk": 5.0, "chatty": 3.0, "batch2mb": None}
RSS_LIMIT_MB = 500


# ---------------------------------------------------------------------------------------------------------
# timing


@dataclass
class Run:
    wall: float
    cpu: float  # user + system, the process and its children
    rss_mb: float  # peak RSS of the biggest single process (wait4)
    total_rss_mb: (
        float  # peak memory of the process and its children together (summed PSS, sampled every 20 ms)
    )
    returncode: int


def _tree_rss_kb(root: int) -> int:
    """Summed proportional set size (PSS) of `root` and its descendants, from /proc (the tree
    through each process's ``task/*/children``, rather than every process's ``stat``)."""
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
    total = 0
    for pid in tree:  # PSS: pages shared by forked workers counted once, not once per process
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except OSError:
            pass
    return total


def timed(command: list[str], stdout: int | None = subprocess.DEVNULL, sample: bool = False) -> Run:
    """Run `command` as a child: its wall time, CPU time (children included) and peak RSS; with
    `sample`, also the peak summed PSS of its process tree (which slows what it samples)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE)
    peak_total = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG if sample else 0)
        if pid:
            break
        peak_total = max(peak_total, _tree_rss_kb(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.stderr is not None:
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        if proc.returncode:
            print(f"  {' '.join(command[:3])} ... exited {proc.returncode}: {err.strip()[-500:]}")
    peak = usage.ru_maxrss / 1024
    return Run(wall, usage.ru_utime + usage.ru_stime, peak, peak_total / 1024 or peak, proc.returncode)


def broker_port(path: Path) -> int:
    """The broker's port: the destination port of the capture's first SYN (or first packet)."""
    from decoder.pcap import SYN, iter_segments

    first = None
    for seg in iter_segments(path):
        first = first or seg
        if seg.flags & SYN and not seg.flags & 0x10:
            return seg.dst_port
    assert first is not None, f"{path} holds no TCP"
    return min(first.src_port, first.dst_port)


def frame_count(dataset: Path) -> tuple[int, int]:
    """(Kafka frames, exchange rows) in a kwire dataset."""
    import pyarrow.dataset as ds

    connections = (
        ds.dataset(dataset / "connections", format="parquet", partitioning="hive")
        .to_table(columns=["frames_to_broker", "frames_to_client"])
        .to_pylist()
    )
    frames = sum((c["frames_to_broker"] or 0) + (c["frames_to_client"] or 0) for c in connections)
    exchanges = ds.dataset(dataset / "exchanges", format="parquet", partitioning="hive").count_rows()
    return frames, exchanges


def _figures(run: Run, frames: int, size_mb: float) -> dict[str, Any]:
    return {
        "wall_s": round(run.wall, 2),
        "cpu_s": round(run.cpu, 2),
        "rss_mb": round(run.rss_mb),
        "total_rss_mb": round(run.total_rss_mb),
        "frames_per_s": round(frames / run.wall),
        "mb_per_s": round(size_mb / run.wall, 1),
        "exit": run.returncode,
    }


def compare(kind: str, path: Path, work: Path, jobs: int | None, repeat: int) -> dict[str, Any]:
    """Decode `path` with kwire and tshark, alternately, `repeat` times each; medians and ratios."""
    size_mb = path.stat().st_size / 1e6
    port = broker_port(path)
    kwire = [str(REPO / ".venv" / "bin" / "kwire")]
    if not Path(kwire[0]).exists():
        kwire = [sys.executable, "-m", "kwire.cli"]
    out = work / f"{kind}.kwire"
    command = [*kwire, "decode", str(path), "-o", str(out), "--overwrite", "--quiet"]
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    tshark = shutil.which("tshark")
    tshark_command = [tshark or "tshark", "-r", str(path), "-d", f"tcp.port=={port},kafka", "-T", "fields"]
    for field in ("kafka.request_key", "kafka.response_key", "kafka.correlation_id", "kafka.error"):
        tshark_command += ["-e", field]
    with open(path, "rb") as f:  # into the page cache first, so that neither tool's first run reads the disk
        while f.read(16 << 20):
            pass
    kw_runs: list[Run] = []
    ts_runs: list[Run] = []
    for _ in range(repeat):
        kw_runs.append(timed(command))
        if tshark:
            ts_runs.append(timed(tshark_command))
    frames, exchanges = frame_count(out)

    def median(runs: list[Run]) -> Run:
        return sorted(runs, key=lambda r: r.wall)[len(runs) // 2]

    kw = median(kw_runs)
    result: dict[str, Any] = {
        "capture": str(path),
        "size_mb": round(size_mb, 1),
        "broker_port": port,
        "frames": frames,
        "exchanges": exchanges,
        "runs": repeat,
        "kwire": _figures(kw, frames, size_mb),
    }
    # memory: the worst of the runs, not the median's; the summed PSS from a run of its own
    sampled = timed(command, sample=True)
    result["kwire"]["rss_mb"] = round(max(r.rss_mb for r in [*kw_runs, sampled]))
    result["kwire"]["total_rss_mb"] = round(sampled.total_rss_mb)
    if ts_runs:
        result["tshark"] = _figures(median(ts_runs), frames, size_mb)
        # pair by pair: run i of kwire against run i of tshark, made one after the other
        walls = [t.wall / k.wall for k, t in zip(kw_runs, ts_runs, strict=True)]
        cpus = [t.cpu / k.cpu for k, t in zip(kw_runs, ts_runs, strict=True)]
        result["ratio_wall"] = round(statistics.median(walls), 2)
        result["ratio_wall_min_max"] = [round(min(walls), 2), round(max(walls), 2)]
        result["ratio_cpu"] = round(statistics.median(cpus), 2)
    return result


def _line(kind: str, res: dict[str, Any]) -> str:
    kw, ts = res["kwire"], res.get("tshark")
    text = (
        f"{kind:8} {res['size_mb']:7.1f} MB {res['frames']:>8,} frames {res['exchanges']:>7,} exchanges | "
        f"kwire {kw['wall_s']:6.2f} s wall {kw['cpu_s']:6.2f} s CPU, peak {kw['rss_mb']} MB RSS "
        f"({kw['total_rss_mb']} MB PSS, all processes)"
    )
    if ts:
        text += (
            f" | tshark {ts['wall_s']:6.2f} s wall {ts['cpu_s']:6.2f} s CPU, {ts['rss_mb']} MB RSS"
            f" | kwire/tshark {res['ratio_wall']:.2f}x wall (pairs {res['ratio_wall_min_max'][0]:.2f}-"
            f"{res['ratio_wall_min_max'][1]:.2f}), {res['ratio_cpu']:.2f}x CPU"
        )
        target = TARGETS[kind]
        if target is not None:
            fast = "ok" if res["ratio_wall"] >= target else "MISSED"
            small = "ok" if kw["total_rss_mb"] <= RSS_LIMIT_MB else "MISSED"
            text += f" (target {target:.0f}x: {fast}; RSS <= {RSS_LIMIT_MB} MB: {small})"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for kind in KINDS:
        ap.add_argument(f"--{kind}", type=Path, help=f"use this capture as the {kind} one")
    ap.add_argument("--only", help=f"comma-separated cases to run (default: {','.join(KINDS)})")
    ap.add_argument(
        "--captures", type=Path, default=decode_captures.DEFAULT_DIR, help="where captures are kept"
    )
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--keep", action="store_true", help="keep the decoded datasets")
    ap.add_argument("--jobs", type=int, help="pass --jobs to kwire decode")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool (alternating); medians count")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    kinds = args.only.split(",") if args.only else list(KINDS)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"--only: unknown case(s) {', '.join(sorted(unknown))}")

    work = Path(tempfile.mkdtemp(prefix="kwire-bench-", dir=args.workdir))
    results: dict[str, object] = {"load_average": os.getloadavg()}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs", flush=True)
    try:
        for kind in kinds:
            path = getattr(args, kind) or decode_captures.ensure(kind, args.captures)
            res = compare(kind, path, work, args.jobs, args.repeat)
            results[kind] = res
            print(_line(kind, res), flush=True)
        results["load_average_after"] = os.getloadavg()
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
