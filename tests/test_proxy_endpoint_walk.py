"""``proxy.rewrite.may_carry_endpoints``: the walk that lets the proxy forward a held Fetch or
Produce response as the pieces it arrived in. It may say False only when the frame provably
names no broker; every doubt (an endpoint present, a frame cut short or overlong) must say True,
and the answer must not depend on how the frame was split into pieces."""

from __future__ import annotations

import random
from typing import Any

import pytest

from decoder import message_codec as mc
from decoder import protocol
from proxy.rewrite import DECODE_ERRORS, has_endpoints, may_carry_endpoints, rewrite_response

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


@pytest.mark.parametrize(
    ("api_key", "version"), [kv for kv in protocol.all_versions("response") if has_endpoints(*kv)]
)
def test_never_false_where_a_rewrite_would_change_the_frame(api_key: int, version: int) -> None:
    """Every response that can name a broker, as its default tree with a broker named wherever
    its top level has the fields for one (FindCoordinator v0-3 names it there, in no struct):
    wherever rewriting changes the frame, the walk must say True, in one piece or many."""
    tree = mc.default_tree("response", api_key, version)
    if "Host" in tree and "Port" in tree:
        tree.update({k: v for k, v in ENDPOINT.items() if k in tree})
    data = frame(api_key, version, tree)
    if rewrite_response(data, api_key, version, lambda *_: ("127.0.0.1", 1)) is None:
        return
    for pieces in splits(data, random.Random(api_key * 100 + version), count=3):
        assert may_carry_endpoints(pieces, api_key, version) is True


def test_an_api_without_a_walk_plan_is_always_held() -> None:
    data = frame(3, 12, mc.default_tree("response", 3, 12))  # Metadata: always rewritten
    assert may_carry_endpoints([data], 3, 12) is True


def with_header_tag(data: bytes) -> bytes:
    """The frame with one unknown tagged field (tag 5, b"hi") in its flexible response header."""
    assert data[8] == 0  # no header tags yet
    payload = data[4:8] + b"\x01\x05\x02hi" + data[9:]
    return len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize(("api_key", "version", "build"), CASES)
def test_rewrite_skips_header_tags_and_keeps_them(api_key, version, build) -> None:
    """The header is skipped, not decoded, on the way to the body; a rewrite keeps it as it was."""
    plain = with_header_tag(frame(api_key, version, build(version, endpoints=False)))
    assert rewrite_response(plain, api_key, version, lambda *_: ("127.0.0.1", 1)) is None
    data = with_header_tag(frame(api_key, version, build(version, endpoints=True)))
    learned: list[Any] = []
    out = rewrite_response(data, api_key, version, lambda *_: ("127.0.0.1", 1), learned)
    assert learned == [(1, "broker-1.internal", 9092)]
    header, body = mc.decode_frame("response", out, api_key, version)
    assert header == {"CorrelationId": 7, "_unknown_tags": [(5, b"hi")]}
    assert [(e["Host"], e["Port"]) for e in body["NodeEndpoints"]] == [("127.0.0.1", 1)]


@pytest.mark.parametrize(("api_key", "version", "build"), CASES)
def test_rewrite_rejects_header_tags_past_the_frame(api_key, version, build) -> None:
    data = frame(api_key, version, build(version, endpoints=False))
    for bad_tags in (b"\x7f", b"\x01\x05\x7f"):  # a count, then a size, beyond the frame
        payload = data[4:8] + bad_tags + data[9:]
        bad = len(payload).to_bytes(4, "big") + payload
        with pytest.raises(DECODE_ERRORS):
            rewrite_response(bad, api_key, version, lambda *_: ("127.0.0.1", 1))


def test_topic_ids_are_learned_only_where_a_struct_names_both() -> None:
    """Metadata names topics by name and id: learned. A Fetch response (ids only) teaches nothing."""
    topic_id = bytes(range(16))
    tree = mc.default_tree("response", 3, 12)
    tree["Brokers"] = [{"NodeId": 1, "Host": "b1", "Port": 9092, "Rack": None}]
    tree["Topics"] = [
        {
            "ErrorCode": 0,
            "Name": "orders",
            "TopicId": topic_id,
            "IsInternal": False,
            "Partitions": [],
            "TopicAuthorizedOperations": -2147483648,
        }
    ]
    topics: dict[str, str] = {}
    rewrite_response(frame(3, 12, tree), 3, 12, lambda *_: None, [], topics)
    assert list(topics.values()) == ["orders"]
    fetched: dict[str, str] = {}
    rewrite_response(frame(FETCH, 16, fetch_response(16, True)), FETCH, 16, lambda *_: None, [], fetched)
    assert fetched == {}
