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
frame starts and resumes there, emitting ``Resync``. A header that merely looks right turns up
by chance inside other frames' bodies, so a candidate is accepted only once its whole frame is
buffered and checks out: a request must decode cleanly (known api key and version, sane client
id, the body fills the frame); a response must carry the correlation id of a pending request
and decode as that request's answer (with nothing pending: a complete frame followed by one
with a later correlation id; right after a gap: an aligned frame followed by a checked
response, reported as an orphan). The frame boundary after it must look plausible too, or be
the end of the data so far. A candidate whose frame is still incomplete is remembered while
later offsets are tried; a frame longer than ``HUNT_WAIT`` bytes is trusted on its header once
that many bytes of it are in, so a hunting direction holds at most a few times ``HUNT_WAIT``
bytes. Hunting never emits a frame it has not checked, so garbage is never decoded.

SASL tokens sent outside Kafka framing (``decoder.sasl``: after SaslHandshake v0, or a Kafka 0.9
GSSAPI client's first frame, ``0x60``, on a connection whose start was seen) are credentials: such
a frame is cut by its length and counted, never read. A direction in that state takes any length
from 0 up (an empty token is common), never decodes, never hunts inside a token, and the exchange
ends in one ``SaslExchange`` event with counts only. A gap inside it ends it for that direction:
the hunt that follows accepts only frames that check out as Kafka.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections import OrderedDict, deque
from typing import Any

from decoder import protocol
from decoder.compiled import load
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
    SaslExchange,
    Unanswered,
)
from decoder.fastclass import fast_constructor
from decoder.primitives import Malformed, skip_tagged_fields
from decoder.receivebuffer import ReceiveBuffer
from decoder.sasl import GSSAPI_TOKEN_TAG, HANDSHAKE, RawExchange, starts_raw_exchange
from decoder.skeleton import frame_head, frame_skeleton, has_records

__all__ = ["DEFAULT_FRAME_LIMIT", "HUNT_WAIT", "KafkaConnection", "decodes_as_request", "looks_like_request"]

DEFAULT_FRAME_LIMIT = 100 << 20
DEFAULT_MAX_PENDING = 100_000
#: While hunting, bytes of a candidate frame awaited before deciding on its header alone (and so
#: about the most a hunting direction buffers).
HUNT_WAIT = 1 << 20
#: Bytes of a large frame cut by the end of the connection kept to report it (not all of it).
_CLOSE_HEAD = 64 << 10

_I32 = struct.Struct(">i").unpack_from
_I16 = struct.Struct(">h").unpack_from
_REQUEST_HEAD = struct.Struct(">ihhi").unpack_from  # length, api key, api version, correlation id
_RESPONSE_HEAD = struct.Struct(">ii").unpack_from  # length, correlation id
_MIN_REQUEST = 8  # api key + version + correlation id
_MIN_RESPONSE = 4  # correlation id
_DECODE_ERRORS = (Malformed, struct.error, IndexError, ValueError, OverflowError)
_API_VERSIONS = 18
_Request = fast_constructor(Request)
_Response = fast_constructor(Response)
_RequestReceived = fast_constructor(RequestReceived)
_ResponseReceived = fast_constructor(ResponseReceived)
_ACKS0_REMEMBERED = 256
_PADDING = bytes(64)  # zeros after a malformed frame decoded again (see ``_padded``)
_HUNT_WAITING_MAX = 64  # incomplete candidates remembered at once while hunting
_SKELETON_MIN = 64 << 10  # held frames at least this long are decoded from their skeleton when they can be
_CORR_STEP = 1 << 16  # most a connection's correlation ids advance from one response to the next

# Hunt verdicts on one candidate offset.
_REJECT = 0  # not a frame start
_ACCEPT = 1  # a frame start: resume framing here
_WAIT = 2  # cannot tell before more bytes arrive; later offsets may still be tried
_BLOCK = 3  # cannot tell before more bytes arrive; try nothing later meanwhile

# Offsets where a request header may start: 8 <= length < 128 MiB, api key 0..127, version 0..127.
# A regex finds candidates at C speed; only those get the full Python check.
_REQUEST_CANDIDATE = re.compile(
    rb"(?=(?!\x00\x00\x00[\x00-\x07])[\x00-\x07][\x00-\xff]{3}\x00[\x00-\x7f]\x00[\x00-\x7f])", re.DOTALL
)
# Offsets where a response may start: length < 128 MiB and at least 4.
_RESPONSE_CANDIDATE = re.compile(rb"(?=(?!\x00\x00\x00[\x00-\x03])[\x00-\x07][\x00-\xff]{3})", re.DOTALL)


# The common case of _parse_request and _parse_response, and of _frame_chunk's loop, compiled
# (decoder/_framecore.c: why, and how it leaves every doubtful frame to the Python below);
# KWIRE_PURE_PYTHON=1 leaves it out.
_framecore = load("_framecore", "compiled frame headers")
if _framecore is not None:
    _framecore.configure(Request, Response, RequestReceived, ResponseReceived, protocol)
    _compiled_request = _framecore.parse_request
    _compiled_response = _framecore.parse_response
    _compiled_frames = _framecore.run_frames
else:
    _compiled_request = _compiled_response = _compiled_frames = None


def _padded(buf: Any, pos: int, end: int) -> bytes:
    """The frame ``buf[pos:end]`` alone, then zeros: a malformed body is decoded again from this,
    so its error reads the same whatever bytes happened to follow it in the buffer."""
    return bytes(buf[pos:end]) + _PADDING


def _printable(text: str) -> bool:
    return text.isprintable()


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


_NO, _CLEAN, _TRAILING = 0, 1, 2  # how a frame decodes


def _request_decodes(buf: Any, pos: int, end: int) -> int:
    """How the request frame ``buf[pos:end]`` decodes: ``_CLEAN`` (a known body that fills it
    exactly), ``_TRAILING`` (a known body, then a few bytes it does not explain, from a client
    that names itself) or ``_NO``."""
    _size, api_key, api_version, _corr = _REQUEST_HEAD(buf, pos)
    header_version, decoder = protocol.request_plan(api_key, api_version)
    if decoder is None:
        return _NO
    client_id = None
    try:
        body = pos + 12
        if header_version >= 1:
            client_id, body = _read_client_id(buf, body, end)
        if header_version >= 2:
            body = skip_tagged_fields(buf, body, end)
        _fields, stop = decoder(buf, body, end)
    except _DECODE_ERRORS:
        return _NO
    if stop == end:
        return _CLEAN
    return _TRAILING if stop < end and client_id and (end - stop) * 4 <= end - pos else _NO


def decodes_as_request(buf: Any, pos: int, end: int) -> bool:
    """True if ``buf[pos:end]`` is a whole request frame whose body decodes (known api and
    version, the body fills the frame, or nearly so from a client that names itself)."""
    try:
        return _request_decodes(buf, pos, end) != _NO
    except _DECODE_ERRORS:
        return False


class _Direction:
    """Framing state of one direction."""

    __slots__ = (
        "frames",
        "gap_bytes",
        "hunt_after_gap",
        "hunt_reason",
        "hunt_scan",
        "hunt_skipped",
        "hunt_waiting",
        "hunting",
        "kafka_minimum",
        "minimum",
        "raw",
        "rx",
        "skip",
        "total_bytes",
    )

    def __init__(self, synced: bool, minimum: int) -> None:
        self.rx = ReceiveBuffer()
        # Smallest plausible frame length: a Kafka header's, or 0 while frames are SASL tokens (``raw``).
        self.kafka_minimum = self.minimum = minimum
        self.raw = False
        self.hunting = not synced
        self.hunt_reason = "" if synced else "stream entered mid-way"
        self.hunt_skipped = 0
        # While hunting (stream offsets, i.e. ``rx.base`` + index): where scanning for new
        # candidates resumes, the candidates waiting for their frame's bytes as (offset, offset
        # by which they can be decided), and the first offset after a gap (-1: none).
        self.hunt_scan = 0
        self.hunt_waiting: list[tuple[int, int]] = []
        self.hunt_after_gap = -1
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
        self._dirs = (_Direction(synced, _MIN_REQUEST), _Direction(synced, _MIN_RESPONSE))
        self._pending: OrderedDict[int, tuple[int, Request]] = OrderedDict()
        self._seq = 0
        self._gap_covers_seq = 0
        # recent Produce acks=0 requests: some brokers (Tansu) answer them anyway
        self._acks0: OrderedDict[int, Request] = OrderedDict()
        self._events: deque[Event] = deque()
        self.resyncs = 0
        self.closed = False
        self._closing = False  # receive_close is deciding what the last bytes were
        self._hunt_behind = False  # the hunt checks a candidate behind one still waiting for bytes
        self._sasl: RawExchange | None = None  # an unframed SASL token exchange under way
        self._sasl_end = "complete"  # how it ended, when not by its own course
        self._fresh = synced  # no client frame yet on a connection whose start was seen
        # client frames need a look before decoding: fresh, or inside a SASL exchange
        self._watch_client = synced

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
        rx = state.rx
        if state.hunting or rx.pos < len(rx.buf):
            rx.append(data, ts_ns)
            self._drain_and_park(direction, state, ts_ns)
            return
        self._frame_chunk(direction, state, data if type(data) is bytes else bytes(data), ts_ns)

    def receive_gap(self, direction: int, nbytes: int, ts_ns: int) -> None:
        """``nbytes`` of ``direction`` are missing (the capture lost them)."""
        if nbytes <= 0 or self.closed:
            return
        state = self._dirs[direction]
        state.rx.spill()
        state.gap_bytes += nbytes
        if direction == BROKER_TO_CLIENT:
            # Responses to requests sent so far may be among the lost bytes: any of them that
            # turns out unanswered is reported as lost to the gap, not as ignored by the broker.
            self._gap_covers_seq = self._seq
        if state.skip:
            if nbytes <= state.skip:
                state.skip -= nbytes
                return
            nbytes -= state.skip
            state.skip = 0
            self._start_hunting(state, f"gap of {nbytes} bytes")
            self._hunt_after_gap(state)
            return
        rx = state.rx
        have = rx.available()
        if state.hunting:
            rx.clear()  # bytes before a gap cannot join bytes after it
            self._hunt_after_gap(state)
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
        self._hunt_after_gap(state)

    def receive_skeleton(self, direction: int, frame: bytes, size: int, start_ns: int, end_ns: int) -> bool:
        """A whole frame of ``size`` bytes of ``direction``, given as its skeleton (``frame``:
        ``decoder.skeleton``, record payloads left out), its first byte seen at ``start_ns`` and
        its last at ``end_ns``. Rows are as if the frame itself had been fed. Where this
        direction is not at a frame boundary (bytes were lost before it, a SASL token is read
        raw), the frame is a gap of ``size`` bytes: False then."""
        if size <= 0 or self.closed:
            return True
        state = self._dirs[direction]
        rx = state.rx
        if state.skip or state.hunting or state.raw or rx.held or rx.pos < len(rx.buf):
            self.receive_gap(direction, size, end_ns)
            return False
        state.total_bytes += size
        state.frames += 1
        rx.base += size
        if not self._decode_skeleton(direction, frame, size, start_ns, end_ns):
            # not clean: the skeleton as it is (its own size), as a frame that does not decode
            if direction == CLIENT_TO_BROKER:
                self._request_frame(frame, 0, len(frame), start_ns, end_ns)
            else:
                self._response_frame(frame, 0, len(frame), start_ns, end_ns)
        return True

    def buffered(self, direction: int) -> int:
        """Bytes of ``direction`` held until more arrive (a frame in progress, a hunt's window)."""
        rx = self._dirs[direction].rx
        return rx.held + len(rx.buf) - rx.pos

    def abandon_frame(self, direction: int, ts_ns: int) -> int:
        """Let go of the frame in progress of ``direction`` (too large to hold): it is reported
        truncated, as if its remaining bytes were lost in a gap, and those bytes are skipped
        when they come, so the direction stays aligned. How many bytes will be skipped; 0 when
        no frame of known size is held."""
        state = self._dirs[direction]
        rx = state.rx
        if self.closed or not rx.held or not rx.need or state.hunting:
            return 0
        left = rx.need - rx.held
        total = rx.need
        held = rx.spill_head(_CLOSE_HEAD)
        state.gap_bytes += left
        self._truncated_frame(direction, state, total, ts_ns)
        rx.clear()
        rx.base += held - min(held, _CLOSE_HEAD)  # the stream offset past what was held
        state.skip += left
        if direction == BROKER_TO_CLIENT:
            self._gap_covers_seq = self._seq
        return left

    def receive_close(self, ts_ns: int, reason: str = "closed") -> None:
        """The connection ended (or the capture did): flush partial frames and pending requests."""
        if self.closed:
            return
        # A hunting direction may hold checked frames that waited only for the bytes after them.
        self._closing = True
        held_big = [0, 0]
        for direction, state in enumerate(self._dirs):
            rx = state.rx
            if rx.need and rx.held > _CLOSE_HEAD and not state.hunting and not state.raw:
                # a large frame cut by the end: only its head is needed to report it (no copy)
                held_big[direction] = rx.spill_head(_CLOSE_HEAD)
            else:
                rx.spill()
        for direction, state in enumerate(self._dirs):
            if state.hunting and state.rx.available() >= 4:
                self._drain(direction, state, ts_ns)
        for direction, state in enumerate(self._dirs):
            rx = state.rx
            if not state.hunting and rx.available() >= 4:
                total = 4 + _I32(rx.buf, rx.pos)[0]
                self._truncated_frame(direction, state, total, ts_ns, held_big[direction] or None)
            elif state.hunting and rx.available():
                state.hunt_skipped += rx.available()
            rx.clear()
        if self._sasl is not None:
            self._end_sasl("closed" if self._sasl_end == "complete" else self._sasl_end)
        answers = self._dirs[BROKER_TO_CLIENT]
        if answers.hunting and answers.hunt_reason.startswith("gap"):
            # still looking for a frame after a gap: the answers may be in what it skipped
            self._gap_covers_seq = self._seq
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
        if state.raw:  # alignment lost inside a SASL exchange: this side of it is over
            sasl = self._sasl
            assert sasl is not None
            if state is self._dirs[CLIENT_TO_BROKER]:
                sasl.client_ended()
            else:
                sasl.server_ended()
            self._sasl_end = "gap"
            self._sasl_sync()
        if not state.hunting:
            state.hunting = True
            state.hunt_reason = reason
            state.hunt_skipped = 0
            state.hunt_scan = 0
            state.hunt_waiting = []
            state.hunt_after_gap = -1

    @staticmethod
    def _hunt_after_gap(state: _Direction) -> None:
        """A hunting direction lost bytes: nothing buffered is kept, the next byte follows a gap."""
        rx = state.rx
        state.hunt_after_gap = state.hunt_scan = rx.base + len(rx.buf)
        state.hunt_waiting = []

    def _frame_chunk(self, direction: int, state: _Direction, data: bytes, ts_ns: int) -> None:
        """Frame a chunk of a direction in step with the framing, ``rx.buf`` holding nothing.

        Frames wholly inside the chunk are decoded where they lie; the frame running past its
        end is held (``ReceiveBuffer.hold``) and decoded once complete. Anything unusual (an
        implausible length) goes to ``_drain`` with the bytes in ``rx.buf``, as they always did.
        """
        rx = state.rx
        p = self._continue_frame(direction, state, data, ts_ns) if rx.held else 0
        if p < 0:
            return
        n = len(data)
        start = p
        limit = self.frame_limit
        decode = self._request_frame if direction == CLIENT_TO_BROKER else self._response_frame
        run = _compiled_frames
        size = 0
        while n - p >= 4:
            if run is not None:  # the plain frames from p on; then this loop takes the one after them
                p = run(self, state, direction, data, p, ts_ns)
                if n - p < 4:
                    break
            size = _I32(data, p)[0]
            if size < state.minimum or size > limit:  # (a decoded frame may change the minimum)
                rx.base += p - start
                rx.append(memoryview(data)[p:], ts_ns)
                self._drain_and_park(direction, state, ts_ns)
                return
            end = p + 4 + size
            if end > n:
                break
            state.frames += 1
            decode(data, p, end, ts_ns, ts_ns)
            p = end
        rx.base += p - start
        if p < n:
            rx.frame_ns = ts_ns
            rx.hold(data if p == 0 else memoryview(data)[p:])
            rx.need = 4 + size if n - p >= 4 else 0

    def _continue_frame(self, direction: int, state: _Direction, data: bytes, ts_ns: int) -> int:
        """Feed the held frame from the start of ``data``: how many bytes of it were used, or -1
        when the chunk was handed to ``_drain`` (the held frame's length is implausible)."""
        rx = state.rx
        n = len(data)
        p = 0
        if not rx.need:
            if rx.held < 4:
                p = min(4 - rx.held, n)
                rx.hold(data[:p])
                if rx.held < 4:
                    return p
            parts = rx.parts
            size = _I32(parts[0] if len(parts[0]) >= 4 else b"".join(parts), 0)[0]
            if size < state.minimum or size > self.frame_limit:
                rx.spill()
                if p < n:
                    rx.append(memoryview(data)[p:], ts_ns)
                self._drain_and_park(direction, state, ts_ns)
                return -1
            rx.need = 4 + size
        take = min(rx.need - rx.held, n - p)
        if take:
            rx.hold(data if take == n else memoryview(data)[p : p + take])
            p += take
        if rx.held == rx.need:
            start_ns = rx.frame_ns
            state.frames += 1
            if (
                len(rx.parts) > 1
                and rx.held >= _SKELETON_MIN
                and not state.raw
                and self._skeleton_frame(direction, rx.parts, start_ns, ts_ns)
            ):
                rx.drop_frame()
                return p
            frame = rx.take_frame()
            if direction == CLIENT_TO_BROKER:
                self._request_frame(frame, 0, len(frame), start_ns, ts_ns)
            else:
                self._response_frame(frame, 0, len(frame), start_ns, ts_ns)
        return p

    def _skeleton_frame(self, direction: int, parts: list[Any], start_ns: int, end_ns: int) -> bool:
        """Decode a frame held in pieces from its skeleton (``decoder.skeleton``): True when done.

        False (nothing noted yet) when the frame's api has no records, the walk fails, or the
        skeleton does not decode cleanly: the caller then joins the frame and decodes that.
        """
        head = frame_head(parts)
        try:
            api = self._frame_api(direction, head)
        except _DECODE_ERRORS:
            return False
        if api is None:
            return False
        name = "request" if direction == CLIENT_TO_BROKER else "response"
        if not has_records(name, *api):
            return False
        frame = frame_skeleton(parts, name, *api, head=head)
        if frame is None:
            return False
        return self._decode_skeleton(direction, frame, sum(len(part) for part in parts), start_ns, end_ns)

    def _answered_by(self, corr: int) -> Any:
        """The pending (or acks=0) request with correlation id ``corr``, None when there is none."""
        entry = self._pending.get(corr)
        return entry[1] if entry is not None else self._acks0.get(corr)

    def _frame_api(self, direction: int, head: Any) -> tuple[int, int] | None:
        """(api key, version) of the frame starting with ``head``: a request's own, a response's
        request's (None when no request awaits it)."""
        if direction == CLIENT_TO_BROKER:
            _size, api_key, api_version, _corr = _REQUEST_HEAD(head, 0)
            return api_key, api_version
        corr = _I32(head, 4)[0]
        request = self._answered_by(corr)
        return None if request is None else (request.api_key, request.api_version)

    def _decode_skeleton(self, direction: int, frame: bytes, size: int, start_ns: int, end_ns: int) -> bool:
        """Note the frame of ``size`` bytes whose skeleton is ``frame``: True when it decoded
        cleanly (False, nothing noted, otherwise)."""
        end = len(frame)
        if direction == CLIENT_TO_BROKER:
            if self._fresh:  # (a first frame starting 0x60 has no records: never here)
                self._fresh = False
                self._watch_client = self._sasl is not None
            parsed = self._parse_request(frame, 0, end, start_ns, end_ns)
            if parsed.status != "ok" or parsed.decode_error is not None:
                return False
            self._add_request(dataclasses.replace(parsed, size=size), end_ns)
            return True
        corr = _I32(frame, 4)[0]
        request = self._answered_by(corr)
        if request is None:
            return False
        response = self._decode_response(request, frame, 0, end, start_ns, end_ns)
        if response.status != "ok" or response.decode_error is not None:
            return False
        self._response_frame(
            frame, 0, end, start_ns, end_ns, decoded=dataclasses.replace(response, size=size)
        )
        return True

    def _drain_and_park(self, direction: int, state: _Direction, ts_ns: int) -> None:
        """``_drain`` what ``rx.buf`` holds; once in step again, hold the frame left in progress."""
        self._drain(direction, state, ts_ns)
        rx = state.rx
        if not state.hunting and rx.pos < len(rx.buf):
            rx.park()

    def _drain(self, direction: int, state: _Direction, ts_ns: int) -> None:
        rx = state.rx
        buf = rx.buf
        limit = self.frame_limit
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
            if size < state.minimum or size > limit:
                # inside a SASL exchange the number may be token bytes: not told
                why = "implausible SASL token length" if state.raw else f"implausible frame length {size}"
                self._events.append(
                    MalformedFrame(  # size 4: only the length prefix surely belongs to it
                        direction,
                        4,
                        rx.time_at(pos),
                        ts_ns,
                        why,
                    )
                )
                rx.pos = pos + 4
                self._start_hunting(state, why)
                state.hunt_skipped = 4
                pos += 4
                continue
            end = pos + 4 + size
            if end > len(buf):
                break
            state.frames += 1
            # times of the frame's first and last bytes (a hunt may have held it past its arrival)
            start_ns = rx.time_at(pos)
            end_ns = rx.time_at(end - 1)
            if direction == CLIENT_TO_BROKER:
                self._request_frame(buf, pos, end, start_ns, end_ns)
            else:
                self._response_frame(buf, pos, end, start_ns, end_ns)
            pos = end
        rx.consume_to(pos)

    def _hunt(self, direction: int, state: _Direction, ts_ns: int) -> bool:
        """Find the next checked frame start; True once aligned (``rx.pos`` moved there).

        Candidates still waiting for bytes are decided first (oldest first), then new offsets are
        scanned. False: nothing yet; the bytes that may still hold a frame start are kept.
        """
        rx = state.rx
        buf = rx.buf
        base = rx.base
        start = rx.pos
        end = len(buf)
        request = direction == CLIENT_TO_BROKER
        check = self._plausible_request if request else self._plausible_response
        after_gap = state.hunt_after_gap - base
        found = -1
        waiting: list[tuple[int, int]] = []
        for at_abs, ready_abs in state.hunt_waiting:
            at = at_abs - base
            if base + end < ready_abs and not self._closing:
                waiting.append((at_abs, ready_abs))
                continue
            self._hunt_behind = bool(waiting)
            verdict, ready = check(buf, at, end, at == after_gap)
            if verdict == _ACCEPT:
                found = at
                break
            if verdict != _REJECT:
                waiting.append((at_abs, base + ready))
        stop = -1
        if found < 0:
            pattern = _REQUEST_CANDIDATE if request else _RESPONSE_CANDIDATE
            for match in pattern.finditer(buf, max(start, state.hunt_scan - base)):
                at = match.start()
                self._hunt_behind = bool(waiting)
                verdict, ready = check(buf, at, end, at == after_gap)
                if verdict == _ACCEPT:
                    found = at
                    break
                if verdict == _BLOCK or (verdict == _WAIT and len(waiting) >= _HUNT_WAITING_MAX):
                    stop = at
                    break
                if verdict == _WAIT:
                    waiting.append((base + at, base + ready))
        if found < 0:
            if stop < 0:  # every offset the pattern can test was tried
                stop = max(start, state.hunt_scan - base, end - (7 if request else 3))
            state.hunt_scan = base + stop
            state.hunt_waiting = waiting
            keep_from = min(stop, waiting[0][0] - base) if waiting else stop
            state.hunt_skipped += keep_from - start
            rx.consume_to(keep_from)
            return False
        state.hunt_skipped += found - start
        rx.consume_to(found)
        rx.compact()  # once per resync: the frame is decoded as if it had arrived on its own
        state.hunting = False
        state.hunt_waiting = []
        if direction == BROKER_TO_CLIENT and state.hunt_reason.startswith("gap"):
            # the hunt after a gap skipped responses too: their requests were lost to the gap
            self._gap_covers_seq = self._seq
        self.resyncs += 1
        self._events.append(Resync(direction, ts_ns, state.hunt_skipped, state.hunt_reason))
        state.hunt_skipped = 0
        return True

    def _at_data_end(self, at: int, need: int) -> tuple[int, int]:
        """Verdict on a frame that ends where the bytes so far end and whose body did not decode
        cleanly (trailing bytes, or not the layout): taken, unless an earlier candidate still
        waits for its bytes. This one may then be a chance match inside that one's frame (in a
        record batch), so the bytes after it decide: the earlier candidate, checked first, is
        taken if it checks out."""
        if self._hunt_behind and not self._closing:
            return _WAIT, at + need
        return _ACCEPT, 0

    def _plausible_request(self, buf: Any, at: int, end: int, _after_gap: bool) -> tuple[int, int]:
        """Hunt verdict on a request starting at ``buf[at]`` (and the index to wait for)."""
        if end - at < 14:
            return _BLOCK, at + 14
        if not looks_like_request(buf, at, end, self.frame_limit):
            return _REJECT, 0
        frame_end = at + 4 + _I32(buf, at)[0]
        if frame_end > end:
            if end - at >= HUNT_WAIT:  # long: no later frame checked out in this many bytes
                return _ACCEPT, 0
            return _WAIT, min(frame_end, at + HUNT_WAIT)
        decodes = _request_decodes(buf, at, frame_end)
        if decodes == _NO:
            return _REJECT, 0
        # Bytes the body does not explain: real clients send that (newer fields, padding), and so
        # do chance matches. Taken only if the next request decodes too (or the data ends here).
        return self._next_request(buf, frame_end, end, decodes == _TRAILING)

    def _next_request(self, buf: Any, at: int, end: int, whole: bool = False) -> tuple[int, int]:
        """Is ``at``, just after a checked request, plausibly where the next one starts?

        ``whole``: only if that one decodes as well (once it is all there)."""
        have = end - at
        if have == 0:
            return self._at_data_end(at, 14) if whole else (_ACCEPT, 0)
        if have < 4:
            return (_ACCEPT, 0) if self._closing else (_WAIT, at + 4)
        size = _I32(buf, at)[0]
        if size < _MIN_REQUEST or size > self.frame_limit:
            return _REJECT, 0
        need = min(HUNT_WAIT, 4 + size) if whole else min(14, 4 + size)
        if have < need:
            return (_ACCEPT, 0) if self._closing else (_WAIT, at + need)
        if not looks_like_request(buf, at, end, self.frame_limit):
            return _REJECT, 0
        if whole and at + 4 + size <= end and _request_decodes(buf, at, at + 4 + size) == _NO:
            return _REJECT, 0
        return _ACCEPT, 0

    def _plausible_response(self, buf: Any, at: int, end: int, after_gap: bool) -> tuple[int, int]:
        """Hunt verdict on a response starting at ``buf[at]`` (and the index to wait for).

        With requests pending, the correlation id must be one of theirs and the body must decode
        as that request's answer, except right after a gap, where an aligned frame whose request
        was lost too is taken (as an orphan) when a checked response follows it. With nothing to
        match against, a complete frame is taken when the data ends with it or the next header
        has a plausible length and a later correlation id; offsets are then tried strictly in
        order (``_BLOCK``), as nothing stronger could overrule a later match.
        """
        if end - at < 8:
            return _BLOCK, at + 8
        size, corr = _RESPONSE_HEAD(buf, at)
        if size < _MIN_RESPONSE or size > self.frame_limit:
            return _REJECT, 0
        frame_end = at + 4 + size
        if self._pending or self._acks0:  # some brokers (Tansu) answer acks=0 Produce too
            verdict, ready = self._matched_response(buf, at, end, corr, frame_end)
            if verdict != _REJECT or not after_gap:
                return verdict, ready
            if frame_end > end:  # right after a gap: maybe a response whose request was lost
                return (_WAIT, frame_end) if size <= HUNT_WAIT else (_REJECT, 0)
            have = end - frame_end
            if have < 8:  # wait for the next response (at the end: take it)
                return (_ACCEPT, 0) if self._closing else (_WAIT, frame_end + 8)
            next_size, next_corr = _RESPONSE_HEAD(buf, frame_end)
            if not _MIN_RESPONSE <= next_size <= self.frame_limit:
                return _REJECT, 0
            verdict, ready = self._matched_response(buf, frame_end, end, next_corr, frame_end + 4 + next_size)
            return (
                (_ACCEPT, 0)
                if verdict == _ACCEPT or (verdict == _WAIT and self._closing)
                else (verdict, ready)
            )
        # Nothing pending to match against: require the whole frame, then the end of the data or
        # a next header with a plausible length and a later correlation id (a broker answers a
        # connection's requests in order, and clients number them upwards).
        if frame_end > end:
            return (_BLOCK, frame_end) if size <= HUNT_WAIT else (_REJECT, 0)
        have = end - frame_end
        if have == 0 or (have < 8 and self._closing):
            return _ACCEPT, 0
        if have < 8:
            return _BLOCK, frame_end + 8
        next_size, next_corr = _RESPONSE_HEAD(buf, frame_end)
        if _MIN_RESPONSE <= next_size <= self.frame_limit and 0 < next_corr - corr <= _CORR_STEP:
            return _ACCEPT, 0
        return _REJECT, 0

    def _matched_response(self, buf: Any, at: int, end: int, corr: int, frame_end: int) -> tuple[int, int]:
        """Hunt verdict on a response to a pending (or acks=0) request, by decoding it as one."""
        request = self._answered_by(corr)
        if request is None:
            return _REJECT, 0
        if frame_end > end:
            if end - at >= HUNT_WAIT:  # long: its header is all there is to go by
                return _ACCEPT, 0
            return _WAIT, min(frame_end, at + HUNT_WAIT)
        response = self._decode_response(request, buf, at, frame_end, 0, 0)
        if response.status == "unknown_api" or (response.status == "ok" and response.decode_error is None):
            return self._next_response(buf, frame_end, end)
        # A body that does not fit the layout: some brokers' real answers do that, and so do chance
        # matches. Taken only if the next header also names a pending request (or the data ends).
        return self._next_response(buf, frame_end, end, matched=True)

    def _next_response(self, buf: Any, at: int, end: int, matched: bool = False) -> tuple[int, int]:
        """Is ``at``, just after a checked response, plausibly where the next one starts?

        ``matched``: only if that one answers a pending (or acks=0) request too."""
        have = end - at
        if have == 0:
            return self._at_data_end(at, 8) if matched else (_ACCEPT, 0)
        if have < (8 if matched else 4):
            return (_ACCEPT, 0) if self._closing else (_WAIT, at + (8 if matched else 4))
        size = _I32(buf, at)[0]
        if not _MIN_RESPONSE <= size <= self.frame_limit:
            return _REJECT, 0
        if matched:
            corr = _I32(buf, at + 4)[0]
            if corr not in self._pending and corr not in self._acks0:
                return _REJECT, 0
        return _ACCEPT, 0

    # ---- frames ------------------------------------------------------------------------

    def _request_frame(self, buf: Any, pos: int, end: int, start_ns: int, end_ns: int) -> None:
        """Decode the request frame ``buf[pos:end]`` and note it."""
        if self._watch_client and self._sasl_client_frame(buf, pos, end, start_ns, end_ns):
            return
        request = self._parse_request(buf, pos, end, start_ns, end_ns)
        if request.status == "malformed":
            request = self._parse_request(_padded(buf, pos, end), 0, end - pos, start_ns, end_ns)
        self._add_request(request, end_ns)

    def _parse_request(self, buf: Any, pos: int, end: int, start_ns: int, end_ns: int) -> Request:
        if _compiled_request is not None:
            request = _compiled_request(buf, pos, end, start_ns, end_ns)
            if request is not None:
                return request
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
                body = skip_tagged_fields(buf, body, end)
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
        return request

    def _add_request(self, request: Request, ts_ns: int) -> None:
        # (the key first: this runs for every request)
        if request.api_key == HANDSHAKE and starts_raw_exchange(request.api_key, request.api_version):
            self._start_sasl(request)
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

    def _response_frame(
        self, buf: Any, pos: int, end: int, start_ns: int, end_ns: int, decoded: Any = None
    ) -> None:
        """Decode the response frame ``buf[pos:end]`` and match it (``decoded``: the response,
        already decoded as the answer to the request it matches)."""
        if self._dirs[BROKER_TO_CLIENT].raw and self._sasl_server_frame(buf, pos, end, end_ns):
            return
        corr = _I32(buf, pos + 4)[0]
        entry = self._pending.pop(corr, None)
        if entry is None:
            answered = self._acks0.pop(corr, None)
            if answered is not None:  # decodable: we know what it answers
                response = decoded or self._decode_response(answered, buf, pos, end, start_ns, end_ns)
                self._events.append(OrphanResponse(response, answered))
            else:
                self._events.append(
                    OrphanResponse(Response(corr, -1, end - pos, start_ns, end_ns, "ok", None, None))
                )
            return
        seq, request = entry
        if seq != self._oldest_seq():
            self._expire_older(seq, end_ns)
        response = decoded or self._decode_response(request, buf, pos, end, start_ns, end_ns)
        received = _ResponseReceived(request, response)
        received.__class__ = ResponseReceived
        self._events.append(received)
        if request.api_key == HANDSHAKE and self._sasl is not None:
            self._sasl_answered(request, response)

    def _decode_response(
        self, request: Request, buf: Any, pos: int, end: int, start_ns: int, end_ns: int
    ) -> Response:
        """Decode a response as the answer to ``request``."""
        response = self._parse_response(request, buf, pos, end, start_ns, end_ns)
        if response.status != "ok":
            response = self._parse_response(request, _padded(buf, pos, end), 0, end - pos, start_ns, end_ns)
        return response

    def _parse_response(
        self, request: Request, buf: Any, pos: int, end: int, start_ns: int, end_ns: int
    ) -> Response:
        if _compiled_response is not None:
            response = _compiled_response(request, buf, pos, end, start_ns, end_ns)
            if response is not None:
                return response
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
                    body = skip_tagged_fields(buf, body, end)
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

    def _truncated_frame(
        self, direction: int, state: _Direction, total: int, ts_ns: int, have: int | None = None
    ) -> None:
        """Report the frame in progress as truncated, with whatever header it had (``have``:
        how many of its bytes came, when ``rx.buf`` holds only its head)."""
        rx = state.rx
        buf, pos = rx.buf, rx.pos
        have = rx.available() if have is None else have
        start_ns = rx.time_at(pos)
        state.frames += 1
        if self._fresh and direction == CLIENT_TO_BROKER:
            self._fresh = False
            self._watch_client = self._sasl is not None
            if have > 4 and buf[pos + 4] == GSSAPI_TOKEN_TAG:
                self._start_sasl(None, start_ns)
        if state.raw:  # part of a SASL token: counted, never read
            sasl = self._sasl
            assert sasl is not None
            if direction == CLIENT_TO_BROKER:
                sasl.client_token(total, ts_ns)
            else:
                sasl.server_token(total, ts_ns)
            self._sasl_sync()
            return
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
                if entry[1].api_key == HANDSHAKE and self._sasl is not None:
                    self._sasl_answered(entry[1], response)
        else:
            self._events.append(
                MalformedFrame(direction, total, start_ns, ts_ns, f"truncated after {have} of {total} bytes")
            )

    # ---- SASL tokens outside Kafka framing (decoder.sasl) -----------------------------------

    def _start_sasl(self, handshake: Request | None, start_ns: int = 0) -> None:
        """A SaslHandshake v0 request (tokens follow it), or None: a first frame that is a token."""
        if self._sasl is not None:
            self._end_sasl(self._sasl_end)
        self._fresh = False
        if handshake is None:
            self._sasl = RawExchange("GSSAPI", False, start_ns)
        else:
            fields = handshake.fields
            mechanism = fields.get("sasl_mechanism") if fields else None
            self._sasl = RawExchange(mechanism if type(mechanism) is str else None, True, handshake.end_ns)
        self._sasl_end = "complete"
        self._sasl_sync()

    def _sasl_sync(self) -> None:
        """Each direction reads tokens or Kafka frames as the exchange says; report it once over."""
        sasl = self._sasl
        client, server = self._dirs
        self._watch_client = self._fresh or sasl is not None
        client.raw = sasl is not None and sasl.client_open
        server.raw = sasl is not None and sasl.server_open
        client.minimum = 0 if client.raw else client.kafka_minimum
        server.minimum = 0 if server.raw else server.kafka_minimum
        if sasl is not None and sasl.done:
            self._end_sasl(self._sasl_end)

    def _end_sasl(self, ended: str) -> None:
        sasl = self._sasl
        assert sasl is not None
        self._sasl = None
        self._sasl_sync()
        if sasl.client_frames or sasl.server_frames:
            self._events.append(
                SaslExchange(
                    sasl.mechanism,
                    sasl.handshake,
                    sasl.client_frames,
                    sasl.client_bytes,
                    sasl.server_frames,
                    sasl.server_bytes,
                    sasl.start_ns,
                    sasl.end_ns,
                    ended,
                )
            )

    def _sasl_client_frame(self, buf: Any, pos: int, end: int, start_ns: int, end_ns: int) -> bool:
        """True if the client frame ``buf[pos:end]`` is a SASL token (counted, not read)."""
        sasl = self._sasl
        if sasl is None:  # the connection's first client frame: a Kafka 0.9 GSSAPI token?
            self._fresh = self._watch_client = False
            if end - pos <= 4 or buf[pos + 4] != GSSAPI_TOKEN_TAG:
                return False
            self._start_sasl(None, start_ns)
            sasl = self._sasl
            assert sasl is not None
        elif not sasl.client_open:
            return False
        elif (
            not sasl.fixed
            and looks_like_request(buf, pos, end, self.frame_limit)
            and decodes_as_request(buf, pos, end)
        ):  # plainly a Kafka request: the tokens are over
            sasl.client_ended()
            self._sasl_sync()
            return False
        sasl.client_token(end - pos, end_ns)
        self._sasl_sync()
        return True

    def _sasl_server_frame(self, buf: Any, pos: int, end: int, end_ns: int) -> bool:
        """True if the broker frame ``buf[pos:end]`` is a SASL token (counted, not read)."""
        sasl = self._sasl
        assert sasl is not None
        if not sasl.fixed and not sasl.client_open and end - pos >= 8:
            corr = _I32(buf, pos + 4)[0]
            if corr in self._pending or corr in self._acks0:  # the answer to a request after the tokens
                sasl.server_ended()
                self._sasl_sync()
                return False
        sasl.server_token(end - pos, end_ns)
        self._sasl_sync()
        return True

    def _sasl_answered(self, request: Request, response: Response) -> None:
        """A SaslHandshake answer: with v0 and no error, the broker's tokens follow."""
        sasl = self._sasl
        if sasl is None or not sasl.handshake or request.api_version != 0:
            return
        fields = response.fields
        # an answer lost to a gap or undecodable: assume it let the tokens through
        ok = not fields or not fields.get("error_code")
        if not ok and sasl.client_frames:
            self._sasl_end = "rejected"
        sasl.handshake_answered(ok)
        self._sasl_sync()

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
