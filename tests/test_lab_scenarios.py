"""The incident lab: committed captures of real Apache Kafka clusters checked against their truth,
and one scenario run live on a real 3-broker KRaft cluster with real clients.

The truth of each scenario (``captures/lab/<name>/truth.json``) was built from the clients'
and brokers' own records (``tests/lab/truth.py``), never from the capture. The checks here
are about what the wire must show given that truth: which brokers answered, which clients
spoke, where requests went unanswered or connections were refused, which errors a broker
returned. The diagnoses drawn from it (findings) are tested by the analysis tests.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kwire.decode_command import decode_captures

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "captures" / "lab"
US = 1_000_000


def _scenarios() -> list[str]:
    return sorted(p.parent.name for p in LAB.glob("*/truth.json"))


class Decoded:
    """A lab capture's rows, with the lookups the checks need."""

    def __init__(self, path: Path) -> None:
        self.exchanges: list[dict[str, Any]] = []
        self.connections: list[dict[str, Any]] = []
        self.result = decode_captures([path], self.exchanges.append, self.connections.append)

    def broker_ips(self, port: int = 9092) -> set[str]:
        return {
            c["broker_ip"] for c in self.connections if c["broker_port"] == port and c["protocol"] == "kafka"
        }

    def client_ids(self, api: str) -> Counter[str]:
        return Counter(r.get("client_id") for r in self.exchanges if r.get("api_name") == api)

    def refused(self, ip: str) -> list[dict[str, Any]]:
        """Connections to *ip* that carried no byte and ended in a reset: refused SYNs."""
        return [
            c
            for c in self.connections
            if c["broker_ip"] == ip
            and c["end_reason"] == "rst"
            and c["bytes_to_broker"] == 0
            and c["syn_seen"]
        ]

    def partition_errors(self, api: str, ip: str, name_code: int) -> list[tuple[int, str]]:
        """(response time, client id) of every partition result with error *name_code* from *ip*."""
        return [
            (r.get("response_time"), r.get("client_id"))
            for r in self.exchanges
            if r.get("api_name") == api and r["broker_ip"] == ip
            for p in r.get("partition_errors") or ()
            if p["error_code"] == name_code
        ]


def _load(name: str) -> tuple[dict[str, Any], Decoded]:
    truth = json.loads((LAB / name / "truth.json").read_text())
    return truth, Decoded(LAB / name / "capture.pcap.gz")


def _at(truth: dict[str, Any], kind: str) -> float:
    return next(e["ts"] for e in truth["timeline"] if e["kind"] == kind)


@pytest.mark.parametrize("name", _scenarios())
def test_committed_capture_matches_manifest_and_truth(name: str) -> None:
    manifest = json.loads((LAB / "manifest.json").read_text())[name]
    capture = LAB / name / "capture.pcap.gz"
    assert hashlib.sha256(capture.read_bytes()).hexdigest() == manifest["sha256"]
    assert capture.stat().st_size < 8_000_000, "lab captures stay small"
    truth, decoded = _load(name)
    assert decoded.result.error is None
    # a frame kwire cannot read is allowed only where it had to hunt for frame boundaries: on a
    # connection opened before the capture started (a replica fetcher), never on one seen whole
    whole = {c["connection_id"] for c in decoded.connections if c["syn_seen"]}
    malformed = [r for r in decoded.exchanges if r["status"] == "malformed"]
    assert [r for r in malformed if r["connection_id"] in whole] == []
    assert len(malformed) <= 2
    # every broker of the truth answered on its own address, and nothing else did on the broker port
    assert decoded.broker_ips() == {b["ip"] for b in truth["brokers"].values()}
    # every client that got a message acked is in the capture under its own client id (one that
    # handed messages to its library but never got metadata, as against the 0.9 broker, may
    # never have sent a Produce at all)
    producers = decoded.client_ids("Produce")
    for client_id, client in truth["clients"].items():
        assert client["sent"] == client["acked"] + client["failed"] + client["unresolved"], client_id
        if client["acked"]:
            assert producers[client_id] > 0, f"{client_id} got {client['acked']} acks, no Produce seen"


def test_001_frozen_then_killed_broker_on_the_wire() -> None:
    truth, decoded = _committed("001-broker-drops-out")
    check_broker_drops_out(truth, decoded)


def check_broker_drops_out(truth: dict[str, Any], decoded: Decoded) -> None:
    """What scenario 001's truth implies for its capture (committed or live)."""
    victim = truth["brokers"][str(truth["victim"])]["ip"]
    paused, killed = _at(truth, "broker_paused") * US, _at(truth, "broker_killed") * US
    started = _at(truth, "broker_started") * US
    # acks=all with min.insync.replicas=2 and RF=3: a broker loss loses nothing acked
    for client_id, client in truth["clients"].items():
        if client["sent"]:
            assert client["lost"] == 0, client_id
            assert client["acked"] > 0, client_id
    # the frozen broker read requests and answered none of them: all were sent while it was frozen
    # or dead (a request sent in the milliseconds between the kill and the reset counts too)
    unanswered = [
        r
        for r in decoded.exchanges
        if r["broker_ip"] == victim and r["status"] == "unanswered" and r.get("api_name") == "Produce"
    ]
    assert unanswered, "no Produce to the frozen broker went unanswered"
    late = [r for r in unanswered if not paused - 2 * US <= r["request_time"] <= started]
    assert not late, f"{len(late)} unanswered Produce requests outside the outage, e.g. {late[0]}"
    # after the kill and before the restart, connections to it were refused
    refused = decoded.refused(victim)
    assert refused and all(killed <= c["first_packet_time"] <= started + 2 * US for c in refused)
    # leadership of every partition the victim led moved to another broker, by the brokers' logs
    moved = {p for p, leader in truth["leaders_before"].items() if leader == truth["victim"]}
    assert moved and all(truth["leaders_after"][p] != truth["victim"] for p in moved)
    others = [b for n, b in truth["brokers"].items() if n != str(truth["victim"])]
    assert sum(b["facts"].get("became_leader", {}).get("count", 0) for b in others) >= len(moved)


def _committed(name: str) -> tuple[dict[str, Any], Decoded]:
    if not (LAB / name).is_dir():
        pytest.skip(f"{name} not committed")
    return _load(name)


def test_003_storage_errors_from_the_failed_dir_only() -> None:
    truth, decoded = _committed("003-jbod-disk-failure")
    victim = truth["brokers"][str(truth["victim"])]["ip"]
    failed_at = _at(truth, "log_dir_failed") * US
    storage_errors = [
        (r.get("response_time"), r.get("broker_ip"), r.get("client_id"))
        for r in decoded.exchanges
        if r.get("api_name") == "Produce"
        for p in r.get("partition_errors") or ()
        if p["error_code"] == 56
    ]
    # the truth: sarama 1.27.0 failed messages with KAFKA_STORAGE_ERROR, the others lost nothing
    sarama = truth["clients"]["sarama-1.27.0-producer"]
    assert sarama["failed_by_error"].get("KAFKA_STORAGE_ERROR", 0) == sarama["failed"] > 0
    assert all(c["failed"] == 0 for cid, c in truth["clients"].items() if cid != "sarama-1.27.0-producer")
    # the wire: every KAFKA_STORAGE_ERROR came from the failed broker after its dir failed, and
    # sarama 1.27.0 got them
    assert storage_errors and all(ip == victim and t >= failed_at for t, ip, _ in storage_errors)
    assert any(cid == "sarama-1.27.0-producer" for _, _, cid in storage_errors)


def test_004_acks1_lost_acked_messages_acks_all_did_not() -> None:
    truth, decoded = _committed("004-acks1-loss")
    clients = truth["clients"]
    lossy = [c for c in clients.values() if c["acks"] == "1"]
    assert lossy and all(c["acked"] == c["sent"] and c["lost"] > 0 for c in lossy)
    assert all(c["lost"] == 0 for c in clients.values() if c["acks"] in ("all", "-1") and c["sent"])
    reader = next(c for c in clients.values() if not c["sent"])
    assert reader["consumed"] == sum(c["acked"] - c["lost"] for c in clients.values())
    victim = truth["brokers"][str(truth["victim"])]["ip"]
    killed, started = _at(truth, "broker_killed") * US, _at(truth, "broker_started") * US
    refused = decoded.refused(victim)
    assert refused and all(killed <= c["first_packet_time"] <= started + 2 * US for c in refused)
    assert truth["leaders_before"]["0"] == truth["victim"] != truth["leaders_after"]["0"]


@pytest.mark.skipif(os.environ.get("KWIRE_LAB_LIVE", "1") == "0", reason="KWIRE_LAB_LIVE=0")
def test_001_live_on_a_real_cluster(tmp_path: Path) -> None:
    """Scenario 001 run now: Kafka 4.1 (3 brokers, 3 controllers) fetched from Maven Central,
    the Java client, librdkafka, sarama and kafka-python, a tcpdump capture and the truth."""
    from lab.scenarios import scenario
    from realkafka import tcpdump_available

    if reason := tcpdump_available():
        pytest.skip(reason)
    out = tmp_path / "out"
    truth = scenario("001-broker-drops-out").run(out, tmp_path / "work")
    assert truth["read_back"] and truth["capture_dropped"] == 0
    decoded = Decoded(out / "capture.pcap.gz")
    assert decoded.result.error is None
    assert decoded.broker_ips() == {b["ip"] for b in truth["brokers"].values()}
    check_broker_drops_out(truth, decoded)
