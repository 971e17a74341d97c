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
from collections.abc import Callable, Iterator, Sequence
from functools import cache, lru_cache
from typing import Any

from decoder import message_codec, protocol
from decoder.pieces import LayoutWalk, Unsure
from decoder.primitives import skip_tagged_fields

__all__ = [
    "Endpoint",
    "RewriteMemo",
    "endpoints",
    "has_endpoints",
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


@lru_cache(maxsize=4096)  # bounded: a hostile client may name any (key, version)
def has_endpoints(api_key: int, api_version: int) -> bool:
    """True if responses of (api key, version) can carry broker addresses."""
    entry = protocol.layout("response", api_key, api_version)
    return entry is not None and _has_node_struct(entry[1])


def endpoints(fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Structs holding node_id + host + port in a body decoded by the compiled decoder."""
    found: list[dict[str, Any]] = []
    _collect_endpoints(fields, found)
    return found


def _collect_endpoints(node: dict[str, Any], found: list[dict[str, Any]]) -> None:
    # a plain recursion over exact types: every Produce response passes here
    if "node_id" in node and "host" in node and "port" in node:
        found.append(node)
    for value in node.values():
        kind = type(value)
        if kind is dict:
            _collect_endpoints(value, found)
        elif kind is list:
            for item in value:
                if type(item) is dict:
                    _collect_endpoints(item, found)


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
    decoder, header_version, names_topic_ids = _read_plan(api_key, api_version)
    if decoder is None:
        return None
    # every Produce response comes this way: the header is skipped, not decoded (it is only
    # needed, below, when the frame is re-encoded)
    body_at = 8 if header_version < 1 else skip_tagged_fields(frame, 8, len(frame))
    fields, stop = decoder(frame, body_at, len(frame))
    if stop > len(frame):
        raise message_codec.CodecError("body runs past the frame")
    if topics is not None and names_topic_ids:
        topic_ids(fields, topics)
    changes = {}
    for endpoint in endpoints(fields):
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
    header, body_at = message_codec.decode_header("response", header_version, frame, 4)
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


class RewriteMemo:
    """``rewrite_response`` remembered by the bytes it read: the same answer is not decoded twice.

    Clients ask for Metadata (and FindCoordinator, DescribeCluster) over and over, and while the
    cluster does not change, every answer is the same bytes after the correlation id. Decoding
    and re-encoding one was 27% of the forwarding loop's Python time at 200 connections asking
    ApiVersions and Metadata in turn (py-spy, issue 18), so an answer already rewritten is
    reused: its rewritten bytes after the correlation id, behind the new length and the
    frame's own correlation id.

    A remembered answer is reused only while every broker it names still maps to the same
    proxy listener (``local_address`` is asked again, so a listener is still opened or found
    as without the memo), and the topic ids it names are learned again. Only answers that
    name a broker are kept, and only small ones (``max_frame``); what is kept is bounded
    (``max_bytes``, oldest first out), so a broker sending ever-new answers costs a fixed
    amount of memory.
    """

    def __init__(self, max_bytes: int = 1 << 20, max_frame: int = 32 << 10) -> None:
        self.max_bytes = max_bytes
        self.max_frame = max_frame
        self._entries: dict[tuple[int, int, bytes], _Remembered] = {}
        self._bytes = 0
        self.hits = 0

    def rewrite(
        self,
        frame: bytes,
        api_key: int,
        api_version: int,
        local_address: Callable[[int, str, int], tuple[str, int] | None],
        topics: dict[str, str],
    ) -> bytes | None:
        """As ``rewrite_response(frame, api_key, api_version, local_address, None, topics)``."""
        if len(frame) > self.max_frame:
            return rewrite_response(frame, api_key, api_version, local_address, None, topics)
        key = (api_key, api_version, bytes(frame[8:]))
        known = self._entries.get(key)
        if known is not None and all(local_address(*seen) == target for seen, target in known.targets):
            self.hits += 1
            topics.update(known.topics)
            if known.tail is None:
                return None
            return _I32.pack(len(known.tail) + 4) + frame[4:8] + known.tail
        learned: list[Endpoint] = []
        named: dict[str, str] = {}
        out = rewrite_response(frame, api_key, api_version, local_address, learned, named)
        topics.update(named)
        if learned:
            tail = None if out is None else out[8:]
            targets = tuple((seen, local_address(*seen)) for seen in learned)
            self._remember(key, _Remembered(tail, targets, tuple(named.items())))
        return out

    def _remember(self, key: tuple[int, int, bytes], entry: _Remembered) -> None:
        size = _size(key, entry)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= _size(key, old)
        while self._entries and self._bytes + size > self.max_bytes:
            first = next(iter(self._entries))
            self._bytes -= _size(first, self._entries.pop(first))
        if size <= self.max_bytes:
            self._entries[key] = entry
            self._bytes += size


class _Remembered:
    """One rewritten answer: its bytes after the correlation id (None: unchanged), the brokers
    it named with the listener each mapped to, and the topic ids it named."""

    __slots__ = ("tail", "targets", "topics")

    def __init__(
        self,
        tail: bytes | None,
        targets: tuple[tuple[Endpoint, tuple[str, int] | None], ...],
        topics: tuple[tuple[str, str], ...],
    ) -> None:
        self.tail = tail
        self.targets = targets
        self.topics = topics


def _size(key: tuple[int, int, bytes], entry: _Remembered) -> int:
    return len(key[2]) + (len(entry.tail) if entry.tail is not None else 0)


@lru_cache(maxsize=4096)  # bounded: callers may pass any (key, version)
def _read_plan(api_key: int, api_version: int) -> tuple[Any, int, bool]:
    """(compiled body decoder, header version, whether it names topic ids) of a response."""
    entry = protocol.layout("response", api_key, api_version)
    names = entry is not None and _names_topic_ids(entry[1])
    return (
        protocol.response_decoder(api_key, api_version),
        protocol.response_header_version(api_key, api_version),
        names,
    )


# ---- walking a frame held in pieces ---------------------------------------------------


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
    if {"node_id", "host", "port"} <= {field[4] for field in fields}:
        return None  # the response itself names a broker (FindCoordinator v0-3): no struct to find
    return entry[0], fields, protocol.response_header_version(api_key, api_version)


def _names_topic_ids(fields: Sequence[Any]) -> bool:
    roles = {field[4] for field in fields}
    if {"topic", "topic_id"} <= roles:
        return True
    return any(field[5] and _names_topic_ids(field[5]) for field in fields)


class _Found(Exception):
    """An address-carrying struct is present."""


class _EndpointWalk(LayoutWalk):
    """The walk that stops (``_Found``) at the first struct that can hold a node endpoint."""

    __slots__ = ()

    def entering(self, field: Sequence[Any]) -> None:
        if field[5] and _carries(field):  # type: ignore[arg-type]
            raise _Found

    def tagged(self, pos: int, fields: Sequence[Any]) -> int:
        count, pos = self.uvarint(pos)
        for _ in range(count):
            tag, pos = self.uvarint(pos)
            size, pos = self.uvarint(pos)
            for field in fields:
                if field[3] == tag and _carries(field):
                    # present, but perhaps empty (Tansu always sends an empty NodeEndpoints)
                    if self.field(pos, field, True) != pos + size:
                        raise Unsure
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
    walk = _EndpointWalk(pieces)
    try:
        if walk.int32(0) + 4 != walk.end:
            return True
        pos = 8  # length prefix, correlation id
        if header_version >= 1:
            pos = walk.tagged(pos, ())
        pos = walk.struct(pos, fields, flexible)
    except _Found:
        return True
    except (Unsure, IndexError, struct.error):
        return True
    return pos != walk.end
