"""Large record frames handed to the recorder as their skeletons, cut on the forwarding path.

The recorder process (``proxy.recorder_worker``) decodes what the loop sends down its pipe.
A Produce request or Fetch response is mostly record payload, which the decoder never reads:
it reads each record batch's header (``decoder.skeleton``). Sent whole, the payload cost both
processes more than anything else under a bulk load: the pipe's two copies and the worker's
own (``bench/proxy_overhead.py``, 300k records of 1 KB through one proxy: the loop's
``writev`` was 14% of its samples; reading the pipe and copying the chunks out, 58% of the
worker's).

``FrameSkim`` follows one connection's two streams by their length prefixes, as the decoder
does, and holds a frame that can carry records (a Produce request; a Fetch response, its
request noted by correlation id) of ``SKIM_MIN`` bytes or more by reference until its last
byte is in. It then hands on the frame's skeleton, its size and the times of its first and
last bytes, and the decoder makes the same rows from that as from the frame
(``KafkaConnection.receive_skeleton``). Everything else passes as it came. Sans-io: it is fed
chunks and says what to send; it does no I/O and keeps no time of its own.

It never guesses. A frame whose skeleton cannot be made passes as its pieces; a frame head
split across two reads passes too (it is not held back); and a connection that does anything
a length prefix cannot follow stops being skimmed for good, both ways: a SaslHandshake (v0
tokens follow unframed), a first request that is no known api (a raw GSSAPI token), an
implausible length. The bytes held count against the proxy's memory budget (``take``/``give``);
a frame the budget cannot take passes as it comes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from decoder import protocol
from decoder.connection import DEFAULT_FRAME_LIMIT
from decoder.sasl import HANDSHAKE
from decoder.skeleton import frame_skeleton, has_records

__all__ = ["SKIM_MIN", "FrameSkim"]

#: Frames from this size on (length prefix included) are held and sent as their skeletons:
#: below it, the skeleton's walk in the loop costs more than the copies it saves.
SKIM_MIN = 64 << 10
#: Requests whose answers may carry records (Fetch) remembered at most, per connection.
_AWAITED_MAX = 1024
_REQUEST_HEAD = struct.Struct(">ihhi").unpack_from
_RESPONSE_HEAD = struct.Struct(">ii").unpack_from
_LENGTH = struct.Struct(">i").unpack_from
#: Bytes of a frame's head read to follow it (size, api key, version, correlation id).
_HEAD = (12, 8)
_NAMES = ("request", "response")


def _carrying(direction: str) -> frozenset[tuple[int, int]]:
    return frozenset(kv for kv in protocol.all_versions(direction) if has_records(direction, *kv))


#: (api key, version) of the requests that carry records (Produce), and of the requests whose
#: answers do (Fetch), with their keys alone for a first, cheaper test.
_RECORD_REQUESTS = _carrying("request")
_RECORD_ANSWERS = _carrying("response")
_REQUEST_KEYS = frozenset(k for k, _ in _RECORD_REQUESTS)
_ANSWER_KEYS = frozenset(k for k, _ in _RECORD_ANSWERS)

#: What ``feed`` returns: ("data", piece, ts) to send as a chunk, or ("skeleton", frame, size,
#: start_ns, end_ns).
Item = tuple[Any, ...]


class _Held:
    __slots__ = ("api", "need", "pieces", "size", "start_ns", "times")

    def __init__(self, size: int, api: tuple[int, int], ts_ns: int) -> None:
        self.size = size
        self.need = size
        self.api = api
        self.pieces: list[Any] = []
        self.times: list[int] = []
        self.start_ns = ts_ns


def _pieces(held: _Held) -> list[Item]:
    return [("data", piece, ts) for piece, ts in zip(held.pieces, held.times, strict=True)]


class FrameSkim:
    """One connection's two streams (0: client -> broker, 1: broker -> client) on their way to
    the recorder, large record frames replaced by their skeletons."""

    __slots__ = ("_awaited", "_first", "_give", "_head", "_held", "_left", "_take", "off")

    def __init__(
        self, take: Callable[[int], bool] | None = None, give: Callable[[int], None] | None = None
    ) -> None:
        self._take = take or (lambda _n: True)
        self._give = give or (lambda _n: None)
        self._left = [0, 0]  # bytes of the frame in progress still to come (passing)
        self._head = [b"", b""]  # a frame's first bytes while fewer than its head's are in
        self._held: list[_Held | None] = [None, None]
        self._awaited: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)
        self._first = True
        self.off = False  # no longer skimmed: everything passes

    def feed(self, direction: int, data: Any, ts_ns: int) -> list[Item] | None:
        """The chunk ``data`` of ``direction``, read at ``ts_ns``: None when it passes as it is,
        else what to send instead, in order (possibly nothing yet: a frame being held)."""
        if self.off and self._held[direction] is None:
            return None
        n = len(data)
        left = self._left[direction]
        if left >= n:  # wholly inside a passing frame: the common case
            self._left[direction] = left - n
            return None
        pos = 0
        if self._held[direction] is None and not self._head[direction]:
            # small frames pass whole: followed by their heads alone, nothing made
            want = _HEAD[direction]
            pos = left
            while n - pos >= want:
                size = _LENGTH(data, pos)[0] + 4
                if size >= SKIM_MIN:
                    break
                if not self._frame(direction, data, pos, ts_ns, held=False):
                    return None
                pos += size
                if pos >= n:
                    self._left[direction] = pos - n
                    return None
            self._left[direction] = 0
        out: list[Item] = []
        span = 0  # bytes before ``span`` are dealt with
        while pos < n:
            held = self._held[direction]
            if held is not None:
                take = min(held.need, n - pos)
                held.pieces.append(data if take == n else memoryview(data)[pos : pos + take])
                held.times.append(ts_ns)
                held.need -= take
                pos = span = pos + take
                if not held.need:
                    self._held[direction] = None
                    out.extend(self._finish(direction, held, ts_ns))
                continue
            left = self._left[direction]
            if left:
                take = min(left, n - pos)
                self._left[direction] = left - take
                pos += take
                continue
            if self.off:  # (a frame held when it stopped has just ended)
                break
            want = _HEAD[direction]
            head = self._head[direction]
            if head or n - pos < want:  # a head split across reads: followed, not held
                piece = bytes(data[pos : pos + want - len(head)])
                head += piece
                pos += len(piece)
                self._head[direction] = head
                if len(head) < want:
                    continue
                self._head[direction] = b""
                if not self._frame(direction, head, 0, ts_ns, held=False):
                    break
                self._left[direction] -= want
                continue
            if not self._frame(direction, data, pos, ts_ns, held=True):
                break
            if self._held[direction] is not None:
                if span < pos:
                    out.append(("data", memoryview(data)[span:pos], ts_ns))
                span = pos
        if span == 0 and not out and self._held[direction] is None:
            return None  # nothing held or cut: the chunk passes whole
        if span < n:
            out.append(("data", memoryview(data)[span:] if span else data, ts_ns))
        return out

    def _frame(self, direction: int, buf: Any, pos: int, ts_ns: int, *, held: bool) -> bool:
        """A frame starts at ``buf[pos]`` (its head at hand): follow it, and hold it if ``held``
        allows and it is worth it. False when the connection stops being skimmed."""
        api: tuple[int, int] | None = None
        if direction == 0:
            length, api_key, api_version, corr = _REQUEST_HEAD(buf, pos)
            if self._first:
                self._first = False
                if protocol.layout("request", api_key, api_version) is None:
                    return self._stop()
            if length < 8 or length > DEFAULT_FRAME_LIMIT or api_key == HANDSHAKE:
                return self._stop()
            if (
                api_key in _ANSWER_KEYS
                and (api_key, api_version) in _RECORD_ANSWERS
                and len(self._awaited) < _AWAITED_MAX
            ):
                self._awaited[corr] = (api_key, api_version)
            elif api_key in _REQUEST_KEYS and (api_key, api_version) in _RECORD_REQUESTS:
                api = (api_key, api_version)
        else:
            length, corr = _RESPONSE_HEAD(buf, pos)
            if length < 4 or length > DEFAULT_FRAME_LIMIT:
                return self._stop()
            if self._awaited:
                api = self._awaited.pop(corr, None)
        size = length + 4
        if held and api is not None and size >= SKIM_MIN and self._take(size):
            self._held[direction] = _Held(size, api, ts_ns)
        else:
            self._left[direction] = size
        return True

    def _finish(self, direction: int, held: _Held, ts_ns: int) -> list[Item]:
        self._give(held.size)
        frame = frame_skeleton(held.pieces, _NAMES[direction], *held.api)
        if frame is None:  # passed as it came
            return _pieces(held)
        return [("skeleton", frame, held.size, held.start_ns, ts_ns)]

    def _stop(self) -> bool:
        """No new frame is held from now on, either way (one held already is finished)."""
        self.off = True
        return False

    def close(self) -> list[list[Item]]:
        """No more skimming (the connection ended, or its streams can no longer be followed):
        per direction, what is still held, to pass as it came."""
        out: list[list[Item]] = [[], []]
        for direction, held in enumerate(self._held):
            if held is not None:
                self._held[direction] = None
                self._give(held.size)
                out[direction] = _pieces(held)
        self.off = True
        return out
