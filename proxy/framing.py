"""The little the forwarding path reads of a request: its header, and Produce's acks.

The proxy forwards bytes as they come and only needs, per request frame, the api key,
version and correlation id (to know what each response answers), the client id (metrics and
fault rules), for Produce, acks (acks=0 gets no response), and for SaslHandshake, the mechanism
(how many unframed tokens follow a v0 handshake, ``decoder.sasl``). ``parse_request_head`` reads
those from the first bytes of a frame without copying, and says when it needs more bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from decoder import protocol
from decoder.primitives import read_uvarint

__all__ = ["HEAD_LIMIT", "RequestHead", "parse_request_head"]

#: Bytes of a frame held back at most while its head is read (a longer client id or
#: transactional id is simply not read: the fields are left None).
HEAD_LIMIT = 1024

_HEAD = struct.Struct(">ihhi").unpack_from
_I16 = struct.Struct(">h").unpack_from
_PRODUCE = 0
_SASL_HANDSHAKE = 17


class _Short(Exception):
    """The bytes at hand end before the field."""


@dataclass(slots=True)
class RequestHead:
    size: int  # frame size including the 4-byte length prefix
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    acks: int | None  # Produce only; None when not read
    mechanism: str | None = None  # SaslHandshake only; None when not read

    @property
    def expects_response(self) -> bool:
        return self.acks != 0


def _uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """A varint from the bytes at hand (``end``); ``_Short`` when it is not all there yet."""
    try:
        value, stop = read_uvarint(buf, pos)
    except IndexError:
        raise _Short from None
    if stop > end:
        raise _Short
    return value, stop


def parse_request_head(buf: Any, pos: int, end: int) -> RequestHead | None:
    """The head of the request frame starting at ``buf[pos]`` (``end`` bounds the bytes at hand).

    None when more bytes are needed: fewer than 12, or the optional fields (client id, acks)
    not yet complete while the frame and ``HEAD_LIMIT`` both go further. Raises ValueError
    for a negative length.
    """
    have = end - pos
    if have < 12:
        return None
    length, api_key, api_version, corr = _HEAD(buf, pos)
    if length < 8:
        raise ValueError(f"implausible request length {length}")
    size = length + 4
    stop = min(end, pos + size)  # bytes of this frame at hand
    head = RequestHead(size, api_key, api_version, corr, None, None)
    complete = stop - pos >= min(size, HEAD_LIMIT)
    header_version, body_decoder = protocol.request_plan(api_key, api_version)
    try:
        at = pos + 12
        if header_version >= 1:
            if at + 2 > stop:
                raise _Short
            n = _I16(buf, at)[0]
            at += 2
            if n >= 0:
                if at + n > stop:
                    raise _Short
                head.client_id = str(buf[at : at + n], "utf-8", "replace")
                at += n
        if api_key == _PRODUCE and body_decoder is not None:
            flexible = header_version >= 2
            if flexible:  # header tagged fields
                count, at = _uvarint(buf, at, stop)
                for _ in range(count):
                    _tag, at = _uvarint(buf, at, stop)
                    n, at = _uvarint(buf, at, stop)
                    at += n
            if api_version >= 3:  # transactional id
                if flexible:
                    n, at = _uvarint(buf, at, stop)
                    n -= 1
                else:
                    if at + 2 > stop:
                        raise _Short
                    n = _I16(buf, at)[0]
                    at += 2
                at += max(n, 0)
            if at + 2 > stop:
                raise _Short
            head.acks = _I16(buf, at)[0]
        elif api_key == _SASL_HANDSHAKE and body_decoder is not None:  # v0-v1: a plain string
            if at + 2 > stop:
                raise _Short
            n = _I16(buf, at)[0]
            at += 2
            if at + max(n, 0) > stop:
                raise _Short
            head.mechanism = str(buf[at : at + n], "utf-8", "replace") if n >= 0 else None
    except (_Short, ValueError):
        if not complete:
            return None
    return head
