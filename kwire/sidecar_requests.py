"""Counting a tapped connection's requests for ``kwire_proxy_requests_total``, as the proxy does.

The proxy counts each request when it reads its header on the forwarding path
(``Metrics.count_request``: api, version and client id, each as the protocol table knows it).
``kwire capture`` has no forwarding path, so ``RequestCounter`` reads the client's bytes of one
connection the same way: frame by frame, the head of each with ``proxy.framing.parse_request_head``
(at most ``HEAD_LIMIT`` bytes kept per connection), the rest of the frame skipped unread.

Where it cannot know where frames start it counts nothing until it is sure again: after bytes the
capture lost (a gap), on a connection joined mid-way, after a SaslHandshake v0 of a mechanism
whose token count is not fixed (unframed SASL tokens follow, credentials that must never become a
label: ``decoder.sasl``), and when a connection's first frame is not a Kafka request (a
handshake-less GSSAPI token). After a SaslHandshake v0 of PLAIN or SCRAM it skips their client
tokens, frames it never reads (``decoder.sasl.FIXED_ROUNDS``), and counts on. It is sure again
at the start of a segment holding a whole frame that decodes as a request
(``decoder.connection.decodes_as_request``; a token practically never does). Requests missed
that way are in the rows (the recorder's decoder hunts for frames too) but not in the counter.
"""

from __future__ import annotations

from typing import Any

from decoder.connection import decodes_as_request, looks_like_request
from decoder.sasl import FIXED_ROUNDS, starts_raw_exchange
from proxy.framing import HEAD_LIMIT, parse_request_head

__all__ = ["RequestCounter"]


class RequestCounter:
    """Counts the requests in one connection's client -> broker bytes into ``metrics``."""

    __slots__ = ("first", "head", "metrics", "skip", "synced", "tokens")

    def __init__(self, metrics: Any, synced: bool = True) -> None:
        """``synced``: the bytes start at a frame boundary (the capture saw the connection open)."""
        self.metrics = metrics
        self.synced = synced
        self.first = synced  # the next frame is the connection's first
        self.head = bytearray()  # the current frame's first bytes, until its head is read
        self.skip = 0  # bytes of the current frame still to pass
        self.tokens = 0  # unframed SASL client tokens still to pass unread

    def gap(self) -> None:
        """Bytes were lost: count nothing until a frame boundary is certain again."""
        self.synced = False
        self.first = False
        self.head.clear()
        self.skip = 0
        self.tokens = 0

    def data(self, chunk: Any) -> None:
        """The next bytes the client sent."""
        end = len(chunk)
        if not self.synced:
            if not _whole_request_at_start(chunk, end):
                return
            self.synced = True
        pos = 0
        while pos < end and self.synced:
            if self.skip:
                step = min(self.skip, end - pos)
                self.skip -= step
                pos += step
                continue
            had = len(self.head)
            if self.tokens:  # a SASL token: its 4-byte length, and nothing else, is read
                taken = min(4 - had, end - pos)
                self.head += chunk[pos : pos + taken]
                pos += taken
                if len(self.head) == 4:
                    self.skip = max(int.from_bytes(self.head, "big", signed=True), 0)
                    self.head.clear()
                    self.tokens -= 1
                continue
            taken = min(HEAD_LIMIT - had, end - pos)
            self.head += chunk[pos : pos + taken]
            try:
                head = parse_request_head(self.head, 0, len(self.head))
            except ValueError:  # a negative or tiny length: not a request frame
                self.gap()
                return
            if head is None:  # more bytes needed
                pos += taken
                continue
            if self.first and not looks_like_request(self.head, 0, len(self.head)):
                self.gap()  # not Kafka framing (a handshake-less GSSAPI token): wait for a request
                return
            self.first = False
            self.head.clear()
            if head.size - had <= taken:
                pos += head.size - had
            else:
                self.skip = head.size - had - taken
                pos += taken
            self.metrics.count_request(head.api_key, head.api_version, head.client_id)
            if starts_raw_exchange(head.api_key, head.api_version):  # unframed SASL tokens follow
                rounds = FIXED_ROUNDS.get(head.mechanism or "")
                if rounds is None:
                    self.gap()  # how many, only the mechanism knows: wait for a request
                    return
                self.tokens = rounds[0]


def _whole_request_at_start(chunk: Any, end: int) -> bool:
    """Whether ``chunk`` starts with a whole frame that decodes as a request."""
    if end < 12 or not looks_like_request(chunk, 0, end):
        return False
    size = int.from_bytes(bytes(chunk[0:4]), "big") + 4
    return size <= end and decodes_as_request(chunk, 0, size)
