"""The proxy's recorder on real bytes: inline catch-up, the task's backlog, and its two bounds.

The bytes are the connections of a real capture (several client libraries against Tansu),
fed to the recorder frame by frame as the forwarding code would hand it chunks. Rows are counted
against a ``KafkaConnection`` fed the same bytes directly (the decoder the recorder wraps).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from decoder.connection import KafkaConnection
from kwire.rows import ConnectionInfo, ExchangeRows
from proxy import recorder as recorder_module
from proxy.budget import MemoryBudget
from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.recorder_worker import RecorderProcess
from proxy.streams import capture_streams, split_frames

CAPTURE = Path(__file__).resolve().parents[1] / "captures" / "tansu-mixed.pcap"
Chunks = list[tuple[int, bytes]]


def _frames(stream: Any) -> Chunks:
    """(direction, frame) of one connection, each request before its response."""
    requests, responses = list(split_frames(stream.data[0])), list(split_frames(stream.data[1]))
    chunks: Chunks = []
    for index in range(max(len(requests), len(responses))):
        if index < len(requests):
            chunks.append((0, requests[index]))
        if index < len(responses):
            chunks.append((1, responses[index]))
    return chunks


CONNECTIONS: list[tuple[int, ConnectionInfo, Chunks]] = [
    (key, ConnectionInfo("test", f"c-{key}", "127.0.0.1", 40000 + key, "127.0.0.1", 9092), _frames(stream))
    for key, stream in enumerate(capture_streams([CAPTURE]), 1)
]
CHUNK_COUNT = sum(len(chunks) for _, _, chunks in CONNECTIONS)
TOTAL_BYTES = sum(len(frame) for _, _, chunks in CONNECTIONS for _, frame in chunks)
END_NS = 10**9


def _direct_rows() -> list[dict[str, Any]]:
    """The exchange rows of ``CONNECTIONS`` from a ``KafkaConnection`` fed directly."""
    rows: list[dict[str, Any]] = []
    for _, info, chunks in CONNECTIONS:
        decoder, builder = KafkaConnection(), ExchangeRows(info)
        for ts, (direction, frame) in enumerate(chunks, 1):
            decoder.receive_data(direction, frame, ts * 1000)
        decoder.receive_close(END_NS, "closed")
        rows += [row for row in map(builder.row, decoder.events()) if row is not None]
    return rows


EXPECTED_ROWS = len(_direct_rows())


def _feed(recorder: Recorder, catch_up: bool, connections: int | None = None, base: int = 0) -> None:
    for key, info, chunks in CONNECTIONS[:connections]:
        recorder.open(key, info, base)
        for ts, (direction, frame) in enumerate(chunks, 1):
            recorder.data(key, direction, frame, base + ts * 1000)
            if catch_up:
                recorder.catch_up()


def _close(recorder: Recorder, base: int = 0) -> None:
    for key, _, _ in CONNECTIONS:
        recorder.close(key, base + END_NS, "fin", {})


def _close_and_write(recorder: Recorder, base: int = 0) -> None:
    """Close every connection, decode everything and write it, as ``Recorder.stop`` would."""
    _close(recorder, base)
    recorder._process(None)
    recorder._maybe_flush(force=True)
    recorder._writing.result()  # type: ignore[union-attr]
    # no _collect(): the metrics must count a roll once it is done, not when the recorder next looks
    recorder._executor.shutdown(wait=True)


def _table(root: Path, name: str) -> list[dict[str, Any]]:
    return ds.dataset(root / name, partitioning="hive").to_table().to_pylist()


def _comparable(root: Path, table: str) -> list[list[tuple[str, str]]]:
    """A written table's rows in a canonical order, without what differs between two writers
    (their source name, their connection ids)."""
    rows = [
        sorted((k, repr(v)) for k, v in row.items() if k not in ("source", "connection_id"))
        for row in _table(root, table)
    ]
    return sorted(rows)


def test_the_capture_has_enough_exchanges() -> None:
    assert len(CONNECTIONS) >= 5 and EXPECTED_ROWS > 40


def test_catch_up_decodes_each_read_at_once() -> None:
    recorder = Recorder(None, Metrics())
    _feed(recorder, catch_up=True)
    assert recorder.queued_items == 0  # nothing left for the task
    assert not recorder._wake.is_set()  # and the task was not woken
    for key, _, _ in CONNECTIONS:
        recorder.close(key, END_NS, "fin", {})
        recorder.catch_up()
    assert recorder.queued_items == 0 and recorder.rows_total == EXPECTED_ROWS


def test_a_backlog_is_left_to_the_task_in_slices() -> None:
    recorder = Recorder(None, Metrics())
    _feed(recorder, catch_up=False)
    assert recorder.queued_items == CHUNK_COUNT + len(CONNECTIONS)  # opens and chunks
    assert recorder._wake.is_set()  # more than a few queued: the task is woken
    recorder.catch_up()  # a backlog: not decoded inline
    assert recorder.queued_items == CHUNK_COUNT + len(CONNECTIONS) and recorder.rows_total == 0
    _close(recorder)
    recorder._process(None)  # what the task (or stop) does
    assert recorder.rows_total == EXPECTED_ROWS


def test_a_full_queue_turns_chunks_into_counted_gaps(tmp_path: Path) -> None:
    metrics = Metrics()
    recorder = Recorder(tmp_path, metrics, max_queue_bytes=TOTAL_BYTES // 2)
    _feed(recorder, catch_up=False)  # nothing decoded meanwhile: the queue fills up
    _close_and_write(recorder)
    assert 0 < metrics.dropped_bytes <= TOTAL_BYTES - TOTAL_BYTES // 2
    connections = _table(tmp_path, "connections")
    assert len(connections) == len(CONNECTIONS)
    assert (
        sum(c["gap_bytes_to_broker"] + c["gap_bytes_to_client"] for c in connections) == metrics.dropped_bytes
    )
    rows = _table(tmp_path, "exchanges")
    statuses = [row["status"] for row in rows]
    assert statuses.count("ok") < EXPECTED_ROWS  # what fell in the gaps is not reported as seen
    # ... nor as unanswered, cut or answering nothing: the recorder cannot tell, and says so
    gapped = {c["connection_id"] for c in connections if c["gap_bytes_to_broker"] or c["gap_bytes_to_client"]}
    claims = {"truncated", "orphan_response", "malformed", "unanswered"}
    assert gapped and not [r for r in rows if r["connection_id"] in gapped and r["status"] in claims]
    assert statuses.count("gap") == metrics.gap_rows > 0


@pytest.mark.parametrize("feed_delay", [0.0, 1.5])
def test_a_feed_that_hands_chunks_over_late_is_not_taken_for_decoding_lag(
    feed_delay: float, monkeypatch: Any
) -> None:
    """A passive capture's packets reach kwire up to ``RING_DELAY_S`` after their timestamps
    (tcpdump's kernel ring). With a 1 s flush window (a 0.5 s lag bound), a backlog of chunks
    stamped a second ago is taken for decoding lag, and what comes in meanwhile is skipped,
    unless the recorder is told of the feed's delay. (``kwire capture`` skipped whole
    connections of a quiet link so, when a ring block came in late.)"""
    clock = iter(range(10**9))  # each look at the clock: 0.1 ms later, so a slice ends in order
    monkeypatch.setattr(recorder_module.time, "monotonic", lambda: next(clock) * 1e-4)
    metrics = Metrics()
    recorder = Recorder(None, metrics, flush_seconds=1.0, feed_delay_seconds=feed_delay)
    stale = time.time_ns() - 10**9
    _feed(recorder, catch_up=False, base=stale)  # a ring block's worth, handed over at once
    recorder._process(0.01)  # a slice of it (about 200 items, more than 64, fewer than all)
    assert recorder.queued_items > 0
    _, info, chunks = CONNECTIONS[0]
    recorder.open(1000, info, stale)
    for direction, frame in chunks:  # the next chunks the feed hands over meanwhile
        recorder.data(1000, direction, frame, stale)
    if feed_delay:
        assert metrics.dropped_bytes == 0
    else:
        assert metrics.dropped_bytes == sum(len(frame) for _, frame in chunks)


def test_rows_beyond_the_writers_backlog_are_dropped_and_counted(tmp_path: Path) -> None:
    metrics = Metrics()
    recorder = Recorder(tmp_path, metrics, max_pending_rows=5, flush_rows=10_000)
    _feed(recorder, catch_up=True)
    _close_and_write(recorder)
    assert metrics.dropped_rows == EXPECTED_ROWS - 5 == recorder.dropped_rows
    assert metrics.rows_written == 5 and metrics.files_rolled == 1
    assert sum(c["dropped_rows"] for c in _table(tmp_path, "connections")) == EXPECTED_ROWS - 5
    assert ds.dataset(tmp_path / "exchanges", partitioning="hive").count_rows() == 5


@pytest.mark.parametrize("items", [recorder_module._CATCH_UP_ITEMS, recorder_module._CATCH_UP_ITEMS + 1])
def test_catch_up_takes_a_few_items_inline_and_no_more(items: int) -> None:
    recorder = Recorder(None, Metrics())
    key, info, chunks = max(CONNECTIONS, key=lambda connection: len(connection[2]))
    assert len(chunks) >= items
    recorder.open(key, info, 0)
    for ts, (direction, frame) in enumerate(chunks[: items - 1], 1):
        recorder.data(key, direction, frame, ts * 1000)
    recorder.catch_up()
    assert recorder.queued_items == (0 if items <= recorder_module._CATCH_UP_ITEMS else items)


def test_who_ended_a_connection_is_recorded_when_the_proxy_says(tmp_path: Path) -> None:
    """``connections.ended_by``/``end_time`` as the forwarding code reports them; null when it does not
    say (the schema's default for a proxy that cannot tell)."""
    recorder = Recorder(tmp_path, Metrics())
    _feed(recorder, catch_up=True, connections=2)
    (first, _, _), (second, _, _) = CONNECTIONS[:2]
    recorder.close(first, END_NS, "rst", {"ended_by": "broker_rst", "end_ns": END_NS - 5_000})
    recorder.close(second, END_NS, "fin", {})
    recorder._process(None)
    recorder._maybe_flush(force=True)
    recorder._writing.result()  # type: ignore[union-attr]
    recorder._executor.shutdown(wait=True)
    got = {c["connection_id"]: c for c in _table(tmp_path, "connections")}
    assert got[f"c-{first}"]["ended_by"] == "broker_rst"
    assert got[f"c-{first}"]["end_time"].timestamp() == pytest.approx((END_NS - 5_000) / 1e9)
    assert (got[f"c-{second}"]["ended_by"], got[f"c-{second}"]["end_time"]) == (None, None)


def test_rows_handed_to_the_writer_between_rolls_are_published_and_counted_at_the_roll(
    tmp_path: Path,
) -> None:
    """Rows go to the writer thread every ``_HANDOFF_SECONDS`` (converted as they come, not all
    at the roll), but become visible, and counted as written, only when the files roll."""
    metrics = Metrics()
    recorder = Recorder(tmp_path, metrics, flush_seconds=3600)
    _feed(recorder, catch_up=True)
    made = recorder.rows_recorded
    recorder._last_handoff -= recorder_module._HANDOFF_SECONDS
    recorder._maybe_flush()  # a handoff, no roll
    assert recorder._writing is not None
    recorder._writing.result()
    assert not recorder._rows and recorder._unrolled == made > 0
    assert metrics.rows_written == 0 and metrics.files_rolled == 0
    assert not list(tmp_path.rglob("*.parquet"))  # nothing published yet
    _close_and_write(recorder)  # the roll: the rows handed over before it and those since
    assert metrics.rows_written == recorder.rows_recorded == EXPECTED_ROWS and metrics.files_rolled == 1
    assert ds.dataset(tmp_path / "exchanges", partitioning="hive").count_rows() == EXPECTED_ROWS


def test_next_due_says_when_the_recorder_wants_a_turn_without_new_input(tmp_path: Path) -> None:
    """What a driver of the recorder sleeps on when no traffic comes (``proxy.recorder_worker``):
    rows waiting are handed to the writer within ``_HANDOFF_SECONDS``, handed ones rolled within
    the flush window; nothing held, nothing due."""
    assert Recorder(None, Metrics()).next_due() is None  # no writer: nothing is ever due
    recorder = Recorder(tmp_path, Metrics(), flush_seconds=3600)
    assert recorder.next_due() is None
    _feed(recorder, catch_up=False, connections=1)
    assert recorder.next_due() == 0.0  # items queued
    recorder._process(None)
    assert recorder._rows and 0.0 <= recorder.next_due() <= recorder_module._HANDOFF_SECONDS
    recorder._last_handoff -= recorder_module._HANDOFF_SECONDS
    recorder._maybe_flush()  # a hand-off, no roll
    assert recorder._writing is not None
    recorder._writing.result()
    assert recorder.next_due() == 0.0  # a finished write to collect
    recorder._maybe_flush()
    assert not recorder._rows and recorder._unrolled
    assert 3000 < recorder.next_due() <= 3600  # the roll, at the end of the flush window
    recorder._executor.shutdown(wait=True)


# ---- the proxy's recorder process -------------------------------------------------------------


def _through_worker(
    out: Path | None,
    metrics: Metrics,
    base: int | None,
    catch_up: bool = True,
    connections: list[tuple[int, ConnectionInfo, Chunks]] = CONNECTIONS,
    started: Any = None,
    **options: Any,
) -> RecorderProcess:
    """``CONNECTIONS`` fed to a ``RecorderProcess`` on a loop, as the forwarding code would,
    their time counted from ``base`` (the worker skips chunks that lag too far behind the
    clock; None: from when the first is sent); without ``catch_up`` nothing is sent before
    ``stop``. ``started()`` is called once the worker is ready, before the first chunk."""

    async def run(base: int | None) -> RecorderProcess:
        recorder = RecorderProcess(out, metrics, **options)
        await recorder.start()
        if started is not None:
            started()
        base = time.time_ns() if base is None else base
        for key, info, chunks in connections:
            recorder.open(key, info, base)
            for ts, (direction, frame) in enumerate(chunks, 1):
                recorder.data(key, direction, memoryview(frame), base + ts * 1000)  # any buffer
                if catch_up:
                    recorder.catch_up()
            recorder.close(key, base + END_NS, "fin", {})  # sent within a few ms, or at stop
            if catch_up:
                await asyncio.sleep(0)
        await recorder.stop()
        return recorder

    return asyncio.run(run(base))


def test_the_worker_process_makes_the_rows_and_metrics_the_recorder_makes(tmp_path: Path) -> None:
    base = time.time_ns()
    inline = Metrics()
    recorder = Recorder(tmp_path / "inline", inline)
    _feed(recorder, catch_up=False, base=base)
    _close_and_write(recorder, base)
    metrics = Metrics()
    worker = _through_worker(tmp_path / "worker", metrics, base, flush_seconds=0.2)
    assert worker.rows_total == worker.rows_recorded == EXPECTED_ROWS
    assert metrics.rows_recorded == metrics.rows_written == EXPECTED_ROWS and metrics.files_rolled >= 1
    for table in ("exchanges", "connections"):
        made, expected = (_comparable(tmp_path / name, table) for name in ("worker", "inline"))
        assert made == expected and made, table
    # the metric deltas the worker shipped add up to what the same rows make in-process
    assert metrics.latency == inline.latency and metrics.errors == inline.errors
    assert metrics.latency_sum == pytest.approx(inline.latency_sum)
    assert not metrics.dropped_bytes and not metrics.gap_rows


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_worker_process_runs_only_on_cpu_nobody_else_wants(tmp_path: Path) -> None:
    """SCHED_IDLE: a forwarding loop that wakes preempts the worker at once (issue 18's p99)."""

    async def run() -> int:
        recorder = RecorderProcess(tmp_path, Metrics())
        await recorder.start()
        try:
            assert recorder._proc is not None
            return os.sched_getscheduler(recorder._proc.pid)
        finally:
            await recorder.stop()

    assert asyncio.run(run()) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the proxy's own loop keeps its priority


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_proxy_lifts_its_idle_worker_to_write_the_last_rows(tmp_path: Path) -> None:
    """As it stops the worker, the proxy's own process puts every thread of it back to an
    ordinary priority (``_leave_idle(pid)``): the worker doing it itself first needs a CPU, which
    an idle-class process on a saturated machine may not get for a minute (a CI run of
    ``test_a_recording_proxy_starts_and_stops_on_a_saturated_machine`` outlasted its 60 s)."""
    from proxy.recorder_worker import _leave_idle

    def policies(pid: int) -> set[int]:
        return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}

    async def run() -> tuple[set[int], set[int]]:
        recorder = RecorderProcess(tmp_path, Metrics())
        await recorder.start()
        try:
            assert recorder._proc is not None
            pid = recorder._proc.pid
            before = policies(pid)
            _leave_idle(pid)
            return before, policies(pid)
        finally:
            await recorder.stop()

    before, after = asyncio.run(run())
    assert os.SCHED_IDLE in before and after == {os.SCHED_OTHER}, (before, after)


def test_the_worker_process_runs_the_tuned_collector(tmp_path: Path) -> None:
    """The worker starts with ``python -m``, not through ``kwire.cli``: it tunes CPython's cyclic
    collector itself (``kwire.runtime.tune_gc``). With the defaults it cost a fifth of its CPU
    on issue 18's 200-connection load (``bench/recorder_replay.py``)."""
    code = (
        "import gc, os, sys\n"
        "from proxy import recorder_worker as w\n"
        "settings = {'out_dir': sys.argv[1], 'budget_limit': 1 << 28}\n"
        "r, s = os.pipe(); back_r, back_w = os.pipe()\n"
        "os.write(s, w._frame(settings)); os.close(s)\n"
        "before = gc.get_threshold()\n"
        "assert w._worker(r, back_w) == 0\n"
        "print(before, gc.get_threshold(), gc.get_freeze_count() > 1000)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "(700, 10, 10) (100000, 50, 100) True"


def test_the_worker_process_bounds_its_queue_with_gaps(tmp_path: Path) -> None:
    """Chunks waiting to be sent beyond the queue's bound (here: nothing sent while the loop
    feeds it) are skipped as counted gaps, and no row claims what the recorder did not see."""
    metrics = Metrics()
    budget = MemoryBudget(4 * TOTAL_BYTES)
    _through_worker(
        tmp_path, metrics, time.time_ns(), catch_up=False, max_queue_bytes=TOTAL_BYTES // 8, budget=budget
    )
    assert metrics.dropped_bytes > 0
    connections = _table(tmp_path, "connections")
    assert (
        sum(c["gap_bytes_to_broker"] + c["gap_bytes_to_client"] for c in connections) >= metrics.dropped_bytes
    )
    statuses = [row["status"] for row in _table(tmp_path, "exchanges")]
    assert statuses.count("gap") == metrics.gap_rows
    assert budget.used == 0  # everything taken was given back


def test_an_idle_worker_reports_about_once_a_second_and_still_rolls_on_time(tmp_path: Path) -> None:
    """With no traffic the worker sleeps until its recorder has something due (a hand-off to the
    writer, a roll) or a heartbeat report (``_IDLE_REPORT_SECONDS``), and reports nothing that did
    not change: reporting ten times a second regardless, an idle ``kwire proxy -o`` took 10-11 ms
    of CPU a second, each of its two processes woken ten times a second. What it holds is still
    written, and reported, with no more traffic."""

    async def run() -> tuple[int, float]:
        metrics = Metrics()
        recorder = RecorderProcess(tmp_path, metrics, flush_seconds=1.0)
        applied: list[float] = []
        apply = recorder._apply

        def counted(report: dict[str, Any]) -> None:
            applied.append(time.monotonic())
            apply(report)

        recorder._apply = counted  # type: ignore[method-assign]
        await recorder.start()
        try:
            base = time.time_ns()
            for key, info, chunks in CONNECTIONS:
                recorder.open(key, info, base)
                for ts, (direction, frame) in enumerate(chunks, 1):
                    recorder.data(key, direction, memoryview(frame), base + ts * 1000)
                recorder.close(key, base + END_NS, "fin", {})
            recorder.catch_up()
            deadline = time.monotonic() + 60
            while metrics.rows_written < EXPECTED_ROWS and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # rolled within the flush window, no traffic since
            written = metrics.rows_written
            await asyncio.sleep(0.5)
            before = len(applied)
            await asyncio.sleep(3.0)
            idle = len(applied) - before
        finally:
            await recorder.stop()
        return written, idle

    written, idle = asyncio.run(run())
    assert written == EXPECTED_ROWS
    # the heartbeat, every _IDLE_REPORT_SECONDS (1 s): 3 in 3 s (ten a second before: 30)
    assert 1 <= idle <= 5


def test_metric_deltas_add_up() -> None:
    source, target = Metrics(), Metrics()
    source.observe_response(0, 0.003, [6, 56])
    source.observe_response(0, 0.5, [])
    source.add("gap_rows", 2)
    target.observe_response(0, 0.003, [6])
    target.merge(source.take_recorded())
    source.observe_response(3, None, [999_999])  # an unknown code: "other", bounded
    target.merge(source.take_recorded())
    assert sum(target.latency[0]) == 3 and target.errors[(0, 6)] == 2 and target.errors[(0, 56)] == 1
    assert target.gap_rows == 2 and source.gap_rows == 0 and not source.latency
    assert len(target.errors) == 3


def test_a_batch_larger_than_the_workers_reads_goes_through(tmp_path: Path) -> None:
    """16 MB sent in one message (one loop turn's chunks, e.g. 16 connections' 1 MB reads): the
    worker reads 8 MB at a time, and reads on to the end of a larger message."""
    size = 16 << 20
    head = struct.pack(">hhih", 0, 3, 1, 3) + b"big"
    frame = struct.pack(">i", len(head) + size) + head + bytes(size)
    big = (999, ConnectionInfo("test", "big", "127.0.0.1", 1, "127.0.0.1", 9092), [(0, frame)])
    metrics = Metrics()
    worker = _through_worker(
        tmp_path, metrics, time.time_ns(), catch_up=False, connections=[big, *CONNECTIONS]
    )
    assert not metrics.dropped_bytes
    assert worker.rows_total == EXPECTED_ROWS + 1  # the big request too, unanswered


def test_the_worker_stops_gathering_once_a_quarter_of_its_pipe_waits(monkeypatch: Any) -> None:
    """After a quiet turn the recorder process lets batches gather in its pipe, but never until
    the pipe fills: once a quarter of it waits, it reads again. (Gathering for its full time,
    60 s here, would leave the thread running.)"""
    import threading

    from proxy import recorder_worker

    monkeypatch.setattr(recorder_worker, "_GATHER_SECONDS", 60.0)
    read_fd, write_fd = os.pipe()
    try:
        enough = recorder_worker._pipe_size(read_fd) // 4
        os.write(write_fd, b"x" * (enough - 1))
        assert recorder_worker._waiting_bytes(read_fd) == enough - 1
        gathering = threading.Thread(target=recorder_worker._gather, args=(read_fd, enough), daemon=True)
        gathering.start()
        gathering.join(0.3)
        assert gathering.is_alive()  # not enough yet: still gathering
        os.write(write_fd, b"x")
        gathering.join(10)
        assert not gathering.is_alive()
    finally:
        os.close(read_fd)
        os.close(write_fd)


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_messages_cross_the_pipe_whole_and_large_chunks_are_never_copied_on_the_way_out() -> None:
    """``_message`` leaves chunks of ``_OUT_OF_BAND`` bytes or more out of the pickle (its
    segments are the chunks themselves); ``_Inbox`` takes messages back however the pipe cuts
    them, growing for one larger than its buffer and letting that go after."""
    from proxy import recorder_worker as w

    big = bytes(range(256)) * 12_000  # 3 MB: larger than the inbox's buffer below
    chunks: list[Any] = [b"", b"tiny", b"m" * 5000, big, memoryview(big)[100:70_000]]
    items = [
        (w._DATA, 7, 0, pickle.PickleBuffer(c) if len(c) >= w._OUT_OF_BAND else bytes(c), i)
        for i, c in enumerate(chunks)
    ]
    messages = [(0, items[:2]), {"settings": 1}, (5, items[2:])]
    segments = [w._message(m) for m in messages]

    def root(buffer: Any) -> Any:
        while isinstance(buffer, memoryview | pickle.PickleBuffer):
            buffer = memoryview(buffer).obj if isinstance(buffer, pickle.PickleBuffer) else buffer.obj
        return buffer

    assert [root(s) for s in segments[2][2:]] == [chunks[2], big, big]
    assert all(root(s) is c for s, c in zip(segments[2][2:], [chunks[2], big, big], strict=True))
    wire = b"".join(bytes(memoryview(s)) for m in segments for s in m)
    read_fd, write_fd = os.pipe()
    got: list[Any] = []
    inbox = w._Inbox(1 << 20)
    try:
        for at in range(0, len(wire), 1 << 16):
            os.write(write_fd, wire[at : at + (1 << 16)])
            while _readable(read_fd):
                inbox.read(read_fd, min(max(inbox.target() - inbox.held, 1), 100_000))
                got += inbox.messages()
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert got == [
        (0, [(w._DATA, 7, 0, bytes(c), i) for i, c in enumerate(chunks[:2])]),
        {"settings": 1},
        (5, [(w._DATA, 7, 0, bytes(c), i + 2) for i, c in enumerate(chunks[2:])]),
    ]
    assert (inbox.held, len(inbox.buf)) == (0, 1 << 20)


def test_decoding_steps_aside_between_stretches_and_makes_the_same_rows(tmp_path: Path) -> None:
    """``pause``/``pause_every``: what the worker process gives its ``Recorder`` so that it can
    step aside while other tasks wait for a CPU (``proxy.contention``). Called between decoding
    stretches, it changes no row; and never while decoding lags by half its bound or more."""
    base = time.time_ns()
    pauses = []
    paused = Recorder(tmp_path / "paused", Metrics(), pause=lambda: pauses.append(1), pause_every=1e-9)
    plain = Recorder(tmp_path / "plain", Metrics())
    for recorder in (paused, plain):
        _feed(recorder, catch_up=False, base=base)
        _close_and_write(recorder, base)
    assert len(pauses) >= CHUNK_COUNT // 2 - 1  # every second item, at this stretch
    for table in ("exchanges", "connections"):
        paused_rows, plain_rows = (_comparable(tmp_path / name, table) for name in ("paused", "plain"))
        assert paused_rows == plain_rows and paused_rows, table
    late = []
    lagging = Recorder(None, Metrics(), pause=lambda: late.append(1), pause_every=1e-9, max_lag_seconds=2)
    _feed(lagging, catch_up=False, base=time.time_ns() - 1_000_000_000)  # 1 s behind: half the bound
    lagging._process(None)
    assert lagging.lagging and len(late) <= 1  # the first look may come before it knows


def test_feeding_steps_aside_when_due(tmp_path: Path) -> None:
    """``pause_if_due``: what the worker calls between the batches it feeds, so that a read's
    worth of them is not one stretch without a look at the CPUs. Due every ``pause_every``, and
    never while decoding lags."""
    pauses = []
    recorder = Recorder(None, Metrics(), pause=lambda: pauses.append(1), pause_every=3600)
    recorder.pause_if_due()
    recorder.pause_if_due()  # due again in an hour
    assert pauses == [1]
    recorder.lagging = True
    recorder._next_pause = 0.0
    recorder.pause_if_due()
    assert pauses == [1]
    Recorder(None, Metrics()).pause_if_due()  # no pause given: nothing to call


def test_the_writer_steps_aside_between_conversions(tmp_path: Path) -> None:
    from kwire.dataset import DatasetWriter

    pauses = []
    writer = DatasetWriter(tmp_path, convert_rows=16, batch_rows=64, pause=lambda: pauses.append(1))
    rows = _direct_rows()
    assert len(rows) == EXPECTED_ROWS >= 64
    for row in rows:
        writer.exchanges.append(row)
    writer.close()
    assert len(pauses) >= len(rows) // 64 * (64 // 16)
    assert len(_table(tmp_path, "exchanges")) == len(rows)


def test_the_worker_process_steps_aside_while_others_wait_and_still_records_everything(
    tmp_path: Path,
) -> None:
    """One busy process more than the machine has CPUs, at normal priority: the worker sleeps
    while they wait (counted in ``kwire_proxy_recorder_deferred_seconds_total``), within its
    allowance, and records every row all the same."""
    from proxy import recorder_worker
    from proxy.contention import CpuContention

    # for 3 s from when the worker is ready; at nice 19, so that the idle-class worker still gets
    # a little CPU (about 6%) to look with, and sees them wait, well within its lag bound (5 s)
    spin = "import os, time\nos.nice(19)\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\n"
    spinners: list[subprocess.Popen[bytes]] = []

    def spinning() -> None:
        spinners.extend(
            subprocess.Popen([sys.executable, "-c", spin]) for _ in range(CpuContention().cpus + 1)
        )
        time.sleep(0.3)  # started (the loop is held: the chunks all come while they spin)

    start = time.monotonic()
    try:
        metrics = Metrics()
        worker = _through_worker(tmp_path, metrics, None, started=spinning)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)
    assert worker.rows_total == worker.rows_recorded == EXPECTED_ROWS
    assert len(_table(tmp_path, "exchanges")) == EXPECTED_ROWS and not metrics.gap_rows
    assert metrics.recorder_deferred_seconds > 0
    elapsed = time.monotonic() - start
    assert (
        metrics.recorder_deferred_seconds
        <= recorder_worker._DEFER_BURST + recorder_worker._DEFER_SHARE * elapsed
    )
