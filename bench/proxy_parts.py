"""Where ``kwire proxy``'s event loop spends its time per exchange, part by part, under issue 18's
200-connection load.

    python bench/proxy_parts.py [--variants bare,bare-busy,bare-polite,kwire,no-recorder,no-decode,no-writer,
                                            no-metrics,no-rewrite,no-skim,passthru]
                                [--rounds 3] [--conns 200] [--rate 10] [--seconds 8] [--busy-duty 0.15]

Each variant is ``kwire proxy`` (recording on, as in ``bench/proxy_overhead.py``) with one part
replaced by a no-op in its own process, so what a part costs *in place* (amid the loop's other
work, its caches cold) is the difference to ``kwire``; profiles and in-process loops (a hot cache)
put the whole session path at a fifth of what it costs in place:

* ``bare``: ``bench/asyncio_forwarder.py``, the floor for a Python asyncio forwarder;
* ``bare-busy``: ``bare`` with a process beside it that only spins, under ``SCHED_IDLE`` as the
  recorder process runs, for ``--busy-duty`` of every 20 ms (its CPU in the ``worker us``
  column). It touches no memory and makes no system call: what any recorder that takes that much
  CPU beside the loop does to the tail, whatever its work;
* ``bare-polite``: ``bare-busy`` whose spinner looks at the CPUs every 0.25 ms and sleeps 1 ms
  while other tasks wait for one (``proxy.contention``: what the recorder process does);
* ``kwire``: the proxy as it ships;
* ``no-recorder``: chunks are not handed to the recorder process (which then idles);
* ``no-decode``: the recorder process gets every chunk, as shipped, and drops it unread (its
  pipe and batching stay; its decoding, rows and writing go);
* ``no-writer``: the recorder process decodes and makes rows and metrics, but writes no file;
* ``no-metrics``: no counters, no per-request client-id counting;
* ``no-skim``: no chunk is looked at for large record frames to send as skeletons
  (``proxy.skim``): every chunk goes to the recorder as it came;
* ``no-rewrite``: responses are not rewritten (the load's raw clients never follow the
  addresses Metadata gives, so the load is unchanged);
* ``passthru``: the session forwards each chunk as it comes: no framing, no request
  bookkeeping, no recording, no metrics. What is left is kwire's connection handling.

For each variant and round (interleaved, the order rotating): a fresh Tansu broker, an unmeasured
warm-up load, then the measured load (``tests/proxy_load.py``: raw connections, one ApiVersions or
Metadata request at a time each, ``--rate`` a second). Printed: the forwarding process's CPU per
exchange (its main thread: the event loop), the recorder process's, and the load's round-trip
p50/p99; then each column's median. CPU per exchange is the steady figure on this shared 2-core
machine; the p99 column swings with the machine's load (printed per round).

A variant is made by ``--launch VARIANT -- ARGS``: this script patches the part, then runs
``kwire proxy ARGS`` in the same process (a benchmark device; the product has no such switches).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from proxy_overhead import BenchPath, _stat_fields, cpu_seconds, many_connections  # noqa: E402

VARIANTS = (
    "bare",
    "bare-busy",
    "bare-polite",
    "kwire",
    "no-recorder",
    "no-decode",
    "no-writer",
    "no-metrics",
    "no-rewrite",
    "no-skim",
    "passthru",
)


def _patch(variant: str) -> None:
    """Replace the part ``variant`` names with a no-op (in this process, before the proxy starts)."""
    from proxy import metrics, recorder_worker, session

    if variant in ("no-recorder", "passthru"):
        recorder_worker.RecorderProcess.data = lambda self, *args: None  # type: ignore[method-assign]
        recorder_worker.RecorderProcess.catch_up = lambda self: None  # type: ignore[method-assign]
    if variant in ("no-decode", "no-writer"):
        flag = "--worker-" + variant
        popen = recorder_worker.subprocess.Popen

        def worker(command: Any, *args: Any, **kwargs: Any) -> Any:
            # python -m proxy.recorder_worker FDS... -> this script's --worker-VARIANT FDS...
            if isinstance(command, list) and command[1:3] == ["-m", "proxy.recorder_worker"]:
                command = [command[0], str(Path(__file__).resolve()), flag, *command[3:]]
            return popen(command, *args, **kwargs)

        recorder_worker.subprocess.Popen = worker  # type: ignore[assignment]
    if variant == "worker-no-writer":
        from proxy import recorder

        init = recorder.Recorder.__init__

        def no_writer(self: Any, out_dir: Any, *args: Any, **kwargs: Any) -> None:
            init(self, None, *args, **kwargs)

        recorder.Recorder.__init__ = no_writer  # type: ignore[method-assign]
    if variant == "worker-no-decode":
        from proxy import recorder

        recorder.Recorder.data = lambda self, *args: None  # type: ignore[method-assign]
    if variant == "no-metrics":
        for name in ("add", "count_request", "bump"):
            setattr(metrics.Metrics, name, lambda self, *args: None)
    if variant == "no-skim":
        from proxy import skim

        skim.FrameSkim.feed = lambda self, direction, data, ts_ns: None  # type: ignore[method-assign]
    if variant == "no-rewrite":
        session.Session._rewritten = lambda self, frame, entry: frame  # type: ignore[method-assign]
    if variant == "passthru":

        def from_client(self: session.Session, data: bytes) -> None:
            if self.c_backlog is not None:  # upstream still connecting: held as kwire holds it
                self.c_backlog.append((data, 0))
                self.c_backlog_bytes += len(data)
            else:
                self.up.write(data)

        session.Session.from_client = from_client  # type: ignore[method-assign]
        session.Session._from_client = lambda self, data, ts: self.up.write(data)  # type: ignore[method-assign]
        session.Session.from_upstream = lambda self, data: self.cl.write(data)  # type: ignore[method-assign]


def _loop_seconds(pid: int) -> float:
    """CPU of ``pid``'s own threads (not its children): the forwarding process."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Variant(BenchPath):
    """``BenchPath`` for ``asyncio`` (bare), or ``kwire proxy`` launched through ``_patch``."""

    def __init__(self, variant: str, workdir: Path, tag: str) -> None:
        self.variant = variant
        super().__init__("asyncio" if variant.startswith("bare") else "kwire", workdir, tag)

    def _launcher(self, mode: str) -> list[str] | None:
        if self.variant == "kwire":
            return None
        return [sys.executable, str(Path(__file__).resolve()), "--launch", self.variant, "--"]


def _spin(duty: float, seconds: float, polite: bool = False) -> int:
    """The ``bare-busy`` neighbour: spin ``duty`` of every 20 ms under ``SCHED_IDLE``, then sleep.
    ``polite`` (``bare-polite``): every ``_POLITE_EVERY`` of spinning, sleep 1 ms while other tasks
    wait for a CPU (``proxy.contention``, as the recorder process does), without a budget."""
    from proxy.contention import CpuContention

    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    contention = CpuContention()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        while time.perf_counter() - start < 0.02 * duty:
            stretch = time.perf_counter()
            while time.perf_counter() - stretch < _POLITE_EVERY:
                pass
            if polite and contention.waiting():
                time.sleep(0.001)
        time.sleep(0.02 * (1 - duty))
    return 0


#: How long the ``bare-polite`` spinner spins between two looks at the CPUs.
_POLITE_EVERY = 0.00025


def measure(variant: str, workdir: Path, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    path = _Variant(variant, workdir, tag)
    busy = None
    try:
        assert path.pid is not None
        many_connections(path.bootstrap, args.conns, args.rate, 2.0)  # warm-up, unmeasured
        if variant in ("bare-busy", "bare-polite"):
            command = [sys.executable, str(Path(__file__).resolve()), "--spin", str(args.busy_duty)]
            command += ["--polite"] if variant == "bare-polite" else []
            busy = subprocess.Popen([*command, str(args.seconds + 30)])
        loop0, all0 = _loop_seconds(path.pid), cpu_seconds(path.pid)
        busy0 = cpu_seconds(busy.pid) if busy else 0.0
        out = many_connections(path.bootstrap, args.conns, args.rate, args.seconds)
        loop = _loop_seconds(path.pid) - loop0
        kids = cpu_seconds(path.pid) - all0 - loop  # the recorder process
        if busy is not None:
            kids = cpu_seconds(busy.pid) - busy0
    finally:
        if busy is not None:
            busy.kill()
            busy.wait(10)
        path.stop()
    n = max(out["many_answered"], 1)
    return {
        "loop_us": 1e6 * loop / n,
        "worker_us": 1e6 * kids / n,
        "p50_ms": out["many_p50_ms"],
        "p99_ms": out["many_p99_ms"],
        "answered": out["many_answered"],
    }


def _line(name: str, row: dict[str, Any]) -> str:
    return (
        f"{name:<12} {row['loop_us']:>9.1f} {row['worker_us']:>10.1f} {row['p50_ms']:>8.2f} "
        f"{row['p99_ms']:>8.2f} {row['answered']:>9.0f}"
    )


HEADER = f"{'variant':<12} {'loop us':>9} {'worker us':>10} {'p50 ms':>8} {'p99 ms':>8} {'answered':>9}"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("--worker-no-decode", "--worker-no-writer"):
        _patch(sys.argv[1][2:])
        from proxy import recorder_worker

        return recorder_worker.main(sys.argv[2:])
    if len(sys.argv) > 3 and sys.argv[1] == "--spin":
        return _spin(float(sys.argv[2]), float(sys.argv[-1]), "--polite" in sys.argv)
    if len(sys.argv) > 2 and sys.argv[1] == "--launch":
        _patch(sys.argv[2])
        from kwire.cli import app

        sys.argv = ["kwire", *sys.argv[4:]]
        app()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conns", type=int, default=200)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--busy-duty", type=float, default=0.15, help="bare-busy: the spinning share of each 20 ms"
    )
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    workdir = Path(tempfile.mkdtemp(prefix="kwire-parts-"))
    try:
        for i in range(args.rounds):
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            load = os.getloadavg()[0]
            started = time.monotonic()
            for v in order:
                rows[v].append(measure(v, workdir, f"{v}-{i}", args))
            print(
                f"round {i + 1}/{args.rounds}: load average {load:.2f} at its start, "
                f"{os.getloadavg()[0]:.2f} at its end, {time.monotonic() - started:.0f} s"
            )
            print(HEADER)
            for v in variants:
                print(_line(v, rows[v][-1]))
            sys.stdout.flush()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"median of {args.rounds} rounds")
    print(HEADER)
    for v in variants:
        print(_line(v, {k: statistics.median(r[k] for r in rows[v]) for k in rows[v][0]}))
    if "kwire" in rows and "bare" in rows:
        base = statistics.median(r["loop_us"] for r in rows["bare"])
        whole = statistics.median(r["loop_us"] for r in rows["kwire"]) - base
        print(f"kwire's loop over the bare forwarder's: {whole:.1f} us per exchange")
        for v in variants:
            if v not in ("bare", "bare-busy", "kwire"):
                saved = statistics.median(r["loop_us"] for r in rows["kwire"]) - statistics.median(
                    r["loop_us"] for r in rows[v]
                )
                print(f"  {v}: {saved:.1f} us less")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
