"""ApiVersions answers skip the generic walk of ``decoder.extract`` for their ``ApiKeys`` entries
(kept as decoded): the row values must be those of the walk, for every version in the table, with
and without supported/finalized features, and on every ApiVersions answer in the real captures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from decoder import protocol
from decoder.extract import _child_structs, _ResponseScan, response_values
from decoder.message_codec import default_tree, encode_message
from kwire.decode_command import decode_captures

REPO = Path(__file__).resolve().parents[1]
_API_VERSIONS = 18
VERSIONS = [v for v in range(64) if protocol.response_decoder(_API_VERSIONS, v) is not None]


def _walked(fields: dict[str, Any]) -> dict[str, Any]:
    """``response_values`` with every struct walked by ``_ResponseScan.scan`` (no fast path)."""
    scan = _ResponseScan(_API_VERSIONS)
    for child in _child_structs(fields):
        scan.scan(child, None, None)
    values = response_values(_API_VERSIONS, fields)
    return values | {"api_versions": scan.api_versions}


def _decoded(version: int, tree: dict[str, Any]) -> dict[str, Any]:
    body = encode_message("response", _API_VERSIONS, version, tree)
    fields, stop = protocol.response_decoder(_API_VERSIONS, version)(body, 0, len(body))
    assert stop == len(body)
    return fields


def test_the_table_has_api_versions_answers() -> None:
    assert VERSIONS[:4] == [0, 1, 2, 3]


@pytest.mark.parametrize("version", VERSIONS)
def test_api_keys_entries_give_the_walks_values(version: int) -> None:
    tree = default_tree("response", _API_VERSIONS, version)
    tree["ApiKeys"] = [{"ApiKey": key, "MinVersion": key % 3, "MaxVersion": 9 + key} for key in range(70)]
    for name in ("SupportedFeatures", "FinalizedFeatures"):
        if name in tree:
            tree[name] = [{"Name": f"feature-{i}", "MinVersion": 1, "MaxVersion": 2 + i} for i in range(3)]
    fields = _decoded(version, tree)
    values = response_values(_API_VERSIONS, fields)
    assert len(values["api_versions"]) == 70
    assert values["api_versions"][5] == {"api_key": 5, "min_version": 2, "max_version": 14}
    assert values == _walked(fields)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_empty_answer_gives_the_walks_values(version: int) -> None:
    fields = _decoded(version, default_tree("response", _API_VERSIONS, version))
    values = response_values(_API_VERSIONS, fields)
    assert values["api_versions"] == []
    assert values == _walked(fields)


def test_every_api_versions_answer_in_the_captures_gives_the_walks_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, Any]] = []
    inner = protocol._decoder

    def keeping(direction: str, api_key: int, api_version: int) -> Any:
        fn = inner(direction, api_key, api_version)
        if fn is None or direction != "response" or api_key != _API_VERSIONS:
            return fn

        def decode(buf: Any, pos: int, end: int) -> Any:
            fields, stop = fn(buf, pos, end)
            seen.append(fields)
            return fields, stop

        return decode

    monkeypatch.setattr(protocol, "_decoder", keeping)
    monkeypatch.setattr(protocol, "_request_plans", {})
    monkeypatch.setattr(protocol, "_response_plans", {})
    captures = sorted([*REPO.glob("captures/*.pcap"), *REPO.glob("captures/lab/**/capture.pcap*")])
    decode_captures(captures, lambda row: None, lambda row: None)
    assert len(seen) >= 20
    entries = 0
    for fields in seen:
        values = response_values(_API_VERSIONS, fields)
        assert values == _walked(fields)
        entries += len(values["api_versions"])
    assert entries >= 20 * 40  # real brokers answer with dozens of apis each
