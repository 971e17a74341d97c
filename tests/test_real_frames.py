"""Real bytes from real clients (kafka-python, confluent-kafka, aiokafka, kcat) against a real
broker (Tansu), recorded by captures/make_captures.py, decoded end to end.

The expected figures come from the clients themselves (captures/manifest.json: what each
scenario sent, had acknowledged and consumed), not from kwire.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from kwire.decode_command import decode_captures

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
MANIFEST = json.loads((CAPTURES / "manifest.json").read_text())
PYTHON_CLIENTS = ["kafka-python", "confluent", "aiokafka"]


def decode(name: str) -> tuple[list[dict], list[dict]]:
    exchanges: list[dict] = []
    connections: list[dict] = []
    result = decode_captures([CAPTURES / name], exchanges.append, connections.append)
    assert result.error is None
    return exchanges, connections


@pytest.fixture(scope="module")
def mixed() -> tuple[list[dict], list[dict]]:
    return decode("tansu-mixed.pcap")


def scenario(capture: str, client: str) -> dict:
    name = {"confluent": "confluent-kafka"}.get(client, client)
    (found,) = [s for s in MANIFEST["captures"][capture]["scenarios"] if s["client"] == name]
    return found


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_records_produced_and_fetched_match_what_the_client_did(client: str) -> None:
    rows, _ = decode(f"tansu-{client}.pcap")
    facts = scenario(f"tansu-{client}", client)
    produced = sum(
        r.get("records") or 0
        for r in rows
        if r.get("api_name") == "Produce" and r["status"] in ("ok", "no_response_expected")
    )
    fetched = sum(r.get("records") or 0 for r in rows if r.get("api_name") == "Fetch")
    assert produced == facts["produced"]
    assert fetched == facts["consumed"]


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_acks_and_codecs_per_produce_step(client: str) -> None:
    rows, _ = decode(f"tansu-{client}.pcap")
    facts = scenario(f"tansu-{client}", client)
    seen = Counter(
        (r["acks"], r.get("compression"))
        for r in rows
        if r.get("api_name") == "Produce" and r["status"] != "orphan_response"
    )
    acks_code = {0: 0, 1: 1, "all": -1}
    for step in facts["steps"]:
        assert seen[(acks_code[step["acks"]], step["compression"] or "none")] >= 1, step


def test_client_software_and_ids(mixed: tuple[list[dict], list[dict]]) -> None:
    rows, _ = mixed
    software = {(r["client_id"], r.get("client_software_name")) for r in rows if r.get("client_id")}
    assert ("kwire-test-kafka-python", "kafka-python") in software
    assert ("kwire-test-confluent", "confluent-kafka-python") in software
    assert ("kwire-test-kcat", "librdkafka") in software
    assert {"kwire-test-aiokafka", "kwire-test-kcat"} <= {c for c, _ in software}


def test_consumer_groups_are_followed(mixed: tuple[list[dict], list[dict]]) -> None:
    rows, _ = mixed
    by_group: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r.get("group_id"):
            by_group[r["group_id"]].add(r["api_name"])
    for client in PYTHON_CLIENTS:
        apis = by_group[f"kwire-test-{client}-group"]
        assert {"JoinGroup", "SyncGroup", "OffsetCommit"} <= apis, (client, apis)
    joins = [r for r in rows if r.get("api_name") == "JoinGroup" and r["status"] == "ok"]
    assert any(r.get("error_name") == "MEMBER_ID_REQUIRED" for r in joins)  # KIP-394 first join
    assert all(r.get("generation_id") is not None for r in joins if r.get("error_code") == 0)


def test_metadata_and_coordinators(mixed: tuple[list[dict], list[dict]]) -> None:
    rows, _ = mixed
    metadata = [r for r in rows if r.get("api_name") == "Metadata" and r["status"] == "ok"]
    assert metadata
    node = MANIFEST["captures"]["tansu-mixed"]["node_id"]
    assert all(b["node_id"] == node and b["port"] == 9092 for r in metadata for b in r["metadata_brokers"])
    partitions = [p for r in metadata for p in r.get("metadata_partitions") or []]
    assert partitions and all(p["leader"] == node and p["replicas"] == [node] for p in partitions)
    finds = [r for r in rows if r.get("api_name") == "FindCoordinator" and r["status"] == "ok"]
    assert finds and all(r["coordinator_node"] == node for r in finds)


def test_every_frame_is_accounted_for(mixed: tuple[list[dict], list[dict]]) -> None:
    rows, connections = mixed
    statuses = Counter(r["status"] for r in rows)
    # Known, real broker behaviour in these captures (see captures/README.md):
    # Tansu answers Produce acks=0 (orphan rows that say so) and sends a ListOffsets v0 response
    # too short for its own layout (kcat reports "Read underflow" on it).
    orphans = [r for r in rows if r["status"] == "orphan_response"]
    assert orphans and all(r["api_name"] == "Produce" and "acks=0" in r["decode_error"] for r in orphans)
    malformed = [r for r in rows if r["status"] == "malformed"]
    assert {(r["api_name"], r["api_version"], r["client_id"]) for r in malformed} == {
        ("ListOffsets", 0, "kwire-test-kcat")
    }
    frames = sum(c.get("frames_to_broker") or 0 for c in connections) + sum(
        c.get("frames_to_client") or 0 for c in connections
    )
    # an orphan row is one response frame (its request, if known, has its own row)
    request_frames = sum(1 for r in rows if r.get("request_size") and r["status"] != "orphan_response")
    response_frames = sum(1 for r in rows if r.get("response_size"))
    assert frames == request_frames + response_frames
    assert statuses["ok"] > 150
    assert all(c["protocol"] == "kafka" for c in connections)
