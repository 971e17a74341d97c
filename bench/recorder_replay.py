"""The proxy's recorder process, replayed: its CPU per exchange on a recorded input, stage by stage.

    python bench/recorder_replay.py record FILE [--conns 200] [--rate 10] [--seconds 10]
    python bench/recorder_replay.py replay FILE [--repeat 3] [--cprofile N]

Under issue 18's 200-connection load the recorder process's CPU beside the forwarding loop is
what makes the loop's latency tail (README, "Any CPU beside the loop makes the tail"), and that
CPU swings with the machine's load when measured live. This measures it steadily:

* ``record`` runs a Tansu broker and ``kwire proxy -o`` (launched through this script so that
  its recorder process also appends every message it reads from its pipe to FILE), and the
  many-connections load of ``bench/proxy_overhead.py`` (``tests/proxy_load.py``) through it;
* ``replay`` feeds FILE's messages again and prints CPU microseconds per exchange (minimum and
  median of ``--repeat`` runs) of, in this process (all threads, caches warm): decoding alone
  (``KafkaConnection`` fed as the recorder feeds it), with rows (``kwire.rows.ExchangeRows``),
  the whole ``proxy.recorder.Recorder`` fed as the worker feeds it without a writer, and with
  its Parquet writer; then of a real recorder process (``python -m proxy.recorder_worker``)
  sent the messages down its pipe at the pace they were recorded, as a long-running proxy's:
  its warm-up (the first fifth) and its end left out. That last line is the one to compare
  between versions.

``--cprofile N`` also prints the top N functions of one whole replay by own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import fcntl
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from proxy.recorder_worker import _DATA, _GAP, _OPEN  # noqa: E402 - after the path setup

# ---- record ----------------------------------------------------------------------------------


def _tap_worker(path: str, argv: list[str]) -> int:
    """The recorder worker, appending each message it reads (settings first) to ``path``."""
    from proxy import recorder_worker

    taken = recorder_worker._Inbox.messages
    out = open(path, "ab")  # noqa: SIM115 - open for the worker's life

    def tapped(inbox: Any) -> list[Any]:
        messages = taken(inbox)
        for message in messages:
            out.write(recorder_worker._frame(message))
        out.flush()
        return messages

    recorder_worker._Inbox.messages = tapped  # type: ignore[method-assign]
    return recorder_worker.main(argv)


def _launch_tapped(path: str, argv: list[str]) -> int:
    """``kwire proxy ARGV`` whose recorder process runs ``_tap_worker``."""
    from proxy import recorder_worker

    popen = recorder_worker.subprocess.Popen

    def worker(command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, list) and command[1:3] == ["-m", "proxy.recorder_worker"]:
            command = [command[0], str(Path(__file__).resolve()), "--worker-tap", path, *command[3:]]
        return popen(command, *args, **kwargs)

    recorder_worker.subprocess.Popen = worker  # type: ignore[assignment]
    from kwire.cli import app

    sys.argv = ["kwire", *argv]
    app()
    return 0


def record(path: Path, conns: int, rate: float, seconds: float) -> None:
    from proxy_overhead import BenchPath, many_connections

    class _Tapped(BenchPath):
        def _launcher(self, mode: str) -> list[str] | None:
            return [sys.executable, str(Path(__file__).resolve()), "--launch-tap", str(path), "--"]

    path.unlink(missing_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="kwire-replay-"))
    try:
        bench = _Tapped("kwire", workdir, "tap")
        try:
            out = many_connections(bench.bootstrap, conns, rate, seconds)
        finally:
            bench.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB, {out['many_answered']} answered through the proxy")


# ---- replay ----------------------------------------------------------------------------------


def load(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """The settings and the batches of items a recorded worker read."""
    from proxy.recorder_worker import _frames

    messages = _frames(bytearray(path.read_bytes()))
    return messages[0], messages[1:]


def _cpu() -> float:
    return time.process_time()


def replay_recorder(settings: dict[str, Any], batches: list[Any], out_dir: Path | None) -> tuple[float, int]:
    """CPU seconds (all threads) of a ``Recorder`` fed ``batches`` as the worker feeds it, to the end."""
    from proxy.metrics import Metrics
    from proxy.recorder import Recorder
    from proxy.recorder_worker import _BudgetView, _feed, item_calls

    settings = dict(settings)
    settings.pop("out_dir")
    budget = _BudgetView(settings.pop("budget_limit"))
    settings["max_lag_seconds"] = 1e9  # replayed long after: never "behind"
    recorder = Recorder(None if out_dir is None else str(out_dir), Metrics(), budget=budget, **settings)
    start = _cpu()  # after pyarrow's first conversion, which the Recorder makes at once
    calls = item_calls(recorder)
    for batch in batches:
        _feed([batch], budget, calls)
        recorder._process(None)
        recorder._maybe_flush()
    asyncio.run(recorder.stop())
    return _cpu() - start, recorder.rows_total


def replay_decoding(batches: list[Any], with_rows: bool) -> tuple[float, int]:
    """CPU seconds of the connections' decoders alone (and the rows of their events)."""
    from decoder.connection import KafkaConnection
    from kwire.rows import ExchangeRows

    conns: dict[int, Any] = {}
    rows = 0
    start = _cpu()
    for _others, items in batches:
        for item in items:
            kind = item[0]
            if kind == _OPEN:
                conns[item[1]] = (KafkaConnection(), ExchangeRows(item[2]) if with_rows else None)
            elif kind == _DATA:
                decoder, builder = conns[item[1]]
                decoder.receive_data(item[2], item[3], item[4])
                for event in decoder.events():
                    if builder is not None and builder.row(event) is not None:
                        rows += 1
            elif kind == _GAP:
                decoder, _ = conns[item[1]]
                decoder.receive_gap(item[2], item[3], item[4])
    return _cpu() - start, rows


def _batch_ns(batch: Any, last: int) -> int:
    for item in batch[1]:
        if item[0] == _DATA:
            return item[4]
    return last


def _exchanges(batches: list[Any]) -> int:
    return sum(1 for _others, items in batches for item in items if item[0] == _DATA) // 2


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replay_worker(settings: dict[str, Any], batches: list[Any], out_dir: Path, paced: bool = True) -> float:
    """CPU microseconds per exchange the recorder process itself (``python -m
    proxy.recorder_worker``) spends on ``batches`` sent down its pipe at the pace they were
    recorded, as a long-running proxy's would: the first fifth warms it up (its protocol tables
    are compiled on first use, as after the benchmarks' warm-up load) and its end (the last
    files, the interpreter's exit) is left out."""
    from proxy.recorder_worker import _PIPE_BYTES, _frame

    to_read, to_worker = os.pipe()
    from_worker, to_write = os.pipe()
    for fd in (to_worker, from_worker):  # as the proxy sizes them
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    command = [sys.executable, "-m", "proxy.recorder_worker", str(to_read), str(to_write), str(os.getpid())]
    proc = subprocess.Popen(command, pass_fds=(to_read, to_write), stdin=subprocess.DEVNULL, cwd=ROOT)
    os.close(to_read)
    os.close(to_write)
    ready = threading.Event()

    def reports() -> None:  # read (and drop) its reports, so it never blocks on them
        while os.read(from_worker, 1 << 16):
            ready.set()

    reader = threading.Thread(target=reports, daemon=True)
    reader.start()
    with os.fdopen(to_worker, "wb") as pipe:
        pipe.write(_frame({**settings, "out_dir": str(out_dir), "max_lag_seconds": 1e9}))
        pipe.flush()
        if not ready.wait(120):
            raise RuntimeError("the recorder process did not report ready")
        warm = len(batches) // 5
        before = 0.0
        first = _batch_ns(batches[0], 0)
        last = first
        started = time.monotonic()
        for i, batch in enumerate(batches):
            if i == warm:
                time.sleep(0.5)  # (the warm-up worked off)
                started += 0.5
                before = _process_cpu(proc.pid)
            last = _batch_ns(batch, last)
            wait = started + (last - first) / 1e9 - time.monotonic()
            if wait > 0 and paced:
                time.sleep(wait)
            pipe.write(_frame(batch))
            pipe.flush()
        time.sleep(1.0)  # (the last batches worked off)
        after = _process_cpu(proc.pid)
    _, status, _usage = os.wait4(proc.pid, 0)
    reader.join(10)
    os.close(from_worker)
    if status != 0:
        raise RuntimeError(f"the recorder process failed (status {status})")
    return 1e6 * (after - before) / _exchanges(batches[warm:])


def replay(path: Path, repeat: int, top: int) -> None:
    from kwire.runtime import tune_gc

    tune_gc()  # as the recorder process runs
    settings, batches = load(path)
    exchanges = _exchanges(batches)
    print(f"{path}: {len(batches)} batches, about {exchanges} exchanges (data items / 2)")
    workdir = Path(tempfile.mkdtemp(prefix="kwire-replay-"))
    try:
        results: dict[str, list[float]] = {}  # us per exchange, per run
        for i in range(repeat):
            seconds, rows = replay_decoding(batches, True)
            alone, _ = replay_decoding(batches, False)
            results.setdefault("decode", []).append(1e6 * alone / rows)
            results.setdefault("decode + rows", []).append(1e6 * seconds / rows)
            seconds, rows = replay_recorder(settings, batches, None)
            results.setdefault("recorder", []).append(1e6 * seconds / rows)
            out = workdir / f"out-{i}"
            seconds, rows = replay_recorder(settings, batches, out)
            results.setdefault("recorder + writer", []).append(1e6 * seconds / rows)
            shutil.rmtree(out, ignore_errors=True)
            results.setdefault("recorder process", []).append(replay_worker(settings, batches, out))
            shutil.rmtree(out, ignore_errors=True)
        print(f"CPU us per exchange, {repeat} runs: min, median")
        for name, values in results.items():
            print(f"  {name:<20} {min(values):7.1f} {statistics.median(values):7.1f}")
        if top:
            profile = cProfile.Profile()
            profile.enable()
            replay_recorder(settings, batches, workdir / "profiled")
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(top)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker-tap":
        return _tap_worker(sys.argv[2], sys.argv[3:])
    if len(sys.argv) > 3 and sys.argv[1] == "--launch-tap":
        return _launch_tapped(sys.argv[2], sys.argv[4:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("file", type=Path)
    rec.add_argument("--conns", type=int, default=200)
    rec.add_argument("--rate", type=float, default=10.0)
    rec.add_argument("--seconds", type=float, default=10.0)
    rep = sub.add_parser("replay")
    rep.add_argument("file", type=Path)
    rep.add_argument("--repeat", type=int, default=3)
    rep.add_argument("--cprofile", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if args.command == "record":
        record(args.file, args.conns, args.rate, args.seconds)
    else:
        replay(args.file, args.repeat, args.cprofile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
