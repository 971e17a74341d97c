"""Byte streams and Kafka frames of the TCP connections in capture files.

Used to check the proxy against captures taken on either side of it (byte-exactness, what
was rewritten) and to test the message codec on real frames; the proxy itself never reads
captures.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from decoder.pcap import iter_segments_merged
from decoder.tcp import FirstEnd, StreamClosed, StreamData, StreamGap, StreamOpened, TcpReassembler

__all__ = ["CapturedStream", "capture_streams", "split_frames"]

_I32 = struct.Struct(">i").unpack_from


@dataclass
class CapturedStream:
    """Both directions of one TCP connection as the capture saw them."""

    client: tuple[str, int]
    server: tuple[str, int]
    syn_seen: bool
    data: tuple[bytearray, bytearray] = field(default_factory=lambda: (bytearray(), bytearray()))
    gap_bytes: int = 0
    how: str = "open_at_end"
    #: capture times (ns) of the first and the last packet
    opened_ns: int = 0
    closed_ns: int = 0
    #: the first FIN or RST, and its side (None: neither in the capture)
    first_end: FirstEnd | None = None

    @property
    def server_closed_first(self) -> bool:
        """Whether the server ended the connection first, with a FIN: it had accepted it (a
        listener that closes with connections in its backlog resets them without one)."""
        return self.first_end is not None and self.first_end.direction == 1 and self.first_end.flag == "fin"


def capture_streams(paths: Sequence[str | os.PathLike[str]]) -> list[CapturedStream]:
    """Every connection in the captures, in opening order; ``data[0]`` is client -> server."""
    reassembler = TcpReassembler()
    streams: dict[int, CapturedStream] = {}
    order: list[CapturedStream] = []

    def take(events: list) -> None:
        for event in events:
            if isinstance(event, StreamOpened):
                stream = CapturedStream(
                    (event.client_ip, event.client_port),
                    (event.server_ip, event.server_port),
                    event.syn_seen,
                    opened_ns=event.ts_ns,
                    closed_ns=event.ts_ns,
                )
                streams[event.conn_id] = stream
                order.append(stream)
            elif isinstance(event, StreamData):
                streams[event.conn_id].data[event.direction].extend(event.data)
            elif isinstance(event, StreamGap):
                streams[event.conn_id].gap_bytes += event.nbytes
            elif isinstance(event, StreamClosed):
                streams[event.conn_id].how = event.how
                streams[event.conn_id].closed_ns = event.stats.last_ts_ns
                streams[event.conn_id].first_end = event.stats.first_end

    last = 0
    for segment in iter_segments_merged(paths):
        last = segment.ts_ns
        take(reassembler.feed(segment))
    take(reassembler.finish(last))
    return order


def split_frames(data: bytes | bytearray) -> Iterator[bytes]:
    """Complete length-prefixed frames of a stream (a partial frame at the end is left out)."""
    pos = 0
    while len(data) - pos >= 4:
        size = _I32(data, pos)[0]
        if size < 0 or pos + 4 + size > len(data):
            return
        yield bytes(data[pos : pos + 4 + size])
        pos += 4 + size
