"""Keeping clients on the proxy: broker addresses in responses replaced by proxy listeners.

Which responses carry broker addresses is read from the protocol table, not listed by hand:
a response (api key, version) needs a look when its layout has, anywhere (tagged fields
included), a struct with a node id, a host and a port (roles ``node_id``, ``host``,
``port``). That covers Metadata brokers, FindCoordinator (v0-3 top level and v4+
coordinators), DescribeCluster brokers, and the KIP-951 node endpoints Produce and Fetch
responses carry in newer versions, in every version that has them.

A response is first read with the stream decoder's compiled function (it skips records by
length), which says cheaply whether any such struct is on the wire; only then is the whole
message decoded with ``decoder.message_codec``, the addresses changed and the frame
re-encoded with a new length.

Large responses (Fetch with KIP-951 endpoints) arrive in many reads. ``may_carry_endpoints``
walks such a frame where it lies, across the pieces it came in, skipping records by
length, and says whether any struct that can hold an address is actually present; when
none is (the usual Fetch response) the pieces are forwarded as they are, without joining
them into one frame and decoding it a second time.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any

from decoder import message_codec, protocol

__all__ = [
    "Endpoint",
    "has_endpoints",
    "iter_endpoints",
    "may_carry_endpoints",
    "rewrite_response",
    "topic_ids",
]

Endpoint = tuple[int, str, int]  # node id, host, port
_I32 = struct.Struct(">i")
_DECODE_ERRORS = (message_codec.CodecError, struct.error, IndexError, ValueError, UnicodeError)


def _has_node_struct(fields: list[Any]) -> bool:
    roles = {field[4] for field in fields}
    if {"node_id", "host", "port"} <= roles:
        return True
    return any(field[5] and _has_node_struct(field[5]) for field in fields)


@cache
def has_endpoints(api_key: int, api_version: int) -> bool:
    """True if responses of (api key, version) can carry broker addresses."""
    entry = protocol.layout("response", api_key, api_version)
    return entry is not None and _has_node_struct(entry[1])


def iter_endpoints(fields: Any) -> Iterator[dict[str, Any]]:
    """Structs holding node_id + host + port in fields decoded by the compiled decoder."""
    if isinstance(fields, list):
        for item in fields:
            if isinstance(item, dict):
                yield from iter_endpoints(item)
        return
    if not isinstance(fields, dict):
        return
    if "node_id" in fields and "host" in fields and "port" in fields:
        yield fields
    for value in fields.values():
        if isinstance(value, dict | list):
            yield from iter_endpoints(value)


def topic_ids(fields: Any, out: dict[str, str]) -> None:
    """Collect topic id -> name pairs from decoded fields (Metadata responses carry both)."""
    if isinstance(fields, list):
        for item in fields:
            topic_ids(item, out)
    elif isinstance(fields, dict):
        name, tid = fields.get("topic"), fields.get("topic_id")
        if isinstance(name, str) and isinstance(tid, str) and tid != "AAAAAAAAAAAAAAAAAAAAAA":
            out[tid] = name
        for value in fields.values():
            if isinstance(value, dict | list):
                topic_ids(value, out)


def _tree_endpoints(tree: Any) -> Iterator[dict[str, Any]]:
    """Structs with NodeId/BrokerId + Host + Port in a message_codec tree."""
    if isinstance(tree, list):
        for item in tree:
            if isinstance(item, dict):
                yield from _tree_endpoints(item)
        return
    if not isinstance(tree, dict):
        return
    if "Host" in tree and "Port" in tree and ("NodeId" in tree or "BrokerId" in tree):
        yield tree
    for key, value in tree.items():
        if isinstance(value, dict | list) and not key.startswith("_"):
            yield from _tree_endpoints(value)


def rewrite_response(
    frame: bytes,
    api_key: int,
    api_version: int,
    local_address: Callable[[int, str, int], tuple[str, int] | None],
    learned: list[Endpoint] | None = None,
    topics: dict[str, str] | None = None,
) -> bytes | None:
    """The frame with every broker address replaced, or None when nothing needs to change.

    ``local_address(node_id, host, port)`` returns the (host, port) clients should use for
    that broker (opening a listener for it if needed), or None to leave it. Every endpoint
    seen is appended to ``learned``; topic id -> name pairs go to ``topics``. Raises
    ``message_codec.CodecError`` (or struct.error/ValueError) when the frame does not decode.
    """
    decoder = protocol.response_decoder(api_key, api_version)
    if decoder is None:
        return None
    header_version = protocol.response_header_version(api_key, api_version)
    header, body_at = message_codec.decode_header("response", header_version, frame, 4)
    fields, stop = decoder(frame, body_at, len(frame))
    if stop > len(frame):
        raise message_codec.CodecError("body runs past the frame")
    if topics is not None:
        topic_ids(fields, topics)
    changes = {}
    for endpoint in iter_endpoints(fields):
        node_id, host, port = endpoint["node_id"], endpoint["host"], endpoint["port"]
        if node_id is None or node_id < 0 or not host or port is None or port <= 0:
            continue
        if learned is not None:
            learned.append((node_id, host, port))
        target = local_address(node_id, host, port)
        if target is not None and target != (host, port):
            changes[(node_id, host, port)] = target
    if not changes:
        return None
    body = message_codec.decode_message("response", api_key, api_version, frame, body_at, zero_copy=True)
    for struct_ in _tree_endpoints(body):
        node_id = struct_.get("NodeId", struct_.get("BrokerId"))
        new = changes.get((node_id, struct_["Host"], struct_["Port"]))
        if new is not None:
            struct_["Host"], struct_["Port"] = new
    payload = message_codec.encode_header("response", header_version, header) + message_codec.encode_message(
        "response", api_key, api_version, body
    )
    return _I32.pack(len(payload)) + payload


DECODE_ERRORS = _DECODE_ERRORS


# ---- walking a frame held in pieces ---------------------------------------------------

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "float64": 8, "uuid": 16}
_NULLABLE = 1
_CLASSIC_ENCODING = 2
_I16 = struct.Struct(">h").unpack_from
_I32U = struct.Struct(">i").unpack_from


class _Unsure(Exception):
    """The walk cannot tell (unknown type, short or malformed frame): take the safe path."""


class _Pieces:
    """Random access to a frame that lies in several buffers, without joining them."""

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

    def window(self, pos: int, n: int) -> tuple[Any, int]:
        """(buffer, offset) holding frame bytes ``pos .. pos+n`` contiguously."""
        if pos < 0 or pos + n > self.end:
            raise _Unsure
        i = bisect_right(self.starts, pos) - 1
        start = self.starts[i]
        piece = self.pieces[i]
        if pos + n <= start + len(piece):
            return piece, pos - start
        out = bytearray()
        while len(out) < n:
            piece = self.pieces[i]
            out += piece[pos + len(out) - self.starts[i] : pos + n - self.starts[i]]
            i += 1
        return out, 0

    def i16(self, pos: int) -> int:
        buf, at = self.window(pos, 2)
        return _I16(buf, at)[0]

    def i32(self, pos: int) -> int:
        buf, at = self.window(pos, 4)
        return _I32U(buf, at)[0]

    def i8(self, pos: int) -> int:
        buf, at = self.window(pos, 1)
        value = buf[at]
        return value - 256 if value > 127 else value

    def uvarint(self, pos: int) -> tuple[int, int]:
        value = shift = 0
        for _ in range(5):
            buf, at = self.window(pos, 1)
            byte = buf[at]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, pos
            shift += 7
        raise _Unsure


@cache
def _carries(field: tuple[Any, ...]) -> bool:
    """True if this field (a struct or array of structs) can hold a node endpoint."""
    children = field[5]
    return bool(children) and _has_node_struct(children)


def _freeze(fields: list[Any]) -> tuple[Any, ...]:
    return tuple((f[0], f[1], f[2], f[3], f[4], _freeze(f[5]) if f[5] else None) for f in fields)


@cache
def _walk_plan(api_key: int, api_version: int) -> tuple[bool, tuple[Any, ...], int] | None:
    """(flexible, layout, header version) of responses ``may_carry_endpoints`` can walk."""
    entry = protocol.layout("response", api_key, api_version)
    if entry is None:
        return None
    fields = _freeze(entry[1])
    if _names_topic_ids(fields):  # topic ids are learned from responses naming topics both ways
        return None
    return entry[0], fields, protocol.response_header_version(api_key, api_version)


def _names_topic_ids(fields: tuple[Any, ...]) -> bool:
    roles = {field[4] for field in fields}
    if {"topic", "topic_id"} <= roles:
        return True
    return any(field[5] and _names_topic_ids(field[5]) for field in fields)


class _Found(Exception):
    """An address-carrying struct is present."""


def _length(r: _Pieces, pos: int, compact: bool, wide: bool) -> tuple[int, int]:
    if compact:
        n, pos = r.uvarint(pos)
        return n - 1, pos
    if wide:
        return r.i32(pos), pos + 4
    return r.i16(pos), pos + 2


def _walk_field(r: _Pieces, pos: int, field: tuple[Any, ...], flexible: bool) -> int:
    _name, ftype, flags, _tag, _role, children = field
    compact = flexible and not flags & _CLASSIC_ENCODING
    size = _FIXED.get(ftype)
    if size is not None:
        return pos + size
    if ftype in ("string", "bytes", "records"):
        n, pos = _length(r, pos, compact, wide=ftype != "string")
        return pos + n if n > 0 else pos
    if ftype == "{}":
        if flags & _NULLABLE:
            if r.i8(pos) < 0:
                return pos + 1
            pos += 1
        if children and _carries(field):
            raise _Found
        return _walk_struct(r, pos, children or (), flexible)
    if not ftype.startswith("[]"):
        raise _Unsure
    element = ftype[2:]
    n, pos = _length(r, pos, compact, wide=True)
    if n <= 0:
        return pos
    if n > r.end - pos:
        raise _Unsure
    if element == "":
        if _carries(field):
            raise _Found
        for _ in range(n):
            pos = _walk_struct(r, pos, children or (), flexible)
        return pos
    size = _FIXED.get(element)
    if size is not None:
        return pos + size * n
    if element in ("string", "bytes"):
        for _ in range(n):
            m, pos = _length(r, pos, compact, wide=element != "string")
            if m > 0:
                pos += m
        return pos
    raise _Unsure


def _walk_struct(r: _Pieces, pos: int, fields: tuple[Any, ...], flexible: bool) -> int:
    for field in fields:
        if field[3] is None:
            pos = _walk_field(r, pos, field, flexible)
    if flexible:
        pos = _walk_tagged(r, pos, fields)
    return pos


def _walk_tagged(r: _Pieces, pos: int, fields: tuple[Any, ...]) -> int:
    count, pos = r.uvarint(pos)
    for _ in range(count):
        tag, pos = r.uvarint(pos)
        size, pos = r.uvarint(pos)
        for field in fields:
            if field[3] == tag and _carries(field):
                # present, but perhaps empty (Tansu always sends an empty NodeEndpoints)
                if _walk_field(r, pos, field, True) != pos + size:
                    raise _Unsure
                break
        pos += size
    return pos


def may_carry_endpoints(pieces: Sequence[Any], api_key: int, api_version: int) -> bool:
    """Whether a response frame (length prefix included) held as ``pieces`` may name a broker.

    False only when the whole frame was walked to its exact end and no struct that can
    hold a node endpoint is present (empty arrays and absent tagged fields hold none);
    True whenever in doubt, so the caller then joins and rewrites as usual.
    """
    plan = _walk_plan(api_key, api_version)
    if plan is None:
        return True
    flexible, fields, header_version = plan
    r = _Pieces(pieces)
    try:
        if r.i32(0) + 4 != r.end:
            return True
        pos = 8  # length prefix, correlation id
        if header_version >= 1:
            pos = _walk_tagged(r, pos, ())
        pos = _walk_struct(r, pos, fields, flexible)
    except _Found:
        return True
    except (_Unsure, IndexError, struct.error):
        return True
    return pos != r.end
