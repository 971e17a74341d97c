"""The proxy's recorder in a process of its own: the event loop only hands chunks over a pipe.

Decoding (``decoder.connection.KafkaConnection``), rows (``kwire.rows.ExchangeRows``) and the
Parquet writer (``kwire.dataset.DatasetWriter``) all run in ``proxy.recorder.Recorder``, the
same code the passive sidecar (``kwire capture``) runs in-process. Here that ``Recorder`` runs
in a worker process (``python -m proxy.recorder_worker``), so none of its CPU, and none of the
writer thread's hold on the GIL, lands on the forwarding loop. In the proxy's process, the
writer's dict-to-Arrow conversion and zstd cost ~25 us of CPU a row in a thread competing
with the loop for the GIL, and decoding was 11% of the loop: at 200 connections x 10
requests/s kwire added 15.8 ms to p50 where the bare asyncio forwarder added none (median of
3 rounds; issue 18). What it gives, and what it costs, is in the README's "Overhead".

What the loop does (``RecorderProcess``): ``open``/``data``/``gap``/``injected``/``close`` append
an item to a batch (the chunk object itself); every ``_SEND_SECONDS`` (``catch_up`` schedules
it; sooner once ``_SEND_BYTES`` wait) the batch is pickled and written to the worker's pipe,
non-blocking. What the pipe does not
take at once waits, and the bytes waiting are bounded (``max_queue_bytes``, and taken from the
memory budget): a chunk beyond that is sent as a gap (counted in ``dropped_bytes``), and the
worker's decoder resynchronises as after a lost packet, so rows never claim what it skipped.

What the worker does: reads batches as they come (reading goes before decoding, so the pipe
rarely fills), feeds them to its ``Recorder``, whose own bounds apply as in-process (its queue,
its lag, the rows pending for the writer; overflow is a gap), decodes in slices, and writes.
Every ``_REPORT_SECONDS`` (and when its queue runs empty) it sends back a report: the metric
deltas its rows made (latency histograms and error codes per api, already bounded to known
labels or ``other``; gap and drop counters; rows written, files rolled), its rows made, its
queue, and what it holds against the budget.

One memory budget (``proxy.budget``): the loop takes the bytes waiting for the pipe; the worker
runs its ``Recorder`` against a view of the same budget (``_BudgetView``): its limit, less what
the proxy itself holds (sent with every batch), and the worker reports what it holds, which
the proxy charges to its budget until the next report.

The worker dies with the proxy: it asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``, Linux), and it stops at the end of its input (the pipe's EOF: the proxy
stopped, or died where that signal is not available). So a SIGKILL of the proxy loses at most
the rows since the last roll, as before, and leaves no process behind. ``stop`` closes the
pipe; the worker decodes what is left, writes and rolls the last files, sends its last report
and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

from proxy.budget import MemoryBudget, release_free_memory
from proxy.metrics import Metrics

__all__ = ["RecorderProcess"]

log = logging.getLogger("kwire.proxy")

_OPEN, _DATA, _GAP, _INJECTED, _CLOSE = range(5)
_LENGTH = struct.Struct(">I")
#: The pipe's size asked of the kernel (Linux: ``F_SETPIPE_SZ``; the default is 64 KB).
_PIPE_BYTES = 1 << 20
#: How often the worker reports back (metric deltas, rows made, memory held).
_REPORT_SECONDS = 0.1
#: The worker's decoding slice between reads of its pipe.
_SLICE_SECONDS = 0.02
#: How long ``stop`` waits for the worker to write its last files before it kills it.
_STOP_SECONDS = 300.0
_PR_SET_PDEATHSIG = 1
#: How long chunks wait to be sent to the worker, and how many bytes of them are sent at the
#: end of the loop turn without waiting. A pipe write a loop turn (2,000-4,000 a second at 200
#: connections x 10 requests/s) took 14% of the loop's samples in a py-spy profile, as much as
#: its socket writes to clients: every write woke the worker. Rows carry the time a chunk was
#: read, not sent, so the wait changes no row.
_SEND_SECONDS = 0.01
_SEND_BYTES = 256 << 10
_NOW = object()
#: What the worker reads from its pipe before it decodes a slice.
_READ_BYTES = 8 << 20
#: The worker runs under ``SCHED_IDLE`` (Linux): on a busy machine the kernel runs the
#: forwarding loop (and the broker and clients beside it) first, and the loop, once woken,
#: preempts the worker at once; the worker takes the CPU left. When that is too little, it
#: falls behind and skips, counted, as any recorder that falls behind. At nice 10 (before), a
#: loop that woke while the worker ran waited for the worker's time slice to end: at 200
#: connections the recorder then added 6.8 ms to p99 where the bare forwarder added 0.8
#: (issue 18). Where ``SCHED_IDLE`` is not available, the worker runs at nice ``_NICE``.
_NICE = 19
#: After a quiet turn (a read of less than a quarter of the pipe), the worker lets the next
#: batches gather in its pipe for up to this long before it reads again, waking every
#: ``_GATHER_STEP`` to stop early once a quarter of the pipe waits (so the pipe never fills
#: meanwhile). Woken by each 10 ms batch, its caches cold each time, it used about twice the
#: CPU per exchange its work takes hot: replaying a recorded 200-connection load
#: (``bench/recorder_replay.py``, with the writer's whole row groups) it used 71.7 us per
#: exchange waking for every batch and 55.5 gathering for 0.25 s (medians of 4 runs; 0.5 s and
#: 1 s gained nothing more). Rows and metrics come that much later; the lag bound is 1 s or more.
_GATHER_SECONDS = 0.25
_GATHER_STEP = 0.025
#: The least lag the worker's ``Recorder`` allows before it skips (``max_lag_seconds``; half
#: the flush window otherwise, at most 5 s): a process of its own can be kept off a busy
#: machine's cores longer than a loop turn.
_MIN_LAG_SECONDS = 1.0


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


def _frames(buffer: bytearray) -> list[Any]:
    """The whole messages at the start of ``buffer`` (removed from it)."""
    out = []
    at = 0
    with memoryview(buffer) as view:
        while len(view) - at >= 4:
            (size,) = _LENGTH.unpack_from(view, at)
            if len(view) - at - 4 < size:
                break
            out.append(pickle.loads(view[at + 4 : at + 4 + size]))
            at += 4 + size
    del buffer[:at]
    return out


# ---- the proxy's side ------------------------------------------------------------------------


class RecorderProcess:
    """The forwarding path's recorder (same calls as ``proxy.recorder.Recorder``), feeding a
    worker process that runs the ``Recorder``. ``start`` on the event loop, ``await stop()``."""

    def __init__(
        self,
        out_dir: str | Path | None,
        metrics: Metrics,
        *,
        budget: MemoryBudget | None = None,
        max_queue_bytes: int = 64 << 20,
        **settings: Any,
    ) -> None:
        self.metrics = metrics
        self.budget = budget or MemoryBudget(0)
        self.max_queue_bytes = max_queue_bytes
        self._keep = self.budget.limit // 4  # of the budget, left to the forwarding path
        flush = settings.get("flush_seconds", 10.0)
        self._settings = {
            "out_dir": None if out_dir is None else str(out_dir),
            "max_queue_bytes": max_queue_bytes,
            "budget_limit": self.budget.limit,
            "max_lag_seconds": min(max(flush / 2, _MIN_LAG_SECONDS), 5.0),
            # no loop shares the worker's GIL: a row group converted at once costs half the CPU
            # of 64 rows at a time (17 against 34 us a row, 20,000 rows of a real capture)
            "convert_rows": None,
            **settings,
        }
        self._batch: list[tuple[Any, ...]] = []
        self._batch_bytes = 0  # chunk bytes in the batch (taken from the budget)
        self._out: list[tuple[memoryview, int]] = []  # messages the pipe has not taken, their chunk bytes
        self._waiting = 0  # chunk bytes in the batch and in ``_out``
        #: the send scheduled: a timer, ``_NOW`` (at the end of this turn), or None
        self._send_due: Any = None
        self._writer_on = False
        self._worker_held = 0  # what the worker reported holding, charged to the budget
        self._rss_check = 0.0
        self._reports = bytearray()
        self._proc: subprocess.Popen[bytes] | None = None
        self._to_worker = -1
        self._from_worker = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Future[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._dead = False
        self.rows_recorded = 0
        self.rows_total = 0
        self.worker_queue_bytes = 0

    # ---- called from the forwarding path (cheap, never blocks) --------------------------

    def open(self, key: int, info: Any, ts_ns: int) -> None:
        self._batch.append((_OPEN, key, info, ts_ns))

    def data(self, key: int, direction: int, data: bytes, ts_ns: int) -> None:
        size = len(data)
        if (
            not self._dead
            and self._waiting + size <= self.max_queue_bytes
            and self.budget.take(size, self._keep)
        ):
            self._waiting += size
            self._batch_bytes += size
            self._batch.append((_DATA, key, direction, data if type(data) is bytes else bytes(data), ts_ns))
        else:
            self.metrics.add("dropped_bytes", size)
            self._batch.append((_GAP, key, direction, size, ts_ns))

    def gap(self, key: int, direction: int, nbytes: int, ts_ns: int) -> None:
        self._batch.append((_GAP, key, direction, nbytes, ts_ns))

    def injected(self, key: int, correlation_id: int) -> None:
        self._batch.append((_INJECTED, key, correlation_id))

    def close(self, key: int, ts_ns: int, end_reason: str, stats: dict[str, Any]) -> None:
        self._batch.append((_CLOSE, key, ts_ns, end_reason, stats))
        self.catch_up()

    def catch_up(self) -> None:
        """Send what was queued ``_SEND_SECONDS`` from now, or at the end of this loop turn once
        it holds ``_SEND_BYTES`` (a write to the pipe is not one per read, nor one per turn)."""
        if not self._batch or self._loop is None:
            return
        if self._batch_bytes >= _SEND_BYTES:
            if self._send_due is not _NOW:
                if self._send_due is not None:
                    self._send_due.cancel()
                self._send_due = _NOW
                self._loop.call_soon(self._send)
        elif self._send_due is None:
            self._send_due = self._loop.call_later(_SEND_SECONDS, self._send)

    # ---- the pipe to the worker ---------------------------------------------------------

    async def start(self) -> None:
        """Start the worker and wait (bounded) until its ``Recorder`` is made: pyarrow's imports
        and first conversion (~1 s of CPU) are done before any traffic, as in-process."""
        self._loop = asyncio.get_running_loop()
        self._ended = self._loop.create_future()
        self._ready = self._loop.create_future()
        to_read, to_worker = os.pipe()
        from_worker, to_write = os.pipe()
        for fd in (to_worker, from_worker):
            with contextlib.suppress(AttributeError, OSError):  # Linux only; the default works too
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        command = [
            sys.executable,
            "-m",
            "proxy.recorder_worker",
            str(to_read),
            str(to_write),
            str(os.getpid()),
        ]
        try:
            self._proc = subprocess.Popen(command, pass_fds=(to_read, to_write), stdin=subprocess.DEVNULL)
        finally:
            os.close(to_read)
            os.close(to_write)
        os.set_blocking(to_worker, False)
        os.set_blocking(from_worker, False)
        self._to_worker, self._from_worker = to_worker, from_worker
        self._out.append((memoryview(_frame(self._settings)), 0))
        self._write()
        self._loop.add_reader(from_worker, self._read_reports)
        done, _ = await asyncio.wait(
            [self._ready, self._ended], timeout=_STOP_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if self._ready not in done:
            await self.stop()
            raise RuntimeError("the recorder process did not start")

    def _send(self) -> None:
        if self._send_due is not None and self._send_due is not _NOW:
            self._send_due.cancel()  # stop() sends now
        self._send_due = None
        if not self._batch:
            return
        if self._dead:  # nothing more is recorded: let go of what the batch held
            self.budget.give(self._batch_bytes)
            self._waiting -= self._batch_bytes
            self._batch, self._batch_bytes = [], 0
            return
        others = self.budget.used - self._worker_held
        message = _frame((others, self._batch))
        self._out.append((memoryview(message), self._batch_bytes))
        self._batch, self._batch_bytes = [], 0
        self._write()

    def _write(self) -> None:
        """Write what the pipe takes now; the rest when it is writable again."""
        out = self._out
        while out and not self._dead:
            view, chunk_bytes = out[0]
            try:
                n = os.write(self._to_worker, view)
            except BlockingIOError:
                break
            except OSError as exc:  # the worker is gone
                self._worker_died(f"its pipe: {exc}")
                break
            if n < len(view):
                out[0] = (view[n:], chunk_bytes)
                break
            out.pop(0)
            self._waiting -= chunk_bytes
            self.budget.give(chunk_bytes)
        want = bool(out) and not self._dead
        if want != self._writer_on and self._loop is not None:
            self._writer_on = want
            if want:
                self._loop.add_writer(self._to_worker, self._write)
            else:
                self._loop.remove_writer(self._to_worker)

    def _read_reports(self) -> None:
        try:
            chunk = os.read(self._from_worker, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            assert self._loop is not None
            self._loop.remove_reader(self._from_worker)
            if self._ended is not None and not self._ended.done():
                self._ended.set_result(None)
            self._worker_died("it ended its reports")
            return
        self._reports += chunk
        for report in _frames(self._reports):
            self._apply(report)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _apply(self, report: dict[str, Any]) -> None:
        held = report["held"]
        if held > self._worker_held:
            self.budget.charge(held - self._worker_held)
        else:
            self.budget.give(self._worker_held - held)
        self._worker_held = held
        self.rows_recorded = report["rows_recorded"]
        self.rows_total = report["rows_total"]
        self.worker_queue_bytes = report["queue"]
        metrics = self.metrics
        metrics.merge(report["metrics"])
        metrics.rows_recorded = self.rows_recorded
        metrics.recorder_queue_bytes = self.worker_queue_bytes + self._waiting
        metrics.held_bytes = self.budget.used
        self._release_memory()

    def _release_memory(self) -> None:
        """What the recorder task did in the proxy's process: hand freed memory back once the
        load has ebbed, or when RSS passes the budget (see ``proxy.budget``)."""
        budget = self.budget
        if not self._waiting and budget.used < budget.limit // 8:
            release_free_memory()  # at most every 5 s
        now = time.monotonic()
        if now >= self._rss_check:
            self._rss_check = now + 0.5
            if budget.rss_over():
                release_free_memory(0.5)

    def _worker_died(self, why: str) -> None:
        """Chunks from now on are gaps, counted (the proxy goes on forwarding)."""
        if self._dead:
            return
        self._dead = True
        if self._writer_on and self._loop is not None:
            self._loop.remove_writer(self._to_worker)
            self._writer_on = False
        for _, chunk_bytes in self._out:
            self.budget.give(chunk_bytes)
        self._out.clear()
        self._waiting = self._batch_bytes
        if not self._stopping():
            log.error("the recorder process ended (%s): nothing more is recorded", why)

    def _stopping(self) -> bool:
        return self._to_worker < 0

    async def stop(self) -> None:
        """Send what is left, close the pipe; the worker writes and rolls the last files."""
        loop, proc = self._loop, self._proc
        if loop is None or proc is None:
            return
        self._proc = None  # once
        self._send()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_STOP_SECONDS):
                while self._out and not self._dead:
                    await asyncio.sleep(0.01)
        if self._writer_on:
            loop.remove_writer(self._to_worker)
            self._writer_on = False
        os.close(self._to_worker)
        self._to_worker = -1  # the worker's EOF: it finishes
        assert self._ended is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._ended), _STOP_SECONDS)
        except TimeoutError:
            log.error("the recorder process did not finish in %.0f s: killed", _STOP_SECONDS)
            proc.kill()
        try:
            code = await loop.run_in_executor(None, proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = await loop.run_in_executor(None, proc.wait, 30)
        with contextlib.suppress(ValueError):
            loop.remove_reader(self._from_worker)
        os.close(self._from_worker)
        self.budget.give(self._worker_held + self._batch_bytes)
        self._worker_held = 0
        if code != 0:
            raise RuntimeError(f"the recorder process failed (exit code {code}); see its error above")

    @property
    def queued_items(self) -> int:
        return len(self._batch)


# ---- the worker --------------------------------------------------------------------------------


class _BudgetView(MemoryBudget):
    """The proxy's budget as the worker sees it: its limit, less what the proxy itself holds
    (``others``, as of the last batch)."""

    __slots__ = ("others",)

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.others = 0

    def take(self, n: int, keep: int = 0) -> bool:
        with self._lock:
            used = self.used + n
            if self.limit > 0 and n > 0 and used + self.others > self.limit - keep:
                return False
            self.used = used
            self.peak = max(self.peak, used)
            return True

    def room(self) -> int:
        return self.limit - self.used - self.others if self.limit > 0 else 1 << 62


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl: nothing would signal us
        os._exit(0)


def _worker(read_fd: int, write_fd: int) -> int:
    from kwire.runtime import tune_gc
    from proxy.recorder import Recorder

    buffer = bytearray()
    while True:  # the settings come first
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            return 0
        buffer += chunk
        messages = _frames(buffer)
        if messages:
            break
    settings = messages.pop(0)
    out_dir = settings.pop("out_dir")
    budget = _BudgetView(settings.pop("budget_limit"))
    metrics = Metrics()
    recorder = Recorder(out_dir, metrics, budget=budget, **settings)
    # as the kwire commands run (this process does not start through kwire.cli): on a
    # 200-connection load, replayed, the default collector cost a fifth of this process's CPU
    tune_gc()
    calls = item_calls(recorder)
    os.set_blocking(read_fd, False)
    enough = _pipe_size(read_fd) // 4
    last_report = 0.0
    eof = False
    _report(write_fd, recorder, budget, metrics)  # ready
    _feed(messages, budget, calls)
    while not eof:
        busy = recorder.queued_items > 0
        readable, _, _ = select.select([read_fd], [], [], 0 if busy else _REPORT_SECONDS)
        read = 0
        if readable:
            # up to 8 MB at a time, and a message larger than that whole (a loop turn that read
            # 16 connections' 1 MB chunks sends one of 16 MB: reading stopped short of its end
            # stalled the worker for good)
            want = _READ_BYTES
            if len(buffer) >= 4:
                want = max(want, 4 + _LENGTH.unpack_from(buffer)[0])
            try:
                while len(buffer) < want:
                    chunk = os.read(read_fd, 1 << 20)
                    if not chunk:
                        eof = True
                        break
                    buffer += chunk
                    read += len(chunk)
            except BlockingIOError:
                pass
            _feed(_frames(buffer), budget, calls)  # queued now; decoded in slices below
        recorder._process(_SLICE_SECONDS)
        recorder._maybe_flush()
        now = time.monotonic()
        if now - last_report >= _REPORT_SECONDS or (busy and not recorder.queued_items):
            last_report = now
            _report(write_fd, recorder, budget, metrics)
        if not busy and not recorder.queued_items:
            release_free_memory()
            if 0 < read < enough and not eof:
                _gather(read_fd, enough)
    asyncio.run(recorder.stop())
    _report(write_fd, recorder, budget, metrics)
    return 0


def _pipe_size(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):
        return 64 << 10  # Linux's default


def _waiting_bytes(fd: int) -> int:
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _gather(fd: int, enough: int) -> None:
    """Wait up to ``_GATHER_SECONDS`` for batches to gather in the pipe, less once ``enough``
    bytes wait."""
    end = time.monotonic() + _GATHER_SECONDS
    while _waiting_bytes(fd) < enough:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, _GATHER_STEP))


def item_calls(recorder: Any) -> dict[int, Any]:
    """The ``Recorder`` method each kind of item a batch holds is a call of."""
    return {
        _OPEN: recorder.open,
        _DATA: recorder.data,
        _GAP: recorder.gap,
        _INJECTED: recorder.injected,
        _CLOSE: recorder.close,
    }


def _feed(messages: list[Any], budget: _BudgetView, calls: dict[int, Any]) -> None:
    for others, items in messages:
        budget.others = others
        for item in items:
            calls[item[0]](*item[1:])


def _report(fd: int, recorder: Any, budget: MemoryBudget, metrics: Metrics) -> None:
    message = _frame(
        {
            "held": budget.used,
            "rows_recorded": recorder.rows_recorded,
            "rows_total": recorder.rows_total,
            "queue": recorder._queued_bytes,
            "metrics": metrics.take_recorded(),
        }
    )
    view = memoryview(message)
    while view:  # blocking: the proxy reads its reports as they come
        view = view[os.write(fd, view) :]


def _yield_cpu() -> None:
    """Run only on CPU nobody else wants (``SCHED_IDLE``), or else at the lowest priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(_NICE)


def main(argv: list[str]) -> int:
    read_fd, write_fd, parent = (int(arg) for arg in argv)
    _die_with_parent(parent)
    _yield_cpu()
    # Signals sent to the proxy's whole process group (Ctrl-C, systemd's SIGTERM to the unit's
    # cgroup, SIGHUP to reload rules) are the proxy's: it stops us by closing the pipe, after
    # which we write the last rows; killed without that, we would lose them.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return _worker(read_fd, write_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
