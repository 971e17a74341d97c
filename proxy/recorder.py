"""Recording off the forwarding path: chunks in, exchange and connection rows out to Parquet.

The forwarding code hands every chunk it receives from a client, and every chunk it writes
to one, to ``Recorder.data`` (the chunk object itself: bytes are immutable, nothing is
copied). The recorder keeps them in a queue bounded in bytes and feeds them to one
``KafkaConnection`` per client connection, turning events into rows with
``kwire.rows.ExchangeRows`` (the same code ``kwire decode`` uses, so rows look the same).

Who runs it: ``kwire proxy`` runs it in a worker process of its own
(``proxy.recorder_worker``: the forwarding loop only hands chunks over a pipe, and large
Produce requests and Fetch responses as their skeletons, ``Recorder.skeleton``; in the proxy's
process, the writer's conversions held the GIL against the loop and decoding was 11% of it);
``kwire capture`` runs it in-process, fed from its capture-reading thread while the recorder
task decodes on the loop, which is what the locks below are for.

When it decodes: the feeding code calls ``Recorder.catch_up`` once it has handed over a read;
the few chunks just queued are decoded at once; more than a few, a burst it has fallen behind
on, is left to the recorder task (or the worker's loop), which works through it in slices of a
few milliseconds, short ones (``turn_seconds``) unless more than ``_BACKLOG_ITEMS`` are queued.
pyarrow's first conversion (it imports pandas, ~1 s of CPU under the GIL) is done when the
recorder is made, not at the first roll.

Bounds keep a slow recorder from slowing traffic, and it says when it skips:

* the chunk queue (``max_queue_bytes``, and the proxy's memory budget, ``proxy.budget``, of
  which it leaves a quarter to the forwarding path), and the lag (``max_lag_seconds``: once
  decoding lags the traffic by more than that, new chunks are skipped until it has caught
  up; this bounds what a SIGKILL loses beyond the flush window): a chunk that is not queued
  is a gap for the decoder (it resynchronises, exactly as for a capture that lost packets),
  ``dropped_bytes`` counts it, and so does the connection's ``gap_bytes_to_*``;
* a decoder's frame in progress that the budget cannot hold (a frame near 100 MB) is let go:
  its rest is skipped as a gap, and it is counted (``over_budget_frames``);
* on a connection with such a gap, rows that would claim what the recorder did not see (a
  cut or undecodable frame, an answer to no request, a request whose answer may have gone
  by in the gap's wake) are written with status ``gap`` instead (``gap_rows``);
* the rows waiting for the Parquet writer (``max_pending_rows``): rows beyond it are
  dropped and counted, per connection (``connections.dropped_rows``) and in total.

Rows are handed to ``kwire.dataset.DatasetWriter`` in a worker thread every half second,
which converts them ``_BATCH_ROWS`` at a time as they come, writes a row group once it has
``_ROW_GROUP_ROWS`` converted, and rolls every ``flush_seconds`` or ``flush_rows`` rows; each
roll closes the files and renames them from their temporary names, so a reader, or a proxy
killed with SIGKILL, only ever leaves complete files behind (at most the last window is lost).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from decoder.connection import KafkaConnection
from kwire.dataset import DatasetWriter
from kwire.rows import ConnectionInfo, ExchangeRows, utc_date
from proxy.budget import MemoryBudget, release_free_memory
from proxy.metrics import Metrics

__all__ = ["Recorder"]

_OPEN, _DATA, _GAP, _INJECTED, _CLOSE, _SKELETON = range(6)

#: Queued items ``catch_up`` decodes at once; more than that is a backlog for the task.
_CATCH_UP_ITEMS = 8
#: Queued items beyond which decoding has fallen behind: the task then decodes in full slices
#: (``slice_seconds``). Short slices alone, under 175 pipelining connections and 8 producers,
#: left decoding so little time that it made a fifth of the rows and skipped most of the bytes.
_BACKLOG_ITEMS = 64
#: Rows the writer thread converts to Arrow at once: one conversion holds the GIL throughout,
#: so this bounds how long the loop can wait for it. Measured on 20,000 rows of a real capture
#: (switch interval 0.5 ms): 128 at a time cost 8-10 us of CPU a row and another thread waited
#: p99 5.5-6.2 ms to wake; 64: 11 us, p99 3.2-3.5 ms; 32: 14-18 us, p99 3.1-3.7 ms.
_CONVERT_ROWS = 64
#: How often rows made are handed to the writer thread (which converts them once it has
#: ``_BATCH_ROWS``), between rolls.
_HANDOFF_SECONDS = 0.5
#: How often ``next_due`` asks to look again while the writer thread writes.
_WRITE_POLL_SECONDS = 0.1
#: The longest the in-process recorder task sleeps with nothing queued or due (it then hands
#: freed memory back if the load has ebbed, and looks at RSS).
_IDLE_WAKE_SECONDS = 1.0
_BATCH_ROWS = 4096
#: Rows of a Parquet row group (a roll writes what is left as a shorter one).
_ROW_GROUP_ROWS = 65536


#: Statuses that claim something about the wire (no answer, a cut or bad frame, an answer to
#: nothing) which bytes the recorder skipped can fake: on a connection with such a gap they
#: become ``gap`` (the recorder did not see enough to say).
_GAP_STATUSES = frozenset({"truncated", "malformed", "orphan_response"})
_ORPHANS_KEPT = 4096
_GAP_ERROR = "not recorded in full: the proxy's recorder skipped bytes of this connection (it fell behind)"


class _Conn:
    __slots__ = (
        "decoder",
        "dropped_rows",
        "first_ns",
        "gap_bytes",
        "gap_rows",
        "held",
        "info",
        "injected",
        "last_answer_ns",
        "last_ns",
        "orphans",
        "rows",
    )

    def __init__(self, info: ConnectionInfo, ts_ns: int) -> None:
        self.info = info
        self.decoder = KafkaConnection()
        self.rows = ExchangeRows(info)
        self.injected: set[int] = set()
        self.dropped_rows = 0
        self.first_ns = ts_ns
        self.last_ns = ts_ns
        self.gap_bytes = [0, 0]
        self.gap_rows = 0
        self.held = [0, 0]  # bytes its decoder holds per direction, taken from the budget
        #: correlation ids of answers seen without their request since a gap (bounded): a request
        #: the decoder finds later in the gap's wake was answered, not left unanswered
        self.orphans: set[int] = set()
        self.last_answer_ns = 0  # when the broker last sent bytes (recorded or skipped)


class Recorder:
    """Decodes both directions of every proxied connection and writes rows to ``out_dir``.

    With ``out_dir`` None it still decodes (metrics need error codes and latencies) but
    writes nothing.
    """

    def __init__(
        self,
        out_dir: str | Path | None,
        metrics: Metrics,
        *,
        flush_seconds: float = 10.0,
        flush_rows: int = 100_000,
        max_queue_bytes: int = 64 << 20,
        max_pending_rows: int | None = None,
        slice_seconds: float = 0.002,
        turn_seconds: float = 0.0005,
        budget: MemoryBudget | None = None,
        max_lag_seconds: float | None = None,
        convert_rows: int | None = _CONVERT_ROWS,
        pause: Callable[[], None] | None = None,
        pause_every: float = 0.0,
        feed_delay_seconds: float = 0.0,
    ) -> None:
        """``feed_delay_seconds``: how long after their timestamps the feed may hand chunks over
        (a passive capture's kernel ring holds packets up to ``kwire.live.RING_DELAY_S``): not
        counted as decoding's lag, which the timestamps measure.

        ``pause``: what decoding calls every ``pause_every`` seconds (if not 0), and the writer
        thread between two conversions of ``convert_rows`` rows (``kwire.dataset.TableWriter``),
        while decoding lags the traffic by less than half ``max_lag_seconds``: a recorder in a
        process of its own steps aside there while others wait for a CPU."""
        self.metrics = metrics
        self._pause = pause if pause_every > 0 else None
        self._pause_every = pause_every
        self._next_pause = 0.0  # monotonic: when decoding next calls pause
        #: Decoding lags the traffic by half its bound or more (seen where it pauses): no pause.
        self.lagging = False
        self.budget = budget or MemoryBudget(0)
        #: How far behind the traffic decoding may fall: once a chunk waited longer than this,
        #: new chunks are skipped (gaps) until the queue is worked off. It bounds what a
        #: SIGKILL loses beyond the flush window. Default: half the flush window, at most 5 s.
        self.max_lag_ns = int(1e9 * (max_lag_seconds if max_lag_seconds else min(flush_seconds / 2, 5.0)))
        #: A chunk stamped longer ago than this is behind: the lag bound plus the feed's delay.
        self._late_ns = self.max_lag_ns + int(1e9 * feed_delay_seconds)
        self._behind = False
        self._rss_check = 0.0
        self._keep = self.budget.limit // 4  # of the budget, left to the forwarding path
        self.flush_seconds = flush_seconds
        self.flush_rows = flush_rows
        self.max_queue_bytes = max_queue_bytes
        self.max_pending_rows = max_pending_rows or max(10 * flush_rows, 200_000)
        self.slice_seconds = slice_seconds
        #: The recorder task's slice on the loop while decoding keeps up (a read that comes in
        #: meanwhile waits for it); ``slice_seconds`` once it has fallen behind.
        self.turn_seconds = turn_seconds
        # rows converted a few at a time (``convert_rows``): the writer thread never holds the
        # GIL for long; a recorder in a process of its own converts more at once, and steps
        # aside in between (``pause``)
        self.writer = (
            DatasetWriter(
                out_dir,
                convert_rows=convert_rows,
                row_group_rows=_ROW_GROUP_ROWS,
                batch_rows=_BATCH_ROWS,
                pause=self._step_aside if self._pause is not None else None,
            )
            if out_dir is not None
            else None
        )
        if self.writer is not None:
            # pyarrow imports pandas on its first conversion (~1 s holding the GIL): here, before
            # any traffic, not in the writer thread at the first roll, where it stalled the loop
            pa.array([], type=pa.int8())
        self._queue: deque[tuple[Any, ...]] = deque()
        self._queued_bytes = 0
        self._conns: dict[int, _Conn] = {}
        self._rows: list[dict[str, Any]] = []
        self._conn_rows: list[dict[str, Any]] = []
        self._writing: concurrent.futures.Future[None] | None = None
        self._writing_rows = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kwire-writer")
        self._last_flush = time.monotonic()
        self._last_handoff = self._last_flush
        self._unrolled = 0  # rows handed to the writer thread since the last roll
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._queue_lock = threading.Lock()  # _queued_bytes
        self._decode_lock = threading.Lock()  # the decoders, the rows, the writer hand-off
        self.dropped_rows = 0
        self.rows_total = 0
        self.rows_recorded = 0  # rows kept for the writer (rows_total less those dropped)

    # ---- called from the forwarding path (cheap, never blocks) --------------------------

    def open(self, key: int, info: ConnectionInfo, ts_ns: int) -> None:
        self._queue.append((_OPEN, key, info, ts_ns))

    def _queued(self, nbytes: int) -> bool:
        """Take ``nbytes`` more into the queue, if it and the budget allow and decoding is not
        behind (else the caller queues a gap)."""
        with self._queue_lock:
            fits = (
                not self._behind
                and self._queued_bytes + nbytes <= self.max_queue_bytes
                and self.budget.take(nbytes, self._keep)
            )
            if fits:
                self._queued_bytes += nbytes
        return fits

    def data(self, key: int, direction: int, data: bytes, ts_ns: int) -> None:
        size = len(data)
        if self._queued(size):
            self._queue.append((_DATA, key, direction, data, ts_ns))
        else:
            self.metrics.add("dropped_bytes", size)
            self._queue.append((_GAP, key, direction, size, ts_ns))
        if len(self._queue) > _CATCH_UP_ITEMS:
            self._poke()  # a backlog: the task takes it in slices

    def skeleton(self, key: int, direction: int, frame: bytes, size: int, start_ns: int, end_ns: int) -> None:
        """A whole frame of ``size`` bytes of ``direction`` as its skeleton (``proxy.skim``): its
        first byte seen at ``start_ns``, its last at ``end_ns``. Queued as ``data`` is, by the
        skeleton's own bytes; one that does not fit is a gap of ``size``."""
        if self._queued(len(frame)):
            self._queue.append((_SKELETON, key, direction, frame, size, start_ns, end_ns))
        else:
            self.metrics.add("dropped_bytes", size)
            self._queue.append((_GAP, key, direction, size, end_ns))

    def gap(self, key: int, direction: int, nbytes: int, ts_ns: int) -> None:
        """``nbytes`` of ``direction`` were never seen (a passive capture lost them, or joined the
        connection mid-way): the decoder hunts for the next frame boundary, as for a lost packet."""
        self._queue.append((_GAP, key, direction, nbytes, ts_ns))

    def catch_up(self) -> None:
        """Decode what was just queued, if it is little; else leave it to the recorder task.

        Called by the feeding code after it has handed over what one read brought in.
        """
        queue = self._queue
        lock = self._decode_lock
        while queue and not self._stopping:
            if len(queue) > _CATCH_UP_ITEMS:
                self._poke()  # a backlog: the task takes it in slices
                return
            if not lock.acquire(blocking=False):
                return  # another thread is decoding, and looks again when done
            try:
                self._process(self.slice_seconds)
                if len(self._rows) >= self.flush_rows:
                    self._maybe_flush()
            finally:
                lock.release()

    def injected(self, key: int, correlation_id: int) -> None:
        self._queue.append((_INJECTED, key, correlation_id))

    def close(self, key: int, ts_ns: int, end_reason: str, stats: dict[str, Any]) -> None:
        """The connection ended. ``stats`` may hold bytes_to_broker, bytes_to_client, protocol and,
        when the forwarding code knows who ended it first, ended_by (as ``connections.ended_by``:
        client_fin, broker_fin, client_rst, broker_rst, refused) and end_ns (when)."""
        self._queue.append((_CLOSE, key, ts_ns, end_reason, stats))
        self._poke()

    def _poke(self) -> None:
        """Wake the recorder task, from the loop's thread or any other."""
        if self._wake.is_set():
            return
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: stop() has run
                loop.call_soon_threadsafe(self._wake.set)

    # ---- the recorder task --------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._task = self._loop.create_task(self._run(), name="kwire-recorder")

    async def _run(self) -> None:
        while not self._stopping:
            if not self._queue:
                self._wake.clear()
                due = self.next_due()
                wait = _IDLE_WAKE_SECONDS if due is None else min(due, _IDLE_WAKE_SECONDS)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                if not self._queue and self.budget.used < self.budget.limit // 8:
                    release_free_memory()  # the load has ebbed: let RSS come down
            now = time.monotonic()
            if now >= self._rss_check:
                self._rss_check = now + 0.5
                if self.budget.rss_over():
                    release_free_memory(0.5)
            if not self._queue and self.next_due() != 0.0:
                continue  # woken by the clock with nothing to decode, hand over or roll yet
            # let a burst of forwarding work go first, then take a slice
            await asyncio.sleep(0.002)
            with self._decode_lock:
                # on the loop: as short as a turn's slice, unless decoding has fallen behind
                backlog = len(self._queue) > _BACKLOG_ITEMS
                self._process(self.slice_seconds if backlog else self.turn_seconds)
                self._maybe_flush()
        self.metrics.recorder_queue_bytes = self._queued_bytes

    def _process(self, budget: float | None) -> None:
        queue = self._queue
        now = time.monotonic()
        deadline = now + budget if budget is not None else None
        pause = self._pause
        timed = deadline is not None or pause is not None
        ts_ns = 0
        count = 0
        consumed = 0
        while queue:
            item = queue.popleft()
            kind = item[0]
            if kind in (_DATA, _SKELETON):
                key, direction, data, ts_ns = item[1], item[2], item[3], item[-1]
                consumed += len(data)
                conn = self._conns.get(key)
                if conn is not None:
                    conn.last_ns = ts_ns
                    if direction:
                        conn.last_answer_ns = ts_ns
                    if kind == _DATA:
                        conn.decoder.receive_data(direction, data, ts_ns)
                    elif not conn.decoder.receive_skeleton(direction, data, item[4], item[5], ts_ns):
                        conn.gap_bytes[direction] += item[4]  # out of step: taken as a gap
                    self._hold(conn, direction, ts_ns)
                    self._drain(conn)
                if count % 64 == 0:
                    behind = time.time_ns() - ts_ns > self._late_ns
                    if behind != self._behind:
                        self._behind = behind
            elif kind == _GAP:
                _, key, direction, nbytes, ts_ns = item
                conn = self._conns.get(key)
                if conn is not None:
                    if direction:
                        conn.last_answer_ns = ts_ns
                    conn.gap_bytes[direction] += nbytes
                    conn.decoder.receive_gap(direction, nbytes, ts_ns)
                    self._drain(conn)
            elif kind == _OPEN:
                _, key, info, ts_ns = item
                self._conns[key] = _Conn(info, ts_ns)
            elif kind == _INJECTED:
                conn = self._conns.get(item[1])
                if conn is not None:
                    conn.injected.add(item[2])
            elif kind == _CLOSE:
                _, key, ts_ns, reason, stats = item
                conn = self._conns.pop(key, None)
                if conn is not None:
                    self._finish(conn, ts_ns, reason, stats)
                    self.budget.give(conn.held[0] + conn.held[1])
            count += 1
            # checked often: a slice on the loop is short, and a chunk can take 100 us to decode
            if timed and count % 2 == 0:
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    break
                if pause is not None and now > self._next_pause:
                    if ts_ns:
                        self.lagging = time.time_ns() - ts_ns >= self._late_ns - self.max_lag_ns // 2
                    self._pause_now()
        with self._queue_lock:
            self._queued_bytes -= consumed
            self.metrics.recorder_queue_bytes = self._queued_bytes
            if not queue:
                self._behind = False
        self.budget.give(consumed)
        self.metrics.held_bytes = self.budget.used
        self.metrics.rows_recorded = self.rows_recorded

    def _hold(self, conn: _Conn, direction: int, ts_ns: int) -> None:
        """Account for what the connection's decoder holds now (a frame in progress); one that
        the budget cannot take is let go: its rest is skipped, a gap, and counted."""
        held = conn.decoder.buffered(direction)
        grown = held - conn.held[direction]
        if grown <= 0:
            if grown:
                self.budget.give(-grown)
                conn.held[direction] = held
            return
        if self.budget.take(grown, self._keep):
            conn.held[direction] = held
            return
        left = conn.decoder.abandon_frame(direction, ts_ns)
        if not left:  # nothing of known size to let go of (a hunt's window, bounded): keep it
            self.budget.charge(grown)
            conn.held[direction] = held
            return
        conn.gap_bytes[direction] += left
        self.metrics.add("over_budget_frames")
        self.metrics.add("over_budget_bytes", left + held)
        now = conn.decoder.buffered(direction)
        self.budget.give(conn.held[direction] - now)
        conn.held[direction] = now

    def _drain(self, conn: _Conn) -> None:
        builder = conn.rows
        metrics = self.metrics
        for event in conn.decoder.events():
            row = builder.row(event)
            if row is None:
                continue
            if (conn.gap_bytes[0] or conn.gap_bytes[1]) and self._unseen(conn, row):
                row["status"] = "gap"
                row["decode_error"] = _GAP_ERROR
                conn.gap_rows += 1
                metrics.add("gap_rows")
            corr = row.get("correlation_id")
            row["injected"] = corr in conn.injected
            if row["injected"]:
                conn.injected.discard(corr)
            api_key = row.get("api_key")
            if api_key is not None:
                latency = row.get("latency_us")
                codes = [r["error_code"] for r in row.get("partition_errors") or () if r.get("error_code")]
                if row.get("error_code"):
                    codes.append(row["error_code"])
                metrics.observe_response(api_key, None if latency is None else latency / 1e6, codes)
            self.rows_total += 1
            if self.writer is None:
                continue
            if len(self._rows) + self._writing_rows >= self.max_pending_rows:
                conn.dropped_rows += 1
                self.dropped_rows += 1
                metrics.add("dropped_rows")
                continue
            self._rows.append(row)
            self.rows_recorded += 1

    @staticmethod
    def _unseen(conn: _Conn, row: dict[str, Any]) -> bool:
        """Whether a row of a connection with skipped bytes claims what the recorder did not see."""
        status = row.get("status")
        corr = row.get("correlation_id")
        if status == "orphan_response":
            if len(conn.orphans) < _ORPHANS_KEPT:
                conn.orphans.add(corr)
            return True
        if status == "unanswered":
            # Its answer may have gone by while its request was still in a gap's wake (the
            # decoder finds requests after a gap late): the broker sent bytes after the request.
            sent = row.get("request_time")
            return corr in conn.orphans or (sent is not None and sent <= conn.last_answer_ns // 1000)
        return status in _GAP_STATUSES

    def _finish(self, conn: _Conn, ts_ns: int, reason: str, stats: dict[str, Any]) -> None:
        conn.decoder.receive_close(ts_ns, "open_at_end" if reason == "open_at_end" else "closed")
        self._drain(conn)
        info = conn.info
        up, down = conn.decoder.stats(0), conn.decoder.stats(1)
        row = {
            "source": info.source,
            "connection_id": info.connection_id,
            "client_ip": info.client_ip,
            "client_port": info.client_port,
            "broker_ip": info.broker_ip,
            "broker_port": info.broker_port,
            "first_packet_time": conn.first_ns // 1000,
            "last_packet_time": max(conn.last_ns, ts_ns) // 1000,
            "syn_seen": True,
            "end_reason": reason,
            # who ended it first, when the forwarding code says (client_fin, broker_rst, refused, ...);
            # null when it does not know
            "ended_by": stats.get("ended_by"),
            "end_time": stats["end_ns"] // 1000 if stats.get("end_ns") else None,
            "protocol": stats.get("protocol", "kafka"),
            "client_id": conn.rows.client_id,
            "bytes_to_broker": stats.get("bytes_to_broker", up["bytes"] + conn.gap_bytes[0]),
            "bytes_to_client": stats.get("bytes_to_client", down["bytes"] + conn.gap_bytes[1]),
            "frames_to_broker": up["frames"],
            "frames_to_client": down["frames"],
            "gap_bytes_to_broker": conn.gap_bytes[0],
            "gap_bytes_to_client": conn.gap_bytes[1],
            "resyncs": conn.decoder.resyncs,
            "dropped_rows": conn.dropped_rows,
            "date": utc_date(conn.first_ns),
        }
        if row["protocol"] != "kafka":  # as kwire decode: no Kafka decoder, so no Kafka counts
            row.update(frames_to_broker=None, frames_to_client=None, resyncs=None, client_id=None)
        if self.writer is not None:
            self._conn_rows.append(row)

    # ---- writing ------------------------------------------------------------------------

    def _maybe_flush(self, force: bool = False) -> None:
        """Hand the rows made so far to the writer thread every ``_HANDOFF_SECONDS``, and roll
        (files closed and published) every ``flush_seconds`` or ``flush_rows`` rows.

        The writer converts rows ``_BATCH_ROWS`` at a time as they come: converting a whole
        window's rows at the roll (25 us of CPU a row, most of it holding the GIL) was a burst
        of half a second every 10 s at 2,000 exchanges/s, and the forwarding loop's p99."""
        if self.writer is None or (self._writing is not None and not self._writing.done()):
            return
        if self._writing is not None:
            self._collect()
        now = time.monotonic()
        roll = force or now - self._last_flush >= self.flush_seconds or len(self._rows) >= self.flush_rows
        if not roll and now - self._last_handoff < _HANDOFF_SECONDS:
            return
        self._last_handoff = now
        if roll:
            self._last_flush = now
        if not self._rows and not self._conn_rows and not (roll and self._unrolled):
            return
        rows, conn_rows = self._rows, self._conn_rows
        self._rows, self._conn_rows = [], []
        self._writing_rows = len(rows)
        self._unrolled += len(rows)
        rolled = None
        if roll:
            rolled, self._unrolled = self._unrolled, 0
        self._writing = self._executor.submit(self._write, rows, conn_rows, rolled)

    def _write(self, rows: list[dict[str, Any]], conn_rows: list[dict[str, Any]], rolled: int | None) -> None:
        """Writer thread: append rows; with ``rolled`` (the rows handed over since the last
        roll, these included) close and publish the files."""
        writer = self.writer
        assert writer is not None
        for row in rows:
            writer.exchanges.append(row)
        for row in conn_rows:
            writer.connections.append(row)
        if rolled is None:
            return
        writer.roll()
        # counted here, in the writer thread, so the metrics show a roll as soon as it is done
        self.metrics.add("rows_written", rolled)
        self.metrics.add("files_rolled")

    def _collect(self) -> None:
        future, self._writing = self._writing, None
        self._writing_rows = 0
        if future is None:
            return
        future.result()  # a writer error ends the proxy loudly rather than silently

    async def stop(self) -> None:
        """Decode everything queued, close what is still open, write and roll the last files."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        with self._decode_lock:
            self._process(None)
            now = time.time_ns()
            for key in list(self._conns):
                self._finish(self._conns.pop(key), now, "open_at_end", {})
        if self._writing is not None:
            await asyncio.wrap_future(self._writing)
            self._collect()
        if self.writer is not None and (self._rows or self._conn_rows or self._unrolled):
            rows, conn_rows = self._rows, self._conn_rows
            self._rows, self._conn_rows = [], []
            rolled, self._unrolled = self._unrolled + len(rows), 0
            await asyncio.wrap_future(self._executor.submit(self._write, rows, conn_rows, rolled))
        self._executor.shutdown(wait=True)

    @property
    def queued_items(self) -> int:
        return len(self._queue)

    def next_due(self) -> float | None:
        """Seconds until this recorder wants a turn though nothing new comes in: its rows handed to
        the writer, a roll, a finished write collected (None: not until something comes). A caller
        that drives it (``proxy.recorder_worker``) sleeps that long when idle, not a fixed tick."""
        if self._queue:
            return 0.0
        if self.writer is None:
            return None
        if self._writing is not None:
            return 0.0 if self._writing.done() else _WRITE_POLL_SECONDS
        now = time.monotonic()
        due = []
        if self._rows or self._conn_rows:
            due.append(self._last_handoff + _HANDOFF_SECONDS - now)
        if self._rows or self._conn_rows or self._unrolled:
            due.append(self._last_flush + self.flush_seconds - now)
        return max(0.0, min(due)) if due else None

    def pause_if_due(self) -> None:
        """Step aside as ``_process`` does every ``pause_every`` seconds, between other work: the
        worker process feeds a quarter second of a 200-connection load in milliseconds, and a
        stretch without a look at the CPUs raised the loop's p99 (``bench/proxy_parts.py``)."""
        if self._pause is not None and time.monotonic() > self._next_pause:
            self._pause_now()

    def _pause_now(self) -> None:
        """Step aside, and look again ``pause_every`` seconds after."""
        self._step_aside()
        self._next_pause = time.monotonic() + self._pause_every

    def _step_aside(self) -> None:
        """``pause``, unless decoding lags."""
        if not self.lagging and self._pause is not None:
            self._pause()
