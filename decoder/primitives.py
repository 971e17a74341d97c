"""Kafka primitive readers the compiled layouts call (the fixed-size ones are plain struct calls)."""

from __future__ import annotations

import base64
import struct
from typing import Any

__all__ = [
    "Malformed",
    "read_uuid",
    "read_uvarint",
    "skip_tagged_fields",
    "unpack_int16_array",
    "unpack_int32_array",
    "unpack_int64_array",
]


class Malformed(ValueError):
    """A frame's bytes do not fit its declared layout; the message says where."""


def read_uvarint(buf: Any, pos: int) -> tuple[int, int]:
    """Read an unsigned LEB128 varint (at most 5 bytes, a 32-bit value); return (value, new pos)."""
    value = 0
    shift = 0
    for _ in range(5):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise Malformed("unsigned varint longer than 5 bytes")


def skip_tagged_fields(buf: Any, pos: int, end: int) -> int:
    """The position after the tagged-field section at ``buf[pos]`` (a header's, say)."""
    count, pos = read_uvarint(buf, pos)
    if count > end - pos:
        raise Malformed("tagged field count exceeds the frame")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    if pos > end:
        raise Malformed("tagged fields run past the frame")
    return pos


def read_uuid(buf: Any, pos: int) -> str:
    """A 16-byte UUID as Kafka prints it: URL-safe base64 without padding."""
    raw = bytes(buf[pos : pos + 16])
    if len(raw) != 16:
        raise Malformed("uuid runs past the buffer")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _array_reader(code: str) -> Any:
    size = struct.calcsize(code)

    def unpack(buf: Any, pos: int, count: int) -> list[int]:
        if pos + size * count > len(buf):
            raise Malformed("array runs past the buffer")
        return list(struct.unpack_from(f">{count}{code}", buf, pos))

    return unpack


unpack_int16_array = _array_reader("h")
unpack_int32_array = _array_reader("i")
unpack_int64_array = _array_reader("q")
