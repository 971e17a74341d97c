"""Sans-io TCP reassembly: TcpSegments in, per-direction byte streams out, as events.

    r = TcpReassembler()
    for seg in iter_segments(path):
        for event in r.feed(seg):
            ...
    for event in r.finish(last_ts_ns):
        ...

The reassembler does no I/O and keeps no clock of its own: time is the segments' capture time. For each
connection it emits `StreamOpened`, then `StreamData` / `StreamGap` events per direction strictly in
sequence order (a gap stands exactly where the missing bytes were, so a consumer can resync there), then
one `StreamClosed`. Direction 0 is client -> server, 1 is server -> client.

Rules:
- The client is whoever sent the SYN (or received the SYN/ACK when only that was captured). Without a
  handshake in the capture, the sender of the first data-bearing segment is a *provisional* client
  (`StreamOpened.syn_seen` is False) and the consumer may swap the roles later: see `StreamOpened.swapped`.
- Retransmitted and overlapping bytes are dropped, keeping the bytes seen first; sequence numbers wrap
  mod 2**32. Segments ahead of a hole wait, up to `max_out_of_order_bytes` per direction (and
  `max_buffered_bytes` over all connections); past that, the hole is declared a gap and delivery moves
  on. A hole before held data (or before the FIN) is declared a gap as soon as the peer acknowledges
  bytes past it: they were on the wire but the capture lost them, so they will never come. Bytes the
  peer acknowledged that never show up at all are reported as a gap when the connection closes.
- Zero-length ACKs open nothing and emit nothing. Data after a FIN is ignored. A connection closes on a
  RST, on FINs both ways once everything before them is delivered, after `idle_timeout_ns` without
  packets, when a fresh SYN reuses its 4-tuple (how='idle': its end was not captured), or at `finish`.
  `StreamStats.first_end` says which side sent the first FIN or RST, and when (a refused SYN is a
  server RST with no SYN/ACK before it). A closed connection is forgotten; its 4-tuple is remembered
  for `time_wait_ns` so that late packets are dropped rather than taken for a new connection, while a
  new SYN starts one (a new conn_id).
- Memory is bounded: at most `max_connections` connections (the oldest is closed as idle to make room),
  bounded out-of-order buffers, bounded tombstones.

Events carry payload `bytes` objects straight from the segments: in-order data is never copied (only
partial overlaps are trimmed, which slices).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Literal

from decoder.compiled import load
from decoder.fastclass import fast_constructor
from decoder.pcap import ACK, FIN, RST, SYN, TcpSegment

__all__ = [
    "DirectionStats",
    "Event",
    "FirstEnd",
    "ReassemblerStats",
    "StreamClosed",
    "StreamData",
    "StreamGap",
    "StreamOpened",
    "StreamStats",
    "TcpReassembler",
]

CloseHow = Literal["fin", "rst", "open_at_end", "idle"]


@dataclass(frozen=True, slots=True)
class DirectionStats:
    """What one direction of a connection carried."""

    bytes: int  # payload bytes delivered in StreamData
    packets: int  # segments seen, zero-length ACKs included
    gap_bytes: int  # bytes reported missing in StreamGap
    dropped_bytes: int  # retransmitted or overlapping bytes dropped (the first-seen copy was kept)
    after_fin_bytes: int  # bytes beyond the FIN, ignored
    out_of_order: int  # segments that arrived ahead of a hole
    syn_seen: bool
    fin_seen: bool
    rst_seen: bool


@dataclass(frozen=True, slots=True)
class FirstEnd:
    """The first FIN or RST of a connection: which side sent it, and when. Who ended a connection
    first is what tells a client giving up from a broker going away; what follows (the other
    side's FIN, a RST to a late segment) is only the answer to it."""

    direction: int  # 0: the client (the SYN's sender), 1: the server
    flag: Literal["fin", "rst"]
    ts_ns: int


@dataclass(frozen=True, slots=True)
class StreamStats:
    """Per-connection totals, in StreamClosed. `directions[0]` is client -> server."""

    directions: tuple[DirectionStats, DirectionStats]
    first_ts_ns: int
    last_ts_ns: int
    syn_seen: bool  # roles come from the handshake (as in StreamOpened)
    first_end: FirstEnd | None = None  # None: neither side sent FIN or RST in the capture


@dataclass(frozen=True, slots=True)
class StreamOpened:
    """A new connection. If `syn_seen` is False the roles are provisional (first data sender = client)."""

    conn_id: int
    client_ip: str
    client_port: int
    server_ip: str
    server_port: int
    ts_ns: int
    syn_seen: bool

    def swapped(self) -> StreamOpened:
        """The same connection with roles exchanged: for a consumer that finds the provisional client is
        really the server. Its directions are then the reassembler's with 0 and 1 exchanged."""
        return StreamOpened(
            self.conn_id,
            self.server_ip,
            self.server_port,
            self.client_ip,
            self.client_port,
            self.ts_ns,
            self.syn_seen,
        )


@dataclass(frozen=True, slots=True)
class StreamData:
    """In-order bytes of one direction; `ts_ns` is the capture time of the segment that carried them."""

    conn_id: int
    direction: int
    ts_ns: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StreamGap:
    """`nbytes` bytes of one direction are missing from the capture, right here in the stream.

    nbytes can be large (a capture that lost much, or hostile input): never allocate by it."""

    conn_id: int
    direction: int
    ts_ns: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class StreamClosed:
    """The connection ended (or was given up); nothing more will come for `conn_id`."""

    conn_id: int
    ts_ns: int
    how: CloseHow
    stats: StreamStats


Event = StreamOpened | StreamData | StreamGap | StreamClosed


@dataclass(slots=True)
class ReassemblerStats:
    """Counters over the reassembler's life."""

    connections: int = 0  # opened
    ignored_segments: int = 0  # no connection to belong to: lone ACK/FIN/RST, late packets after a close
    evicted: int = 0  # connections closed early to respect max_connections


_Data = fast_constructor(StreamData)
_M = 0xFFFFFFFF
_HALF = 1 << 31
_first = itemgetter(0)


class _Half:
    """One direction's state. Offsets count bytes from the first byte after the SYN (or from the first
    byte seen); they never wrap. `pending` holds (offset, ts, data) ahead of `off`, sorted, disjoint."""

    __slots__ = (
        "acked",
        "after_fin",
        "base",
        "dropped",
        "fin_off",
        "gap",
        "isn",
        "next_seq",
        "off",
        "ooo",
        "packets",
        "pending",
        "pending_bytes",
        "rst",
        "syn",
    )

    def __init__(self) -> None:
        self.next_seq = -1  # sequence number of the next byte to deliver; -1 until known
        self.base = 0  # sequence number of offset 0
        self.off = 0  # offset of the next byte to deliver
        self.fin_off = -1  # offset of the FIN, once seen
        self.isn = -1
        self.acked = -1  # the newest acknowledgment number the peer sent for this direction
        self.pending: list[tuple[int, int, bytes]] = []
        self.pending_bytes = 0
        self.packets = self.gap = self.dropped = self.after_fin = self.ooo = 0
        self.syn = self.rst = False

    def start(self, seq: int) -> None:
        """Offset 0 is at sequence number `seq`."""
        self.base = self.next_seq = seq
        self.off = 0

    def offset(self, seq: int) -> int:
        """Offset of sequence number `seq`, taking the nearer of its wraps around the current position."""
        delta = (seq - self.next_seq) & _M
        return self.off + (delta - (1 << 32) if delta >= _HALF else delta)

    def stats(self) -> DirectionStats:
        return DirectionStats(
            self.off - self.gap,
            self.packets,
            self.gap,
            self.dropped,
            self.after_fin,
            self.ooo,
            self.syn,
            self.fin_off >= 0,
            self.rst,
        )


class _Conn:
    __slots__ = ("client", "first_end", "first_ts", "halves", "id", "last_ts", "server", "syn_seen")

    def __init__(
        self, cid: int, client: tuple[str, int], server: tuple[str, int], ts: int, syn: bool
    ) -> None:
        self.id = cid
        self.client, self.server = client, server
        self.halves = (_Half(), _Half())
        self.first_ts = self.last_ts = ts
        self.syn_seen = syn
        self.first_end: FirstEnd | None = None

    def flow_keys(self) -> tuple[tuple[str, int, str, int], tuple[str, int, str, int]]:
        c, s = self.client, self.server
        return (c[0], c[1], s[0], s[1]), (s[0], s[1], c[0], c[1])


class TcpReassembler:
    """Feed TcpSegments (in capture order) with `feed`; call `finish` at the end of the capture."""

    def __init__(
        self,
        max_out_of_order_bytes: int = 4 << 20,
        idle_timeout_ns: int = 900 * 10**9,
        *,
        max_connections: int = 200_000,
        max_buffered_bytes: int = 512 << 20,
        max_out_of_order_segments: int = 8192,
        time_wait_ns: int = 60 * 10**9,
    ) -> None:
        """`idle_timeout_ns` defaults to 15 minutes, longer than Kafka's own idle limit
        (connections.max.idle.ms, 10 minutes), so a live Kafka connection is not cut by the reassembler."""
        self.max_out_of_order_bytes = max_out_of_order_bytes
        self.max_out_of_order_segments = max_out_of_order_segments
        self.max_buffered_bytes = max_buffered_bytes
        self.idle_timeout_ns = idle_timeout_ns
        self.max_connections = max_connections
        self.time_wait_ns = time_wait_ns
        self.stats = ReassemblerStats()
        # 4-tuple as sent -> (connection, direction, that direction's half, the other half)
        self._flows: dict[tuple[str, int, str, int], tuple[_Conn, int, _Half, _Half]] = {}
        self._conns: dict[int, _Conn] = {}  # by id, oldest first
        self._closed: dict[tuple[str, int, str, int], int] = {}  # 4-tuple -> forget after (ns)
        self._next_id = 0
        self._buffered = 0  # out-of-order bytes held over all connections
        self._now = 0  # latest capture time seen
        self._sweep_every = max(1, idle_timeout_ns // 4)
        self._next_sweep: int | None = None

    # -- public ---------------------------------------------------------------------------------------

    def feed(self, seg: TcpSegment) -> list[Event]:
        """Take one segment; return the events it completes (often one StreamData, often none)."""
        ts = seg.ts_ns
        out: list[Event] = []
        if ts > self._now:
            self._now = ts
            if self._next_sweep is None:
                self._next_sweep = ts + self._sweep_every
            elif ts >= self._next_sweep:
                self._sweep(ts, out)
        ent = self._flows.get((seg.src_ip, seg.src_port, seg.dst_ip, seg.dst_port))
        if ent is None:
            self._new_flow(seg, out)
            return out
        conn, d, h, o = ent
        if ts > conn.last_ts:  # files merged out of time order must not move it back
            conn.last_ts = ts
        h.packets += 1
        flags = seg.flags
        if flags & (SYN | FIN | RST):
            self._segment(conn, d, h, o, seg, out)
            return out
        if flags & ACK:
            # The peer's ACK first: it may reveal a hole in the other direction (bytes the capture
            # lost) that must become a gap before this segment's payload (often the answer) is seen.
            a = seg.ack
            if o.acked < 0 or (a - o.acked) & _M < _HALF:  # keep the newest
                o.acked = a
            if o.pending or o.fin_off >= 0:
                self._acked(conn, d ^ 1, o, ts, out)
        payload = seg.payload
        if payload:
            if seg.seq == h.next_seq and h.fin_off < 0 and not h.pending:  # in order: the fast path
                h.off += len(payload)
                h.next_seq = (h.base + h.off) & _M
                ev = _Data(conn.id, d, ts, payload)
                ev.__class__ = StreamData
                out.append(ev)
            else:
                self._data(conn, d, h, seg.seq, payload, ts, out)
        return out

    def feeder(self) -> Callable[[TcpSegment], list[Event]]:
        """``feed`` as one callable, its common segment taken in C (``decoder/_tcpfast.c``) when
        that is built: for the loops that feed every packet."""
        return self.feed if _tcpfast is None else partial(_tcpfast.feed, self)

    def flush_idle(self, now_ns: int) -> list[Event]:
        """Close connections without packets for `idle_timeout_ns` before `now_ns` and forget old
        tombstones. `feed` does this by itself as capture time passes; call it to force a sweep."""
        out: list[Event] = []
        self._sweep(now_ns, out)
        return out

    def finish(self, end_ts_ns: int) -> list[Event]:
        """End of capture: close every open connection as 'open_at_end', oldest first."""
        out: list[Event] = []
        for conn in list(self._conns.values()):
            self._close(conn, "open_at_end", end_ts_ns, out)
        self._closed.clear()
        return out

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def buffered_bytes(self) -> int:
        """Out-of-order bytes held, over all connections."""
        return self._buffered

    # -- connections ------------------------------------------------------------------------------------

    def _new_flow(self, seg: TcpSegment, out: list[Event]) -> None:
        flags = seg.flags
        syn = flags & SYN
        key = (seg.src_ip, seg.src_port, seg.dst_ip, seg.dst_port)
        if flags & RST or not (syn or seg.payload):
            self.stats.ignored_segments += 1
            return
        expires = self._closed.get(key)
        if expires is not None:
            if not syn and seg.ts_ns < expires:  # a late packet of a closed connection
                self.stats.ignored_segments += 1
                return
            del self._closed[key]
            self._closed.pop((key[2], key[3], key[0], key[1]), None)
        if len(self._conns) >= self.max_connections:
            self.stats.evicted += 1
            self._close(next(iter(self._conns.values())), "idle", seg.ts_ns, out)
        src, dst = (seg.src_ip, seg.src_port), (seg.dst_ip, seg.dst_port)
        d = 1 if syn and flags & ACK else 0  # a SYN/ACK comes from the server
        client, server = (dst, src) if d else (src, dst)
        conn = _Conn(self._next_id, client, server, seg.ts_ns, bool(syn))
        self._next_id += 1
        self.stats.connections += 1
        self._conns[conn.id] = conn
        k0, k1 = conn.flow_keys()
        h0, h1 = conn.halves
        self._flows[k0] = (conn, 0, h0, h1)
        self._flows[k1] = (conn, 1, h1, h0)
        out.append(StreamOpened(conn.id, client[0], client[1], server[0], server[1], seg.ts_ns, bool(syn)))
        h, o = conn.halves[d], conn.halves[d ^ 1]
        h.packets += 1
        self._segment(conn, d, h, o, seg, out)

    def _close(self, conn: _Conn, how: CloseHow, ts: int, out: list[Event]) -> None:
        """Deliver what is buffered (gaps included), emit StreamClosed, forget the connection."""
        for d, h in enumerate(conn.halves):
            if h.pending:
                last, _, data = h.pending[-1]
                self._advance(conn, d, h, last + len(data), ts, out)
            end = self._acked_offset(h)  # bytes the peer acknowledged but the capture lacks
            if h.fin_off >= 0:  # bytes before the FIN never seen
                end = h.fin_off
            if end > h.off:
                self._advance(conn, d, h, end, ts, out)
        stats = StreamStats(
            (conn.halves[0].stats(), conn.halves[1].stats()),
            conn.first_ts,
            conn.last_ts,
            conn.syn_seen,
            conn.first_end,
        )
        out.append(StreamClosed(conn.id, ts, how, stats))
        del self._conns[conn.id]
        for key in conn.flow_keys():
            del self._flows[key]
            if how in ("fin", "rst"):
                self._closed[key] = ts + self.time_wait_ns
        while len(self._closed) > 2 * self.max_connections:
            del self._closed[next(iter(self._closed))]

    def _sweep(self, now: int, out: list[Event]) -> None:
        self._next_sweep = now + self._sweep_every
        limit = now - self.idle_timeout_ns
        for conn in [c for c in self._conns.values() if c.last_ts <= limit]:
            self._close(conn, "idle", now, out)
        closed = self._closed
        while closed:  # expiry times grow with insertion order
            key = next(iter(closed))
            if closed[key] > now:
                break
            del closed[key]

    def _maybe_close(self, conn: _Conn, ts: int, out: list[Event]) -> None:
        a, b = conn.halves
        if 0 <= a.fin_off <= a.off and 0 <= b.fin_off <= b.off:
            self._close(conn, "fin", ts, out)

    # -- segments ---------------------------------------------------------------------------------------

    def _segment(self, conn: _Conn, d: int, h: _Half, o: _Half, seg: TcpSegment, out: list[Event]) -> None:
        """The general path: a segment with SYN, FIN or RST, or the first of a connection."""
        flags, ts, seq = seg.flags, seg.ts_ns, seg.seq
        if flags & RST:
            h.rst = True
            if conn.first_end is None:
                conn.first_end = FirstEnd(d, "rst", ts)
            self._close(conn, "rst", ts, out)
            return
        if flags & SYN:
            if h.syn or h.next_seq >= 0:
                if h.isn != seq and not flags & ACK:  # a fresh SYN on a busy 4-tuple: a new connection
                    self._close(conn, "idle", ts, out)
                    self._new_flow(seg, out)
                    return
                if h.isn != seq:  # a SYN/ACK that fits nothing: keep the connection as it is
                    h.dropped += len(seg.payload)
                    return
            else:
                h.syn = True
                h.isn = seq
                h.start((seq + 1) & _M)
            seq = (seq + 1) & _M  # data on a SYN (TCP Fast Open) starts after it
        payload = seg.payload
        if payload:
            self._data(conn, d, h, seq, payload, ts, out)
        if flags & FIN:
            if conn.first_end is None:
                conn.first_end = FirstEnd(d, "fin", ts)
            if h.next_seq < 0:
                h.start(seq)
            fin = h.offset((seq + len(payload)) & _M)
            if h.fin_off < 0 and fin >= h.off:
                h.fin_off = fin
                self._drop_after_fin(h)
            elif h.fin_off < 0:  # a FIN behind what was delivered: make it the end anyway
                h.fin_off = h.off
                self._drop_after_fin(h)
        if flags & ACK:
            a = seg.ack
            if o.acked < 0 or (a - o.acked) & _M < _HALF:  # keep the newest
                o.acked = a
            if o.pending or o.fin_off >= 0:
                self._acked(conn, d ^ 1, o, ts, out)
                if conn.id not in self._conns:
                    return
        self._maybe_close(conn, ts, out)

    def _data(
        self, conn: _Conn, d: int, h: _Half, seq: int, payload: bytes, ts: int, out: list[Event]
    ) -> None:
        """Place payload starting at sequence number `seq` in direction d's stream."""
        if h.next_seq < 0:  # first bytes seen this way, mid-stream: they define offset 0
            h.start(seq)
        n = len(payload)
        start = h.offset(seq)
        end = start + n
        if 0 <= h.fin_off < end:
            extra = end - max(start, h.fin_off)
            h.after_fin += extra
            if extra == n:
                return
            payload = payload[: n - extra]
            n, end = n - extra, h.fin_off
        if end <= h.off:
            h.dropped += n
            return
        if start < h.off:
            cut = h.off - start
            h.dropped += cut
            payload = payload[cut:]
            start = h.off
        if start == h.off and not h.pending:
            h.off = end
            h.next_seq = (h.base + end) & _M
            out.append(StreamData(conn.id, d, ts, payload))
            return
        if start > h.off:
            h.ooo += 1
        self._insert(h, start, ts, payload)
        self._drain(conn, d, h, out)
        pend = h.pending
        while pend and (
            h.pending_bytes > self.max_out_of_order_bytes
            or len(pend) > self.max_out_of_order_segments
            or self._buffered > self.max_buffered_bytes
        ):
            self._advance(conn, d, h, pend[0][0], ts, out)  # give up on the first hole

    def _insert(self, h: _Half, start: int, ts: int, data: bytes) -> None:
        """Add data at offset `start` (> h.off) to the pending list, keeping bytes already there."""
        pend = h.pending
        end = start + len(data)
        i = bisect_left(pend, start, key=_first)
        if i:
            p_off, _, p_data = pend[i - 1]
            p_end = p_off + len(p_data)
            if p_end > start:  # the previous piece covers our head
                if p_end >= end:
                    h.dropped += len(data)
                    return
                h.dropped += p_end - start
                data = data[p_end - start :]
                start = p_end
        j = i
        while j < len(pend) and pend[j][0] < end:
            j += 1
        if i == j:  # no overlap: the usual case
            pend.insert(i, (start, ts, data))
            added = len(data)
        else:  # interleave the uncovered parts of data with the pieces already held
            merged: list[tuple[int, int, bytes]] = []
            cur = start
            for piece in pend[i:j]:
                q_off, _, q_data = piece
                if cur < q_off:
                    merged.append((cur, ts, data[cur - start : q_off - start]))
                merged.append(piece)
                cur = max(cur, q_off + len(q_data))
            if cur < end:
                merged.append((cur, ts, data[cur - start :]))
            added = sum(len(m[2]) for m in merged) - sum(len(q[2]) for q in pend[i:j])
            h.dropped += len(data) - added
            pend[i:j] = merged
        h.pending_bytes += added
        self._buffered += added

    def _drain(self, conn: _Conn, d: int, h: _Half, out: list[Event]) -> None:
        """Deliver pending pieces that now continue the stream."""
        pend = h.pending
        k = 0
        off = h.off
        while k < len(pend) and pend[k][0] == off:
            _, ts, data = pend[k]
            out.append(StreamData(conn.id, d, ts, data))
            off += len(data)
            k += 1
        if k:
            del pend[:k]
            h.pending_bytes -= off - h.off
            self._buffered -= off - h.off
            h.off = off
            h.next_seq = (h.base + off) & _M

    def _advance(self, conn: _Conn, d: int, h: _Half, target: int, ts: int, out: list[Event]) -> None:
        """Move direction d's stream up to `target`, delivering what is held and declaring the rest gaps."""
        pend = h.pending
        while h.off < target:
            nxt = pend[0][0] if pend and pend[0][0] <= target else target
            if nxt > h.off:
                out.append(StreamGap(conn.id, d, ts, nxt - h.off))
                h.gap += nxt - h.off
                h.off = nxt
                h.next_seq = (h.base + nxt) & _M
            self._drain(conn, d, h, out)

    def _drop_after_fin(self, h: _Half) -> None:
        pend = h.pending
        fin = h.fin_off
        while pend:
            off, ts, data = pend[-1]
            if off + len(data) <= fin:
                break
            keep = max(0, fin - off)
            h.after_fin += len(data) - keep
            h.pending_bytes -= len(data) - keep
            self._buffered -= len(data) - keep
            if keep:
                pend[-1] = (off, ts, data[:keep])
                break
            pend.pop()

    def _acked_offset(self, h: _Half) -> int:
        """Offset up to which the peer acknowledged direction h (h.off if nothing beyond)."""
        if h.next_seq < 0 or h.acked < 0:
            return h.off
        delta = (h.acked - h.next_seq) & _M
        return h.off + delta if delta < _HALF else h.off

    def _acked(self, conn: _Conn, d: int, h: _Half, ts: int, out: list[Event]) -> None:
        """The peer acknowledged direction d up to h.acked while bytes are missing before held data or
        the FIN: the missing bytes the acknowledgment covers were on the wire, the capture lost them.
        (A hole with nothing after it is left open: its bytes may still come, slightly reordered; if
        they never do, `_close` reports them.)"""
        target = self._acked_offset(h)
        limit = h.fin_off
        if h.pending:
            last, _, data = h.pending[-1]
            limit = max(limit, last + len(data))
        if target > limit:
            target = limit
        if target > h.off:
            self._advance(conn, d, h, target, ts, out)
            self._maybe_close(conn, ts, out)


# The common segment of ``TcpReassembler.feed`` compiled (decoder/_tcpfast.c: why, and when it
# hands a segment to ``feed``); KWIRE_PURE_PYTHON=1 leaves it out.
_tcpfast = load("_tcpfast", "compiled TCP fast path")
if _tcpfast is not None:
    _tcpfast.configure(TcpSegment, _Conn, _Half, StreamData)
