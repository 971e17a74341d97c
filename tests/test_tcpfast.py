"""The compiled common segment of TCP reassembly (decoder/_tcpfast.c) against its Python reference
(``decoder.tcp.TcpReassembler.feed``): every real capture, and copies of them with segments
reordered, repeated, dropped and sent with odd timestamps, give the same events either way (their
connections' closing statistics included); the compiled path takes the common segments itself.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import decoder.tcp as tcp
from decoder.pcap import iter_segments
from decoder.tcp import TcpReassembler

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted(
    [
        *REPO.glob("captures/*.pcap"),
        *REPO.glob("captures/lab/**/capture.pcap*"),
    ]
)

pytestmark = pytest.mark.skipif(tcp._tcpfast is None, reason="KWIRE_PURE_PYTHON=1: no compiled TCP path")


def _events(segments: list[Any], compiled: bool) -> list[Any]:
    reassembler = TcpReassembler(max_out_of_order_bytes=1 << 16, idle_timeout_ns=5 * 10**9)
    feed = reassembler.feeder() if compiled else reassembler.feed
    events: list[Any] = []
    last = 0
    for segment in segments:
        last = max(last, segment.ts_ns)
        events.extend(feed(segment))
    events.extend(reassembler.finish(last))
    return events


def _shaken(segments: list[Any], rng: random.Random) -> list[Any]:
    """The segments with neighbours swapped, some repeated, some dropped, some moved in time."""
    out = list(segments)
    for _ in range(len(out) // 20):
        i = rng.randrange(len(out))
        roll = rng.random()
        if roll < 0.4 and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
        elif roll < 0.6:
            out.insert(i, out[i])
        elif roll < 0.8:
            del out[i]
        else:
            out[i] = replace(out[i], ts_ns=rng.choice((0, out[i].ts_ns + 7 * 10**9, 2**70, -5)))
    return out


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_same_events_either_way(path: Path) -> None:
    segments = list(iter_segments(path))
    reference = _events(segments, compiled=False)
    assert _events(segments, compiled=True) == reference
    assert any(type(event) is tcp.StreamData for event in reference)


@pytest.mark.parametrize("seed", range(4))
def test_shaken_captures_give_the_same_events_either_way(seed: int) -> None:
    rng = random.Random(seed)
    for path in CAPTURES[:: 2 if seed % 2 else 3]:
        segments = _shaken(list(iter_segments(path)), rng)
        assert _events(segments, compiled=True) == _events(segments, compiled=False), path


def test_the_common_segments_are_taken_in_c() -> None:
    segments = list(iter_segments(max(CAPTURES, key=lambda path: path.stat().st_size)))
    reassembler = TcpReassembler()
    handed = 0
    python_feed = reassembler.feed

    def counted(segment: Any) -> list[Any]:
        nonlocal handed
        handed += 1
        return python_feed(segment)

    reassembler.feed = counted  # type: ignore[method-assign]  # what the compiled path falls back to
    feed = reassembler.feeder()
    for segment in segments:
        feed(segment)
    assert len(segments) > 1000
    assert handed < len(segments) / 10
