"""Hostile input: the stream decoder never raises, never hangs, never allocates past its limits.

Three angles: every compiled body decoder on random bytes (hypothesis), whole streams of
random and mutated real frames through ``KafkaConnection`` (hypothesis), and coverage-guided
fuzzing with atheris when it is installed. The number of inputs tried is reported at the end
of the run.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import coverage_report
import kafka_frames as kf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoder import protocol
from decoder.connection import KafkaConnection
from decoder.events import RequestReceived
from decoder.pcap import iter_segments
from decoder.primitives import Malformed
from decoder.tcp import StreamData, TcpReassembler

REPO = Path(__file__).resolve().parent.parent
DECODE_ERRORS = (Malformed, struct.error, IndexError, ValueError, OverflowError)
ALL_MESSAGES = [(d, k, v) for d in ("request", "response") for k, v in protocol.all_versions(d)]


def real_streams() -> list[tuple[bytes, bytes]]:
    """(client->broker, broker->client) byte streams of every connection in a bundled capture."""
    reassembler = TcpReassembler()
    streams: dict[int, list[bytearray]] = {}
    for segment in iter_segments(REPO / "captures" / "tansu-mixed.pcap"):
        for event in reassembler.feed(segment):
            if isinstance(event, StreamData):
                streams.setdefault(event.conn_id, [bytearray(), bytearray()])[event.direction] += event.data
    return [(bytes(up), bytes(down)) for up, down in streams.values() if up]


REAL = real_streams()


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(message=st.sampled_from(ALL_MESSAGES), body=st.binary(max_size=300))
def test_every_body_decoder_survives_random_bytes(message: tuple[str, int, int], body: bytes) -> None:
    direction, api_key, version = message
    decoder = (protocol.request_decoder if direction == "request" else protocol.response_decoder)(
        api_key, version
    )
    try:
        _fields, stop = decoder(body, 0, len(body))
    except DECODE_ERRORS:
        stop = None
    assert stop is None or stop >= 0
    coverage_report.add("fuzz: random bodies through compiled decoders", 1)


def _feed_all(conn: KafkaConnection, up: bytes, down: bytes, chunk: int) -> list:
    for at in range(0, max(len(up), len(down)), chunk):
        conn.receive_data(0, up[at : at + chunk], at)
        conn.receive_data(1, down[at : at + chunk], at)
    conn.receive_close(1 << 40)
    return conn.events()


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    up=st.binary(max_size=2000),
    down=st.binary(max_size=2000),
    chunk=st.integers(1, 700),
    synced=st.booleans(),
)
def test_random_streams_never_raise(up: bytes, down: bytes, chunk: int, synced: bool) -> None:
    events = _feed_all(KafkaConnection(synced=synced), up, down, chunk)
    assert all(not isinstance(e, RequestReceived) or e.request.size >= 12 for e in events)
    coverage_report.add("fuzz: random byte streams", 1)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    index=st.integers(0, len(REAL) - 1),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=8),
    cut=st.integers(0, 10**6),
    chunk=st.integers(1, 500),
)
def test_mutated_real_streams_never_raise(
    index: int, flips: list[tuple[int, int]], cut: int, chunk: int
) -> None:
    up, down = (bytearray(s) for s in REAL[index])
    for position, value in flips:
        target = up if position % 2 else down
        if target:
            target[position % len(target)] = value
    _feed_all(KafkaConnection(), bytes(up[: cut % (len(up) + 1)]), bytes(down), chunk)
    coverage_report.add("fuzz: mutated real streams", 1)


def test_real_streams_decode_cleanly_unmutated() -> None:
    """The control for the mutation test: the unmutated streams decode without a malformed frame."""
    statuses = set()
    for up, down in REAL:
        for event in _feed_all(KafkaConnection(), up, down, 1000):
            if isinstance(event, RequestReceived):
                statuses.add(event.request.status)
    assert statuses == {"ok"}


def test_two_gib_length_prefix_allocates_nothing() -> None:
    conn = KafkaConnection()
    tracemalloc.start()
    conn.receive_data(0, struct.pack(">i", 2**31 - 1) + b"\x00" * 64, 1)
    conn.receive_data(1, struct.pack(">i", 2**31 - 1) + b"\xff" * 64, 1)
    for _ in range(1000):
        conn.receive_data(0, b"\x00" * 1024, 2)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    conn.receive_close(3)
    assert peak < 4 << 20


def test_frame_limit_is_configurable_and_enforced() -> None:
    conn = KafkaConnection(frame_limit=1000)
    big = kf.heartbeat_v0(1, group="g" * 2000)
    conn.receive_data(0, big + kf.heartbeat_v0(2), 1)
    events = conn.events()
    assert any("implausible frame length" in getattr(e, "reason", "") for e in events)
    assert [e.request.correlation_id for e in events if isinstance(e, RequestReceived)] == [2]


def test_negative_and_huge_array_counts_are_malformed_not_fatal() -> None:
    for count in (-5, 2**31 - 1, 10**6):
        body = kf.string(None) + struct.pack(">hi", 1, 1000) + struct.pack(">i", count)
        conn = KafkaConnection()
        conn.receive_data(0, kf.request(0, 3, 1, body), 1)
        (received,) = [e for e in conn.events() if isinstance(e, RequestReceived)]
        assert received.request.status == ("ok" if count < 0 else "malformed")


def test_deep_nesting_is_bounded_by_the_frame() -> None:
    """Nested arrays each claiming the most elements the frame could hold finish quickly."""
    body = struct.pack(">i", 1) + kf.string("t") + struct.pack(">i", 100_000) + b"\x00" * 40
    conn = KafkaConnection()
    conn.receive_data(0, kf.request(0, 3, 1, kf.string(None) + struct.pack(">hi", 1, 1) + body), 1)
    (received,) = [e for e in conn.events() if isinstance(e, RequestReceived)]
    assert received.request.status == "malformed"


ATHERIS_TARGET = """
import sys, atheris
with atheris.instrument_imports():
    from decoder.connection import KafkaConnection
def one(data):
    fdp = atheris.FuzzedDataProvider(data)
    conn = KafkaConnection(synced=fdp.ConsumeBool(), frame_limit=1 << 16)
    while fdp.remaining_bytes():
        chunk = fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 300))
        conn.receive_data(fdp.ConsumeIntInRange(0, 1), chunk, 1)
    conn.receive_close(2)
    conn.events()
atheris.Setup(sys.argv, one)
atheris.Fuzz()
"""


def test_atheris_coverage_guided_fuzzing(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    runs = int(os.environ.get("KWIRE_ATHERIS_RUNS", "20000"))
    script = tmp_path / "fuzz_stream.py"
    script.write_text(ATHERIS_TARGET)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, (up, _down) in enumerate(REAL[:20]):
        (corpus / f"seed{i}").write_bytes(b"\x01" + up[:4000])
    result = subprocess.run(
        [sys.executable, str(script), f"-runs={runs}", "-max_len=8192", str(corpus)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"Done {runs} runs" in result.stderr
    coverage_report.add("fuzz: atheris runs", runs)
