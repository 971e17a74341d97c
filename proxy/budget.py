"""One memory budget for everything the proxy holds beyond a read in flight (``--max-memory-mb``).

What it covers, across all connections: response frames held whole to rewrite broker
addresses, request frames held whole for fault rules, what a client sends while its upstream
connection is being made, the recorder's queue of chunks, and the partial frames its decoders
hold until they are complete. Each holder asks ``take(n)`` before it holds ``n`` more bytes
and ``give(n)`` once they are let go; when ``take`` says no, the holder does without:
frames are forwarded as they come, not held and not decoded (the recorder marks a gap), and
counted (``kwire_proxy_over_budget_frames_total``). So no input can push what is held past
the budget; RSS stays below it plus the fixed overhead of the process and of the reads in
flight (up to 1 MB per connection reading).

Thread-safe (a short lock), so callers off the event loop (embedders, tests) stay correct.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

__all__ = ["DEFAULT_MAX_MEMORY_MB", "MemoryBudget", "release_free_memory"]

#: ``--max-memory-mb`` default: sized for a sidecar.
DEFAULT_MAX_MEMORY_MB = 256


class MemoryBudget:
    """Bytes held against a fixed limit (``limit`` <= 0: no limit)."""

    __slots__ = ("_lock", "baseline_rss", "limit", "peak", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.baseline_rss = rss_bytes()  # the process before any traffic
        self._lock = threading.Lock()

    def rss_over(self, slack: int = 64 << 20) -> bool:
        """Whether RSS is past the baseline plus the budget plus ``slack`` (freed memory kept
        by malloc for reuse, piling up): time to hand it back."""
        return self.limit > 0 and rss_bytes() > self.baseline_rss + self.limit + slack

    def take(self, n: int, keep: int = 0) -> bool:
        """Hold ``n`` more bytes if they fit, leaving ``keep`` bytes of the budget free for
        others; False (nothing taken) if not. The recorder keeps a quarter for the forwarding
        path, so a recorder that falls behind cannot stop responses from being rewritten."""
        with self._lock:
            used = self.used + n
            if self.limit > 0 and used > self.limit - keep and n > 0:
                return False
            self.used = used
            if used > self.peak:
                self.peak = used
            return True

    def charge(self, n: int) -> None:
        """Hold ``n`` more bytes whether they fit or not (what cannot be let go, bounded elsewhere)."""
        with self._lock:
            self.used += n
            if self.used > self.peak:
                self.peak = self.used

    def give(self, n: int) -> None:
        """Let go of ``n`` bytes taken before."""
        with self._lock:
            self.used -= n

    def room(self) -> int:
        """Bytes that can still be taken (a large number when there is no limit)."""
        return self.limit - self.used if self.limit > 0 else 1 << 62


_libc: ctypes.CDLL | None = None
_last_release = 0.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def release_free_memory(min_interval: float = 5.0) -> bool:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim``), at most every
    ``min_interval`` seconds. ``tune_malloc`` keeps freed blocks for reuse while traffic
    flows; once it has ebbed, or when they pile up past the budget, this returns them, so
    RSS goes back down after a burst."""
    global _libc, _last_release
    now = time.monotonic()
    if now - _last_release < min_interval:
        return False
    _last_release = now
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)
        return bool(_libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
