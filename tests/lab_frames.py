"""kwire's Kafka frames of a capture, each with its bytes, for checking kwire against other decoders.

kwire's events (``decoder.events``) say what a frame was (api key, version, correlation id, size,
decoded fields) but not where its bytes lie. ``capture_frames`` drives kwire's own pieces as
``kwire decode --port`` does (``decoder.pcap`` segments, ``decoder.tcp`` reassembly, one
``decoder.connection.KafkaConnection`` per connection touching a broker port, fed the same chunks
at the same times), keeps each direction's reassembled bytes, and cuts every frame kwire reports
out of them in order: a frame must start where the previous one ended, with the length prefix and
header kwire read; only where kwire had to look for a frame boundary (a connection whose start the
capture missed, a resync, SASL tokens outside Kafka framing) may bytes be skipped first. Frames
kwire did not report (a whole frame left after its last one) and frames not where kwire says are
``FrameStats.problems``. Where the capture lost bytes of a direction, that direction is cut up to
the gap only: the frames kwire reports after it are counted, not cut.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from decoder.connection import KafkaConnection
from decoder.events import (
    CLIENT_TO_BROKER,
    MalformedFrame,
    OrphanResponse,
    RequestReceived,
    ResponseReceived,
    Resync,
    SaslExchange,
)
from decoder.pcap import iter_segments
from decoder.tcp import StreamClosed, StreamData, StreamGap, StreamOpened, TcpReassembler

__all__ = ["Frame", "FrameStats", "capture_frames"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame kwire decoded, with its bytes (length prefix included)."""

    connection: str  # client ip:port -> broker ip:port
    request: bool
    api_key: int | None  # None: a response kwire could not match to a request
    api_version: int | None  # a response's: the layout kwire used (ApiVersions may fall back to v0)
    correlation_id: int
    client_id: str | None  # a request's; None for responses
    status: str  # ok, unknown_api, malformed, truncated (see decoder.events)
    decode_error: str | None
    fields: dict[str, Any] | None
    data: bytes

    def where(self) -> str:
        kind = "request" if self.request else "response"
        return f"{self.connection} {kind} corr {self.correlation_id} (key {self.api_key} v{self.api_version})"


@dataclass
class FrameStats:
    """What ``capture_frames`` saw besides the frames."""

    kafka_connections: int = 0
    unsynced_connections: int = 0  # the capture missed their start: kwire hunted for a boundary
    other_connections: int = 0  # touching no broker port
    gap_connections: int = 0  # bytes missing from the capture
    after_gap: int = 0  # frames after a gap in their direction: not cut
    skipped_bytes: int = 0  # bytes before a frame where kwire hunted (partial frames), SASL tokens
    events: Counter[str] = field(default_factory=Counter)  # Resync, MalformedFrame, SaslExchange
    problems: list[str] = field(default_factory=list)  # kwire's framing against the bytes


@dataclass(frozen=True, slots=True)
class _Gap:
    direction: int


class _Conn:
    __slots__ = ("chunks", "decoder", "events", "gapped", "name", "swapped", "synced")

    def __init__(self, name: str, swapped: bool, synced: bool) -> None:
        self.name = name
        self.swapped = swapped
        self.synced = synced
        self.decoder = KafkaConnection(synced=synced)
        self.chunks: tuple[list[bytes], list[bytes]] = ([], [])
        self.events: list[Any] = []
        self.gapped = [False, False]  # per direction: bytes after a gap are not kept


def capture_frames(
    path: str | os.PathLike[str], broker_ports: Iterable[int], stats: FrameStats | None = None
) -> Iterator[Frame]:
    """Every frame kwire decodes in the capture, connection by connection as each ends.

    A connection is Kafka when one side is on a ``broker_ports`` port (that side is the broker).
    """
    ports = frozenset(broker_ports)
    stats = stats if stats is not None else FrameStats()
    reassembler = TcpReassembler()
    conns: dict[int, _Conn | None] = {}
    last_ts = 0

    def handle(event: Any) -> Iterator[Frame]:
        kind = type(event)
        if kind is StreamOpened:
            conns[event.conn_id] = _open(event, ports, stats)
            return
        conn = conns.get(event.conn_id)
        if conn is None:
            if kind is StreamClosed:
                conns.pop(event.conn_id, None)
            return
        if kind is StreamData:
            direction = event.direction ^ conn.swapped
            if not conn.gapped[direction]:
                conn.chunks[direction].append(event.data)
            conn.decoder.receive_data(direction, event.data, event.ts_ns)
        elif kind is StreamGap:
            direction = event.direction ^ conn.swapped
            conn.events += conn.decoder.events()
            conn.events.append(_Gap(direction))  # what kwire reports from here on lies past it
            conn.gapped[direction] = True
            conn.decoder.receive_gap(direction, event.nbytes, event.ts_ns)
        elif kind is StreamClosed:
            del conns[event.conn_id]
            reason = "open_at_end" if event.how == "open_at_end" else "closed"
            conn.decoder.receive_close(event.ts_ns, reason)
        conn.events += conn.decoder.events()
        if kind is StreamClosed:
            stats.gap_connections += any(conn.gapped)
            yield from _cut(conn, stats)

    for segment in iter_segments(path):
        last_ts = max(last_ts, segment.ts_ns)
        for event in reassembler.feed(segment):
            yield from handle(event)
    for event in reassembler.finish(last_ts):
        yield from handle(event)


def _open(event: StreamOpened, ports: frozenset[int], stats: FrameStats) -> _Conn | None:
    if event.server_port in ports:
        swapped = False
    elif event.client_port in ports:
        swapped = True
    else:
        stats.other_connections += 1
        return None
    opened = event.swapped() if swapped else event
    stats.kafka_connections += 1
    stats.unsynced_connections += not event.syn_seen
    name = f"{opened.client_ip}:{opened.client_port}->{opened.server_ip}:{opened.server_port}"
    return _Conn(name, swapped, event.syn_seen)


def _frame_of(event: Any) -> tuple[bool, Any, int | None, int | None] | None:
    """(is request, the Request/Response, api key, api version) of an event that carries a frame."""
    kind = type(event)
    if kind is RequestReceived:
        r = event.request
        return True, r, r.api_key, r.api_version
    if kind is ResponseReceived:
        version = event.response.api_version
        return (
            False,
            event.response,
            event.request.api_key,
            event.request.api_version if version is None else version,
        )
    if kind is OrphanResponse:
        asked = event.unexpected_for
        if asked is None:
            return False, event.response, None, None
        version = event.response.api_version
        return False, event.response, asked.api_key, asked.api_version if version is None else version
    return None


def _cut(conn: _Conn, stats: FrameStats) -> Iterator[Frame]:
    """Cut kwire's frames out of the connection's two streams (see the module docstring)."""
    streams = (b"".join(conn.chunks[0]), b"".join(conn.chunks[1]))
    cursor = [0, 0]
    # SASL tokens outside Kafka framing are skipped by kwire unreported (SaslExchange may come
    # only once the frame after them is read): on such a connection bytes may be skipped anywhere
    sasl = any(type(event) is SaslExchange for event in conn.events)
    may_skip = [not conn.synced or sasl] * 2  # kwire was (or may be) hunting a boundary
    ended = [False, False]  # past a gap
    for event in conn.events:
        kind = type(event)
        if kind is _Gap:
            ended[event.direction] = True
            continue
        if kind in (Resync, MalformedFrame, SaslExchange):
            stats.events[kind.__name__] += 1
            if kind is not SaslExchange:
                may_skip[event.direction] = True
            continue
        found = _frame_of(event)
        if found is None:
            continue
        request, frame, api_key, api_version = found
        direction = CLIENT_TO_BROKER if request else 1
        if ended[direction]:
            stats.after_gap += 1
            continue
        if frame.status == "truncated":
            continue  # its bytes run past the end of the stream
        stream, at = streams[direction], cursor[direction]
        head = struct.pack(">i", frame.size - 4)
        head += (
            struct.pack(">hhi", api_key, api_version, frame.correlation_id)
            if request
            else struct.pack(">i", frame.correlation_id)
        )
        if not stream.startswith(head, at):
            found_at = stream.find(head, at) if may_skip[direction] else -1
            if found_at < 0:
                stats.problems.append(
                    f"{conn.name}: kwire's {'request' if request else 'response'} corr "
                    f"{frame.correlation_id} (key {api_key} v{api_version}, {frame.size} bytes) "
                    f"is not at byte {at} of its stream"
                )
                return
            stats.skipped_bytes += found_at - at
            at = found_at
        may_skip[direction] = sasl
        cursor[direction] = at + frame.size
        yield Frame(
            conn.name,
            request,
            api_key,
            api_version,
            frame.correlation_id,
            frame.client_id if request else None,
            frame.status,
            frame.decode_error,
            frame.fields,
            stream[at : at + frame.size],
        )
    for direction, stream in enumerate(streams):
        rest = len(stream) - cursor[direction]
        if (
            not may_skip[direction]
            and not ended[direction]
            and rest >= 4
            and 4 + struct.unpack_from(">i", stream, cursor[direction])[0] <= rest
        ):
            stats.problems.append(
                f"{conn.name}: a whole frame at byte {cursor[direction]} of direction {direction} "
                "that kwire did not report"
            )
