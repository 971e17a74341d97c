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
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from decoder import message_codec, protocol

__all__ = ["Endpoint", "has_endpoints", "iter_endpoints", "rewrite_response", "topic_ids"]

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
