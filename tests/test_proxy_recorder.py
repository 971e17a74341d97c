"""The proxy's recorder on real bytes: inline catch-up, the task's backlog, and its two bounds.

The bytes are the connections of a real capture (several client libraries against Tansu),
fed to the recorder frame by frame as the forwarding code would hand it chunks. Rows are counted
against a ``KafkaConnection`` fed the same bytes directly (the decoder the recorder wraps).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from decoder.connection import KafkaConnection
from kwire.rows import ConnectionInfo, ExchangeRows
from proxy import recorder as recorder_module
from proxy.metrics import Metrics
from proxy.recorder import Recorder
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


def _expected_rows() -> int:
    rows = 0
    for _, info, chunks in CONNECTIONS:
        decoder, builder = KafkaConnection(), ExchangeRows(info)
        for ts, (direction, frame) in enumerate(chunks, 1):
            decoder.receive_data(direction, frame, ts * 1000)
        decoder.receive_close(END_NS, "closed")
        rows += sum(builder.row(event) is not None for event in decoder.events())
    return rows


EXPECTED_ROWS = _expected_rows()


def _feed(recorder: Recorder, catch_up: bool, connections: int | None = None) -> None:
    for key, info, chunks in CONNECTIONS[:connections]:
        recorder.open(key, info, 0)
        for ts, (direction, frame) in enumerate(chunks, 1):
            recorder.data(key, direction, frame, ts * 1000)
            if catch_up:
                recorder.catch_up()


def _close(recorder: Recorder) -> None:
    for key, _, _ in CONNECTIONS:
        recorder.close(key, END_NS, "fin", {})


def _close_and_write(recorder: Recorder) -> None:
    """Close every connection, decode everything and write it, as ``Recorder.stop`` would."""
    _close(recorder)
    recorder._process(None)
    recorder._maybe_flush(force=True)
    recorder._writing.result()  # type: ignore[union-attr]
    # no _collect(): the metrics must count a roll once it is done, not when the recorder next looks
    recorder._executor.shutdown(wait=True)


def _table(root: Path, name: str) -> list[dict[str, Any]]:
    return ds.dataset(root / name, partitioning="hive").to_table().to_pylist()


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


# ---- on the event loop: forwarding first --------------------------------------------------


def _on_loop(connections: list[tuple[int, ConnectionInfo, Chunks]]) -> tuple[list[int], int, int]:
    """Queue ``connections``' chunks on a running loop as reads would, ask for a catch-up, and
    note how many items are still queued when a callback made ready just after them runs (a read
    of the next loop turn) and once the recorder is idle. Also: how many were queued, rows made."""
    seen: list[int] = []

    async def run() -> tuple[int, int]:
        recorder = Recorder(None, Metrics())
        recorder.start()
        loop = asyncio.get_running_loop()
        for key, info, chunks in connections:
            recorder.open(key, info, time.time_ns())
            for direction, frame in chunks:
                recorder.data(key, direction, frame, time.time_ns())
        queued = recorder.queued_items
        recorder.catch_up()  # on the loop: a decoding turn is scheduled, nothing decoded now
        seen.append(recorder.queued_items)
        loop.call_soon(lambda: seen.append(recorder.queued_items))
        deadline = time.monotonic() + 10
        while recorder.queued_items and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        seen.append(recorder.queued_items)
        await recorder.stop()
        return queued, recorder.rows_total

    queued, rows = asyncio.run(run())
    return seen, queued, rows


def test_on_the_loop_decoding_steps_behind_the_reads_of_the_next_turn() -> None:
    """A few chunks queued: the next turn's reads are forwarded before any of them is decoded."""
    small = [c for c in CONNECTIONS if len(c[2]) >= 8][:2]
    seen, queued, rows = _on_loop(small)
    assert queued <= recorder_module._BACKLOG_ITEMS
    assert seen[:2] == [queued, queued]  # the callback ran first; nothing was decoded before it
    assert seen[2] == 0 and rows > 0  # then it was all decoded, without the recorder task's help


def test_on_the_loop_a_backlog_is_decoded_before_more_reads() -> None:
    """Decoding behind (more than ``_BACKLOG_ITEMS`` queued): it takes its slice first, so a
    loop that is never idle cannot starve it."""
    seen, queued, rows = _on_loop(CONNECTIONS)
    assert queued > recorder_module._BACKLOG_ITEMS
    assert seen[0] == queued and seen[1] < queued  # a slice was decoded before the callback ran
    assert seen[2] == 0 and rows > 0


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
