"""Which worker decodes which TCP connection, when a decode is split among processes.

Every worker reads the whole capture, in the same order, and runs the same assignment, so all
of them agree on who decodes what without talking to each other. A connection is its port pair,
so both directions and every packet land in the same part.

With a plan (:func:`plan_parts`, from the weights of a first pass over the capture,
:class:`ConnectionWeights`), the heaviest connections are spread first, each to the part with
the least work so far: on the chatty benchmark capture (two producers with 75k segments each,
seven small connections) the rule below put both producers in one part, because the clients'
bootstrap connections were still open when they started; one worker then got 98% of the segments.

Without a plan, or for a connection the plan lacks, a connection is assigned when its first
packet is seen, to the part with the fewest connections still open (then the fewest assigned,
then the lowest number): round robin that makes up for connections that ended. A hash of the
ports, the alternative, puts two busy connections in the same part half the time.

The tables of port pairs are bounded: past ``MAX_TRACKED`` pairs, new ones are placed by hash.
"""

from __future__ import annotations

import os

from decoder.pcap import FIN, RST, TcpSegment, weigh_segments

__all__ = ["MAX_TRACKED", "ConnectionShards", "ConnectionWeights", "plan_parts", "shard_of"]

MAX_TRACKED = 1 << 18
_MIX = 0x9E3779B1  # 2**32 / golden ratio


def shard_of(port_a: int, port_b: int, parts: int) -> int:
    """A part for a port pair from a hash: the same for both directions. The ports are mixed
    (Fibonacci hashing) first: Linux gives outgoing connections even ports, so plain parity would
    put every client of a broker in the same part."""
    return ((port_a ^ port_b) * _MIX >> 16 & 0xFFFF) % parts


def _pair(segment: TcpSegment) -> int:
    a, b = segment.src_port, segment.dst_port
    return a << 16 | b if a < b else b << 16 | a


#: A segment's weight in a connection's work is one unit, and one more per this many payload
#: bytes: decoding costs mostly per segment and per frame, little per byte.
_BYTES_PER_UNIT = 1 << 16


class ConnectionWeights:
    """The work each connection (port pair) of a capture brings, counted in a first pass."""

    def __init__(self) -> None:
        self.weights: dict[int, int] = {}

    def add_capture(self, path: str | os.PathLike[str]) -> None:
        """Every segment of the capture at ``path``: the common ones weighed in C as the pcap
        loop reads them (``decoder.pcap.weigh_segments``), the others here."""
        add = self.add
        for segment in weigh_segments(path, self.weights, _BYTES_PER_UNIT, MAX_TRACKED):
            add(segment)

    def add(self, segment: TcpSegment) -> None:
        size = len(segment.payload)
        if not size:
            return
        key = _pair(segment)
        weights = self.weights
        if key in weights:
            weights[key] += 1 + size // _BYTES_PER_UNIT
        elif len(weights) < MAX_TRACKED:
            weights[key] = 1 + size // _BYTES_PER_UNIT


def plan_parts(weights: dict[int, int], parts: int) -> dict[int, int]:
    """A part for each port pair of ``weights``: heaviest first, each to the part with the least
    work so far (then the lowest number). The same for the same weights, in every process."""
    loads = [0] * parts
    plan = {}
    for key, weight in sorted(weights.items(), key=lambda item: (-item[1], item[0])):
        part = min(range(parts), key=lambda p: (loads[p], p))
        plan[key] = part
        loads[part] += weight
    return plan


class ConnectionShards:
    """The part of each segment's connection, for a decode split into ``parts`` (``plan``: parts
    of port pairs decided beforehand, :func:`plan_parts`)."""

    def __init__(self, parts: int, plan: dict[int, int] | None = None) -> None:
        self.parts = parts
        self._part_of: dict[int, int] = dict(plan) if plan else {}
        self._placed_open: set[int] = set()  # pairs the rule placed, not seen to end yet
        self._open = [0] * parts
        self._assigned = [0] * parts

    def part_of(self, segment: TcpSegment) -> int:
        """The part that decodes this segment's connection."""
        a, b = segment.src_port, segment.dst_port
        key = a << 16 | b if a < b else b << 16 | a  # _pair, inline: this runs for every segment
        part = self._part_of.get(key)
        if part is None:
            part = self._assign(key, a, b)
        if segment.flags & (FIN | RST) and key in self._placed_open:
            self._placed_open.discard(key)
            self._open[part] -= 1
        return part

    def _assign(self, key: int, port_a: int, port_b: int) -> int:
        if len(self._part_of) >= MAX_TRACKED:
            return shard_of(port_a, port_b, self.parts)
        part = min(range(self.parts), key=lambda p: (self._open[p], self._assigned[p]))
        self._part_of[key] = part
        self._placed_open.add(key)
        self._open[part] += 1
        self._assigned[part] += 1
        return part
