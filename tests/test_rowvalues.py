"""The compiled row values (decoder/_rowvalues.c) against their Python reference (decoder.extract).

Every exchange of every real capture gives the same values, in the same key order, without the C
walk handing one back to the reference; rows are identical with and without the compiled walk;
mutated field trees give the same values or the same exception either way; and the per-row caps
(batches, legacy message CRCs) cut at the same places.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import kwire.rows
from decoder import extract
from decoder.records import MAX_BATCHES_KEPT, MAX_MESSAGE_CRCS_KEPT, RecordsSummary
from kwire.decode_command import decode_captures

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted(
    [
        *REPO.glob("captures/*.pcap"),
        *REPO.glob("captures/lab/**/capture.pcap*"),
        *REPO.glob(".cache/bench/chatty.pcap"),
    ]
)
C = extract._rowvalues

pytestmark = pytest.mark.skipif(C is None, reason="KWIRE_PURE_PYTHON=1: no compiled row values")


def _ordered(value: Any) -> Any:
    """Values as comparable data, dict key order included."""
    if type(value) is dict:
        return [(key, _ordered(item)) for key, item in value.items()]
    if type(value) is list:
        return [_ordered(item) for item in value]
    return value


def _outcome(fn: Any, api_key: Any, fields: Any) -> Any:
    try:
        return ("ok", _ordered(fn(api_key, fields)))
    except Exception as exc:  # the reference's exception is the answer
        return ("raised", type(exc), str(exc))


def _rows(path: Path) -> list[dict[str, Any]]:
    exchanges: list[dict[str, Any]] = []
    decode_captures([path], exchanges.append, lambda row: None)
    return exchanges


@pytest.fixture(scope="module")
def exchanges() -> list[tuple[int, Any, Any]]:
    """(api key, request fields, response fields) of every exchange of every capture."""
    seen: list[tuple[int, Any, Any]] = []
    original = kwire.rows.exchange_values

    def keep(api_key: int, request: Any, response: Any) -> dict[str, Any]:
        seen.append((api_key, request, response))
        return original(api_key, request, response)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kwire.rows, "exchange_values", keep)
        mp.setattr(kwire.rows, "_exchange_row", None)  # every row through ExchangeRows._row
        for path in CAPTURES:
            _rows(path)
    return seen


class _Counting:
    """The reference functions, configured into the C module, counting the calls handed to them."""

    def __init__(self) -> None:
        self.calls = 0

    def __enter__(self) -> _Counting:
        def count(fn: Any) -> Any:
            def counted(api_key: Any, fields: Any) -> Any:
                self.calls += 1
                return fn(api_key, fields)

            return counted

        self._configure(count(extract.request_values), count(extract.response_values))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._configure(extract.request_values, extract.response_values)

    @staticmethod
    def _configure(request: Any, response: Any) -> None:
        C.configure(
            RecordsSummary,
            extract.batch_identity,
            extract.CODEC_OF,
            extract._CODEC_NAMES,
            MAX_BATCHES_KEPT,
            MAX_MESSAGE_CRCS_KEPT,
            request,
            response,
        )


def test_exchange_values_use_the_compiled_walks() -> None:
    assert extract._request_values is C.request_values
    assert extract._response_values is C.response_values


def test_every_captured_exchange_gives_the_same_values_without_falling_back(
    exchanges: list[tuple[int, Any, Any]],
) -> None:
    assert len(exchanges) > 1000
    apis = {api_key for api_key, _, _ in exchanges}
    assert {0, 1, 3, 10, 18} <= apis  # Produce, Fetch, Metadata, FindCoordinator, ApiVersions
    with _Counting() as handed:
        differ = [
            (api_key, which)
            for api_key, request, response in exchanges
            for which, c, ref, fields in (
                ("request", C.request_values, extract.request_values, request),
                ("response", C.response_values, extract.response_values, response),
            )
            if _outcome(c, api_key, fields) != _outcome(ref, api_key, fields)
        ]
        assert differ == []
        handed.calls = 0
        for api_key, request, response in exchanges:
            C.request_values(api_key, request)
            C.response_values(api_key, response)
        assert handed.calls == 0


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_rows_identical_with_and_without_the_compiled_row_values(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = _rows(path)
    monkeypatch.setattr(extract, "_request_values", extract.request_values)
    monkeypatch.setattr(extract, "_response_values", extract.response_values)
    monkeypatch.setattr(kwire.rows, "_exchange_row", None)  # it holds the compiled walks
    reference = _rows(path)
    assert len(compiled) == len(reference) > 0
    assert [_ordered(row) for row in compiled] == [_ordered(row) for row in reference]


_ODD_VALUES = (
    None,
    True,
    False,
    0,
    -1,
    2**70,
    1.5,
    "",
    "x",
    b"x",
    [],
    ["a", 1, "b"],
    [{}],
    {},
    ("t",),
    [None],
)


def _copy(value: Any) -> Any:
    if type(value) is dict:
        return {key: _copy(item) for key, item in value.items()}
    if type(value) is list:
        return [_copy(item) for item in value]
    return value


def _nodes(value: Any, found: list[Any]) -> list[Any]:
    if type(value) is dict:
        found.append(value)
        for item in value.values():
            _nodes(item, found)
    elif type(value) is list:
        found.append(value)
        for item in value:
            _nodes(item, found)
    return found


def _mutate(fields: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A copy with one container changed: a value replaced by an odd one, a key added or removed,
    or an item of a list replaced."""
    fields = _copy(fields)
    node = rng.choice(_nodes(fields, []))
    odd = rng.choice(_ODD_VALUES)
    if type(node) is dict:
        keys = list(node)
        roll = rng.random()
        if keys and roll < 0.6:
            node[rng.choice(keys)] = odd
        elif keys and roll < 0.75:
            del node[rng.choice(keys)]
        else:
            role = rng.choice(
                (
                    "topic",
                    "topic_id",
                    "error_code",
                    "records",
                    "host",
                    "port",
                    "leader",
                    "api_key",
                    "high_watermark",
                    "group_id",
                    "member_id",
                    "partition",
                    "controller_id",
                )
            )
            node[role] = odd
    elif node:
        node[rng.randrange(len(node))] = odd
    else:
        node.append(odd)
    return fields


def test_mutated_fields_give_the_same_values_or_the_same_error(exchanges: list[tuple[int, Any, Any]]) -> None:
    rng = random.Random(22)
    samples = rng.sample(exchanges, min(len(exchanges), 3000))
    differ = []
    for api_key, request, response in samples:
        for c, ref, fields in (
            (C.request_values, extract.request_values, request),
            (C.response_values, extract.response_values, response),
        ):
            if not fields:
                continue
            for _ in range(3):
                mutated = _mutate(fields, rng)
                if _outcome(c, api_key, mutated) != _outcome(ref, api_key, mutated):
                    differ.append((api_key, repr(mutated)[:200]))
    assert differ == []


def _summary(entries: list[Any], batches: int, records: int, codecs: int) -> RecordsSummary:
    summary = RecordsSummary((batches, records, codecs))
    summary.entries = tuple(entries)
    return summary


def _v2(base: int, attrs: int = 0) -> tuple[int, ...]:
    return (base, 100, 3, 2, 0xFFFFFFFF, attrs, 4, 1_700_000_000_000, 1_700_000_000_001, 7, 1, base, 5)


def test_caps_and_odd_batches_cut_at_the_same_places() -> None:
    many = _summary([_v2(i, attrs=i % 64) for i in range(MAX_BATCHES_KEPT + 7)], MAX_BATCHES_KEPT + 7, 1, 3)
    legacy = {"magic": 1, "message_crcs": list(range(MAX_MESSAGE_CRCS_KEPT - 3)), "base_offset": 9}
    crcs = _summary([legacy, dict(legacy), dict(legacy)], 3, 3, 1)
    produce = {
        "acks": -1,
        "topics": [
            {
                "topic": "a",
                "partitions": [{"partition": 0, "records": many}, {"partition": True, "records": crcs}],
            },
            {"topic": "b", "partitions": [{"partition": 1, "records": _summary([(1, 2)], 1, 1, 1)}]},
        ],
    }
    short = {
        "topics": [
            {"topic": "b", "partitions": [{"partition": 1, "records": _summary([_v2(1), (1, 2)], 2, 2, 1)}]}
        ]
    }
    legacy_only = {"topics": [{"topic": "c", "partitions": [{"partition": 2, "records": crcs}]}]}
    fetch = {
        "responses": [
            {
                "topic": "a",
                "partitions": [{"partition": 0, "error_code": 0, "high_watermark": 9, "records": many}],
            }
        ]
    }
    cases = [(0, produce), (0, short), (0, legacy_only), (1, fetch), (1, {"responses": [{"x": crcs}]})]
    for api_key, fields in cases:
        for c, ref in (
            (C.request_values, extract.request_values),
            (C.response_values, extract.response_values),
        ):
            assert _outcome(c, api_key, fields) == _outcome(ref, api_key, fields)
    # past the cap, the short header is never read; before it, the reference raises and so does C
    assert _outcome(C.request_values, 0, produce)[0] == "ok"
    assert len(C.request_values(0, produce)["batches"]) == MAX_BATCHES_KEPT
    assert _outcome(C.request_values, 0, short)[0] == "raised"
    kept = C.request_values(0, legacy_only)["batches"]
    assert [len(b["message_crcs"]) for b in kept] == [MAX_MESSAGE_CRCS_KEPT - 3, 3, 0]


def test_inputs_the_walk_does_not_expect_go_to_the_reference() -> None:
    for api_key, fields in [
        (0, None),
        (0, {}),
        (0, []),
        (3, {"brokers": [{"host": "h", "port": 1}, "not a struct"]}),
        (18, {"api_keys": [{"api_key": 0, "min_version": 0, "max_version": 9}, 5]}),
        (True, {"topics": [{"topic": "t"}]}),
        (2**80, {"topics": [{"topic": "t"}]}),
        ("3", {"topics": [{"topic": "t"}]}),
    ]:
        for c, ref in (
            (C.request_values, extract.request_values),
            (C.response_values, extract.response_values),
        ):
            assert _outcome(c, api_key, fields) == _outcome(ref, api_key, fields), (api_key, fields)
