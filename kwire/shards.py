"""Which worker decodes which TCP connection, when a decode is split among processes.

Every worker reads the whole capture, in the same order, and runs the same assignment, so all
of them agree on who decodes what without talking to each other. A connection (its port pair,
so both directions and every packet land in the same part) is assigned when its first packet
is seen, to the part with the fewest connections still open (then the fewest assigned, then
the lowest number): round robin that makes up for connections that ended. That spreads a capture's few busy connections (a producer or two, a consumer) over the parts;
a hash of the ports, the alternative, puts two busy connections in the same part half the time.

The table of port pairs is bounded: past ``MAX_TRACKED`` pairs, new ones are placed by hash.
"""

from __future__ import annotations

from decoder.pcap import FIN, RST, TcpSegment

__all__ = ["MAX_TRACKED", "ConnectionShards", "shard_of"]

MAX_TRACKED = 1 << 18
_MIX = 0x9E3779B1  # 2**32 / golden ratio


def shard_of(port_a: int, port_b: int, parts: int) -> int:
    """A part for a port pair from a hash: the same for both directions. The ports are mixed
    (Fibonacci hashing) first: Linux gives outgoing connections even ports, so plain parity would
    put every client of a broker in the same part."""
    return ((port_a ^ port_b) * _MIX >> 16 & 0xFFFF) % parts


class ConnectionShards:
    """The part of each segment's connection, for a decode split into ``parts``."""

    def __init__(self, parts: int) -> None:
        self.parts = parts
        self._part_of: dict[int, int] = {}
        self._ended: set[int] = set()
        self._open = [0] * parts
        self._assigned = [0] * parts

    def part_of(self, segment: TcpSegment) -> int:
        """The part that decodes this segment's connection."""
        a, b = segment.src_port, segment.dst_port
        key = a << 16 | b if a < b else b << 16 | a
        part = self._part_of.get(key)
        if part is None:
            part = self._assign(key, a, b)
        if segment.flags & (FIN | RST) and key not in self._ended and key in self._part_of:
            self._ended.add(key)
            self._open[part] -= 1
        return part

    def _assign(self, key: int, port_a: int, port_b: int) -> int:
        if len(self._part_of) >= MAX_TRACKED:
            return shard_of(port_a, port_b, self.parts)
        part = min(range(self.parts), key=lambda p: (self._open[p], self._assigned[p]))
        self._part_of[key] = part
        self._open[part] += 1
        self._assigned[part] += 1
        return part
