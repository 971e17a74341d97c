"""Upgrade audit: the same client mix against Kafka 3.9 and against Kafka 4.1.

Kafka 4.0 removed the oldest versions of many requests (KIP-896: Produce v0-2, Fetch v0-3,
ListOffsets v0, OffsetCommit v0-1, OffsetFetch v0, CreateTopics v0-1, the oldest admin versions;
JoinGroup v0-1, refused by 4.0.0, are accepted again from 4.0.1, KAFKA-19444). A client that
still sends one gets its connection closed: the 4.x broker logs "Closing socket for ...
because of error" with UnsupportedVersionException, and every other request in flight on
that connection dies with it. Produce v0-2 are still advertised in 4.x's ApiVersions
(KAFKA-18659), so a client that trusts ApiVersions sends them anyway; a client that checks
ApiVersions and finds nothing it speaks (Fetch v3 for kafka-clients 0.10.2) sends nothing.

Two runs of the same client mix, one capture per broker release, each a KRaft cluster of 3 brokers and
1 controller: ``baseline-3.9/`` (everything accepted) and the scenario folder itself (4.1).
Seven clients each produce PRODUCE messages (acks=all) to one topic and read the topic with a
group of their own: kafka-clients 0.10.2.2 (Produce v2, Fetch v3), sarama 1.27.0 (OffsetCommit
v1 whatever its Version; the lab driver's Version 2.1 gives Produce v3, Fetch v10), kafka-python,
confluent-kafka, kafka-clients 4.1.1, franz-go, kafkajs.

The truth, per release and client: sent, acked, failed (by error), consumed, what the client's
own log says (unsupported versions, disconnects), and the brokers' "Closing socket ... because of
error" lines with the request key and version each names.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from lab.cluster import KRaftCluster
from lab.run import LabRun
from lab.scenarios import addresses
from lab.truth import broker_errors

NAME = "upgrade-audit"
DESCRIPTION = (
    "the same 7 clients (kafka-clients 0.10.2.2/4.1.1, sarama 1.27.0, kafka-python, librdkafka, franz-go, "
    "kafkajs) against KRaft 3.9 (baseline-3.9/) and 4.1: requests KIP-896 removed, and how 4.1 answers them"
)
RELEASES = ("3.9", "4.1")
#: Where each release's run is written, relative to the scenario's folder.
FOLDERS = {"3.9": "baseline-3.9", "4.1": "."}
TOPIC = "audit"
PARTITIONS = 3
PRODUCE = 20
RATE = 2.0
RUN_S = 45.0
#: A consumer stops once it has read every client's messages, or after IDLE_S without a new one.
IDLE_S = 10.0
CLIENTS: dict[str, dict[str, Any]] = {
    "java-0.10.2.2": {},
    "sarama-1.27.0": {},
    "kafka-python": {},
    "confluent-kafka": {},
    "java-4.1.1": {},
    # franz-go compresses with snappy by default: kafka-python without python-snappy and
    # kafkajs (no snappy codec) then cannot read the topic at all.
    "franz-go": {"compression.type": "none"},
    "kafkajs": {},
}
_UNSUPPORTED = re.compile(
    r"api with key (?P<key>\d+) \((?P<api>\w+)\) and unsupported version (?P<version>\d+)"
)


def closed_for_version(cluster: KRaftCluster, since: float) -> dict[str, Any]:
    """Per broker, the connections it closed over an unsupported request version, by api and version."""
    out: dict[str, Any] = {}
    for node in cluster.brokers:
        counts: dict[str, int] = {}
        for e in broker_errors(cluster.log_path(node), since):
            found = _UNSUPPORTED.search(e["cause"] or "")
            if found and e["message"].startswith("Closing socket for"):
                key = f"{found['api']} v{found['version']}"
                counts[key] = counts.get(key, 0) + 1
        out[str(node)] = counts
    return out


def run_release(version: str, out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """One release's run: cluster, clients, capture; writes into *out_dir* and returns its truth."""
    with KRaftCluster(
        version, **addresses(), brokers=3, controllers=1, base_dir=work_dir / "cluster"
    ) as cluster:
        cluster.start(timeout=180)
        cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3)
        with LabRun(f"{NAME}-{version}", cluster, work_dir / "run") as run:
            for name, props in CLIENTS.items():
                run.start_client(
                    name,
                    name,
                    TOPIC,
                    produce=PRODUCE,
                    rate=RATE,
                    acks="all",
                    consume=True,
                    group=f"{TOPIC}-{name}",
                    expect=PRODUCE * len(CLIENTS),
                    idle_s=IDLE_S,
                    duration_s=RUN_S,
                    props=props,
                )
            run.wait_clients()
            closed = closed_for_version(cluster, run.started - 1)
            return run.finish(
                out_dir,
                extra={
                    "topic": TOPIC,
                    "description": DESCRIPTION,
                    "client_props": CLIENTS,
                    "closed_for_unsupported_version": closed,
                },
            )


def _headline(truth: dict[str, Any]) -> dict[str, Any]:
    keys = ("sent", "acked", "failed", "unresolved", "failed_by_error", "consumed", "log")
    return {cid: {k: c.get(k) for k in keys} for cid, c in truth["clients"].items()}


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run 3.9 then 4.1; the 4.1 truth (written last, into *out_dir*) carries the 3.9 headline."""
    truths = {}
    for version in RELEASES:
        started = time.monotonic()
        target = (out_dir / FOLDERS[version]).resolve()
        truths[version] = run_release(version, target, work_dir / version)
        truths[version]["run_seconds"] = round(time.monotonic() - started)
    baseline = truths["3.9"]
    base_capture = (out_dir / FOLDERS["3.9"] / "capture.pcap.gz").resolve()
    truth = truths["4.1"]
    truth["baseline"] = {
        "folder": FOLDERS["3.9"],
        "kafka_version": baseline["kafka_version"],
        "capture_packets": baseline["capture_packets"],
        "capture_bytes": base_capture.stat().st_size,
        "capture_sha256": hashlib.sha256(base_capture.read_bytes()).hexdigest(),
        "clients": _headline(baseline),
        "closed_for_unsupported_version": baseline["closed_for_unsupported_version"],
    }
    truth["captures"] = {
        version: f"{FOLDERS[version]}/capture.pcap.gz".removeprefix("./") for version in RELEASES
    }
    (out_dir / "truth.json").write_text(_dump(truth))
    return truth


def _dump(truth: dict[str, Any]) -> str:
    return json.dumps(truth, indent=1, sort_keys=True) + "\n"
