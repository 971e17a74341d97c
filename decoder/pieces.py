"""Walking a frame that lies in several buffers, by the protocol table's layout, without joining it.

Joining a large Produce request or Fetch response copies megabytes that are mostly record
payload. Two readers need only its shape: the recorder, which decodes a skeleton of the frame
without the payloads (``decoder.skeleton``), and the proxy, which asks whether a response
can name a broker before rewriting it (``proxy.rewrite``). ``LayoutWalk`` follows lengths and
counts field by field as the compiled decoders do; subclasses act on the fields they care
about. Anything the walk cannot follow (an unknown type, a length past the end) raises
``Unsure``, and the caller takes its safe path.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

__all__ = ["LayoutWalk", "Unsure"]

FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "int64": 8,
    "float64": 8,
    "uuid": 16,
}
_NULLABLE = 1  # layout flag bits, as the generator writes them
_CLASSIC_ENCODING = 2
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from


class Unsure(Exception):
    """The walk cannot follow the frame (unknown type, short or malformed frame)."""


class LayoutWalk:
    """Random access to a frame held as ``pieces``, and a walk over it by layout."""

    __slots__ = ("end", "pieces", "starts")

    def __init__(self, pieces: Sequence[Any]) -> None:
        self.pieces = pieces
        starts = []
        total = 0
        for piece in pieces:
            starts.append(total)
            total += len(piece)
        self.starts = starts
        self.end = total

    # ---- reading -----------------------------------------------------------------------

    def window(self, pos: int, n: int) -> tuple[Any, int]:
        """(buffer, offset) holding frame bytes ``pos .. pos+n`` contiguously."""
        if pos < 0 or pos + n > self.end:
            raise Unsure
        i = bisect_right(self.starts, pos) - 1
        at = pos - self.starts[i]
        if at + n <= len(self.pieces[i]):
            return self.pieces[i], at
        return b"".join(self.slices(pos, pos + n)), 0

    def slices(self, start: int, stop: int) -> list[Any]:
        """Views of the pieces covering frame bytes ``start .. stop``."""
        out = []
        i = bisect_right(self.starts, start) - 1
        while start < stop:
            piece, base = self.pieces[i], self.starts[i]
            take = min(stop, base + len(piece))
            out.append(memoryview(piece)[start - base : take - base])
            start = take
            i += 1
        return out

    def byte(self, pos: int) -> int:
        buf, at = self.window(pos, 1)
        return buf[at]

    def int32(self, pos: int) -> int:
        buf, at = self.window(pos, 4)
        return _I32(buf, at)[0]

    def uvarint(self, pos: int) -> tuple[int, int]:
        """An unsigned varint and the position after it."""
        value = shift = 0
        for _ in range(5):
            byte = self.byte(pos)
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos
            shift += 7
        raise Unsure

    def length(self, pos: int, compact: bool, wide: bool) -> tuple[int, int]:
        """A length or count as the layout encodes it (-1: null), and the position after it."""
        if compact:
            n, pos = self.uvarint(pos)
            return n - 1, pos
        buf, at = self.window(pos, 4 if wide else 2)
        return (_I32 if wide else _I16)(buf, at)[0], pos + (4 if wide else 2)

    # ---- walking -----------------------------------------------------------------------

    def struct(self, pos: int, fields: Sequence[Any], flexible: bool) -> int:
        """Walk a struct's fields from ``pos``; return where it ends."""
        for field in fields:
            if field[3] is None:
                pos = self.field(pos, field, flexible)
        if flexible:
            pos = self.tagged(pos, fields)
        return pos

    def field(self, pos: int, field: Sequence[Any], flexible: bool) -> int:
        """Walk one field (a layout entry: name, type, flags, tag, role, children)."""
        _name, ftype, flags, _tag, _role, children = field
        compact = flexible and not flags & _CLASSIC_ENCODING
        size = FIXED_SIZES.get(ftype)
        if size is not None:
            return pos + size
        if ftype == "records":
            return self.records(pos, compact)
        if ftype in ("string", "bytes"):
            n, pos = self.length(pos, compact, wide=ftype == "bytes")
            return pos + n if n > 0 else pos
        if ftype == "{}":
            if flags & _NULLABLE:
                if self.byte(pos) >= 0x80:  # int8 -1: null
                    return pos + 1
                pos += 1
            self.entering(field)
            return self.struct(pos, children or (), flexible)
        if not ftype.startswith("[]"):
            raise Unsure
        element = ftype[2:]
        n, pos = self.length(pos, compact, wide=True)
        if n <= 0:
            return pos
        if n > self.end - pos:
            raise Unsure
        if element == "":
            self.entering(field)
            for _ in range(n):
                pos = self.struct(pos, children or (), flexible)
            return pos
        size = FIXED_SIZES.get(element)
        if size is not None:
            return pos + size * n
        if element in ("string", "bytes"):
            for _ in range(n):
                m, pos = self.length(pos, compact, wide=element == "bytes")
                if m > 0:
                    pos += m
            return pos
        raise Unsure

    def records(self, pos: int, compact: bool) -> int:
        """A ``records`` field: skipped by its length."""
        n, pos = self.length(pos, compact, wide=True)
        return pos + n if n > 0 else pos

    def entering(self, field: Sequence[Any]) -> None:
        """Called before the walk enters a struct field, or a non-empty array of structs."""

    def tagged(self, pos: int, fields: Sequence[Any]) -> int:
        """The tagged fields ending a flexible struct: skipped by their sizes."""
        count, pos = self.uvarint(pos)
        for _ in range(count):
            _tag, pos = self.uvarint(pos)
            size, pos = self.uvarint(pos)
            pos += size
        return pos
