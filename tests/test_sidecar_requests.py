"""``kwire capture``'s request counter (``kwire.sidecar_requests``): requests counted as the proxy
counts them, whatever the segment boundaries; nothing counted where frame boundaries are unsure
(a gap, an unframed SASL exchange, a first frame that is no request), and never a label from a
SASL token's bytes."""

from __future__ import annotations

import struct

import pytest

from kwire.sidecar_requests import RequestCounter
from proxy.metrics import Metrics

MARKER = b"kw-Marker-pw-9d2e"


def _frame(api_key: int, version: int, corr: int, body: bytes = b"", client: bytes = b"counted") -> bytes:
    payload = struct.pack(">hhih", api_key, version, corr, len(client)) + client + body
    return struct.pack(">i", len(payload)) + payload


def _api_versions(corr: int) -> bytes:
    return _frame(18, 0, corr)


def _counts(metrics: Metrics) -> dict[str, dict[tuple[object, object], int]]:
    return metrics.clients.copy()


def test_requests_are_counted_across_any_segment_boundaries() -> None:
    stream = b"".join(_api_versions(i) for i in range(20))
    for size in (1, 5, 13, 64, len(stream)):
        metrics = Metrics()
        counter = RequestCounter(metrics)
        for at in range(0, len(stream), size):
            counter.data(stream[at : at + size])
        assert _counts(metrics) == {"counted": {(18, 0): 20}}, size


def test_after_a_gap_counting_resumes_on_a_whole_request() -> None:
    metrics = Metrics()
    counter = RequestCounter(metrics)
    counter.data(_api_versions(0))
    counter.gap()
    counter.data(_api_versions(1)[5:])  # the rest of a frame the capture lost the start of
    counter.data(_api_versions(2)[:7])  # a frame cut by the segment: not sure yet
    counter.data(_api_versions(3) + _api_versions(4))  # a whole request at the start: sure again
    assert _counts(metrics) == {"counted": {(18, 0): 3}}
    joined = RequestCounter(metrics, synced=False)  # a connection joined mid-way
    joined.data(b"\x00\x00" + _api_versions(5))
    assert _counts(metrics) == {"counted": {(18, 0): 3}}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
@pytest.mark.parametrize("piece", [1, 7, 10_000])
def test_an_unframed_sasl_exchange_is_never_counted_or_labelled(mechanism: str, piece: int) -> None:
    metrics = Metrics()
    counter = RequestCounter(metrics)
    handshake = _frame(17, 0, 1, struct.pack(">h", len(mechanism)) + mechanism.encode())
    # a token whose bytes read as a header would be a whole ApiVersions v0 request with the
    # password as its client id: it must not be counted
    tricky = b"\x00\x12\x00\x00" + b"\x00\x00\x00\x01" + struct.pack(">h", len(MARKER)) + MARKER
    tokens = [tricky] * (1 if mechanism == "PLAIN" else 2)
    stream = handshake + b"".join(struct.pack(">i", len(t)) + t for t in tokens) + _api_versions(2)
    for at in range(0, len(stream), piece):  # as the client wrote it, in pieces of any size
        counter.data(stream[at : at + piece])
    assert _counts(metrics) == {"counted": {(17, 0): 1, (18, 0): 1}}
    assert MARKER.decode() not in metrics.render()


def test_a_first_frame_that_is_no_request_is_not_counted() -> None:
    metrics = Metrics()
    counter = RequestCounter(metrics)
    gssapi = b"\x60\x82\x01\x00" + bytes(60)  # a handshake-less GSSAPI initial token
    counter.data(struct.pack(">i", len(gssapi)) + gssapi)
    counter.data(_api_versions(1))
    assert _counts(metrics) == {"counted": {(18, 0): 1}}
