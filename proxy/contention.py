"""Whether tasks wait for a CPU right now, so that background work can step aside for them.

The recorder process runs under ``SCHED_IDLE``, yet measured beside a bare forwarder at 200
connections (``bench/proxy_parts.py``, 2 cores), a neighbour that only spins 15% of every 20 ms
under ``SCHED_IDLE`` raised the load's p99 from 1.30 to 5.28 ms, and one that spins as much but
sleeps 1 ms whenever tasks wait for a CPU (this module's test) to 2.07 ms. Our reading of why,
not traced: the kernel preempts an idle-class task for a task that wakes on its CPU, but a task
already queued behind another on the second CPU waits there for the scheduler's balancing, ms
later, rather than moving to the CPU the idle-class task holds; a CPU that goes idle pulls it at
once.

The test is the kernel's count of runnable tasks (``/proc/loadavg``'s fourth field, its running
part: a 2 us ``pread``) above the CPUs: it counts the caller itself, so more than one per CPU
means someone waits. Where the file cannot be read, nobody ever waits.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CpuContention", "Deferral"]


class CpuContention:
    """``waiting()``: more tasks can run than there are CPUs (Linux); always False elsewhere."""

    def __init__(self, path: str = "/proc/loadavg", cpus: int | None = None) -> None:
        self.cpus = cpus or os.cpu_count() or 1
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open(path, os.O_RDONLY)

    def waiting(self) -> bool:
        """Whether more tasks are runnable than there are CPUs, this one included."""
        if self._fd is None:
            return False
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[3].split(b"/")[0]) > self.cpus
        except (OSError, IndexError, ValueError):
            self.close()
            return False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


@dataclass
class Deferral:
    """Steps aside while tasks wait for a CPU: ``pause()`` sleeps ``step`` seconds if they do,
    from an allowance that fills at ``share`` seconds a second up to ``burst`` seconds, each pause
    taking what it cost: the sleep and the wait to run again after it. So the work it defers is
    delayed by about ``burst`` at most at once and ``share`` of the time in the long run, however
    busy the machine stays. Pauses that take longer than ``saturated_after`` in all say the machine
    has no slack to give: once more than ``slow_share`` of the recent ones did (a moving share,
    the last pause weighing ``1 / slow_memory``), no pause for ``back_off`` seconds. (Counting the
    sleeps alone, an idle-class recorder on a saturated machine, which gets a CPU seldom, gave it
    up at every turn: it skipped 92-96% of a bulk load against 8-45% without pauses. On one slow
    pause, as before, it backed off too on a machine with slack: 1.1% of the pauses took over
    5 ms under ``bench/proxy_parts.py``'s 200 connections, 31% under a bulk load.)"""

    contention: CpuContention
    step: float
    share: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    saturated_after: float = 0.005
    slow_share: float = 0.15
    slow_memory: int = 16
    back_off: float = 1.0

    def __post_init__(self) -> None:
        # Two threads pause from one Deferral (the recorder's decoding and its writer), without a
        # lock: a lost update of the allowance is one pause's worth, which no bound here minds.
        self._allowance = self.burst
        self._filled = self.clock()
        self._untaken = 0.0  # given up since the last take
        self._slow = 0.0  # moving share of the pauses that took longer than saturated_after

    def pause(self) -> bool:
        """Sleep one step if tasks wait for a CPU and the allowance has it; whether it slept."""
        now = self.clock()
        self._allowance = min(self.burst, self._allowance + (now - self._filled) * self.share)
        self._filled = now
        if self._allowance < self.step - 1e-9 or not self.contention.waiting():  # (float sums)
            return False
        time.sleep(self.step)
        # what stepping aside cost: the sleep, and the wait for a CPU after it, which is long
        # for an idle-class process on a machine that stays busy
        spent = max(self.clock() - now, self.step)
        self._allowance -= spent
        self._untaken += spent
        slow = spent > self.saturated_after
        self._slow += (slow - self._slow) / self.slow_memory
        if slow and self._slow > self.slow_share:  # the machine is saturated: no slack to give
            self._allowance = min(self._allowance, -self.share * self.back_off)
        return True

    def pause_while_waiting(self) -> None:
        """Sleep while tasks wait for a CPU, within the allowance."""
        while self.pause():
            pass

    def take(self) -> float:
        """Seconds given up (sleeps and the waits after them) since the last call."""
        taken, self._untaken = self._untaken, 0.0
        return taken
