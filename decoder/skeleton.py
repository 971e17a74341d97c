"""A frame held in pieces, without its record payloads: what decoding it needs, joined.

A large Produce request or Fetch response is mostly record payload, and the decoder only
reads each record batch's header (``decoder.records``). When such a frame arrived in several
chunks, joining it just to decode it copies every byte. ``skeleton`` walks the frame where
it lies, following the protocol table's layout (lengths and counts, as the compiled
decoders do), and joins only the rest: every byte outside ``records`` fields, and of each
record batch its 61-byte header, its length field shortened to match. The compiled decoder
reads the same fields and batch headers from the skeleton as from the whole frame. Anything
the walk cannot follow (unknown type, legacy message sets, a length that does not fit)
is copied as it is or makes ``skeleton`` return None, and the caller joins the frame.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from decoder import protocol
from decoder.pieces import LayoutWalk, Unsure
from decoder.primitives import Malformed, skip_tagged_fields

__all__ = ["HEAD_BYTES", "body_at", "frame_head", "frame_skeleton", "has_records", "skeleton"]

#: Bytes of a frame its request or response header is looked for in.
HEAD_BYTES = 1 << 10

_BATCH_HEADER = 61
_MAGIC_AT = 16
_INT32 = struct.Struct(">i")
_I16 = struct.Struct(">h").unpack_from
_SHORT_HEADER = _INT32.pack(_BATCH_HEADER - 12)


def _records_in(fields: Sequence[Any]) -> bool:
    return any(f[1] == "records" or (f[5] and _records_in(f[5])) for f in fields)


@lru_cache(maxsize=4096)  # bounded: hostile streams may name any (key, version)
def has_records(direction: str, api_key: int, api_version: int) -> bool:
    """True if (direction, api key, version) has a ``records`` field outside tagged fields."""
    entry = protocol.layout(direction, api_key, api_version)
    return entry is not None and _records_in([f for f in entry[1] if f[3] is None])


class _Skeleton(LayoutWalk):
    """The walk that assembles the skeleton: every byte, except record payloads."""

    __slots__ = ("copied", "out")

    def __init__(self, pieces: Sequence[Any]) -> None:
        super().__init__(pieces)
        self.out: list[Any] = []
        self.copied = 4  # frame bytes before this are in ``out`` (the length prefix is rewritten)

    def records(self, pos: int, compact: bool) -> int:
        """Record batches as their headers, behind a length prefix rewritten to match."""
        start = pos
        n, pos = self.length(pos, compact, wide=True)
        if n <= 0:
            return pos
        if pos + n > self.end:
            raise Unsure
        payload = self._batches(pos, pos + n)
        size = sum(len(piece) for piece in payload)
        prefix = _uvarint_bytes(size + 1) if compact else _INT32.pack(size)
        self._replace(start, pos + n, [prefix, *payload])
        return pos + n

    def _batches(self, pos: int, end: int) -> list[Any]:
        """Record batches ``pos .. end`` as their headers; from the first that is not a whole
        magic-2 batch on, the bytes as they are (``summarize_records`` reads them the same)."""
        out: list[Any] = []
        while pos + _BATCH_HEADER <= end:
            buf, at = self.window(pos, _BATCH_HEADER)
            total = 12 + _INT32.unpack_from(buf, at + 8)[0]
            if total < _BATCH_HEADER or pos + total > end or buf[at + _MAGIC_AT] != 2:
                break
            out.append(bytes(buf[at : at + 8]))
            out.append(_SHORT_HEADER)
            out.append(bytes(buf[at + 12 : at + _BATCH_HEADER]))
            pos += total
        out.extend(self.slices(pos, end))
        return out

    def _replace(self, start: int, stop: int, blob: list[Any]) -> None:
        """In the skeleton, frame bytes ``start .. stop`` become ``blob``."""
        self.out.extend(self.slices(self.copied, start))
        self.out.extend(blob)
        self.copied = stop

    def finish(self) -> bytes:
        self.out.extend(self.slices(self.copied, self.end))
        size = sum(len(piece) for piece in self.out)
        return b"".join([_INT32.pack(size), *self.out])


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skeleton(
    pieces: Sequence[Any], direction: str, api_key: int, api_version: int, body_at: int
) -> bytes | None:
    """The frame held as ``pieces`` (length prefix included) with record payloads left out.

    ``body_at``: where the message body starts (after the request or response header). None
    when the layout is unknown or the walk does not end exactly at the frame's end.
    """
    entry = protocol.layout(direction, api_key, api_version)
    if entry is None:
        return None
    flexible, fields = entry
    walk = _Skeleton(pieces)
    try:
        if walk.struct(body_at, fields, flexible) != walk.end:
            return None
    except (Unsure, IndexError, struct.error):
        return None
    return walk.finish()


def frame_head(pieces: Sequence[Any]) -> bytes:
    """The first ``HEAD_BYTES`` of a frame held as ``pieces`` (fewer if it is shorter)."""
    first = pieces[0]
    if len(first) >= HEAD_BYTES:
        return bytes(first[:HEAD_BYTES])
    out = bytearray()
    for piece in pieces:
        out += piece[: HEAD_BYTES - len(out)]
        if len(out) >= HEAD_BYTES:
            break
    return bytes(out)


def body_at(head: Any, direction: str, api_key: int, api_version: int) -> int:
    """Where the message body starts in a frame beginning with ``head`` (length prefix included):
    past the request header (correlation id, client id, tagged fields by its version) or the
    response header. Raises ``Malformed`` (or ``IndexError``/``struct.error``) when ``head``
    ends first."""
    end = len(head)
    if direction == "request":
        version = protocol.request_header_version(api_key, api_version)
        pos = 12
        if version >= 1:
            n = _I16(head, pos)[0]
            pos += 2 + max(n, 0)
            if pos > end:
                raise Malformed("client id runs past the head")
        return skip_tagged_fields(head, pos, end) if version >= 2 else pos
    version = protocol.response_header_version(api_key, api_version)
    return 8 if version < 1 else skip_tagged_fields(head, 8, end)


def frame_skeleton(
    pieces: Sequence[Any], direction: str, api_key: int, api_version: int, head: bytes | None = None
) -> bytes | None:
    """``skeleton`` of the frame held as ``pieces``, its header read from its first bytes
    (``head``, or ``frame_head(pieces)``). None when it cannot be made."""
    if head is None:
        head = frame_head(pieces)
    try:
        body = body_at(head, direction, api_key, api_version)
    except (Malformed, IndexError, struct.error):
        return None
    return skeleton(pieces, direction, api_key, api_version, body)
