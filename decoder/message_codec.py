"""Whole-message encoder and decoder driven by the protocol table (every field, both ways).

The stream decoder (``decoder.connection``) reads only the fields that carry a role and skips
the rest; this module is its opposite number for the few places that must *change* a message
or *build* one: the proxy rewriting broker addresses in responses and answering injected
faults. It walks ``protocol.layout(direction, api_key, version)`` field by field, so every API
and version in the table is covered without a line of per-API code.

A decoded message is a *tree*: a dict per struct keyed by the field names of Kafka's JSON
definitions (``"Brokers"``, ``"NodeId"``, ...). Values:

* ints, floats and bools as Python values; uuids as 16 ``bytes``;
* strings as ``str`` (decoded with ``surrogateescape``, so invalid UTF-8 survives the trip);
* ``bytes`` and ``records`` fields as ``bytes`` (or ``memoryview`` slices of the input with
  ``zero_copy=True``: record batches are never copied or looked into);
* nullable values as ``None``; arrays as lists; structs as dicts.

Tagged fields appear under their names only when they were on the wire (an absent key is not
written back). Tags the table does not know are kept as raw bytes under ``"_unknown_tags"``
(a list of ``(tag, bytes)``), tags met out of ascending order keep their order under
``"_tag_order"``, and bytes after the body under ``"_trailing"``, so that for every message
that follows the protocol ``encode_message(decode_message(buf)) == buf`` byte for byte.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from decoder import protocol
from decoder.primitives import Malformed, read_uvarint

__all__ = [
    "CodecError",
    "decode_frame",
    "decode_header",
    "decode_message",
    "default_tree",
    "encode_frame",
    "encode_header",
    "encode_message",
    "read_uvarint",
    "write_uvarint",
]

NULLABLE = 1
CLASSIC_ENCODING = 2

UNKNOWN_TAGS = "_unknown_tags"
TAG_ORDER = "_tag_order"
TRAILING = "_trailing"

_FIXED: dict[str, struct.Struct] = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "uint16": struct.Struct(">H"),
    "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"),
    "float64": struct.Struct(">d"),
}
_I8 = _FIXED["int8"]
_I16 = _FIXED["int16"]
_I32 = _FIXED["int32"]


class CodecError(ValueError):
    """The bytes do not fit the layout, or a tree does not fit it."""


def write_uvarint(value: int) -> bytes:
    """Unsigned LEB128 encoding of ``value`` (0 <= value < 2**32)."""
    if value < 0:
        raise CodecError(f"negative unsigned varint {value}")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# ---- decoding ----------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "end", "zero_copy")

    def __init__(self, buf: Any, end: int, zero_copy: bool) -> None:
        self.buf = buf
        self.end = end
        self.zero_copy = zero_copy

    def need(self, pos: int, n: int, what: str) -> None:
        if n < 0 or pos + n > self.end:
            raise CodecError(f"{what}: {n} bytes needed at offset {pos}, frame ends at {self.end}")

    def length(self, pos: int, compact: bool, wide: bool, what: str) -> tuple[int, int]:
        """A length or count; -1 means null."""
        if compact:
            n, pos = read_uvarint(self.buf, pos)
            return n - 1, pos
        size = 4 if wide else 2
        self.need(pos, size, what)
        return (_I32 if wide else _I16).unpack_from(self.buf, pos)[0], pos + size

    def raw(self, pos: int, n: int) -> bytes | memoryview:
        if self.zero_copy:
            return memoryview(self.buf)[pos : pos + n]
        return bytes(self.buf[pos : pos + n])


def _decode_value(r: _Reader, pos: int, field: list[Any], flexible: bool) -> tuple[Any, int]:
    name, ftype, flags, _tag, _role, children = field
    compact = flexible and not flags & CLASSIC_ENCODING
    fixed = _FIXED.get(ftype)
    if fixed is not None:
        r.need(pos, fixed.size, name)
        return fixed.unpack_from(r.buf, pos)[0], pos + fixed.size
    if ftype == "bool":
        r.need(pos, 1, name)
        return r.buf[pos] != 0, pos + 1
    if ftype == "uuid":
        r.need(pos, 16, name)
        return bytes(r.buf[pos : pos + 16]), pos + 16
    if ftype == "string":
        n, pos = r.length(pos, compact, False, name)
        if n < 0:
            return None, pos
        r.need(pos, n, name)
        return bytes(r.buf[pos : pos + n]).decode("utf-8", "surrogateescape"), pos + n
    if ftype in ("bytes", "records"):
        n, pos = r.length(pos, compact, True, name)
        if n < 0:
            return None, pos
        r.need(pos, n, name)
        return r.raw(pos, n), pos + n
    if ftype == "{}":
        if flags & NULLABLE:
            r.need(pos, 1, name)
            marker = _I8.unpack_from(r.buf, pos)[0]
            pos += 1
            if marker < 0:
                return None, pos
        return _decode_struct(r, pos, children, flexible)
    if not ftype.startswith("[]"):
        raise CodecError(f"{name}: unknown field type {ftype!r}")
    n, pos = r.length(pos, compact, True, name)
    if n < 0:
        return None, pos
    if n > r.end - pos:
        raise CodecError(f"{name}: array count {n} exceeds the frame")
    element = ftype[2:]
    item = [name, element, 0 if compact else CLASSIC_ENCODING, None, None, children]
    out = []
    if element == "":
        for _ in range(n):
            value, pos = _decode_struct(r, pos, children, flexible)
            out.append(value)
    else:
        for _ in range(n):
            value, pos = _decode_value(r, pos, item, flexible)
            out.append(value)
    return out, pos


def _decode_struct(
    r: _Reader, pos: int, fields: list[list[Any]], flexible: bool
) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    for field in fields:
        if field[3] is None:
            out[field[0]], pos = _decode_value(r, pos, field, flexible)
    if not flexible:
        return out, pos
    tagged = {f[3]: f for f in fields if f[3] is not None}
    count, pos = read_uvarint(r.buf, pos)
    if count > r.end - pos:
        raise CodecError(f"tagged field count {count} exceeds the frame")
    order = []
    unknown = []
    for _ in range(count):
        tag, pos = read_uvarint(r.buf, pos)
        size, pos = read_uvarint(r.buf, pos)
        r.need(pos, size, f"tagged field {tag}")
        order.append(tag)
        field = tagged.get(tag)
        if field is None:
            unknown.append((tag, bytes(r.buf[pos : pos + size])))
        else:
            sub = _Reader(r.buf, pos + size, r.zero_copy)
            value, stop = _decode_value(sub, pos, field, flexible)
            if stop != pos + size:
                # keep what we cannot reproduce exactly as raw bytes
                unknown.append((tag, bytes(r.buf[pos : pos + size])))
            else:
                out[field[0]] = value
        pos += size
    if unknown:
        out[UNKNOWN_TAGS] = unknown
    if order != sorted(order):
        out[TAG_ORDER] = order
    if pos > r.end:
        raise CodecError("tagged fields run past the frame")
    return out, pos


def _layout(direction: str, api_key: int, version: int) -> tuple[bool, list[Any]]:
    entry = protocol.layout(direction, api_key, version)
    if entry is None:
        name = protocol.api_name(api_key) or f"api key {api_key}"
        raise CodecError(f"no definition for {name} v{version} {direction}")
    return entry


def decode_message(
    direction: str,
    api_key: int,
    version: int,
    buf: Any,
    pos: int = 0,
    end: int | None = None,
    *,
    zero_copy: bool = False,
) -> dict[str, Any]:
    """Decode a whole message body (``buf[pos:end]``, no header) into a tree.

    ``direction`` is ``"request"`` or ``"response"``. Bytes left after the body are kept
    under ``"_trailing"``. Raises ``CodecError`` when the bytes do not fit the layout.
    """
    flexible, fields = _layout(direction, api_key, version)
    end = len(buf) if end is None else end
    reader = _Reader(buf, end, zero_copy)
    try:
        tree, stop = _decode_struct(reader, pos, fields, flexible)
    except (struct.error, IndexError, Malformed) as exc:
        raise CodecError(str(exc)) from exc
    if stop > end:
        raise CodecError(f"body runs {stop - end} bytes past the frame")
    if stop < end:
        tree[TRAILING] = bytes(buf[stop:end])
    return tree


# ---- encoding ----------------------------------------------------------------------------


def _encode_length(out: list[bytes], n: int, compact: bool, wide: bool) -> None:
    if compact:
        out.append(write_uvarint(n + 1))
    else:
        out.append((_I32 if wide else _I16).pack(n))


def _encode_value(out: list[Any], value: Any, field: list[Any], flexible: bool) -> None:
    name, ftype, flags, _tag, _role, children = field
    compact = flexible and not flags & CLASSIC_ENCODING
    fixed = _FIXED.get(ftype)
    try:
        if fixed is not None:
            out.append(fixed.pack(value))
            return
        if ftype == "bool":
            out.append(b"\x01" if value else b"\x00")
            return
        if ftype == "uuid":
            raw = bytes(value)
            if len(raw) != 16:
                raise CodecError(f"{name}: a uuid is 16 bytes, got {len(raw)}")
            out.append(raw)
            return
    except struct.error as exc:
        raise CodecError(f"{name}: {exc}") from exc
    if ftype in ("string", "bytes", "records"):
        if value is None:
            if not flags & NULLABLE:
                raise CodecError(f"{name} is not nullable")
            _encode_length(out, -1, compact, ftype != "string")
            return
        raw = value.encode("utf-8", "surrogateescape") if ftype == "string" else value
        _encode_length(out, len(raw), compact, ftype != "string")
        out.append(raw)
        return
    if ftype == "{}":
        if flags & NULLABLE:
            if value is None:
                out.append(b"\xff")
                return
            out.append(b"\x01")
        _encode_struct(out, value, children, flexible)
        return
    if not ftype.startswith("[]"):
        raise CodecError(f"{name}: unknown field type {ftype!r}")
    if value is None:
        if not flags & NULLABLE:
            raise CodecError(f"{name} is not nullable")
        _encode_length(out, -1, compact, True)
        return
    _encode_length(out, len(value), compact, True)
    element = ftype[2:]
    if element == "":
        for item in value:
            _encode_struct(out, item, children, flexible)
    else:
        item_field = [name, element, 0 if compact else CLASSIC_ENCODING, None, None, children]
        for item in value:
            _encode_value(out, item, item_field, flexible)


def _encode_struct(out: list[Any], tree: dict[str, Any], fields: list[list[Any]], flexible: bool) -> None:
    if not isinstance(tree, dict):
        raise CodecError(f"expected a struct (dict), got {type(tree).__name__}")
    for field in fields:
        if field[3] is None:
            if field[0] not in tree:
                raise CodecError(f"missing field {field[0]}")
            _encode_value(out, tree[field[0]], field, flexible)
    if not flexible:
        return
    entries: dict[int, Any] = {}
    for field in fields:
        if field[3] is not None and field[0] in tree:
            sub: list[Any] = []
            _encode_value(sub, tree[field[0]], field, flexible)
            entries[field[3]] = b"".join(sub)
    for tag, raw in tree.get(UNKNOWN_TAGS, ()):
        entries[tag] = raw
    order = tree.get(TAG_ORDER)
    if order is None or sorted(order) != sorted(entries):
        order = sorted(entries)
    out.append(write_uvarint(len(order)))
    for tag in order:
        raw = entries[tag]
        out.append(write_uvarint(tag))
        out.append(write_uvarint(len(raw)))
        out.append(raw)


def encode_message(direction: str, api_key: int, version: int, tree: dict[str, Any]) -> bytes:
    """Encode a tree (as ``decode_message`` returns it) into a message body, no header."""
    flexible, fields = _layout(direction, api_key, version)
    out: list[Any] = []
    _encode_struct(out, tree, fields, flexible)
    if TRAILING in tree:
        out.append(tree[TRAILING])
    return b"".join(out)


# ---- headers and frames ------------------------------------------------------------------


def _header_fields(direction: str, header_version: int) -> tuple[bool, list[Any]]:
    flexible = header_version >= (2 if direction == "request" else 1)
    return flexible, protocol.header_layout(direction, header_version)


def decode_header(
    direction: str, header_version: int, buf: Any, pos: int = 0, end: int | None = None
) -> tuple[dict[str, Any], int]:
    """Decode a request header (v0-2) or response header (v0-1); return (tree, body offset)."""
    flexible, fields = _header_fields(direction, header_version)
    reader = _Reader(buf, len(buf) if end is None else end, False)
    try:
        return _decode_struct(reader, pos, fields, flexible)
    except (struct.error, IndexError, Malformed) as exc:
        raise CodecError(str(exc)) from exc


def encode_header(direction: str, header_version: int, tree: dict[str, Any]) -> bytes:
    """Encode a header tree (``RequestApiKey``, ``CorrelationId``, ...)."""
    flexible, fields = _header_fields(direction, header_version)
    out: list[Any] = []
    _encode_struct(out, tree, fields, flexible)
    return b"".join(out)


def decode_frame(
    direction: str,
    frame: Any,
    api_key: int | None = None,
    api_version: int | None = None,
    *,
    zero_copy: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Decode a whole frame (4-byte length prefix included) into (header tree, body tree).

    A request names its own api key and version; a response needs them (from its request).
    """
    size = _I32.unpack_from(frame, 0)[0]
    if size + 4 != len(frame):
        raise CodecError(f"frame length {size} does not match {len(frame) - 4} bytes")
    if direction == "request":
        api_key, api_version = struct.unpack_from(">hh", frame, 4)
        header_version = protocol.request_header_version(api_key, api_version)
    else:
        if api_key is None or api_version is None:
            raise CodecError("a response needs the api key and version of its request")
        header_version = protocol.response_header_version(api_key, api_version)
    header, body = decode_header(direction, header_version, frame, 4)
    return header, decode_message(direction, api_key, api_version, frame, body, zero_copy=zero_copy)


def encode_frame(
    direction: str, api_key: int, api_version: int, header: dict[str, Any], body: dict[str, Any]
) -> bytes:
    """Encode header and body trees into a frame with its length prefix."""
    header_fn: Callable[[int, int], int] = (
        protocol.request_header_version if direction == "request" else protocol.response_header_version
    )
    payload = encode_header(direction, header_fn(api_key, api_version), header) + encode_message(
        direction, api_key, api_version, body
    )
    return _I32.pack(len(payload)) + payload


# ---- building messages -------------------------------------------------------------------

# Fields whose "nothing here" value is -1 in Kafka (offsets, leaders, replicas, timestamps).
_MINUS_ONE_SUFFIXES = (
    "Offset",
    "Watermark",
    "LeaderId",
    "LeaderEpoch",
    "ReadReplica",
    "NodeId",
    "TimeMs",
    "Timestamp",
    "ProducerId",
    "Epoch",
)


def _default_value(field: list[Any]) -> Any:
    name, ftype, flags, _tag, _role, children = field
    if ftype in _FIXED:
        if ftype in ("int32", "int64") and name.endswith(_MINUS_ONE_SUFFIXES):
            return -1
        return 0.0 if ftype == "float64" else 0
    if ftype == "bool":
        return False
    if ftype == "uuid":
        return bytes(16)
    if ftype == "string":
        return None if flags & NULLABLE else ""
    if ftype in ("bytes", "records"):
        return None if flags & NULLABLE else b""
    if ftype == "{}":
        return None if flags & NULLABLE else _default_struct(children)
    return []


def _default_struct(fields: list[list[Any]]) -> dict[str, Any]:
    return {field[0]: _default_value(field) for field in fields if field[3] is None}


def default_tree(direction: str, api_key: int, version: int) -> dict[str, Any]:
    """A well-formed tree with every field at its empty value (tagged fields left out).

    Numbers are 0, except int32/int64 offsets, leader ids, epochs and timestamps, which are
    -1 ("unknown") as Kafka writes them when it has nothing to say; strings are "" (None if
    nullable), arrays empty, nullable structs None.
    """
    _flexible, fields = _layout(direction, api_key, version)
    return _default_struct(fields)
