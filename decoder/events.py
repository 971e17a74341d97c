"""The events a ``KafkaConnection`` emits: the decoder's whole public vocabulary.

Frames become ``Request`` and ``Response`` values; events say what happened to them.
Every request ends in exactly one of ``ResponseReceived``, ``NoResponseExpected`` or
``Unanswered``; every response frame ends in ``ResponseReceived`` or ``OrphanResponse``;
a frame too broken to attribute ends in ``MalformedFrame``. So one terminal event is one
exchange row. ``SaslExchange`` (SASL tokens sent outside Kafka framing, see ``decoder.sasl``) and
``Resync`` are informational: no row, and no byte of a token in them.

``Request.status`` / ``Response.status`` say how far decoding got:

* ``ok``: header and body decoded;
* ``unknown_api``: api key or version with no definition (the frame was skipped by its length);
* ``malformed``: the body did not fit the layout (``decode_error`` says where);
* ``truncated``: bytes of the frame are missing from the capture (a gap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "BROKER_TO_CLIENT",
    "CLIENT_TO_BROKER",
    "NEED_DATA",
    "Event",
    "MalformedFrame",
    "NoResponseExpected",
    "OrphanResponse",
    "Request",
    "RequestReceived",
    "Response",
    "ResponseReceived",
    "Resync",
    "SaslExchange",
    "Unanswered",
]

CLIENT_TO_BROKER = 0
BROKER_TO_CLIENT = 1


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by ``KafkaConnection.next_event`` when it needs more bytes.
NEED_DATA = _NeedData()


@dataclass(frozen=True, slots=True)
class Request:
    """One request frame."""

    api_key: int
    api_version: int
    header_version: int
    correlation_id: int
    client_id: str | None
    size: int  # frame bytes including the 4-byte length prefix
    start_ns: int  # first byte seen
    end_ns: int  # last byte seen
    status: str  # ok, unknown_api, malformed, truncated
    fields: dict[str, Any] | None  # body fields by role (see decoder.codegen); None unless decoded
    decode_error: str | None = None

    @property
    def expects_response(self) -> bool:
        """False only for Produce with acks=0."""
        return not (self.api_key == 0 and self.fields is not None and self.fields.get("acks") == 0)


@dataclass(frozen=True, slots=True)
class Response:
    """One response frame."""

    correlation_id: int
    header_version: int
    size: int
    start_ns: int
    end_ns: int
    status: str  # ok, unknown_api, malformed, truncated
    fields: dict[str, Any] | None
    decode_error: str | None = None
    api_version: int | None = None  # layout version used; differs from the request's for
    # ApiVersions answered in v0 format (an unsupported version)


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A request frame was read; its exchange is not finished yet (informational)."""

    request: Request


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A response matched to its request by correlation id (terminal)."""

    request: Request
    response: Response


@dataclass(frozen=True, slots=True)
class NoResponseExpected:
    """A request that by protocol gets no response: Produce with acks=0 (terminal)."""

    request: Request


@dataclass(frozen=True, slots=True)
class OrphanResponse:
    """A response no pending request was waiting for (terminal).

    Usually its request was never seen, and then its body is not decodable. When it answers a
    Produce with acks=0 (which by protocol gets no response, yet some brokers answer),
    ``unexpected_for`` is that request and the body is decoded.
    """

    response: Response
    unexpected_for: Request | None = None


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A request that got no response (terminal).

    ``reason``: ``later_response`` (the broker answered a later request first; Kafka answers in
    order, so this one never will), ``closed`` (the connection ended), ``gap`` (the response
    direction lost bytes, so it may have been answered unseen), ``evicted`` (too many pending).
    """

    request: Request
    reason: str
    end_ns: int


@dataclass(frozen=True, slots=True)
class MalformedFrame:
    """A frame that could not even be attributed (no usable header) (terminal)."""

    direction: int
    size: int
    start_ns: int
    end_ns: int
    reason: str
    correlation_id: int | None = None


@dataclass(frozen=True, slots=True)
class Resync:
    """The decoder lost (or never had) frame alignment in ``direction`` and found it again.

    ``skipped_bytes`` were discarded while hunting for the next plausible frame boundary.
    """

    direction: int
    ts_ns: int
    skipped_bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class SaslExchange:
    """SASL tokens that crossed the connection outside Kafka framing, skipped (informational).

    KIP-43's unframed exchange after SaslHandshake v0 (``handshake`` True), or a Kafka 0.9
    GSSAPI client's tokens sent with no handshake. The tokens are credentials: only their count
    and size are told. ``mechanism`` is the one the handshake asked for (``GSSAPI`` without one).
    ``ended``: ``complete`` (the mechanism's tokens were all seen, or Kafka requests followed),
    ``closed`` (the connection, or the capture, ended first), ``gap`` (bytes were lost), or
    ``rejected`` (the broker refused the mechanism after the client had sent tokens already).
    """

    mechanism: str | None
    handshake: bool
    client_frames: int
    client_bytes: int  # length prefixes included
    server_frames: int
    server_bytes: int
    start_ns: int
    end_ns: int
    ended: str


Event = (
    RequestReceived
    | ResponseReceived
    | NoResponseExpected
    | OrphanResponse
    | Unanswered
    | MalformedFrame
    | Resync
    | SaslExchange
)
