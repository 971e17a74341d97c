"""The compiled pcap record loop (decoder/_pcapscan.c) against the Python reader it shortcuts.

Every real capture, and damaged copies of one (bytes changed anywhere, cut anywhere, record
headers rewritten: other byte order, nanoseconds, Kuznetzov's longer records, snapped records,
VLAN tags, IP options), gives the same segments, the same counters and the same error either way,
and so the same rows.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest

from decoder import pcap
from decoder.pcap import CaptureError, CaptureStats, iter_segments
from kwire.decode_command import decode_captures

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted(
    [
        *REPO.glob("captures/*.pcap"),
        *REPO.glob("captures/lab/**/capture.pcap*"),
        *REPO.glob(".cache/bench/chatty.pcap"),
        *REPO.glob(".cache/bench/bulk.pcap"),
    ]
)
SMALL = REPO / "captures" / "tansu-mixed.pcap"

pytestmark = pytest.mark.skipif(pcap._scan is None, reason="KWIRE_PURE_PYTHON=1: no compiled pcap loop")


def _read(path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], CaptureStats, Any]:
    with monkeypatch.context() as mp:
        if not compiled:
            mp.setattr(pcap, "_scan", None)
        stats = CaptureStats()
        segments: list[Any] = []
        error = None
        try:
            segments.extend(iter_segments(path, stats))
        except CaptureError as exc:
            error = (type(exc), str(exc))
    return segments, stats, error


def _same_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], CaptureStats, Any]:
    compiled = _read(path, True, monkeypatch)
    reference = _read(path, False, monkeypatch)
    assert compiled[2] == reference[2]
    assert compiled[1] == reference[1]
    assert len(compiled[0]) == len(reference[0])
    assert compiled[0] == reference[0]
    return compiled


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_segments_identical_on_real_captures(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # in step, segment by segment, so that the bulk capture's 1.2 GB of segments are not held
    compiled_stats, reference_stats = CaptureStats(), CaptureStats()
    compiled, reference = iter_segments(path, compiled_stats), iter_segments(path, reference_stats)
    with monkeypatch.context() as mp:
        mp.setattr(pcap, "_scan", None)
        first = next(reference)  # the reader looks at pcap._scan when it starts
    assert next(compiled) == first
    count = 1
    for a, b in zip(compiled, reference, strict=True):
        assert a == b
        count += 1
    assert compiled_stats == reference_stats
    assert compiled_stats.tcp_segments == count


def test_rows_identical_with_and_without_the_compiled_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    def rows(compiled: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        exchanges: list[dict[str, Any]] = []
        connections: list[dict[str, Any]] = []
        with monkeypatch.context() as mp:
            if not compiled:
                mp.setattr(pcap, "_scan", None)
            decode_captures([SMALL], exchanges.append, connections.append)
        return exchanges, connections

    compiled, reference = rows(True), rows(False)
    assert len(compiled[0]) > 100
    assert compiled == reference


def _records(data: bytes) -> list[tuple[bytes, bytes]]:
    """(16-byte record header, packet) of a little-endian microsecond pcap."""
    assert data[:4] == b"\xd4\xc3\xb2\xa1"
    out, pos = [], 24
    while pos < len(data):
        caplen = struct.unpack_from("<I", data, pos + 8)[0]
        out.append((data[pos : pos + 16], data[pos + 16 : pos + 16 + caplen]))
        pos += 16 + caplen
    return out


def _pcap(file_header: bytes, records: list[tuple[bytes, bytes]], big: bool = False, extra: int = 0) -> bytes:
    """A pcap of these records, re-encoded in the byte order and record length asked for."""
    parts = [file_header]
    for header, packet in records:
        sec, frac, _caplen, wirelen = struct.unpack("<IIII", header)
        parts.append(struct.pack(">IIII" if big else "<IIII", sec, frac, len(packet), wirelen))
        parts.append(b"\x00" * extra + packet)
    return b"".join(parts)


def _variants() -> list[tuple[str, bytes]]:
    """Damaged and unusual copies of the small capture's first records."""
    data = SMALL.read_bytes()
    header, records = data[:24], _records(data)[:300]
    rng = random.Random(22)
    plain = _pcap(header, records)
    out = [("plain", plain)]
    swapped = struct.pack(">IHHiIII", *struct.unpack("<IHHiIII", header))
    out.append(("big-endian", _pcap(swapped, records, big=True)))
    out.append(("nanoseconds", _pcap(b"\x4d\x3c\xb2\xa1" + header[4:], records)))
    out.append(("modified", _pcap(b"\x34\xcd\xb2\xa1" + header[4:], records, extra=8)))
    out.append(("modified-big", _pcap(b"\xa1\xb2\xcd\x34" + swapped[4:], records, big=True, extra=8)))

    def edited(name: str, change: Any) -> None:
        changed = []
        for i, (head, packet) in enumerate(records):
            changed.append(change(i, head, packet) if i % 3 == 1 else (head, packet))
        out.append((name, _pcap(header, changed)))

    def snap(i: int, head: bytes, packet: bytes) -> tuple[bytes, bytes]:
        cut = packet[: max(0, len(packet) - 1 - i % 70)]
        return head, cut

    def vlan(i: int, head: bytes, packet: bytes) -> tuple[bytes, bytes]:
        return head, packet[:12] + b"\x81\x00\x00\x05" + packet[12:]

    def options(i: int, head: bytes, packet: bytes) -> tuple[bytes, bytes]:
        ip = bytearray(packet[14:34])
        ip[0] = 0x46
        total = struct.unpack_from("!H", ip, 2)[0]
        struct.pack_into("!H", ip, 2, total + 4 if total else 0)
        return head, packet[:14] + bytes(ip) + b"\x01\x01\x01\x00" + packet[34:]

    def padded(i: int, head: bytes, packet: bytes) -> tuple[bytes, bytes]:
        return head, packet + b"\xee" * (i % 40)

    def no_total(i: int, head: bytes, packet: bytes) -> tuple[bytes, bytes]:
        return head, packet[:16] + b"\x00\x00" + packet[18:]

    for name, change in (("snapped", snap), ("vlan", vlan), ("ip-options", options), ("padded", padded)):
        edited(name, change)
    edited("no-total-length", no_total)
    for n in range(120):  # bytes changed anywhere, mostly in the headers
        damaged = bytearray(plain)
        for _ in range(1 + n % 6):
            pos = rng.randrange(24, len(damaged) - 60)
            if rng.random() < 0.7:  # into the link/IP/TCP headers of a packet
                found = plain.find(b"\x08\x00\x45", pos)
                pos = found - 12 + rng.randrange(70) if found > 0 else pos
            pos = min(pos, len(damaged) - 1)
            damaged[pos] = rng.randrange(256)
        out.append((f"flipped-{n}", bytes(damaged)))
    for n in range(60):  # cut anywhere
        out.append((f"cut-{n}", plain[: rng.randrange(24, len(plain))]))
    return out


@pytest.mark.parametrize("name,data", _variants(), ids=lambda v: v if isinstance(v, str) else "")
def test_damaged_and_unusual_captures_read_the_same(
    name: str, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"{name}.pcap"
    path.write_bytes(data)
    segments, _stats, error = _same_both_ways(path, monkeypatch)
    if name.startswith("cut-"):  # every segment before the cut is kept
        whole = _read(SMALL, False, monkeypatch)[0]
        assert segments == whole[: len(segments)]
    if name in ("plain", "big-endian", "nanoseconds", "modified", "modified-big"):
        assert error is None and len(segments) == 300


def test_records_per_call_do_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _read(SMALL, False, monkeypatch)
    for records in (1, 2, 7):
        monkeypatch.setattr(pcap, "_SCAN_RECORDS", records)
        assert _read(SMALL, True, monkeypatch) == expected


@pytest.mark.parametrize("taken", [0, 1, 2, 511, 512, 513, 900])
def test_stats_the_same_when_the_consumer_stops_early(taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def stop_after(compiled: bool) -> CaptureStats:
        with monkeypatch.context() as mp:
            if not compiled:
                mp.setattr(pcap, "_scan", None)
            stats = CaptureStats()
            segments = iter_segments(SMALL, stats)
            for _ in range(taken + 1):
                next(segments)
            segments.close()
        return stats

    assert stop_after(True) == stop_after(False)


def _pair(segment: Any) -> int:
    a, b = segment.src_port, segment.dst_port
    return a << 16 | b if a < b else b << 16 | a


def _skipping(path: Path, pairs: set[int]) -> tuple[list[Any], CaptureStats, Any, int]:
    stats = CaptureStats()
    skip = pcap.SkipPairs(set(pairs))
    segments: list[Any] = []
    error = None
    try:
        segments.extend(iter_segments(path, stats, skip))
    except CaptureError as exc:
        error = (type(exc), str(exc))
    return segments, stats, error, skip.last_ts_ns


def _check_skipping(path: Path, monkeypatch: pytest.MonkeyPatch, share: int) -> None:
    whole, stats, error = _read(path, True, monkeypatch)
    pairs = sorted({_pair(segment) for segment in whole})
    chosen = set(pairs[::share])
    kept, kept_stats, kept_error, last = _skipping(path, chosen)
    assert (kept_stats, kept_error) == (stats, error)  # every record counted, the same damage
    left_out, it = [], iter(kept)
    following = next(it, None)
    for segment in whole:  # what is kept comes in order; what is not is of a skipped pair
        if following is not None and segment == following:
            following = next(it, None)
        else:
            assert _pair(segment) in chosen
            left_out.append(segment)
    assert following is None
    assert last == max((segment.ts_ns for segment in left_out), default=-1)
    if path.suffix == ".pcap" and chosen:
        assert left_out  # the compiled loop did leave them out


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_skipped_pairs_are_left_out_and_counted(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if path.stat().st_size > 100 << 20:
        pytest.skip("the bulk capture's segments are not held twice")
    for share in (1, 2, 3):
        _check_skipping(path, monkeypatch, share)


@pytest.mark.parametrize("name,data", _variants()[::4], ids=lambda v: v if isinstance(v, str) else "")
def test_damaged_captures_skip_the_same(
    name: str, data: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"{name}.pcap"
    path.write_bytes(data)
    _check_skipping(path, monkeypatch, 2)


@pytest.mark.parametrize("taken", [0, 1, 2, 200, 511, 512, 700])
def test_stats_when_a_skipping_consumer_stops_early(taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _read(SMALL, True, monkeypatch)[0]
    chosen = {pair for pair in {_pair(segment) for segment in whole} if pair % 5 == 0}
    kept = _skipping(SMALL, chosen)[0]
    assert len(kept) > taken
    stats = CaptureStats()
    segments = iter_segments(SMALL, stats, pcap.SkipPairs(chosen))
    for _ in range(taken + 1):
        last = next(segments)
    segments.close()
    reference = CaptureStats()  # the same segment, read without skipping
    plain = iter_segments(SMALL, reference)
    for segment in plain:
        if segment == last:
            break
    plain.close()
    assert stats == reference
