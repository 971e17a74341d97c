"""The compiled frame parsing (decoder/_framecore.c) against its Python reference (decoder.connection).

Every request and response frame of every real capture parses to the same ``Request`` and
``Response`` either way, and the compiled path takes the clean ones itself (it does not hand them
all back to Python); every capture decodes to the same events and rows with and without it; and
mutated frames (bytes changed, frames cut or padded, ApiVersions answered in v0) parse the same or
fail the same either way.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

import decoder.connection as connection
from decoder.connection import KafkaConnection
from kwire.decode_command import decode_captures

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted(
    [
        *REPO.glob("captures/*.pcap"),
        *REPO.glob("captures/lab/**/capture.pcap*"),
        *REPO.glob(".cache/bench/chatty.pcap"),
    ]
)
C = connection._framecore

pytestmark = pytest.mark.skipif(C is None, reason="KWIRE_PURE_PYTHON=1: no compiled frame parsing")


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "_compiled_request", None)
    monkeypatch.setattr(connection, "_compiled_response", None)
    monkeypatch.setattr(connection, "_compiled_frames", None)


@pytest.fixture(scope="module")
def frames() -> list[tuple[str, Any, bytes]]:
    """("request", None, frame) and ("response", its request, frame) of every frame the decoder
    parsed in every capture (each frame's bytes alone, length prefix included)."""
    seen: list[tuple[str, Any, bytes]] = []
    parse_request, parse_response = KafkaConnection._parse_request, KafkaConnection._parse_response

    def keep_request(self: Any, buf: Any, pos: int, end: int, start_ns: int, end_ns: int) -> Any:
        seen.append(("request", None, bytes(buf[pos:end])))
        return parse_request(self, buf, pos, end, start_ns, end_ns)

    def keep_response(
        self: Any, request: Any, buf: Any, pos: int, end: int, start_ns: int, end_ns: int
    ) -> Any:
        seen.append(("response", request, bytes(buf[pos:end])))
        return parse_response(self, request, buf, pos, end, start_ns, end_ns)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(connection, "_compiled_frames", None)  # every frame through the two methods
        mp.setattr(KafkaConnection, "_parse_request", keep_request)
        mp.setattr(KafkaConnection, "_parse_response", keep_response)
        for path in CAPTURES:
            decode_captures([path], lambda row: None, lambda row: None)
    return seen


def _outcome(kind: str, request: Any, frame: bytes, start_ns: int = 5, end_ns: int = 9) -> Any:
    conn = KafkaConnection()
    try:
        if kind == "request":
            return ("ok", conn._parse_request(frame, 0, len(frame), start_ns, end_ns))
        return ("ok", conn._parse_response(request, frame, 0, len(frame), start_ns, end_ns))
    except Exception as exc:  # the reference's exception is the answer
        return ("raised", type(exc), str(exc))


def _both(kind: str, request: Any, frame: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    compiled = _outcome(kind, request, frame)
    with monkeypatch.context() as mp:
        _python_only(mp)
        reference = _outcome(kind, request, frame)
    return compiled, reference


def test_every_captured_frame_parses_the_same_and_in_c(
    frames: list[tuple[str, Any, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(frames) > 10_000
    differ = []
    for kind, request, frame in frames:
        compiled, reference = _both(kind, request, frame, monkeypatch)
        if compiled != reference or type(compiled[1]) is not type(reference[1]):
            differ.append((kind, frame[:16]))
    assert differ == []
    # the clean frames were the compiled path's own: None (handed back) only for the rest
    handed_back = [
        (kind, frame[:16])
        for kind, request, frame in frames
        if (
            C.parse_request(frame, 0, len(frame), 5, 9)
            if kind == "request"
            else C.parse_response(request, frame, 0, len(frame), 5, 9)
        )
        is None
        and _outcome(kind, request, frame)[1].status == "ok"
        and _outcome(kind, request, frame)[1].decode_error is None
    ]
    assert handed_back == []


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_events_and_rows_identical_with_and_without_it(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def decode() -> tuple[list[Any], list[Any]]:
        events: list[Any] = []
        rows: list[Any] = []
        drained = KafkaConnection.events

        def keep(self: Any) -> list[Any]:
            out = drained(self)
            events.extend(out)
            return out

        with monkeypatch.context() as mp:
            mp.setattr(KafkaConnection, "events", keep)
            decode_captures([path], rows.append, lambda row: None)
        return events, rows

    compiled = decode()
    with monkeypatch.context() as mp:
        _python_only(mp)
        reference = decode()
    assert len(compiled[0]) == len(reference[0]) > 0
    assert compiled == reference


def _mutants(frame: bytes, rng: random.Random) -> list[bytes]:
    out = [frame[:cut] for cut in (12, 13, 14, 15, len(frame) - 1) if 0 < cut < len(frame)]
    out.append(frame + b"\x00\x07")  # trailing bytes
    for _ in range(12):
        mutant = bytearray(frame)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(4, min(len(mutant), 48)) if len(mutant) > 4 else 0
            mutant[at] = rng.randrange(256)
        out.append(bytes(mutant))
    return out


def test_mutated_frames_parse_the_same_or_fail_the_same(
    frames: list[tuple[str, Any, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(22)
    picked: dict[tuple[str, bytes], tuple[str, Any, bytes]] = {}
    for kind, request, frame in frames:  # a few frames of every kind of header
        picked.setdefault(
            (kind, frame[4:8] if kind == "request" else bytes([request.api_key])), (kind, request, frame)
        )
    checked = compiled_ok = 0
    differ = []
    for kind, request, frame in picked.values():
        for mutant in _mutants(frame, rng):
            compiled, reference = _both(kind, request, mutant, monkeypatch)
            checked += 1
            if compiled != reference:
                differ.append((kind, mutant[:16]))
            call = (
                C.parse_request(mutant, 0, len(mutant), 5, 9)
                if kind == "request"
                else C.parse_response(request, mutant, 0, len(mutant), 5, 9)
            )
            compiled_ok += call is not None
    assert differ == []
    assert checked > 500 and compiled_ok > checked // 10  # the compiled path took a share of them itself


def test_an_apiversions_answer_is_read_in_the_layout_python_reads_it_in(
    frames: list[tuple[str, Any, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker answers an ApiVersions version it does not support in the v0 layout: each real
    answer, taken as the answer to every version, parses the same either way."""
    answers = [
        (request, frame) for kind, request, frame in frames if kind == "response" and request.api_key == 18
    ]
    assert answers
    layouts = set()
    for request, frame in answers[:20]:
        for version in range(5):
            asked = type(request)(
                **{**{f: getattr(request, f) for f in request.__slots__}, "api_version": version}
            )
            compiled, reference = _both("response", asked, frame, monkeypatch)
            assert compiled == reference
            if compiled[0] == "ok" and compiled[1].status == "ok":
                layouts.add((version, compiled[1].api_version))
    assert any(asked != used for asked, used in layouts)  # read in v0 for a newer version asked


def test_the_buffer_is_never_read_outside_the_frame() -> None:
    """Positions and ends that do not fit the buffer are handed back, not read."""
    frame = b"\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"
    assert C.parse_request(frame, 0, len(frame) + 10, 5, 9) is None
    assert C.parse_request(frame, -1, len(frame), 5, 9) is None
    assert C.parse_request(frame, 0, 11, 5, 9) is None
    assert C.parse_request(memoryview(frame), 0, len(frame), 5, 9) is not None
    with pytest.raises(TypeError):
        C.parse_request("not bytes", 0, 4, 5, 9)


def _chunked_events(items: list[tuple[int, bytes, int]], rng: random.Random) -> list[Any]:
    """The events of one connection's stream items (direction, bytes, ts), each item cut in up to
    four pieces at random places, then the close."""
    conn = KafkaConnection()
    events: list[Any] = []
    for direction, data, ts in items:
        at = sorted({0, len(data), *(rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 3)))})
        for start, end in itertools.pairwise(at):
            conn.receive_data(direction, data[start:end], ts)
            events.extend(conn.events())
    conn.receive_close(10**18)
    events.extend(conn.events())
    return events


@pytest.mark.parametrize("seed", range(3))
def test_real_streams_cut_anywhere_give_the_same_events(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real connections (the bundled mixed capture's and a lab capture's), their chunks cut at
    random places, so that the compiled loop meets held frames, frames split in their header and
    chunks ending anywhere: the same events as the Python path's, for the same cuts."""
    from decoder.pcap import iter_segments
    from decoder.tcp import StreamData, TcpReassembler

    streams: dict[tuple[str, int], list[tuple[int, bytes, int]]] = {}
    for path in (
        REPO / "captures" / "tansu-mixed.pcap",
        REPO / "captures" / "lab" / "004-acks1-loss" / "capture.pcap.gz",
    ):
        reassembler = TcpReassembler()
        for segment in iter_segments(path):
            for event in reassembler.feed(segment):
                if type(event) is StreamData:
                    streams.setdefault((path.name, event.conn_id), []).append(
                        (event.direction, bytes(event.data), event.ts_ns)
                    )
    assert len(streams) > 20
    compared = 0
    for key, items in streams.items():
        compiled = _chunked_events(items, random.Random(f"{seed}-{key}"))
        with monkeypatch.context() as mp:
            _python_only(mp)
            reference = _chunked_events(items, random.Random(f"{seed}-{key}"))
        assert compiled == reference
        compared += len(reference)
    assert compared > 1000
