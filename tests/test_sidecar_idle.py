"""Idle sidecars sleep: with no traffic, ``kwire proxy -o`` (both its processes) and ``kwire
capture`` wake about once a second, not on a fixed fast tick.

Before, the proxy's recorder process reported to the proxy every 0.1 s whether or not anything
had changed, which woke both processes ten times a second (5.4 and 5.6 ms of CPU a second idle on
this project's 2-core VM), and ``kwire capture`` polled its reading thread and its recorder every
0.5 s (six wake-ups a second, 4.9 ms of CPU). Counted here as the kernel's count of times each
process's threads were scheduled (``/proc/PID/task/*/schedstat``), which for a process with
nothing to do is its wake-ups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from realkafka import free_port

ROOT = Path(__file__).resolve().parents[1]
#: Wake-ups a second an idle sidecar process may take (measured 1.0-1.9; 6-12 before).
MOST_WAKEUPS_A_SECOND = 4.0
SETTLE_S, WINDOW_S = 3.0, 4.0

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/schedstat").exists(), reason="needs Linux's schedstat"
)


def _scheduled(pid: int) -> int:
    """How many times the threads of ``pid`` have been put on a CPU so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[2])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def _wakeups_a_second(pids: list[int]) -> dict[int, float]:
    before = {pid: _scheduled(pid) for pid in pids}
    time.sleep(WINDOW_S)
    return {pid: (_scheduled(pid) - before[pid]) / WINDOW_S for pid in pids}


def _start(args: list[str], log: Path, ready: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kwire", *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )
    deadline = time.monotonic() + 60
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"kwire {args[0]} did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    time.sleep(SETTLE_S)  # the start's own work (imports, the recorder's first conversion) done
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_an_idle_recording_proxy_sleeps(tmp_path: Path) -> None:
    port = free_port()
    proc = _start(
        ["proxy", "-b", "127.0.0.1:1", "--listen", f"127.0.0.1:{port}", "--broker-port-base", "0",
         "-o", str(tmp_path / "out")],
        tmp_path / "proxy.log",
        "kwire proxy: listening on",
    )  # fmt: skip
    try:
        workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(workers) == 1, workers  # the recorder process
        rates = _wakeups_a_second([proc.pid, *workers])
    finally:
        _stop(proc)
    assert proc.returncode == 0, (tmp_path / "proxy.log").read_text(errors="replace")[-2000:]
    assert all(rate <= MOST_WAKEUPS_A_SECOND for rate in rates.values()), rates


def test_an_idle_capture_sidecar_sleeps(tmp_path: Path) -> None:
    port = free_port()  # a port nothing talks on: tcpdump hands kwire no packet
    proc = _start(
        ["capture", "-i", "lo", "--port", str(port), "-o", str(tmp_path / "out")],
        tmp_path / "capture.log",
        "kwire capture: recording lo",
    )
    try:
        rate = _wakeups_a_second([proc.pid])[proc.pid]
    finally:
        _stop(proc)
    assert rate <= MOST_WAKEUPS_A_SECOND, (
        rate,
        (tmp_path / "capture.log").read_text(errors="replace")[-2000:],
    )
