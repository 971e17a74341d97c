"""The sans-io Kafka stream decoder: one ``KafkaConnection`` per TCP connection.

Feed it the bytes of each direction as they arrive (any chunking, one byte at a time
works), tell it about gaps (bytes a capture lost) and the end of the connection, and read
events (``decoder.events``). It never touches sockets or files, so a pcap reader, a live
proxy and a test all drive the same object.

Framing: every Kafka frame is an int32 length and that many bytes. A response carries no
API key: it is matched to its request by correlation id, and because a broker answers the
requests of one connection in order, a response also tells that every older request still
waiting was never answered.

Losing alignment (a gap longer than the frame in progress, an implausible length, a stream
entered mid-way) switches the direction to hunting: it looks for the next offset where a
frame header is plausible (requests: known api key, defined version, sane client id;
responses: a correlation id that a pending request has) and resumes there, emitting
``Resync``. Hunting never emits a frame it has not checked, so garbage is never decoded.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict, deque
from typing import Any

from decoder import protocol
from decoder.events import (
    BROKER_TO_CLIENT,
    CLIENT_TO_BROKER,
    NEED_DATA,
    Event,
    MalformedFrame,
    NoResponseExpected,
    OrphanResponse,
    Request,
    RequestReceived,
    Response,
    ResponseReceived,
    Resync,
    Unanswered,
)
from decoder.fastclass import fast_constructor
from decoder.primitives import Malformed, read_uvarint
from decoder.receivebuffer import ReceiveBuffer

__all__ = ["DEFAULT_FRAME_LIMIT", "KafkaConnection", "looks_like_request"]

DEFAULT_FRAME_LIMIT = 100 << 20
DEFAULT_MAX_PENDING = 100_000

_I32 = struct.Struct(">i").unpack_from
_I16 = struct.Struct(">h").unpack_from
_REQUEST_HEAD = struct.Struct(">ihhi").unpack_from  # length, api key, api version, correlation id
_MIN_REQUEST = 8  # api key + version + correlation id
_MIN_RESPONSE = 4  # correlation id
_DECODE_ERRORS = (Malformed, struct.error, IndexError, ValueError, OverflowError)
_API_VERSIONS = 18
_Request = fast_constructor(Request)
_Response = fast_constructor(Response)
_RequestReceived = fast_constructor(RequestReceived)
_ResponseReceived = fast_constructor(ResponseReceived)
_ACKS0_REMEMBERED = 256

# Offsets where a request header may start: 8 <= length < 128 MiB, api key 0..127, version 0..127.
# A regex finds candidates at C speed; only those get the full Python check.
_REQUEST_CANDIDATE = re.compile(
    rb"(?=(?!\x00\x00\x00[\x00-\x07])[\x00-\x07][\x00-\xff]{3}\x00[\x00-\x7f]\x00[\x00-\x7f])", re.DOTALL
)
# Offsets where a response may start: length < 128 MiB and at least 4.
_RESPONSE_CANDIDATE = re.compile(rb"(?=(?!\x00\x00\x00[\x00-\x03])[\x00-\x07][\x00-\xff]{3})", re.DOTALL)


def _printable(text: str) -> bool:
    return text.isprintable()


def _skip_tagged_fields(buf: Any, pos: int, end: int) -> int:
    count, pos = read_uvarint(buf, pos)
    if count > end - pos:
        raise Malformed("header tagged field count exceeds the frame")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    if pos > end:
        raise Malformed("header tagged fields run past the frame")
    return pos


def _read_client_id(buf: Any, pos: int, end: int) -> tuple[str | None, int]:
    length = _I16(buf, pos)[0]
    pos += 2
    if length < 0:
        return None, pos
    if pos + length > end:
        raise Malformed("client id runs past the frame")
    return buf[pos : pos + length].decode("utf-8", "replace"), pos + length


def looks_like_request(buf: Any, pos: int, end: int, frame_limit: int = DEFAULT_FRAME_LIMIT) -> bool:
    """True if a plausible request header starts at ``buf[pos]`` (``end`` bounds what is there).

    Plausible: a length within the limit and long enough for the header, a known api key with
    a defined version, and a client id (where the header has one) that fits and is printable.
    """
    if end - pos < 12:
        return False
    size, api_key, api_version, _corr = _REQUEST_HEAD(buf, pos)
    if size < _MIN_REQUEST or size > frame_limit or not protocol.is_known(api_key, api_version):
        return False
    if protocol.request_header_version(api_key, api_version) == 0:
        return True
    if end - pos < 14 or size < 10:
        return False
    length = _I16(buf, pos + 12)[0]
    if length < -1 or length > size - 10:
        return False
    if length <= 0:
        return True
    text_end = min(pos + 14 + length, end)
    try:
        return bytes(buf[pos + 14 : text_end]).decode("utf-8").isprintable()
    except UnicodeDecodeError:
        return False


class _Direction:
    """Framing state of one direction."""

    __slots__ = ("frames", "gap_bytes", "hunt_reason", "hunt_skipped", "hunting", "rx", "skip", "total_bytes")

    def __init__(self, synced: bool) -> None:
        self.rx = ReceiveBuffer()
        self.hunting = not synced
        self.hunt_reason = "" if synced else "stream entered mid-way"
        self.hunt_skipped = 0
        self.skip = 0  # bytes still to come of a frame already reported truncated
        self.frames = 0
        self.total_bytes = 0
        self.gap_bytes = 0


class KafkaConnection:
    """Decodes both directions of one Kafka TCP connection into events.

    ``synced``: whether both streams start at a frame boundary (the connection's start was
    seen). ``frame_limit``: largest frame accepted; a longer length prefix counts as corrupt.
    ``max_pending``: requests awaiting a response kept at most (oldest evicted as unanswered).
    """

    def __init__(
        self,
        *,
        synced: bool = True,
        frame_limit: int = DEFAULT_FRAME_LIMIT,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.frame_limit = frame_limit
        self.max_pending = max_pending
        self._dirs = (_Direction(synced), _Direction(synced))
        self._pending: OrderedDict[int, tuple[int, Request]] = OrderedDict()
        self._seq = 0
        self._gap_covers_seq = 0
        # recent Produce acks=0 requests: some brokers (Tansu) answer them anyway
        self._acks0: OrderedDict[int, Request] = OrderedDict()
        self._events: deque[Event] = deque()
        self.resyncs = 0
        self.closed = False

    # ---- input -------------------------------------------------------------------------

    def receive_data(self, direction: int, data: bytes, ts_ns: int) -> None:
        """Bytes of ``direction`` (CLIENT_TO_BROKER or BROKER_TO_CLIENT) that arrived at ``ts_ns``."""
        if not data or self.closed:
            return
        state = self._dirs[direction]
        state.total_bytes += len(data)
        if state.skip:
            if len(data) <= state.skip:
                state.skip -= len(data)
                return
            data = data[state.skip :]
            state.skip = 0
        state.rx.append(data, ts_ns)
        self._drain(direction, state, ts_ns)

    def receive_gap(self, direction: int, nbytes: int, ts_ns: int) -> None:
        """``nbytes`` of ``direction`` are missing (the capture lost them)."""
        if nbytes <= 0 or self.closed:
            return
        state = self._dirs[direction]
        state.gap_bytes += nbytes
        if state.skip:
            if nbytes <= state.skip:
                state.skip -= nbytes
                return
            nbytes -= state.skip
            state.skip = 0
            self._start_hunting(state, f"gap of {nbytes} bytes")
            return
        rx = state.rx
        have = rx.available()
        if state.hunting:
            rx.clear()  # bytes before a gap cannot join bytes after it
            return
        if have >= 4:
            total = 4 + _I32(rx.buf, rx.pos)[0]
            self._truncated_frame(direction, state, total, ts_ns)
            rx.clear()
            if have + nbytes <= total:
                state.skip = total - have - nbytes  # still aligned: the frame's end is known
                return
        else:
            rx.clear()
        self._start_hunting(state, f"gap of {nbytes} bytes")
        if direction == BROKER_TO_CLIENT:
            # Responses to requests sent so far may be among the lost bytes: any of them that
            # turns out unanswered is reported as lost to the gap, not as ignored by the broker.
            self._gap_covers_seq = self._seq

    def receive_close(self, ts_ns: int, reason: str = "closed") -> None:
        """The connection ended (or the capture did): flush partial frames and pending requests."""
        if self.closed:
            return
        for direction, state in enumerate(self._dirs):
            rx = state.rx
            if not state.hunting and rx.available() >= 4:
                total = 4 + _I32(rx.buf, rx.pos)[0]
                self._truncated_frame(direction, state, total, ts_ns)
            elif state.hunting and rx.available():
                state.hunt_skipped += rx.available()
            rx.clear()
        self._expire_pending(reason, ts_ns)
        self.closed = True

    # ---- output ------------------------------------------------------------------------

    def next_event(self) -> Event | Any:
        """The next event, or ``NEED_DATA`` when everything fed so far has been reported."""
        return self._events.popleft() if self._events else NEED_DATA

    def events(self) -> list[Event]:
        """Every event ready now (drains the queue)."""
        out = list(self._events)
        self._events.clear()
        return out

    @property
    def pending_requests(self) -> int:
        return len(self._pending)

    def stats(self, direction: int) -> dict[str, int]:
        """Counters of one direction: bytes, frames, gap bytes, bytes skipped while hunting."""
        state = self._dirs[direction]
        return {
            "bytes": state.total_bytes,
            "frames": state.frames,
            "gap_bytes": state.gap_bytes,
            "skipped_bytes": state.hunt_skipped,
        }

    # ---- framing -----------------------------------------------------------------------

    def _start_hunting(self, state: _Direction, reason: str) -> None:
        if not state.hunting:
            state.hunting = True
            state.hunt_reason = reason
            state.hunt_skipped = 0

    def _drain(self, direction: int, state: _Direction, ts_ns: int) -> None:
        rx = state.rx
        buf = rx.buf
        limit = self.frame_limit
        minimum = _MIN_REQUEST if direction == CLIENT_TO_BROKER else _MIN_RESPONSE
        pos = rx.pos
        while len(buf) - pos >= 4:
            if state.hunting:
                rx.pos = pos
                if not self._hunt(direction, state, ts_ns):
                    return
                buf = rx.buf
                pos = rx.pos
                continue
            size = _I32(buf, pos)[0]
            if size < minimum or size > limit:
                self._events.append(
                    MalformedFrame(  # size 4: only the length prefix surely belongs to it
                        direction,
                        4,
                        rx.time_at(pos),
                        ts_ns,
                        f"implausible frame length {size}",
                    )
                )
                rx.pos = pos + 4
                self._start_hunting(state, f"implausible frame length {size}")
                state.hunt_skipped = 4
                pos += 4
                continue
            end = pos + 4 + size
            if end > len(buf):
                break
            state.frames += 1
            if direction == CLIENT_TO_BROKER:
                self._request_frame(buf, pos, end, rx.time_at(pos), ts_ns)
            else:
                self._response_frame(buf, pos, end, rx.time_at(pos), ts_ns)
            pos = end
        rx.consume_to(pos)

    def _hunt(self, direction: int, state: _Direction, ts_ns: int) -> bool:
        """Find the next plausible frame start; True once aligned (``rx.pos`` moved there)."""
        rx = state.rx
        buf = rx.buf
        start = rx.pos
        end = len(buf)
        found = -1
        need_more_at = -1
        if direction == CLIENT_TO_BROKER:
            for match in _REQUEST_CANDIDATE.finditer(buf, start):
                at = match.start()
                if end - at < 14:
                    need_more_at = at
                    break
                if looks_like_request(buf, at, end, self.frame_limit):
                    found = at
                    break
        else:
            for match in _RESPONSE_CANDIDATE.finditer(buf, start):
                at = match.start()
                if end - at < 8:
                    need_more_at = at
                    break
                verdict = self._plausible_response(buf, at, end)
                if verdict is None:
                    need_more_at = at
                    break
                if verdict:
                    found = at
                    break
        if found < 0:
            keep_from = need_more_at if need_more_at >= 0 else max(start, end - 13)
            state.hunt_skipped += keep_from - start
            rx.consume_to(keep_from)
            return False
        state.hunt_skipped += found - start
        rx.consume_to(found)
        state.hunting = False
        self.resyncs += 1
        self._events.append(Resync(direction, ts_ns, state.hunt_skipped, state.hunt_reason))
        state.hunt_skipped = 0
        return True

    def _plausible_response(self, buf: Any, at: int, end: int) -> bool | None:
        """Is ``at`` a response start? None: cannot tell until more bytes arrive."""
        size = _I32(buf, at)[0]
        if size < _MIN_RESPONSE or size > self.frame_limit:
            return False
        corr = _I32(buf, at + 4)[0]
        if self._pending or self._acks0:  # some brokers (Tansu) answer acks=0 Produce too
            return corr in self._pending or corr in self._acks0
        # Nothing pending to match against: require the whole frame and a plausible next one.
        frame_end = at + 4 + size
        if frame_end > end:
            return None if size <= (1 << 20) else False
        if frame_end == end:
            return True
        if end - frame_end < 4:
            return None
        next_size = _I32(buf, frame_end)[0]
        return _MIN_RESPONSE <= next_size <= self.frame_limit

    # ---- frames ------------------------------------------------------------------------

    def _request_frame(self, buf: Any, pos: int, end: int, start_ns: int, end_ns: int) -> None:
        _size, api_key, api_version, corr = _REQUEST_HEAD(buf, pos)
        header_version, decoder = protocol.request_plan(api_key, api_version)
        client_id = None
        fields = None
        error = None
        status = "ok"
        try:
            body = pos + 12
            if header_version >= 1:
                client_id, body = _read_client_id(buf, body, end)
            if header_version >= 2 and decoder is not None:
                body = _skip_tagged_fields(buf, body, end)
            if decoder is None:
                status = "unknown_api"
                name = protocol.api_name(api_key)
                error = f"no definition for {name} v{api_version}" if name else f"unknown api key {api_key}"
            else:
                fields, stop = decoder(buf, body, end)
                if stop > end:
                    raise Malformed(f"body runs {stop - end} bytes past the frame")
                if stop < end:
                    error = f"{end - stop} trailing bytes after the body"
        except _DECODE_ERRORS as exc:
            status, fields, error = "malformed", None, str(exc) or type(exc).__name__
        request = _Request(
            api_key,
            api_version,
            header_version,
            corr,
            client_id,
            end - pos,
            start_ns,
            end_ns,
            status,
            fields,
            error,
        )
        request.__class__ = Request
        self._add_request(request, end_ns)

    def _add_request(self, request: Request, ts_ns: int) -> None:
        received = _RequestReceived(request)
        received.__class__ = RequestReceived
        self._events.append(received)
        if not request.expects_response:
            self._events.append(NoResponseExpected(request))
            self._acks0[request.correlation_id] = request
            if len(self._acks0) > _ACKS0_REMEMBERED:
                self._acks0.popitem(last=False)
            return
        pending = self._pending
        old = pending.pop(request.correlation_id, None)
        if old is not None:
            self._events.append(Unanswered(old[1], "correlation_id_reused", ts_ns))
        self._seq += 1
        pending[request.correlation_id] = (self._seq, request)
        if len(pending) > self.max_pending:
            _corr, (_seq, oldest) = pending.popitem(last=False)
            self._events.append(Unanswered(oldest, "evicted", ts_ns))

    def _response_frame(self, buf: Any, pos: int, end: int, start_ns: int, end_ns: int) -> None:
        corr = _I32(buf, pos + 4)[0]
        entry = self._pending.pop(corr, None)
        if entry is None:
            answered = self._acks0.pop(corr, None)
            if answered is not None:  # decodable: we know what it answers
                response = self._decode_response(answered, buf, pos, end, start_ns, end_ns)
                self._events.append(OrphanResponse(response, answered))
            else:
                self._events.append(
                    OrphanResponse(Response(corr, -1, end - pos, start_ns, end_ns, "ok", None, None))
                )
            return
        seq, request = entry
        if seq != self._oldest_seq():
            self._expire_older(seq, end_ns)
        response = self._decode_response(request, buf, pos, end, start_ns, end_ns)
        received = _ResponseReceived(request, response)
        received.__class__ = ResponseReceived
        self._events.append(received)

    def _decode_response(
        self, request: Request, buf: Any, pos: int, end: int, start_ns: int, end_ns: int
    ) -> Response:
        api_key = request.api_key
        versions = [request.api_version]
        if api_key == _API_VERSIONS and request.api_version != 0:
            versions.append(0)  # an unsupported ApiVersions version is answered in v0 format
        error = "no definition for this response"
        for version in versions:
            header_version = protocol.response_header_version(api_key, version)
            decoder = protocol.response_decoder(api_key, version)
            if decoder is None:
                continue
            try:
                body = pos + 8
                if header_version >= 1:
                    body = _skip_tagged_fields(buf, body, end)
                fields, stop = decoder(buf, body, end)
                if stop > end:
                    raise Malformed(f"body runs {stop - end} bytes past the frame")
            except _DECODE_ERRORS as exc:
                error = str(exc) or type(exc).__name__
                continue
            note = f"{end - stop} trailing bytes after the body" if stop < end else None
            response = _Response(
                request.correlation_id,
                header_version,
                end - pos,
                start_ns,
                end_ns,
                "ok",
                fields,
                note,
                version,
            )
            response.__class__ = Response
            return response
        known = protocol.response_decoder(api_key, request.api_version) is not None
        status = "malformed" if known and request.status != "unknown_api" else "unknown_api"
        return Response(request.correlation_id, -1, end - pos, start_ns, end_ns, status, None, error)

    def _truncated_frame(self, direction: int, state: _Direction, total: int, ts_ns: int) -> None:
        """Report the frame in progress as truncated, with whatever header it had."""
        rx = state.rx
        buf, pos, have = rx.buf, rx.pos, rx.available()
        start_ns = rx.time_at(pos)
        state.frames += 1
        missing = f"{total - have} of {total} bytes missing"
        if direction == CLIENT_TO_BROKER and have >= 12:
            _size, api_key, api_version, corr = _REQUEST_HEAD(buf, pos)
            header_version = protocol.request_header_version(api_key, api_version)
            client_id = None
            if header_version >= 1:
                try:
                    client_id, _ = _read_client_id(buf, pos + 12, pos + have)
                except _DECODE_ERRORS:
                    client_id = None
            request = Request(
                api_key,
                api_version,
                header_version,
                corr,
                client_id,
                total,
                start_ns,
                ts_ns,
                "truncated",
                None,
                missing,
            )
            self._add_request(request, ts_ns)
        elif direction == BROKER_TO_CLIENT and have >= 8:
            corr = _I32(buf, pos + 4)[0]
            response = Response(corr, -1, total, start_ns, ts_ns, "truncated", None, missing)
            entry = self._pending.pop(corr, None)
            if entry is None:
                self._events.append(OrphanResponse(response))
            else:
                self._expire_older(entry[0], ts_ns)
                self._events.append(ResponseReceived(entry[1], response))
        else:
            self._events.append(
                MalformedFrame(direction, total, start_ns, ts_ns, f"truncated after {have} of {total} bytes")
            )

    # ---- pending requests --------------------------------------------------------------

    def _oldest_seq(self) -> int:
        """Sequence number of the oldest pending request (0 when none): the usual next answer."""
        pending = self._pending
        return pending[next(iter(pending))][0] if pending else 0

    def _expire_older(self, seq: int, ts_ns: int) -> None:
        """Requests sent before the one just answered will never be answered."""
        pending = self._pending
        while pending:
            corr = next(iter(pending))
            older_seq, request = pending[corr]
            if older_seq > seq:
                break
            del pending[corr]
            reason = "gap" if older_seq <= self._gap_covers_seq else "later_response"
            self._events.append(Unanswered(request, reason, ts_ns))

    def _expire_pending(self, reason: str, ts_ns: int) -> None:
        for seq, request in self._pending.values():
            why = "gap" if seq <= self._gap_covers_seq else reason
            self._events.append(Unanswered(request, why, ts_ns))
        self._pending.clear()
