"""Reassembled TCP streams in, exchange and connection rows out (no I/O here).

``StreamDecoder`` takes the reassembler's events (``decoder.tcp``), decides per connection
whether it carries Kafka, TLS or something else, feeds Kafka connections to a
``KafkaConnection`` and turns its events into rows (``kwire.rows``). The file-reading driver
is ``decode_captures``; the Spark decode job uses the same pieces.

Finding Kafka needs no configuration: a connection is Kafka when one direction starts with a
plausible request frame (known api key, defined version, sane client id). That direction's
sender is the client, whoever sent the SYN. Without a handshake in the capture the stream may
start mid-frame, so the first bytes are searched for a plausible request header. ``forced_ports``
makes every connection touching one of them Kafka, with the broker on that port.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from decoder.connection import DEFAULT_FRAME_LIMIT, KafkaConnection, looks_like_request
from decoder.protocol import error_name
from decoder.tcp import StreamClosed, StreamData, StreamGap, StreamOpened
from kwire.rows import ConnectionInfo, ExchangeRows, utc_date

__all__ = ["DecodeSummary", "StreamDecoder"]

SNIFF_LIMIT = 64 << 10  # bytes per direction looked at before calling a connection "other"
_TLS_RECORD = re.compile(rb"\A[\x14-\x17]\x03[\x00-\x04]")
_REQUEST_START = re.compile(rb"(?=[\x00-\x07][\x00-\xff]{3}\x00[\x00-\xff]\x00)", re.DOTALL)

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


class _Conn:
    """One connection: sniffing state, then its Kafka decoder and row builder."""

    __slots__ = ("decoder", "first_ts", "last_ts", "opened", "pending", "protocol", "rows", "saw_gap",
                 "sniffed", "swapped")

    def __init__(self, opened: StreamOpened) -> None:
        self.opened = opened
        self.protocol: str | None = None  # kafka, tls, other; None while undecided
        self.swapped = False
        self.saw_gap = False
        self.pending: list[StreamData | StreamGap] = []  # events held while undecided
        self.sniffed = [bytearray(), bytearray()]
        self.decoder: KafkaConnection | None = None
        self.rows: ExchangeRows | None = None
        self.first_ts = opened.ts_ns
        self.last_ts = opened.ts_ns


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
        self.summary = DecodeSummary()
        self._conns: dict[int, _Conn] = {}

    def feed(self, event: Any) -> None:
        """One event from ``decoder.tcp.TcpReassembler``."""
        if type(event) is StreamData:
            conn = self._conns.get(event.conn_id)
            if conn is None:
                return
            conn.last_ts = event.ts_ns
            if conn.decoder is not None:
                conn.decoder.receive_data(event.direction ^ conn.swapped, event.data, event.ts_ns)
                self._drain(conn)
            elif conn.protocol is None:
                conn.pending.append(event)
                conn.sniffed[event.direction] += event.data[: SNIFF_LIMIT - len(conn.sniffed[event.direction])]
                self._sniff(conn)
        elif type(event) is StreamGap:
            conn = self._conns.get(event.conn_id)
            if conn is None:
                return
            if conn.decoder is not None:
                conn.decoder.receive_gap(event.direction ^ conn.swapped, event.nbytes, event.ts_ns)
                self._drain(conn)
            elif conn.protocol is None:
                conn.pending.append(event)
                self._sniff(conn, gap=True)
        elif type(event) is StreamOpened:
            conn = _Conn(event)
            self._conns[event.conn_id] = conn
            if self.forced_ports:
                if event.server_port in self.forced_ports:
                    self._start_kafka(conn, swapped=False)
                elif event.client_port in self.forced_ports:
                    self._start_kafka(conn, swapped=True)
        elif type(event) is StreamClosed:
            self._close(event)

    # ---- classification ----------------------------------------------------------------

    def _sniff(self, conn: _Conn, gap: bool = False) -> None:
        conn.saw_gap = conn.saw_gap or gap
        synced = conn.opened.syn_seen and not conn.saw_gap
        for direction in (0, 1):
            data = conn.sniffed[direction]
            if not data:
                continue
            if _TLS_RECORD.match(data):
                self._decide(conn, "tls")
                return
            starts = (0,) if synced else (m.start() for m in _REQUEST_START.finditer(data))
            for at in starts:
                if looks_like_request(data, at, len(data), self.frame_limit):
                    self._start_kafka(conn, swapped=direction == 1)
                    return
        # A Kafka client speaks first, so with the handshake seen its first 14 bytes decide.
        if (synced and len(conn.sniffed[0]) >= 14) or any(len(d) >= SNIFF_LIMIT for d in conn.sniffed):
            self._decide(conn, "other")

    def _decide(self, conn: _Conn, protocol: str) -> None:
        conn.protocol = protocol
        conn.pending.clear()
        conn.sniffed = [bytearray(), bytearray()]

    def _start_kafka(self, conn: _Conn, swapped: bool) -> None:
        opened = conn.opened.swapped() if swapped else conn.opened
        conn.swapped = swapped
        conn.protocol = "kafka"
        conn.decoder = KafkaConnection(synced=conn.opened.syn_seen and not conn.saw_gap,
                                       frame_limit=self.frame_limit)
        conn.rows = ExchangeRows(ConnectionInfo(
            self.source, str(opened.conn_id), opened.client_ip, opened.client_port,
            opened.server_ip, opened.server_port))
        pending, conn.pending = conn.pending, []
        conn.sniffed = [bytearray(), bytearray()]
        for event in pending:
            direction = event.direction ^ swapped
            if isinstance(event, StreamData):
                conn.decoder.receive_data(direction, event.data, event.ts_ns)
            else:
                conn.decoder.receive_gap(direction, event.nbytes, event.ts_ns)
        self._drain(conn)

    # ---- rows --------------------------------------------------------------------------

    def _drain(self, conn: _Conn) -> None:
        builder = conn.rows
        summary = self.summary
        for event in conn.decoder.events():
            row = builder.row(event)
            if row is None:
                continue
            summary.exchanges += 1
            summary.statuses[row["status"]] += 1
            name = row.get("api_name")
            if name:
                summary.apis[name] += 1
            code = row.get("error_code")
            if code:
                summary.errors[row.get("error_name") or str(code)] += 1
            for result in row.get("partition_errors") or ():
                if result["error_code"]:
                    summary.errors[error_name(result["error_code"])] += 1
            self.on_exchange(row)

    def _close(self, event: StreamClosed) -> None:
        conn = self._conns.pop(event.conn_id, None)
        if conn is None:
            return
        if conn.protocol is None:
            conn.protocol = "other"
        if conn.decoder is not None:
            conn.decoder.receive_close(event.ts_ns, "open_at_end" if event.how == "open_at_end" else "closed")
            self._drain(conn)
        self.summary.connections[conn.protocol] += 1
        self.on_connection(self._connection_row(conn, event))

    def _connection_row(self, conn: _Conn, event: StreamClosed) -> Row:
        opened = conn.opened.swapped() if conn.swapped else conn.opened
        stats = event.stats
        to_broker, to_client = (stats.directions[1], stats.directions[0]) if conn.swapped else stats.directions
        row: Row = {
            "source": self.source,
            "connection_id": str(opened.conn_id),
            "client_ip": opened.client_ip,
            "client_port": opened.client_port,
            "broker_ip": opened.server_ip,
            "broker_port": opened.server_port,
            "first_packet_time": stats.first_ts_ns // 1000,
            "last_packet_time": stats.last_ts_ns // 1000,
            "syn_seen": stats.syn_seen,
            "end_reason": event.how,
            "protocol": conn.protocol,
            "bytes_to_broker": to_broker.bytes,
            "bytes_to_client": to_client.bytes,
            "gap_bytes_to_broker": to_broker.gap_bytes,
            "gap_bytes_to_client": to_client.gap_bytes,
            "date": utc_date(stats.first_ts_ns),
        }
        if conn.decoder is not None:
            up, down = conn.decoder.stats(0), conn.decoder.stats(1)
            row.update(frames_to_broker=up["frames"], frames_to_client=down["frames"],
                       resyncs=conn.decoder.resyncs, client_id=conn.rows.client_id)
            self.summary.resyncs += conn.decoder.resyncs
            self.summary.skipped_bytes += up["skipped_bytes"] + down["skipped_bytes"]
            self.summary.gap_bytes += up["gap_bytes"] + down["gap_bytes"]
        return row
