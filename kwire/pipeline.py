"""Reassembled TCP streams in, exchange and connection rows out (no I/O here).

``StreamDecoder`` takes the reassembler's events (``decoder.tcp``), decides per connection
whether it carries Kafka, TLS or something else, feeds Kafka connections to a
``KafkaConnection`` and turns its events into rows (``kwire.rows``). The file-reading driver
is ``kwire.decode_command.decode_captures``; the Spark decode job uses the same pieces.

Finding Kafka needs no configuration:

* With the handshake in the capture (both streams start at a frame boundary, and the SYN's
  sender is the client), the connection is Kafka when the client's first bytes are a plausible
  request header (known api key, defined version, sane client id). A TLS record there makes it
  ``tls``, anything else ``other``.
* Without it (the capture started mid-connection), either side may be the client and either
  stream may start mid-frame, and a plausible request header turns up by chance inside other
  bytes (an ApiVersions response holds a valid-looking ControlledShutdown v0 request, for one).
  So the connection is decoded both ways at once by two probing ``KafkaConnection`` objects,
  each hunting for frame boundaries, and the evidence decides: the first request/response pair
  that matches by correlation id and decodes cleanly settles it; failing that, at
  ``SNIFF_LIMIT`` bytes or at the connection's end, the side with more well-formed requests (a
  one-sided capture has no responses at all). The winning probe simply carries on as the
  connection's decoder, so nothing is decoded twice afterwards. When the handshake was seen but
  bytes were lost before the decision, the roles are known and one probe (unaligned) is enough.

``forced_ports`` makes every connection touching one of them Kafka, with the broker on that
port, and skips detection, except that a stream starting with a TLS record header (which read as
a Kafka length would exceed the frame limit) is still reported as ``tls`` rather than decoded.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from decoder.connection import DEFAULT_FRAME_LIMIT, KafkaConnection, looks_like_request
from decoder.events import MalformedFrame, RequestReceived, ResponseReceived
from decoder.protocol import error_name
from decoder.tcp import StreamClosed, StreamData, StreamGap, StreamOpened
from kwire import rows as rows_module
from kwire.rows import ConnectionInfo, ExchangeRows, ended_by, utc_date

__all__ = ["SNIFF_LIMIT", "DecodeSummary", "Row", "StreamDecoder"]

SNIFF_LIMIT = 64 << 10  # bytes per direction looked at before deciding a connection without evidence
_HEAD = 512  # bytes of each direction kept for the handshake-seen checks (TLS, first request)
# A TLS record header: handshake/alert/change-cipher/application data, version 3.x.
_TLS_RECORD = re.compile(rb"\A[\x14-\x17]\x03[\x00-\x04]")

Row = dict[str, Any]


@dataclass
class DecodeSummary:
    """What a decode saw, for the command's closing summary."""

    connections: Counter[str] = field(default_factory=Counter)  # by protocol
    statuses: Counter[str] = field(default_factory=Counter)
    apis: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    exchanges: int = 0
    resyncs: int = 0
    skipped_bytes: int = 0  # bytes of Kafka streams skipped while hunting for a frame boundary
    gap_bytes: int = 0

    def add(self, other: DecodeSummary) -> None:
        """Add another summary's counts (of other connections) into this one."""
        self.connections.update(other.connections)
        self.statuses.update(other.statuses)
        self.apis.update(other.apis)
        self.errors.update(other.errors)
        self.exchanges += other.exchanges
        self.resyncs += other.resyncs
        self.skipped_bytes += other.skipped_bytes
        self.gap_bytes += other.gap_bytes


class _Probe:
    """One orientation of an undecided connection: a decoder and the evidence it produced."""

    __slots__ = ("decoder", "events", "matched", "requests", "score", "swapped")

    def __init__(self, swapped: bool, frame_limit: int) -> None:
        self.swapped = swapped
        self.decoder = KafkaConnection(synced=False, frame_limit=frame_limit)
        self.events: list[Any] = []
        self.matched = 0  # well-formed request/response pairs
        self.requests = 0  # well-formed requests
        self.score = 0

    def collect(self) -> None:
        new = self.decoder.events()
        if not new:
            return
        self.events += new
        for event in new:
            kind = type(event)
            if kind is RequestReceived:
                request = event.request
                if request.status == "ok":
                    self.requests += 1
                    # trailing bytes after a known body, or no client id: weaker evidence
                    self.score += 1 if request.decode_error or not request.client_id else 2
                else:
                    self.score -= 2
            elif kind is ResponseReceived:
                if event.request.status == "ok" and event.response.status == "ok":
                    self.matched += 1
                    self.score += 4
                else:
                    self.score -= 2
            elif kind is MalformedFrame:
                self.score -= 2


class _Conn:
    """One connection: detection state, then its Kafka decoder and row builder."""

    __slots__ = (
        "decoder",
        "forced",
        "head",
        "id",
        "opened",
        "pending",
        "probes",
        "protocol",
        "rows",
        "saw_gap",
        "seen",
        "swapped",
    )

    def __init__(self, opened: StreamOpened) -> None:
        self.opened = opened
        self.protocol: str | None = None  # kafka, tls, other; None while undecided
        self.swapped = False  # True when the reassembler's provisional client is the broker
        self.saw_gap = False
        self.pending: list[StreamData | StreamGap] = []  # events held while undecided (handshake seen)
        self.head = [b"", b""]  # first bytes of each direction
        self.seen = [0, 0]  # bytes of each direction seen while undecided
        self.probes: tuple[_Probe, ...] | None = None  # both orientations when no handshake, else one
        self.forced: bool | None = None  # --port: Kafka with this `swapped` (TLS excepted); None: detect
        self.decoder: KafkaConnection | None = None
        self.rows: ExchangeRows | None = None
        self.id: str | None = None  # connection_id, once the roles are known


class StreamDecoder:
    """Feed it reassembler events; rows come out through the two callbacks."""

    def __init__(
        self,
        source: str,
        on_exchange: Callable[[Row], None],
        on_connection: Callable[[Row], None],
        *,
        forced_ports: Iterable[int] = (),
        frame_limit: int = DEFAULT_FRAME_LIMIT,
    ) -> None:
        self.source = source
        self.on_exchange = on_exchange
        self.on_connection = on_connection
        self.forced_ports = frozenset(forced_ports)
        self.frame_limit = frame_limit
        # Telling Kafka from other traffic does not depend on the limit a user set for decoding: a
        # first request over a low --frame-limit still makes the connection Kafka (and that frame
        # a malformed row), instead of hiding the whole connection.
        self._detect_limit = max(frame_limit, DEFAULT_FRAME_LIMIT)
        self.summary = DecodeSummary()
        self._conns: dict[int, _Conn] = {}
        self._issued: dict[str, int] = {}  # connection ids given out, for the rare clash

    def feed(self, event: Any) -> None:
        """One event from ``decoder.tcp.TcpReassembler``."""
        kind = type(event)
        if kind is StreamData:
            conn = self._conns.get(event.conn_id)
            if conn is None:
                return
            decoder = conn.decoder
            if decoder is not None:
                decoder.receive_data(event.direction ^ conn.swapped, event.data, event.ts_ns)
                self._drain(conn, decoder.events())
            elif conn.protocol is None:
                self._sniff(conn, event)
        elif kind is StreamGap:
            conn = self._conns.get(event.conn_id)
            if conn is None:
                return
            decoder = conn.decoder
            if decoder is not None:
                decoder.receive_gap(event.direction ^ conn.swapped, event.nbytes, event.ts_ns)
                self._drain(conn, decoder.events())
            elif conn.protocol is None:
                self._sniff(conn, event)
        elif kind is StreamOpened:
            conn = _Conn(event)
            self._conns[event.conn_id] = conn
            if self.forced_ports:
                if event.server_port in self.forced_ports:
                    conn.forced = False
                elif event.client_port in self.forced_ports:
                    conn.forced = True
        elif kind is StreamClosed:
            self._close(event)

    # ---- detection ---------------------------------------------------------------------

    def _sniff(self, conn: _Conn, event: StreamData | StreamGap) -> None:
        direction = event.direction
        if type(event) is StreamGap:
            conn.saw_gap = True
        else:
            data = event.data
            conn.seen[direction] += len(data)
            head = conn.head[direction]
            if len(head) < _HEAD:
                conn.head[direction] = head + data[: _HEAD - len(head)]
        if conn.probes is not None:
            self._probe(conn, event)
            return
        conn.pending.append(event)
        if conn.forced is not None:  # --port: Kafka, unless it starts with a TLS record
            if any(self._tls(head) for head in conn.head):
                self._decide(conn, "tls")
            else:
                self._start_kafka(conn, swapped=conn.forced)
            return
        if not conn.opened.syn_seen or conn.saw_gap:
            self._start_probing(conn)
            return
        # Handshake seen: both streams start at a frame boundary, the SYN's sender is the client and a
        # Kafka client speaks first (bytes from the server first mean the client's are still held
        # behind a hole, or this is not Kafka).
        if any(self._tls(head) for head in conn.head):
            self._decide(conn, "tls")
            return
        head = conn.head[0]
        if head and looks_like_request(head, 0, len(head), self._detect_limit):
            self._start_kafka(conn, swapped=False)
        elif len(head) >= 14 or max(conn.seen) >= SNIFF_LIMIT:
            self._decide(conn, "other")

    def _tls(self, head: bytes) -> bool:
        """Do these first bytes of a stream make a TLS record header (which as a Kafka frame would
        have an impossible length)?"""
        return bool(_TLS_RECORD.match(head)) and int.from_bytes(head[:4], "big") > self.frame_limit

    def _start_probing(self, conn: _Conn) -> None:
        if any(self._tls(head) for head in conn.head):
            self._decide(conn, "tls")
            return
        if conn.opened.syn_seen:  # the handshake names the client; only the alignment is unknown
            conn.probes = (_Probe(False, self.frame_limit),)
        else:
            conn.probes = (_Probe(False, self.frame_limit), _Probe(True, self.frame_limit))
        pending, conn.pending = conn.pending, []
        for event in pending:
            self._probe(conn, event)
            if conn.probes is None:  # decided
                return

    def _probe(self, conn: _Conn, event: StreamData | StreamGap) -> None:
        probes = conn.probes
        assert probes is not None
        for probe in probes:
            direction = event.direction ^ probe.swapped
            if type(event) is StreamData:
                probe.decoder.receive_data(direction, event.data, event.ts_ns)
            else:
                probe.decoder.receive_gap(direction, event.nbytes, event.ts_ns)
            probe.collect()
        best = max(probes, key=lambda p: p.matched)
        if best.matched and all(p.matched == 0 for p in probes if p is not best):
            self._adopt(conn, best)
        elif max(conn.seen) >= SNIFF_LIMIT:
            self._settle(conn)

    def _settle(self, conn: _Conn) -> None:
        """Decide an undecided probing connection on the evidence so far (limit reached, or its end)."""
        probes = conn.probes
        assert probes is not None
        a, b = probes if len(probes) == 2 else (probes[0], probes[0])
        if a is not b and a.score == b.score and a.requests and b.requests:
            # No evidence either way: the broker is the side on the lower (usually well-known) port.
            opened = conn.opened
            best = a if opened.server_port <= opened.client_port else b
        else:
            best = a if a.score > b.score else b
        if best.requests and best.score > 0:
            self._adopt(conn, best)
        else:
            self._decide(conn, "other")

    def _adopt(self, conn: _Conn, probe: _Probe) -> None:
        """Make a probe the connection's decoder and emit the rows of what it decoded so far."""
        conn.probes = None
        self._kafka(conn, probe.swapped, probe.decoder)
        self._drain(conn, probe.events)

    def _decide(self, conn: _Conn, protocol: str) -> None:
        conn.protocol = protocol
        conn.pending = []
        conn.probes = None

    def _start_kafka(self, conn: _Conn, swapped: bool) -> None:
        synced = conn.opened.syn_seen and not conn.saw_gap
        decoder = KafkaConnection(synced=synced, frame_limit=self.frame_limit)
        self._kafka(conn, swapped, decoder)
        pending, conn.pending = conn.pending, []
        for event in pending:
            direction = event.direction ^ swapped
            if type(event) is StreamData:
                decoder.receive_data(direction, event.data, event.ts_ns)
            else:
                decoder.receive_gap(direction, event.nbytes, event.ts_ns)
        self._drain(conn, decoder.events())

    def _kafka(self, conn: _Conn, swapped: bool, decoder: KafkaConnection) -> None:
        opened = conn.opened.swapped() if swapped else conn.opened
        conn.swapped = swapped
        conn.protocol = "kafka"
        conn.decoder = decoder
        conn.head = [b"", b""]
        conn.rows = ExchangeRows(
            ConnectionInfo(
                self.source,
                self._connection_id(conn),
                opened.client_ip,
                opened.client_port,
                opened.server_ip,
                opened.server_port,
            )
        )

    # ---- rows --------------------------------------------------------------------------

    def _connection_id(self, conn: _Conn) -> str:
        """``<first packet time, us>-<client port>-<broker port>``, fixed once the roles are.

        It depends only on the connection itself, not on which other connections came before, so
        a capture decoded in parts (``kwire decode --jobs``, which splits connections by port)
        gives the same ids as decoded whole. Two connections alike in all three (same ports,
        same microsecond, other hosts) get ``-2``, ``-3``...: such connections always fall in the
        same part, in the same order, so the suffixes agree too.
        """
        if conn.id is None:
            opened = conn.opened.swapped() if conn.swapped else conn.opened
            base = f"{opened.ts_ns // 1000}-{opened.client_port}-{opened.server_port}"
            issued = self._issued
            n = issued.get(base, 0) + 1
            if len(issued) >= 100_000:  # only same-microsecond clashes matter: forget old ones
                issued.clear()
            issued[base] = n
            conn.id = base if n == 1 else f"{base}-{n}"
        return conn.id

    def _drain(self, conn: _Conn, events: list[Any]) -> None:
        if rows_module._drain is not None and rows_module._exchange_row is not None:
            # the loop below, compiled (kwire/_exchangerows.c); the loop stays its reference
            rows_module._drain(conn.rows, events, self.summary, self.on_exchange)
            return
        row_of = conn.rows.row  # type: ignore[union-attr]
        summary = self.summary
        statuses, apis, errors = summary.statuses, summary.apis, summary.errors
        on_exchange = self.on_exchange
        for event in events:
            row = row_of(event)
            if row is None:
                continue
            summary.exchanges += 1
            statuses[row["status"]] += 1
            name = row.get("api_name")
            if name:
                apis[name] += 1
            code = row.get("error_code")
            if code:
                errors[row.get("error_name") or str(code)] += 1
            results = row.get("partition_errors")
            if results:
                for result in results:
                    if result["error_code"]:
                        errors[error_name(result["error_code"])] += 1
            on_exchange(row)

    def _close(self, event: StreamClosed) -> None:
        conn = self._conns.pop(event.conn_id, None)
        if conn is None:
            return
        if conn.probes is not None:
            self._settle(conn)
        if conn.protocol is None:
            conn.protocol = "other"
        if conn.decoder is not None:
            conn.decoder.receive_close(event.ts_ns, "open_at_end" if event.how == "open_at_end" else "closed")
            self._drain(conn, conn.decoder.events())
        self.summary.connections[conn.protocol] += 1
        self.on_connection(self._connection_row(conn, event))

    def _connection_row(self, conn: _Conn, event: StreamClosed) -> Row:
        opened = conn.opened.swapped() if conn.swapped else conn.opened
        stats = event.stats
        to_broker, to_client = (
            (stats.directions[1], stats.directions[0]) if conn.swapped else stats.directions
        )
        row: Row = {
            "source": self.source,
            "connection_id": self._connection_id(conn),
            "client_ip": opened.client_ip,
            "client_port": opened.client_port,
            "broker_ip": opened.server_ip,
            "broker_port": opened.server_port,
            "first_packet_time": stats.first_ts_ns // 1000,
            "last_packet_time": stats.last_ts_ns // 1000,
            "syn_seen": stats.syn_seen,
            "end_reason": event.how,
            "protocol": conn.protocol,
            **ended_by(stats, conn.swapped),
            "bytes_to_broker": to_broker.bytes,
            "bytes_to_client": to_client.bytes,
            "gap_bytes_to_broker": to_broker.gap_bytes,
            "gap_bytes_to_client": to_client.gap_bytes,
            "date": utc_date(stats.first_ts_ns),
        }
        if conn.decoder is not None:
            up, down = conn.decoder.stats(0), conn.decoder.stats(1)
            row.update(
                frames_to_broker=up["frames"],
                frames_to_client=down["frames"],
                resyncs=conn.decoder.resyncs,
                client_id=conn.rows.client_id,
            )  # type: ignore[union-attr]
            self.summary.resyncs += conn.decoder.resyncs
            self.summary.skipped_bytes += up["skipped_bytes"] + down["skipped_bytes"]
            self.summary.gap_bytes += up["gap_bytes"] + down["gap_bytes"]
        return row
