"""``proxy.rewrite.may_carry_endpoints``: the walk that lets the proxy forward a held Fetch or
Produce response as the pieces it arrived in. It may say False only when the frame provably
names no broker; every doubt (an endpoint present, a frame cut short or overlong) must say True,
and the answer must not depend on how the frame was split into pieces."""

from __future__ import annotations

import random
from typing import Any

import pytest

from decoder import message_codec as mc
from proxy.rewrite import may_carry_endpoints, rewrite_response

FETCH, PRODUCE = 1, 0
ENDPOINT = {"NodeId": 1, "Host": "broker-1.internal", "Port": 9092, "Rack": None}


def fetch_response(version: int, endpoints: bool) -> dict[str, Any]:
    tree = mc.default_tree("response", FETCH, version)
    partition = {
        "PartitionIndex": 0,
        "ErrorCode": 0,
        "HighWatermark": 10,
        "LastStableOffset": 10,
        "LogStartOffset": 0,
        "AbortedTransactions": [],
        "PreferredReadReplica": -1,
        "Records": bytes(range(256)) * 8,  # skipped by length, never read
    }
    tree["Responses"] = [{"TopicId": bytes(range(16)), "Partitions": [partition]}]
    if endpoints:
        tree["NodeEndpoints"] = [ENDPOINT]
    return tree


def produce_response(version: int, endpoints: bool) -> dict[str, Any]:
    tree = mc.default_tree("response", PRODUCE, version)
    tree["Responses"] = [
        {
            "Name": "orders",
            "PartitionResponses": [
                {
                    "Index": 0,
                    "ErrorCode": 0,
                    "BaseOffset": 5,
                    "LogAppendTimeMs": -1,
                    "LogStartOffset": 0,
                    "RecordErrors": [],
                    "ErrorMessage": None,
                }
            ],
        }
    ]
    if endpoints:
        tree["NodeEndpoints"] = [ENDPOINT]
    return tree


CASES = [(FETCH, 16, fetch_response), (FETCH, 17, fetch_response), (PRODUCE, 11, produce_response)]


def frame(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    return mc.encode_frame("response", api_key, version, {"CorrelationId": 7}, body)


def splits(data: bytes, rnd: random.Random, count: int = 20) -> list[list[memoryview]]:
    """``data`` whole, byte by byte, and in ``count`` random splittings."""
    view = memoryview(data)
    out = [[view], [view[i : i + 1] for i in range(len(data))]]
    for _ in range(count):
        cuts = sorted(rnd.sample(range(1, len(data)), rnd.randint(1, min(12, len(data) - 1))))
        out.append([view[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)])
    return out


@pytest.mark.parametrize(("api_key", "version", "build"), CASES)
def test_a_response_without_endpoints_is_forwarded_as_pieces(api_key, version, build) -> None:
    data = frame(api_key, version, build(version, endpoints=False))
    assert rewrite_response(data, api_key, version, lambda *_: ("127.0.0.1", 1)) is None  # nothing to rewrite
    for pieces in splits(data, random.Random(version)):
        assert may_carry_endpoints(pieces, api_key, version) is False


@pytest.mark.parametrize(("api_key", "version", "build"), CASES)
def test_a_response_with_endpoints_is_held_for_rewriting(api_key, version, build) -> None:
    data = frame(api_key, version, build(version, endpoints=True))
    assert rewrite_response(data, api_key, version, lambda *_: ("127.0.0.1", 1)) is not None
    for pieces in splits(data, random.Random(version)):
        assert may_carry_endpoints(pieces, api_key, version) is True


@pytest.mark.parametrize(("api_key", "version", "build"), CASES)
def test_doubt_means_hold(api_key, version, build) -> None:
    data = frame(api_key, version, build(version, endpoints=False))
    cut_short = data[:-1]
    overlong = data + b"\0"  # more bytes than the length prefix says
    relabelled = (len(data) - 4 + 1).to_bytes(4, "big") + data[4:] + b"\0"  # length agrees, body too long
    for bad in (cut_short, overlong, relabelled):
        for pieces in splits(bad, random.Random(len(bad)), count=5):
            assert may_carry_endpoints(pieces, api_key, version) is True


def test_an_api_without_a_walk_plan_is_always_held() -> None:
    data = frame(3, 12, mc.default_tree("response", 3, 12))  # Metadata: always rewritten
    assert may_carry_endpoints([data], 3, 12) is True
