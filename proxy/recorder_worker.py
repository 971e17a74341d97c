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
an item to a batch (the chunk object itself), except that a large Produce request or Fetch
response is held by reference until whole and goes as its skeleton, without its record
payloads (``proxy.skim``); every ``_SEND_SECONDS`` (``catch_up`` schedules it; sooner once
``_SEND_BYTES`` wait) the batch is pickled and written to the worker's pipe, non-blocking,
chunks of ``_OUT_OF_BAND`` bytes or more as segments of their own (``_message``: never copied
in this process). What the pipe does not
take at once waits, and the bytes waiting are bounded (``max_queue_bytes``, and taken from the
memory budget): a chunk beyond that is sent as a gap (counted in ``dropped_bytes``), and the
worker's decoder resynchronises as after a lost packet, so rows never claim what it skipped.

What the worker does: reads batches as they come (reading goes before decoding, so the pipe
rarely fills), feeds them to its ``Recorder``, whose own bounds apply as in-process (its queue,
its lag, the rows pending for the writer; overflow is a gap), decodes in slices, and writes.
Every ``_REPORT_SECONDS`` (and when its queue runs empty) it sends back a report, if anything in
it changed: the metric deltas its rows made (latency histograms and error codes per api, already
bounded to known labels or ``other``; gap and drop counters; rows written, files rolled), its rows
made, its queue, and what it holds against the budget. With no traffic it sleeps until its
``Recorder`` has something due (rows to hand to the writer, a roll) or the next heartbeat report
(``_IDLE_REPORT_SECONDS``), on which the proxy hands freed memory back: an idle proxy wakes about
once a second, not ten times (``_Reports``).

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
import itertools
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
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.budget import MemoryBudget, release_free_memory
from proxy.contention import CpuContention, Deferral
from proxy.metrics import Metrics
from proxy.skim import FrameSkim

__all__ = ["RecorderProcess"]

log = logging.getLogger("kwire.proxy")

_OPEN, _DATA, _GAP, _INJECTED, _CLOSE, _SKELETON = range(6)
#: A message's head: its length, its pickle's length, how many chunks follow it.
_HEAD = struct.Struct(">III")
#: The pipe's size asked of the kernel (Linux: ``F_SETPIPE_SZ``; the default is 64 KB).
_PIPE_BYTES = 1 << 20
#: How often the worker reports back (metric deltas, rows made, memory held) while they change.
_REPORT_SECONDS = 0.1
#: How often it reports when nothing changed: the proxy's memory release and its RSS check run
#: on reports. Reporting every ``_REPORT_SECONDS`` regardless, an idle ``kwire proxy -o`` took
#: 10-11 ms of CPU a second, its two processes alike (each woken ten times a second).
_IDLE_REPORT_SECONDS = 1.0
#: The worker's decoding slice between reads of its pipe.
_SLICE_SECONDS = 0.02
#: While other tasks wait for a CPU (``proxy.contention``), the worker sleeps ``_DEFER_STEP`` at
#: a time: its ``Recorder`` looks between decoding stretches of ``_PAUSE_EVERY`` seconds (and
#: between the batches fed to it, as often), its writer thread between conversions of
#: ``_DEFER_CONVERT_ROWS`` rows, unless decoding lags the traffic by half its lag bound or more.
#: Both together give up about ``_DEFER_BURST`` seconds at most at once and ``_DEFER_SHARE`` of
#: the time, and none for a while on a machine with no slack (``proxy.contention.Deferral``): the
#: worker falls behind (and skips) no sooner than without, within the noise of
#: ``tests/proxy_load.py``'s bulk loads (README, "Overhead").
_DEFER_STEP = 0.001
_DEFER_SHARE = 0.2
_DEFER_BURST = 0.25
_PAUSE_EVERY = 0.00025
_DEFER_CONVERT_ROWS = 512
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
#: Chunks from this size on are written to the pipe as they are (out of band: ``_message``);
#: smaller ones are copied into the batch's pickle, which costs less than a segment of their own.
_OUT_OF_BAND = 4 << 10
#: How many segments one ``writev`` takes (Linux's ``IOV_MAX``).
_IOV_MAX = 1024
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


def _message(obj: Any) -> list[memoryview]:
    """``obj`` as one message: the segments to write, in order. Chunks wrapped in
    ``pickle.PickleBuffer`` go out of band, as segments of their own: never copied in this
    process (the kernel copies them into the pipe). A message is a head (``_HEAD``: its
    length, its pickle's length, how many chunks), each chunk's length, the pickle, the chunks.
    """
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    chunks = [buffer.raw() for buffer in buffers]
    sizes = [len(chunk) for chunk in chunks]
    total = _HEAD.size + 4 * len(chunks) + len(body) + sum(sizes)
    head = _HEAD.pack(total, len(body), len(chunks))
    if chunks:
        head += struct.pack(f">{len(chunks)}I", *sizes)
    return [memoryview(head), memoryview(body), *chunks]


def _frame(obj: Any) -> bytes:
    """``obj`` as one message, joined (the worker's reports, the settings, the benchmarks)."""
    return b"".join(_message(obj))


def _parse(view: memoryview, at: int, end: int, out: list[Any]) -> int:
    """Append the whole messages in ``view[at:end]`` to ``out``; where the first incomplete one
    starts. Each chunk becomes a ``bytes`` of its own (the one copy the worker makes)."""
    while end - at >= _HEAD.size:
        total, body_size, count = _HEAD.unpack_from(view, at)
        if end - at < total:
            break
        p = at + _HEAD.size + 4 * count
        sizes = struct.unpack_from(f">{count}I", view, at + _HEAD.size) if count else ()
        body = view[p : p + body_size]
        p += body_size
        chunks = []
        for size in sizes:
            chunks.append(bytes(view[p : p + size]))
            p += size
        out.append(pickle.loads(body, buffers=chunks))
        at += total
    return at


def _frames(buffer: bytearray) -> list[Any]:
    """The whole messages at the start of ``buffer`` (removed from it)."""
    out: list[Any] = []
    with memoryview(buffer) as view:
        at = _parse(view, 0, len(view), out)
    del buffer[:at]
    return out


def _wanted(view: memoryview, at: int, end: int) -> int:
    """Bytes from ``at`` that the first message needs (a head's worth until its head is in)."""
    return _HEAD.unpack_from(view, at)[0] if end - at >= _HEAD.size else _HEAD.size


class _Inbox:
    """The worker's end of its pipe: read straight into one reused buffer (no bytes object
    per read, no joining), messages taken from it. Reading 1 MB reads into a fresh bytes and
    appending it to a buffer took two thirds of the worker's samples under a bulk produce load
    (py-spy; the chunks then copied a third time by unpickling)."""

    def __init__(self, size: int = _READ_BYTES) -> None:
        self.size = size
        self.buf = bytearray(size)
        self.start = 0  # the first byte not yet taken
        self.end = 0  # the end of what was read

    @property
    def held(self) -> int:
        """Bytes read and not yet taken."""
        return self.end - self.start

    def target(self) -> int:
        """Bytes to hold before decoding: ``_READ_BYTES``, or the first message whole when it is
        larger (a loop turn that read 16 connections' 1 MB chunks sends one of 16 MB: reading
        stopped short of its end stalled the worker for good)."""
        with memoryview(self.buf) as view:
            return max(_READ_BYTES, _wanted(view, self.start, self.end))

    def read(self, fd: int, n: int) -> int:
        """Read up to ``n`` (>= 1) bytes from ``fd``: how many (0 at EOF; ``BlockingIOError``
        when none wait)."""
        held = self.held
        if self.end + n > len(self.buf):  # move what is held to the front, or grow
            if held + n > len(self.buf):
                grown = bytearray(held + n)
                grown[:held] = self.buf[self.start : self.end]
                self.buf = grown
            else:
                self.buf[:held] = self.buf[self.start : self.end]
            self.start, self.end = 0, held
        with memoryview(self.buf) as view:
            got = os.readv(fd, [view[self.end : self.end + n]])
        self.end += got
        return got

    def messages(self) -> list[Any]:
        """The whole messages read so far (taken)."""
        out: list[Any] = []
        with memoryview(self.buf) as view:
            self.start = _parse(view, self.start, self.end, out)
        if self.start == self.end:
            self.start = self.end = 0
            if len(self.buf) > self.size:  # grown for one large message: not kept
                self.buf = bytearray(self.size)
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
            # of 64 rows at a time (17 against 34 us a row, 20,000 rows of a real capture); in
            # pieces of _DEFER_CONVERT_ROWS, the writer can step aside between them
            "convert_rows": _DEFER_CONVERT_ROWS,
            **settings,
        }
        self._batch: list[tuple[Any, ...]] = []
        self._skims: dict[int, FrameSkim] = {}  # per connection (``proxy.skim``)
        self._skim_held = 0  # bytes of the frames they hold
        self._batch_bytes = 0  # chunk bytes in the batch (taken from the budget)
        #: segments of messages the pipe has not taken, each with the chunk bytes its message
        #: held (on its last segment; 0 on the others)
        self._out: deque[tuple[memoryview, int]] = deque()
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
        self._skims[key] = FrameSkim(self._take, self._give)

    def _take(self, nbytes: int) -> bool:
        """Room for a frame ``FrameSkim`` would hold: within ``max_queue_bytes`` over all
        connections (what the pipe's queue may hold: a slow client's large frame in progress
        holds its share no longer than its connection lives) and the memory budget."""
        if self._skim_held + nbytes > self.max_queue_bytes or not self.budget.take(nbytes, self._keep):
            return False
        self._skim_held += nbytes
        return True

    def _give(self, nbytes: int) -> None:
        self._skim_held -= nbytes
        self.budget.give(nbytes)

    def data(self, key: int, direction: int, data: bytes, ts_ns: int) -> None:
        skim = self._skims.get(key)
        items = None if skim is None else skim.feed(direction, data, ts_ns)
        if items is None:
            self._chunk(key, direction, data, ts_ns)
        else:
            self._send_items(key, direction, items)

    def _send_items(self, key: int, direction: int, items: list[Any]) -> None:
        for item in items:
            if item[0] == "data":
                self._chunk(key, direction, item[1], item[2])
            else:
                _, frame, size, start_ns, end_ns = item
                self._batch.append((_SKELETON, key, direction, frame, size, start_ns, end_ns))
                self.metrics.add("skimmed_frames")
                self.metrics.add("skimmed_bytes", size - len(frame))

    def _chunk(self, key: int, direction: int, data: Any, ts_ns: int) -> None:
        size = len(data)
        if (
            not self._dead
            and self._waiting + size <= self.max_queue_bytes
            and self.budget.take(size, self._keep)
        ):
            self._waiting += size
            self._batch_bytes += size
            if type(data) is not bytes and (
                size < _OUT_OF_BAND or not (type(data) is memoryview and type(data.obj) is bytes)
            ):
                data = bytes(data)  # small (into the pickle), or a view of a buffer that may change
            if size >= _OUT_OF_BAND:
                data = pickle.PickleBuffer(data)
            self._batch.append((_DATA, key, direction, data, ts_ns))
        else:
            self.metrics.add("dropped_bytes", size)
            self._batch.append((_GAP, key, direction, size, ts_ns))

    def gap(self, key: int, direction: int, nbytes: int, ts_ns: int) -> None:
        self._end_skim(key)  # the streams can no longer be followed
        self._batch.append((_GAP, key, direction, nbytes, ts_ns))

    def _end_skim(self, key: int) -> None:
        """Stop skimming ``key``; what it held goes on as it came."""
        skim = self._skims.pop(key, None)
        if skim is not None:
            for direction, items in enumerate(skim.close()):
                self._send_items(key, direction, items)

    def injected(self, key: int, correlation_id: int) -> None:
        self._batch.append((_INJECTED, key, correlation_id))

    def close(self, key: int, ts_ns: int, end_reason: str, stats: dict[str, Any]) -> None:
        self._end_skim(key)
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
        self._queue(_message(self._settings), 0)
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
        self._queue(_message((others, self._batch)), self._batch_bytes)
        self._batch, self._batch_bytes = [], 0
        self._write()

    def _queue(self, segments: list[memoryview], chunk_bytes: int) -> None:
        out = self._out
        for segment in segments[:-1]:
            out.append((segment, 0))
        out.append((segments[-1], chunk_bytes))

    def _write(self) -> None:
        """Write what the pipe takes now; the rest when it is writable again."""
        out = self._out
        while out and not self._dead:
            segments = [segment for segment, _ in itertools.islice(out, _IOV_MAX)]
            try:
                n = os.writev(self._to_worker, segments)
            except BlockingIOError:
                break
            except OSError as exc:  # the worker is gone
                self._worker_died(f"its pipe: {exc}")
                break
            full = n < sum(map(len, segments))
            while out:
                view, chunk_bytes = out[0]
                if n < len(view):
                    if n:
                        out[0] = (view[n:], chunk_bytes)
                    break
                n -= len(view)
                out.popleft()
                if chunk_bytes:
                    self._waiting -= chunk_bytes
                    self.budget.give(chunk_bytes)
            if full:
                break
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
        _leave_idle(proc.pid)  # its last rows come now, however busy the machine
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

    inbox = _Inbox()
    messages: list[Any] = []
    while not messages:  # the settings come first
        if not inbox.read(read_fd, 1 << 16):
            return 0
        messages = inbox.messages()
    settings = messages.pop(0)
    out_dir = settings.pop("out_dir")
    budget = _BudgetView(settings.pop("budget_limit"))
    metrics = Metrics()
    deferral = Deferral(CpuContention(), _DEFER_STEP, _DEFER_SHARE, _DEFER_BURST)
    recorder = Recorder(
        out_dir,
        metrics,
        budget=budget,
        pause=deferral.pause_while_waiting,
        pause_every=_PAUSE_EVERY,
        **settings,
    )
    # as the kwire commands run (this process does not start through kwire.cli): on a
    # 200-connection load, replayed, the default collector cost a fifth of this process's CPU
    tune_gc()
    calls = item_calls(recorder)
    os.set_blocking(read_fd, False)
    enough = _pipe_size(read_fd) // 4
    reports = _Reports(write_fd, recorder, budget, metrics)
    eof = False
    # Only now: its start (imports, pyarrow's first conversion, ~1 s of CPU) comes before the
    # proxy listens, so no traffic waits on it, and under SCHED_IDLE a busy machine starved it.
    # With three busy loops on the 2 CPUs, `kwire proxy -o` had not started after 20 s.
    _yield_cpu()
    reports.send(force=True)  # ready
    _feed(messages, budget, calls)
    while not eof:
        busy = recorder.queued_items > 0
        readable, _, _ = select.select([read_fd], [], [], 0 if busy else reports.idle_wait())
        read = 0
        if readable:
            try:
                while inbox.held < inbox.target():
                    got = inbox.read(read_fd, inbox.target() - inbox.held)
                    if not got:
                        eof = True
                        break
                    read += got
            except BlockingIOError:
                pass
            # queued now, decoded in slices below; feeding a read's batches takes milliseconds
            _feed(inbox.messages(), budget, calls, recorder.pause_if_due)
        recorder._process(_SLICE_SECONDS)
        metrics.recorder_deferred_seconds += deferral.take()
        recorder._maybe_flush()
        reports.turn(drained=busy and not recorder.queued_items)
        if not busy and not recorder.queued_items:
            release_free_memory()
            if 0 < read < enough and not eof:
                _gather(read_fd, enough)
    _leave_idle()  # the proxy stops, and waits for the last rows
    asyncio.run(recorder.stop())
    reports.send(force=True)
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
        _SKELETON: recorder.skeleton,
    }


def _feed(
    messages: list[Any],
    budget: _BudgetView,
    calls: dict[int, Any],
    between: Callable[[], None] | None = None,
) -> None:
    """Each message's items to the ``Recorder``, calling ``between`` after each message."""
    for others, items in messages:
        budget.others = others
        for item in items:
            calls[item[0]](*item[1:])
        if between is not None:
            between()


class _Reports:
    """The worker's reports to the proxy (see the module doc): each turn, one if
    ``_REPORT_SECONDS`` have passed (or the queue just ran empty) and something in it changed, or
    ``_IDLE_REPORT_SECONDS`` have passed since the last one."""

    def __init__(self, fd: int, recorder: Any, budget: MemoryBudget, metrics: Metrics) -> None:
        self.fd = fd
        self.recorder = recorder
        self.budget = budget
        self.metrics = metrics
        self._looked = 0.0  # when a turn last looked for something to report
        self._sent = 0.0  # when the last report went
        self._last: tuple[int, int, int, int] | None = None

    def turn(self, drained: bool) -> None:
        """Report if due: ``drained``, the queue ran empty this turn."""
        now = time.monotonic()
        if drained or now - self._looked >= _REPORT_SECONDS:
            self._looked = now
            self.send(force=now - self._sent >= _IDLE_REPORT_SECONDS)

    def idle_wait(self) -> float:
        """How long the worker may wait for input: until its recorder has something due, or the
        next heartbeat report."""
        wait = self._sent + _IDLE_REPORT_SECONDS - time.monotonic()
        due = self.recorder.next_due()
        if due is not None:
            wait = min(wait, due)
        return max(wait, 0.0)

    def send(self, force: bool = False) -> None:
        """Send a report, unless nothing in it changed (and not ``force``)."""
        recorder = self.recorder
        state = (self.budget.used, recorder.rows_recorded, recorder.rows_total, recorder._queued_bytes)
        delta = self.metrics.take_recorded()
        if not force and state == self._last and _nothing(delta):
            return
        self._last = state
        self._sent = time.monotonic()
        held, rows_recorded, rows_total, queue = state
        message = _frame(
            {
                "held": held,
                "rows_recorded": rows_recorded,
                "rows_total": rows_total,
                "queue": queue,
                "metrics": delta,
            }
        )
        view = memoryview(message)
        while view:  # blocking: the proxy reads its reports as they come
            view = view[os.write(self.fd, view) :]


def _nothing(delta: dict[str, Any]) -> bool:
    """Whether a metrics delta (``Metrics.take_recorded``) adds nothing."""
    return not (
        delta["latency"] or delta["latency_sum"] or delta["errors"] or any(delta["counters"].values())
    )


def _yield_cpu() -> None:
    """Run only on CPU nobody else wants (``SCHED_IDLE``), or else at the lowest priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(_NICE)


def _leave_idle(pid: int | None = None) -> None:
    """Every thread of process ``pid`` (default: this one) back to an ordinary priority, where
    the system allows it (root, ``CAP_SYS_NICE``, or an ``RLIMIT_NICE`` that covers nice 0): the
    proxy has stopped forwarding and waits for the last rows, which on a saturated machine an
    idle-class writer did not get to write (with three busy loops on the 2 CPUs the proxy's stop
    timed out). The proxy's process does it for the worker as it stops it (``pid``): the worker
    doing it itself must first get a CPU, which under ``SCHED_IDLE`` on a saturated machine it
    may not get for a minute (a CI run: the stop outlasted its 60 s)."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        threads = [pid or 0]
    for tid in threads:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def main(argv: list[str]) -> int:
    read_fd, write_fd, parent = (int(arg) for arg in argv)
    _die_with_parent(parent)
    # Signals sent to the proxy's whole process group (Ctrl-C, systemd's SIGTERM to the unit's
    # cgroup, SIGHUP to reload rules) are the proxy's: it stops us by closing the pipe, after
    # which we write the last rows; killed without that, we would lose them.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return _worker(read_fd, write_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
