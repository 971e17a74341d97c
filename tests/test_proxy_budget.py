"""The memory budget, the recorder letting go of frames it cannot hold, and sliced connection ends.

No broker: the recorder is fed hand-made frames as the forwarding code would hand it chunks.
The real-traffic versions (RSS under load, 2,000 closes) are in ``test_proxy_load.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import kafka_frames as kf
import pyarrow.dataset as ds

from kwire.rows import ConnectionInfo
from proxy.budget import MemoryBudget
from proxy.endings import SLICE, Endings
from proxy.metrics import Metrics
from proxy.recorder import Recorder

MB = 1 << 20


def test_the_budget_takes_what_fits_and_keeps_a_share_free() -> None:
    budget = MemoryBudget(10 * MB)
    assert budget.take(6 * MB)
    assert not budget.take(5 * MB)  # would pass the limit: nothing taken
    assert budget.used == 6 * MB
    assert not budget.take(2 * MB, keep=3 * MB)  # the recorder leaves a share to the others
    assert budget.take(2 * MB)
    budget.give(8 * MB)
    assert budget.used == 0 and budget.peak == 8 * MB
    assert MemoryBudget(0).take(1 << 40)  # 0: no limit


def _large_produce(corr: int, size: int) -> bytes:
    """A Produce v3 request frame of about ``size`` bytes (one record batch of filler)."""
    return kf.produce_v3(corr, 1, batches=(kf.record_batch(1, payload=b"x" * size),))


def test_a_frame_the_budget_cannot_hold_is_let_go_as_a_counted_gap(tmp_path: Path) -> None:
    metrics = Metrics()
    budget = MemoryBudget(4 * MB)
    recorder = Recorder(tmp_path, metrics, budget=budget, max_queue_bytes=64 * MB)
    info = ConnectionInfo("test", "c-1", "127.0.0.1", 40001, "127.0.0.1", 9092)
    recorder.open(1, info, 1)
    small = kf.api_versions_v0(1)
    recorder.data(1, 0, small, 2)
    recorder.data(1, 1, kf.api_versions_v0_response(1), 3)
    recorder._process(None)
    big = _large_produce(2, 12 * MB)  # larger than the whole budget
    for at in range(0, len(big), MB // 2):  # as reads bring it in, decoded as they come
        recorder.data(1, 0, big[at : at + MB // 2], 4)
        recorder._process(None)
        assert budget.used <= 4 * MB
    recorder.data(1, 0, kf.api_versions_v0(3), 5)  # the stream goes on, still aligned
    recorder.data(1, 1, kf.produce_v3_response(2, {0: 0}), 6)
    recorder.data(1, 1, kf.api_versions_v0_response(3), 7)
    recorder.close(1, 8, "fin", {})
    recorder._process(None)
    recorder._maybe_flush(force=True)
    recorder._writing.result()  # type: ignore[union-attr]
    recorder._executor.shutdown(wait=True)
    assert budget.used == 0  # everything given back
    assert metrics.over_budget_frames == 1 and metrics.over_budget_bytes == len(big)
    rows = ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table().to_pylist()
    by_corr = {row["correlation_id"]: row["status"] for row in rows}
    assert by_corr == {1: "ok", 2: "gap", 3: "ok"}  # the frames after it decode as before
    (conn,) = ds.dataset(tmp_path / "connections", partitioning="hive").to_table().to_pylist()
    assert 0 < conn["gap_bytes_to_broker"] < len(big)


def test_ends_are_run_a_slice_per_loop_turn() -> None:
    async def main() -> tuple[int, int]:
        endings = Endings()
        ran: list[int] = []
        for i in range(5 * SLICE):
            endings.defer(ran.append, i)
        seen: list[int] = []
        asyncio.get_running_loop().call_soon(lambda: seen.append(len(ran)))  # another client's turn
        for _ in range(20):
            await asyncio.sleep(0)
        return seen[0], len(ran)

    first_turn, total = asyncio.run(main())
    assert first_turn == SLICE  # the rest waited for later turns
    assert total == 5 * SLICE  # and all ran
