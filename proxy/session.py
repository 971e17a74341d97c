"""One client connection and its own upstream connection: the forwarding path.

``Session`` holds the forwarding state and does no I/O of its own: it is fed what one side
sent (``from_client``, ``from_upstream``) and writes to the other through a transport-like
object (``write``, ``close``, ``abort``). The event loop drives it through ``ClientProtocol``,
for every connection (the one I/O model: ``proxy.server``).

Bytes are forwarded as they arrive. The client -> broker direction is cut into frames by
their length prefix only to read each request's head (``proxy.framing``): api key, version
and correlation id tell what the response with that id will be. The broker -> client
direction is cut into frames only to read each response's correlation id; a response is
held whole (and re-encoded) only when its api and version can carry broker addresses
(``proxy.rewrite``). Everything else goes through as the chunks that came in, written
without copies (whole chunks, or memoryview slices of them). A held frame is kept as the
pieces it arrived in; when a walk over them finds no address to rewrite (a Fetch response
with no node endpoints, say) the pieces are written as they are, never joined.

Fault rules (``proxy.inject``) make the client -> broker side hold whole request frames of
the apis they name, to match topics and partitions. An error rule answers such a request
with a response the proxy builds and never forwards it; the injected response is slotted
into the broker -> client stream in request order (after every earlier request's
response), since clients pair responses with requests in order. A latency rule holds the
request, and everything after it on that connection, for the delay. A close rule aborts
both connections.

Frames held whole (responses to rewrite, requests for rules) and what a client sends while
its upstream connection is being made are held against the proxy's memory budget
(``proxy.budget``): a frame the budget cannot take is forwarded as it comes instead, neither
held nor rewritten nor looked at by a rule, and counted.

Every chunk received from the client and every chunk written to it is handed to the
recorder (``proxy.recorder``) as is: the recorder sees exactly what the client saw.
If a stream ever stops looking like Kafka framing (an impossible length), that connection
falls back to forwarding blindly: the proxy never breaks a client it does not understand.

SASL tokens sent outside Kafka framing (after SaslHandshake v0, or a Kafka 0.9 GSSAPI client's
first frame: ``decoder.sasl``) are cut by their length alone, in both directions, and forwarded:
no head is read from them, so none of their bytes becomes a metric label or an awaited
correlation id, and an empty token (4 bytes) is passed on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from decoder import protocol
from decoder.connection import decodes_as_request, looks_like_request
from decoder.sasl import GSSAPI_TOKEN_TAG, RawExchange, starts_raw_exchange
from proxy import inject, rewrite
from proxy.framing import HEAD_LIMIT, RequestHead, parse_request_head

if TYPE_CHECKING:
    from proxy.server import Proxy

__all__ = ["ClientProtocol", "Session"]

log = logging.getLogger("kwire.proxy")

_RESPONSE_HEAD = struct.Struct(">ii").unpack_from
_I32 = struct.Struct(">i").unpack_from
_FRAME_LIMIT = 100 << 20
_time_ns = time.time_ns
#: How long responses are still forwarded after the client ended its side of the stream.
LINGER_SECONDS = 10.0
#: Bytes a client may send while its upstream connection is being made; reading it pauses beyond.
BACKLOG_LIMIT = 1 << 20
#: Bytes asked of the kernel per read (asyncio's default is 256 KB). Under load, 1 MB reads
#: took about 10% less proxy CPU per MB forwarded (fewer wake-ups, reads and recorder items).
_READ_SIZE = 1 << 20


def _read_large(transport: asyncio.BaseTransport) -> None:
    """Let a plain socket transport read up to ``_READ_SIZE`` at a time (TLS ones keep theirs)."""
    if hasattr(transport, "max_size"):
        transport.max_size = _READ_SIZE  # type: ignore[attr-defined]


class _Inflight:
    __slots__ = ("api_key", "api_version", "correlation_id", "injected")

    def __init__(self, correlation_id: int, api_key: int, api_version: int, injected: bytes | None) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.injected = injected


class ClientProtocol(asyncio.Protocol):
    """Accepted client connection; creates its ``Session``."""

    __slots__ = ("proxy", "session", "targets")

    def __init__(self, proxy: Proxy, targets: Any) -> None:
        self.proxy = proxy
        self.targets = targets  # callable -> list of (host, port) to try upstream
        self.session: Session | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _read_large(transport)
        self.session = Session(self.proxy, transport)  # type: ignore[arg-type]
        self.session.connect_async(self.targets())

    def data_received(self, data: bytes) -> None:
        self.session.from_client(data)  # type: ignore[union-attr]
        self.proxy.recorder.catch_up()  # after forwarding: what came in is on its way

    # Ends are run a few per loop turn (``proxy.endings``): a burst of them cannot stall the
    # other connections. The transport stays open meanwhile (a TLS one cannot: it closes).

    def eof_received(self) -> bool:
        self.proxy.endings.defer(Session.client_eof, self.session)
        return self.proxy.client_ssl is None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.proxy.endings.defer(self.session.client_gone, exc)

    def pause_writing(self) -> None:
        self.session.pause_upstream(True)  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        self.session.pause_upstream(False)  # type: ignore[union-attr]


class _UpstreamProtocol(asyncio.Protocol):
    __slots__ = ("session", "transport")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _read_large(transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.session.from_upstream(data)
        self.session.recorder.catch_up()  # after forwarding: what came in is on its way

    def eof_received(self) -> bool:
        self.session.proxy.endings.defer(self._ended, None)
        return self.session.proxy.upstream_ssl is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.proxy.endings.defer(self.session.upstream_gone, exc)

    def _ended(self, _arg: None) -> None:
        """The broker ended its side: the session ends, and this connection is closed."""
        self.session.upstream_gone(None)
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        self.session.pause_client("backpressure", True)

    def resume_writing(self) -> None:
        self.session.pause_client("backpressure", False)


class Session:
    """Forwarding state of one client connection."""

    def __init__(self, proxy: Proxy, client: Any) -> None:
        self.proxy = proxy
        self.metrics = proxy.metrics
        self.recorder = proxy.recorder
        self.rules = proxy.rules
        self.key = proxy.next_session_key()
        self.accepted_ns = _time_ns()  # the connection's first packet, in its rows
        self.cl = client
        self.up: Any = None  # the upstream transport, once connected
        self.closed = False
        self.ended_ns = 0
        self._connect_task: asyncio.Task[None] | None = None
        self.targets: list[tuple[str, int]] = []  # the brokers it connects to, in order
        self._linger: asyncio.TimerHandle | None = None
        self.end_reason: str | None = None
        self.bytes_from_client = 0
        self.bytes_to_client = 0
        # client -> broker
        self.c_backlog: list[tuple[Any, int]] | None = []  # chunks before upstream is ready
        self.c_backlog_bytes = 0
        self.c_eof_waiting = False  # the client ended its side while upstream was connecting
        self.c_delayed: list[Any] | None = None  # chunks held behind a latency rule
        self.c_frame_left = 0
        self.c_head = bytearray()
        self.c_hold: list[Any] | None = None  # pieces of a request frame held whole
        self.c_hold_left = 0
        self.c_hold_head: RequestHead | None = None
        self.c_blind = False
        self.c_first = True  # no client frame seen yet
        #: When the request header begun (or, before the first frame, the connection) must be
        #: complete (``time.monotonic``); 0 while no header is pending. ``Proxy`` closes the
        #: connection once it passes (``header_expired``).
        self.header_timeout = proxy.config.header_timeout or 0.0
        self.header_due = time.monotonic() + self.header_timeout if self.header_timeout else 0.0
        self.c_pause: set[str] = set()
        self.budget = proxy.budget
        self.taken = 0  # bytes this session holds against the budget (held frames, backlog)
        self.c_hold_taken = 0  # of which: the request frame held for rules (until forwarded)
        # broker -> client
        self.b_frame_left = 0
        self.b_head = bytearray()
        self.b_hold: list[Any] | None = None  # pieces of a response frame held whole
        self.b_hold_left = 0
        self.b_hold_entry: _Inflight | None = None
        self.b_hold_taken = 0
        self.b_blind = False
        self.inflight: deque[_Inflight] = deque()
        self.inflight_ids: dict[int, int] = {}
        self.injected_waiting = 0
        #: An unframed SASL token exchange under way (set by the client side, read by both).
        self.sasl: RawExchange | None = None
        peer = client.get_extra_info("peername") or (None, None)
        self.client_addr = (peer[0], peer[1])
        self.metrics.add("connections_open")
        self.metrics.add("connections_total")
        proxy.sessions.add(self)

    # ---- connection life --------------------------------------------------------------

    def connect_async(self, targets: list[tuple[str, int]]) -> None:
        """Connect upstream on the event loop; what the client sends meanwhile is read and held
        (up to ``BACKLOG_LIMIT``), so it is recorded even when no broker can be reached."""
        self.targets = targets
        self._connect_task = asyncio.get_running_loop().create_task(self._connect(targets))

    async def _connect(self, targets: list[tuple[str, int]]) -> None:
        loop = asyncio.get_running_loop()
        error: BaseException | None = None
        for host, port in targets:
            try:
                transport, _ = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: _UpstreamProtocol(self),
                        host,
                        port,
                        ssl=self.proxy.upstream_ssl,
                        server_hostname=host if self.proxy.upstream_ssl else None,
                    ),
                    timeout=self.proxy.config.connect_timeout,
                )
            except (OSError, TimeoutError) as exc:
                error = exc
                continue
            if not self.connected(transport, (host, port)):
                return
            self.recorder.catch_up()
            self.pause_client("connecting", False)
            if self.c_eof_waiting:
                self.client_eof()
            return
        self.unreachable(targets, error)

    def connected(self, upstream: Any, target: tuple[str, int]) -> bool:
        """The upstream connection is open: forward what the client sent meanwhile.

        False (and ``upstream`` aborted) if the session ended while it was connecting.
        """
        if self.closed:
            upstream.abort()
            return False
        self.up = upstream
        peer = upstream.get_extra_info("peername") or target
        self._open_record(peer[0], peer[1])
        backlog, self.c_backlog = self.c_backlog or [], None
        self._give(self.c_backlog_bytes)
        for data, ts in backlog:
            self._from_client(data, ts)
        return True

    def unreachable(self, targets: list[tuple[str, int]], error: BaseException | None) -> None:
        """No broker answered: record the attempt and what the client sent, reset the client.

        The client's requests are recorded (unanswered), as a capture of that connection
        shows them, though none was forwarded.
        """
        self.metrics.add("upstream_failures")
        log.warning("no broker reachable for client %s:%s (%s)", *self.client_addr, error)
        self.proxy.upstream_refused(targets, error)
        self._record_unforwarded()
        if self._end("rst"):
            # A FIN before the reset, even with the client's bytes unread (which make the close
            # a bare RST): a capture then tells a connection the proxy accepted and ended from
            # one a closed listener reset in its backlog, never accepted (tests/test_proxy_real_cluster.py).
            with contextlib.suppress(OSError, RuntimeError):
                if self.cl.can_write_eof():
                    self.cl.write_eof()
            self.cl.abort()

    def _record_unforwarded(self) -> None:
        """Open the connection in the recorder with what the client sent while no upstream
        connection was made (none could be, or the client ended first): its requests are
        recorded unanswered, as a capture of the client's connection shows them. The broker
        is the first one it would have gone to."""
        host, port = self.targets[0] if self.targets else (None, None)
        self._open_record(host, port)
        for data, ts in self.c_backlog or []:
            self.bytes_from_client += len(data)
            self.recorder.data(self.key, 0, data, ts)
        self.c_backlog = None
        self._give(self.c_backlog_bytes)

    def _open_record(self, broker_ip: str | None, broker_port: int | None) -> None:
        from kwire.rows import ConnectionInfo

        info = ConnectionInfo(
            self.proxy.source,
            f"{self.proxy.run_id}-{self.key}",
            self.client_addr[0],
            self.client_addr[1],
            broker_ip,
            broker_port,
        )
        self.recorder.open(self.key, info, self.accepted_ns)

    def pause_client(self, reason: str, on: bool) -> None:
        if self.closed:
            return
        was = bool(self.c_pause)
        if on:
            self.c_pause.add(reason)
        else:
            self.c_pause.discard(reason)
        now = bool(self.c_pause)
        if now != was:
            if not now and self.header_due:  # the client could not send while we did not read
                self.header_due = time.monotonic() + self.header_timeout
            try:
                if now:
                    self.cl.pause_reading()
                else:
                    self.cl.resume_reading()
            except (AttributeError, RuntimeError):
                pass

    def pause_upstream(self, on: bool) -> None:
        if self.up is not None and not self.closed:
            try:
                if on:
                    self.up.pause_reading()
                else:
                    self.up.resume_reading()
            except (AttributeError, RuntimeError):
                pass

    def client_eof(self) -> bool:
        """The client ended its side of the stream (event loop). True: the session goes on.

        The end is passed on to the broker, and what the broker still sends reaches the client
        until the broker ends its side too (at most ``LINGER_SECONDS``), as on a direct
        connection; an end that comes while the upstream connection is being made is passed
        on once it is made, after what the client sent before it. Where it cannot be passed
        on (a delayed request held, TLS on either side) the session ends now.
        """
        up = self.up
        if up is None and self.c_backlog is not None and not self.closed:
            self.c_eof_waiting = True
            return True
        ends_now = up is None or self.c_delayed is not None
        if self.closed or ends_now or not (up.can_write_eof() and self.cl.can_write_eof()):
            self.client_gone(None)
            return False
        up.write_eof()
        self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, self.client_gone, None)
        return True

    def client_gone(self, exc: BaseException | None) -> None:
        """The client closed (``exc`` None) or reset its connection."""
        if not self._end("fin" if exc is None else "rst"):
            return
        self.cl.close()  # after an end of stream the client may still be reading (a linger)
        if self.up is not None:
            self.up.close()  # what the client sent is flushed to the broker first
        if self._connect_task is not None:
            self._connect_task.cancel()

    def upstream_gone(self, exc: BaseException | None) -> None:
        """The broker closed (``exc`` None) or reset the upstream connection."""
        if self._end("fin" if exc is None else "rst"):
            self.cl.close()  # what the broker sent is flushed to the client first

    def abort(self, reason: str) -> None:
        """Cut both connections now (proxy shutdown, injected close)."""
        if not self._end(reason):
            return
        self.cl.abort()
        if self.up is not None:
            self.up.abort()
        if self._connect_task is not None:
            self._connect_task.cancel()

    def _end(self, reason: str) -> bool:
        """Mark the session ended, once: False if it already was (the other side got there first)."""
        if self.closed:
            return False
        self.closed = True
        self.ended_ns = _time_ns()
        self.end_reason = reason
        if self._linger is not None:
            self._linger.cancel()
        self.proxy.sessions.discard(self)
        self._give(self.taken)
        self.metrics.add("connections_open", -1)
        self.record_close()
        return True

    def record_close(self) -> None:
        """Queue the connection's end for the recorder (after every byte it carried)."""
        if self.c_backlog is not None:
            # ended while its upstream connection was being made: a connection the client
            # made all the same (seen in a failover: a client gave up on a frozen broker)
            self._record_unforwarded()
        self.recorder.close(
            self.key,
            self.ended_ns or _time_ns(),
            self.end_reason or "open_at_end",
            {
                "bytes_to_broker": self.bytes_from_client,
                "bytes_to_client": self.bytes_to_client,
                # a stream forwarded blindly did not look like Kafka, and one that carried no byte
                # either way showed nothing: "other", as kwire decode says of both
                "protocol": (
                    "other"
                    if self.c_blind or self.b_blind or not (self.bytes_from_client or self.bytes_to_client)
                    else "kafka"
                ),
            },
        )

    # ---- client -> broker -------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        if self.c_backlog is not None:
            self.c_backlog.append((data, _time_ns()))
            self.c_backlog_bytes += len(data)
            if not self.closed:
                self.taken += len(data)
                self.budget.charge(len(data))  # read already: held, and no more read beyond the budget
            if self.c_backlog_bytes >= BACKLOG_LIMIT or self.budget.room() <= 0:
                self.pause_client("connecting", True)
            return
        self._from_client(data, _time_ns())

    def _from_client(self, data: Any, ts: int) -> None:
        if self.closed:
            return
        self.bytes_from_client += len(data)
        self.metrics.bytes_to_broker += len(data)  # the loop's own counter: no lock (Metrics)
        self.recorder.data(self.key, 0, data, ts)
        if self.c_delayed is not None:
            self.c_delayed.append(data)
            return
        self._c2b(data)

    def _c2b(self, data: Any) -> None:
        up = self.up
        if self.c_blind:
            up.write(data)
            return
        n = len(data)
        pos = 0
        span = 0  # start of the bytes still to forward from this chunk
        while pos < n:
            left = self.c_frame_left
            if left:
                take = left if left < n - pos else n - pos
                pos += take
                self.c_frame_left = left - take
                continue
            if self.c_hold is not None:
                take = min(self.c_hold_left, n - pos)
                self.c_hold.append(data if take == n else memoryview(data)[pos : pos + take])
                pos += take
                span = pos
                self.c_hold_left -= take
                if self.c_hold_left == 0:
                    frame, head = b"".join(self.c_hold), self.c_hold_head
                    self.c_hold = self.c_hold_head = None
                    stopped = self._held_request(head, frame)
                    if self.c_delayed is None:  # forwarded or answered: the frame is let go
                        self._give(self.c_hold_taken)
                        self.c_hold_taken = 0
                    if stopped:  # processing stops here (delay, close)
                        if self.c_delayed is not None and pos < n:
                            self.c_delayed.insert(0, data[pos:])
                        return
                continue
            # at a frame boundary: read the head before deciding what to do with the frame
            if self.c_head:
                buf = bytes(self.c_head) + bytes(data[pos : pos + 2048])
                start, end = 0, len(buf)
            else:
                buf, start, end = data, pos, n
            if self.c_first or self.sasl is not None:
                token = self._client_token(buf, start, end)
                if token is None:  # too few bytes to tell yet
                    if span < pos:
                        up.write(memoryview(data)[span:pos])
                    self.c_head += data[pos:]
                    pos = span = n
                    self._header_begun()
                    continue
                if token >= 0:  # a SASL token: forwarded by its length, never read
                    self.header_due = 0.0
                    held = bytes(self.c_head)
                    self.c_head.clear()
                    if held:
                        up.write(held)
                    self.c_frame_left = token - len(held)
                    continue
            try:
                head = parse_request_head(buf, start, end)
            except ValueError:
                self._go_blind_client(data, span, pos)
                return
            if head is None:
                if span < pos:
                    up.write(memoryview(data)[span:pos])
                self.c_head += data[pos:]
                pos = span = n
                self._header_begun()
                continue
            if self.header_due:
                self.header_due = 0.0
            hold = self._request_head(head)
            held = b""
            if self.c_head:  # a head that came in pieces
                held = bytes(self.c_head)
                self.c_head.clear()
            if hold and not self._take(head.size):
                hold = False  # at the memory budget: forwarded as it comes, no rule looks at it
                if head.expects_response:
                    self._expect(head, None)
            if hold:
                self.c_hold_taken = head.size
                if span < pos:
                    up.write(memoryview(data)[span:pos])
                self.c_hold = [held] if held else []
                self.c_hold_left = head.size - len(held)
                self.c_hold_head = head
                span = pos
            else:
                if held:
                    up.write(held)
                self.c_frame_left = head.size - len(held)
        if span < n:
            up.write(data if span == 0 else memoryview(data)[span:])

    def _take(self, size: int) -> bool:
        """Hold a frame of ``size`` bytes against the memory budget; False (counted) if it is spent."""
        if self.budget.take(size):
            if not self.closed:
                self.taken += size
                return True
            self.budget.give(size)
            return False
        self.metrics.add("over_budget_frames")
        self.metrics.add("over_budget_bytes", size)
        return False

    def _give(self, size: int) -> None:
        if size > 0:
            size = min(size, self.taken)
            self.taken -= size
            self.budget.give(size)

    def _header_begun(self) -> None:
        """Part of a request header (or a SASL token's length) is here: start its clock."""
        if self.header_timeout and not self.header_due:
            self.header_due = time.monotonic() + self.header_timeout

    def header_expired(self, now: float) -> bool:
        """Whether the header begun is overdue. Never while the proxy itself is
        not reading the client (connecting upstream, backpressure, a latency rule): the clock
        starts again when reading resumes."""
        due = self.header_due
        return bool(due) and now >= due and not self.closed and self.up is not None and not self.c_pause

    def _go_blind_client(self, data: Any, span: int, pos: int) -> None:
        log.warning(
            "client %s:%s: request stream does not look like Kafka; forwarding blindly", *self.client_addr
        )
        self.c_blind = True
        self.header_due = 0.0  # not Kafka: no header to wait for
        if self.c_head:
            self.up.write(bytes(self.c_head))
            self.c_head.clear()
        self.up.write(memoryview(data)[span:])

    def _client_token(self, buf: Any, start: int, end: int) -> int | None:
        """At a client frame boundary while a SASL exchange may be under way (or before the first
        frame): the size of the token frame starting at ``buf[start]`` (``end`` bounds the bytes
        at hand), -1 if it is a Kafka request, None if more bytes are needed to tell."""
        have = end - start
        sasl = self.sasl
        if sasl is None:  # the connection's first frame: a Kafka 0.9 client's GSSAPI token?
            if have < 5:
                return None
            self.c_first = False
            size = _I32(buf, start)[0]
            if buf[start + 4] != GSSAPI_TOKEN_TAG or not 0 < size <= _FRAME_LIMIT:
                return -1
            sasl = self.sasl = RawExchange("GSSAPI", False, _time_ns())
        elif not sasl.client_open:
            if sasl.done:
                self.sasl = None
            return -1
        else:
            if have < 4:
                return None
            size = _I32(buf, start)[0]
            if not 0 <= size <= _FRAME_LIMIT:
                return -1  # read as a request: forwarded blindly from here on
            if not sasl.fixed:  # the tokens end where a Kafka request starts (as the decoder decides)
                whole = 4 + size
                if have < min(whole, 14):
                    return None
                if looks_like_request(buf, start, end, _FRAME_LIMIT):
                    if whole <= HEAD_LIMIT and have < whole:
                        return None  # a small frame is decided once it is all here
                    if whole > HEAD_LIMIT or decodes_as_request(buf, start, start + whole):
                        sasl.client_ended()
                        return -1
        self.c_first = False
        sasl.client_token(4 + size, 0)
        return 4 + size

    def _request_head(self, head: RequestHead) -> bool:
        """Note a request; True if its whole frame must be held (a fault rule may act on it)."""
        self.c_first = False
        self.metrics.count_request(head.api_key, head.api_version, head.client_id)
        if self.rules and self.rules.may_apply(head.api_key):
            return True
        if head.expects_response:
            self._expect(head, None)
        return False

    def _expect(self, head: RequestHead, injected: bytes | None) -> None:
        corr = head.correlation_id
        if injected is None and starts_raw_exchange(head.api_key, head.api_version):
            # forwarded to the broker: unframed tokens follow, whatever comes back
            self.sasl = RawExchange(head.mechanism, True, _time_ns())
        self.inflight.append(_Inflight(corr, head.api_key, head.api_version, injected))
        self.inflight_ids[corr] = self.inflight_ids.get(corr, 0) + 1
        if injected is not None:
            self.injected_waiting += 1

    def _held_request(self, head: RequestHead, frame: bytes) -> bool:
        """A whole request a rule may act on. True if client processing must stop for now."""
        fields = None
        if self.rules.needs_body(head.api_key):
            decoder = protocol.request_decoder(head.api_key, head.api_version)
            if decoder is not None:
                hv = protocol.request_header_version(head.api_key, head.api_version)
                try:
                    from decoder import message_codec

                    _h, body_at = message_codec.decode_header("request", hv, frame, 4)
                    fields, _stop = decoder(frame, body_at, len(frame))
                except Exception:  # undecodable: no topic/partition can match
                    fields = None
        rule = self.rules.decide(head.api_key, head.client_id, fields, self.proxy.topic_names)
        if rule is None or (rule.action == "error" and not head.expects_response):
            return self._forward_request(head, frame)
        if rule.action == "error":
            try:
                response = inject.build_error_response(
                    head.api_key,
                    head.api_version,
                    head.correlation_id,
                    frame,
                    rule.error_code,
                    self.proxy.topic_names,
                )
            except Exception as exc:
                log.warning(
                    "cannot build a %s v%s response for rule %r (%s); forwarding the request",
                    protocol.api_name(head.api_key),
                    head.api_version,
                    rule.text,
                    exc,
                )
                return self._forward_request(head, frame)
            self.metrics.bump(self.metrics.injected, (rule.text, "error"))
            self._expect(head, response)
            self.recorder.injected(self.key, head.correlation_id)
            self._flush_injected()
            return False
        if rule.action == "latency":
            self.metrics.bump(self.metrics.injected, (rule.text, "latency"))
            if head.expects_response:
                self._expect(head, None)
            self.c_delayed = []
            self.pause_client("latency", True)
            asyncio.get_running_loop().call_later(rule.latency_s, self._release, frame)
            return True
        self.metrics.bump(self.metrics.injected, (rule.text, "close"))
        self.abort("rst")
        return True

    def _forward_request(self, head: RequestHead, frame: bytes) -> bool:
        if head.expects_response:
            self._expect(head, None)
        self.up.write(frame)
        return False

    def _release(self, frame: bytes) -> None:
        """A delayed request's time has come: forward it and what queued up behind it."""
        if self.closed:
            return
        self.up.write(frame)
        self._give(self.c_hold_taken)
        self.c_hold_taken = 0
        pending, self.c_delayed = self.c_delayed or [], None
        for i, chunk in enumerate(pending):
            self._c2b(chunk)
            if self.c_delayed is not None:  # another delay started: keep the rest behind it
                self.c_delayed.extend(pending[i + 1 :])
                return
            if self.closed:
                return
        self.pause_client("latency", False)

    # ---- broker -> client -------------------------------------------------------------

    # A write that fails (the client reset the connection) is not recorded: the transport
    # swallows the error and is closing from then on.

    def _to_client(self, data: Any) -> None:
        self.cl.write(data)
        if self.cl.is_closing():
            return
        self.bytes_to_client += len(data)
        self.metrics.bytes_to_client += len(data)
        self.recorder.data(self.key, 1, data, _time_ns())

    def _pieces_to_client(self, pieces: list[Any]) -> None:
        """One frame, in the pieces it arrived in (written as they are, never joined)."""
        size = 0
        write = self.cl.write
        for piece in pieces:
            write(piece)
            size += len(piece)
        if self.cl.is_closing():
            return
        self.bytes_to_client += size
        self.metrics.bytes_to_client += size
        ts = _time_ns()
        for piece in pieces:
            self.recorder.data(self.key, 1, piece, ts)

    def _match(self, corr: int) -> tuple[_Inflight | None, list[bytes]]:
        """The request a response answers, and injected responses due before it."""
        before: list[bytes] = []
        if corr not in self.inflight_ids:
            return None, before
        queue = self.inflight
        while queue:
            entry = self._next_inflight()
            if entry.injected is not None:
                before.append(entry.injected)
            elif entry.correlation_id == corr:
                return entry, before
        return None, before

    def _next_inflight(self) -> _Inflight:
        """Take the oldest request awaiting a response off the queue."""
        entry = self.inflight.popleft()
        left = self.inflight_ids[entry.correlation_id] - 1
        if left:
            self.inflight_ids[entry.correlation_id] = left
        else:
            del self.inflight_ids[entry.correlation_id]
        if entry.injected is not None:
            self.injected_waiting -= 1
        return entry

    def _flush_injected(self) -> None:
        """Write injected responses now at the head of the queue, if no response is mid-way."""
        if not self.injected_waiting or self.b_frame_left or self.b_hold is not None or self.b_head:
            return
        while True:
            queue = self.inflight
            if not queue or queue[0].injected is None:
                return
            response = self._next_inflight().injected
            self._to_client(response)

    def from_upstream(self, data: bytes) -> None:
        if self.closed:
            return
        if self.b_blind:
            self._to_client(data)
            return
        n = len(data)
        pos = 0
        span = 0
        while pos < n:
            left = self.b_frame_left
            if left:
                take = left if left < n - pos else n - pos
                pos += take
                self.b_frame_left = left - take
                if self.injected_waiting and not self.b_frame_left:
                    self._to_client(memoryview(data)[span:pos])
                    span = pos
                    self._flush_injected()
                continue
            if self.b_hold is not None:
                take = min(self.b_hold_left, n - pos)
                self.b_hold.append(data if take == n else memoryview(data)[pos : pos + take])
                pos += take
                span = pos
                self.b_hold_left -= take
                if not self.b_hold_left:
                    pieces, entry = self.b_hold, self.b_hold_entry
                    self.b_hold = self.b_hold_entry = None
                    self._give(self.b_hold_taken)
                    self.b_hold_taken = 0
                    if len(pieces) > 1 and not rewrite.may_carry_endpoints(
                        pieces, entry.api_key, entry.api_version
                    ):
                        self._pieces_to_client(pieces)  # nothing to rewrite: no need to join them
                    else:
                        self._to_client(self._rewritten(b"".join(pieces), entry))
                    self._flush_injected()
                continue
            sasl = self.sasl
            if sasl is not None and sasl.server_open:
                if self.b_head:
                    buf = bytes(self.b_head) + bytes(data[pos : pos + 8])
                    start, end = 0, len(buf)
                else:
                    buf, start, end = data, pos, n
                token = self._broker_token(sasl, buf, start, end)
                if token is None:  # too few bytes to tell yet (an empty token is 4)
                    if span < pos:
                        self._to_client(memoryview(data)[span:pos])
                    self.b_head += data[pos:]
                    pos = span = n
                    continue
                if token >= 0:  # a SASL token: forwarded by its length, never read
                    if self.b_head:
                        held = bytes(self.b_head)
                        self.b_head.clear()
                        self._to_client(held)
                        token -= len(held)
                    self.b_frame_left = token
                    continue
            prefix = None
            if self.b_head or n - pos < 8:
                if span < pos:
                    self._to_client(memoryview(data)[span:pos])
                piece = data[pos : pos + 8 - len(self.b_head)]
                self.b_head += piece
                pos += len(piece)
                span = pos
                if len(self.b_head) < 8:
                    continue
                prefix = bytes(self.b_head)
                self.b_head.clear()
                size, corr = _RESPONSE_HEAD(prefix, 0)
            else:
                size, corr = _RESPONSE_HEAD(data, pos)
            if size < 4 or size > _FRAME_LIMIT:
                self._go_blind_upstream(data, span, pos, prefix)
                return
            entry, before = self._match(corr)
            sasl = self.sasl
            if (
                entry is not None
                and sasl is not None
                and starts_raw_exchange(entry.api_key, entry.api_version)
            ):
                # Its answer: the broker's tokens follow this frame. An error answer is followed by
                # the broker closing the connection (Kafka), so it needs no reading.
                sasl.handshake_answered(True)
            if before:
                if span < pos and prefix is None:
                    self._to_client(memoryview(data)[span:pos])
                    span = pos
                for response in before:
                    self._to_client(response)
            total = size + 4
            if (
                entry is not None
                and self.proxy.rewriting
                and rewrite.has_endpoints(entry.api_key, entry.api_version)
                and self._take(total)  # at the memory budget: forwarded as it comes, not rewritten
            ):
                self.b_hold_taken = total
                if prefix is None:
                    if span < pos:
                        self._to_client(memoryview(data)[span:pos])
                    self.b_hold = []
                    self.b_hold_left = total
                    span = pos
                else:
                    self.b_hold = [prefix]
                    self.b_hold_left = total - 8
                self.b_hold_entry = entry
                continue
            if prefix is not None:
                self._to_client(prefix)
                self.b_frame_left = total - 8
                if not self.b_frame_left and self.injected_waiting:
                    self._flush_injected()
            else:
                self.b_frame_left = total
        if span < n:
            self._to_client(data if span == 0 else memoryview(data)[span:])
        if self.injected_waiting:
            self._flush_injected()

    def _broker_token(self, sasl: RawExchange, buf: Any, start: int, end: int) -> int | None:
        """At a broker frame boundary inside a SASL exchange: the size of the token frame at
        ``buf[start]``, -1 if it is a Kafka response, None if more bytes are needed to tell."""
        if end - start < 4:
            return None
        size = _I32(buf, start)[0]
        if not 0 <= size <= _FRAME_LIMIT:
            return -1  # read as a response: forwarded blindly from here on
        if not sasl.fixed and not sasl.client_open and size >= 4:
            # once the client has sent a request, its answer ends the broker's tokens
            if end - start < 8:
                return None
            answers = _I32(buf, start + 4)[0] in self.inflight_ids
            if answers:
                sasl.server_ended()
                self.sasl = None
                return -1
        sasl.server_token(4 + size, 0)
        if sasl.done:
            self.sasl = None
        return 4 + size

    def _go_blind_upstream(self, data: Any, span: int, pos: int, prefix: bytes | None) -> None:
        log.warning("broker stream to %s:%s does not look like Kafka; forwarding blindly", *self.client_addr)
        self.b_blind = True
        if prefix is not None:
            self._to_client(prefix)
        if span < len(data):
            self._to_client(memoryview(data)[span:])

    def _rewritten(self, frame: bytes, entry: _Inflight) -> bytes:
        try:
            out = self.proxy.rewrites.rewrite(
                frame,
                entry.api_key,
                entry.api_version,
                self.proxy.local_address,
                self.proxy.topic_names,
            )
        except rewrite.DECODE_ERRORS as exc:
            self.metrics.bump(self.metrics.rewrite_errors, entry.api_key)
            log.warning(
                "could not rewrite a %s v%s response (%s); forwarded unchanged",
                protocol.api_name(entry.api_key),
                entry.api_version,
                exc,
            )
            return frame
        if out is None:
            return frame
        self.metrics.bump(self.metrics.rewrites, entry.api_key)
        return out
