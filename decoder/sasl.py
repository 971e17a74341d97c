"""SASL token exchanges outside Kafka framing: when they start, when they end (sans-io).

Kafka clients authenticate over SASL in one of three ways, and in two of them the bytes on the
wire are credentials that are *not* Kafka requests:

* **SaslHandshake v1+ then SaslAuthenticate** (KIP-152, Kafka 1.0+): every token travels in the
  ``auth_bytes`` field of a normal request or response. Those are decoded like any frame; the
  protocol table gives ``auth_bytes`` no role, so its value is skipped, never kept.
* **SaslHandshake v0 then unframed tokens** (KIP-43, Kafka 0.10): once the broker has answered
  the handshake with no error, each side sends tokens as a 4-byte length and the raw bytes, with
  no request or response header, until the mechanism is done. Read as Kafka, PLAIN's
  ``NUL user NUL password`` gives an "api version" that is the password's first byte and a
  "correlation id" of four more.
* **No handshake at all** (Kafka 0.9 clients, GSSAPI only): the first frame on the connection is
  already a token, an RFC 2743 initial context token whose first byte is ``0x60``. Brokers before
  4.0 fall back to GSSAPI on a first frame that is not a Kafka request; 4.0 closes the connection.

``RawExchange`` tracks the last two. When an exchange ends follows the broker
(``SaslServerAuthenticator``): the broker leaves the token state once its ``SaslServer`` is
complete, which only the mechanism knows. So:

* mechanisms with a fixed shape end after a fixed number of tokens (``FIXED_ROUNDS``): PLAIN is
  one client token and the broker's (empty) answer, SCRAM two tokens each way. A failure is not
  answered in this mode: the broker closes the connection;
* any other mechanism (GSSAPI, OAUTHBEARER, custom ones) ends, on the client side, at the first
  frame that is plainly a Kafka request: a known api key and version, a printable client id and a
  body that decodes (``decoder.connection.decodes_as_request``; the proxy decides the same way,
  trusting the header alone only for a frame over 1 KiB); on the broker side, once the client side
  has ended, at the first frame whose correlation id is one of a request sent since.

The client side is counted from the handshake request itself, not from its answer: a client that
writes its token right behind the handshake must not have it read as a request. The broker side
starts once the answer has passed (and never, if the answer is an error).

What cannot be known: in a capture that starts after the connection opened, a 0.9 client's
handshake-less exchange looks like nothing in particular. The decoder then hunts for frames, and a
hunt accepts a client frame only if it decodes as a request (a token practically never does),
but it may take a broker token for a response to a request it never saw (an orphan response, whose
correlation id is then 4 bytes of that token).
"""

from __future__ import annotations

__all__ = [
    "FIXED_ROUNDS",
    "GSSAPI_TOKEN_TAG",
    "HANDSHAKE",
    "RawExchange",
    "starts_raw_exchange",
]

HANDSHAKE = 17
#: First byte of a GSSAPI initial context token (RFC 2743 3.1), what a Kafka 0.9 client sends first.
GSSAPI_TOKEN_TAG = 0x60

#: Mechanism -> (client tokens, broker tokens) of a successful unframed exchange, where that is fixed.
FIXED_ROUNDS: dict[str, tuple[int, int]] = {
    "PLAIN": (1, 1),
    "SCRAM-SHA-256": (2, 2),
    "SCRAM-SHA-512": (2, 2),
}

_WAITING, _OPEN, _DONE = 0, 1, 2  # broker side: the handshake answer not seen yet / tokens / ended


def starts_raw_exchange(api_key: int, api_version: int) -> bool:
    """True for the request after which the client sends unframed tokens: SaslHandshake v0."""
    return api_key == HANDSHAKE and api_version == 0


class RawExchange:
    """How far one unframed SASL exchange has got; counts its frames and bytes, keeps none.

    ``handshake``: it follows a SaslHandshake v0 request (its broker side opens when
    ``handshake_answered`` says so); False: the first frame was a token (Kafka 0.9 GSSAPI).
    """

    __slots__ = (
        "client_bytes",
        "client_frames",
        "client_left",
        "client_open",
        "end_ns",
        "handshake",
        "mechanism",
        "server",
        "server_bytes",
        "server_frames",
        "server_left",
        "start_ns",
    )

    def __init__(self, mechanism: str | None, handshake: bool, start_ns: int) -> None:
        self.mechanism = mechanism
        self.handshake = handshake
        rounds = FIXED_ROUNDS.get(mechanism.upper()) if mechanism else None
        self.client_left: int | None = rounds[0] if rounds else None
        self.server_left: int | None = rounds[1] if rounds else None
        self.client_open = True
        self.server = _WAITING if handshake else _OPEN
        self.client_frames = self.client_bytes = 0
        self.server_frames = self.server_bytes = 0
        self.start_ns = self.end_ns = start_ns

    @property
    def fixed(self) -> bool:
        """The mechanism's token count is known (else its end is found by looking at frames)."""
        return self.client_left is not None

    @property
    def server_open(self) -> bool:
        """Frames from the broker are tokens now."""
        return self.server == _OPEN

    @property
    def done(self) -> bool:
        return not self.client_open and self.server == _DONE

    def handshake_answered(self, ok: bool) -> None:
        """The SaslHandshake v0 answer passed: tokens follow from the broker, or (an error) none at all."""
        if self.server != _WAITING:
            return
        if ok:
            self.server = _OPEN
        else:
            self.client_open = False
            self.server = _DONE

    def client_token(self, size: int, end_ns: int) -> None:
        """A client frame of ``size`` bytes (length prefix included) was a token."""
        self.client_frames += 1
        self.client_bytes += size
        self.end_ns = end_ns
        if self.client_left is not None:
            self.client_left -= 1
            if self.client_left <= 0:
                self.client_open = False

    def server_token(self, size: int, end_ns: int) -> None:
        """A broker frame of ``size`` bytes (length prefix included) was a token."""
        self.server_frames += 1
        self.server_bytes += size
        self.end_ns = end_ns
        if self.server_left is not None:
            self.server_left -= 1
            if self.server_left <= 0:
                self.server = _DONE

    def client_ended(self) -> None:
        """The client side is over: a Kafka request came, or its alignment was lost."""
        self.client_open = False

    def server_ended(self) -> None:
        """The broker side is over: a response to a request came, or its alignment was lost."""
        self.server = _DONE
