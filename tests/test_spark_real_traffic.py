"""Compatibility audit on real traffic: an old client and a modern one against Tansu, captured
with tcpdump, decoded by the ``kwire decode`` CLI, then audited for Kafka 4.0 and 0.9.

kafka-python pinned to ``api_version=(0, 10, 0)`` sends ApiVersions v0, Metadata v1 and
Produce v2; Tansu (like Kafka 4.0, KIP-896) closes the connection on that Produce. Every
flag the Spark job raises is checked against a plain-Python oracle over the same rows and the
release table; the domain facts (Produce v2 for 4.0, ApiVersions and Metadata v1 for 0.9, the
old-broker signature) are asserted on top so the oracle cannot agree with an empty result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from realkafka import TansuBroker, Tcpdump, tcpdump_available
from spark_fixtures import spark  # noqa: F401
from typer.testing import CliRunner

from kwire.analytics_commands import audit
from spark_jobs.common import load_tables
from spark_jobs.kafka_versions import load_broker_versions
from spark_jobs.unsupported_versions import audit_release, release_table, unsupported_versions

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

OLD = "old-producer"
MODERN = "modern-producer"
TOPIC = "compat-audit"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Capture:
    dataset: Path
    rows: list[dict[str, Any]]
    old_outcome: str


def old_producer(bootstrap: str) -> str:
    """One record from a client pinned to Kafka 0.10.0's protocol; returns what it saw."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        api_version=(0, 10, 0),
        client_id=OLD,
        request_timeout_ms=3000,
        retries=0,
        max_block_ms=5000,
    )
    try:
        producer.send(TOPIC, b"old").get(timeout=6)
        return "delivered"
    except Exception as exc:  # the broker refuses Produce v2: whichever error the client reports
        return type(exc).__name__
    finally:
        producer.close(timeout=3)


def modern_producer(bootstrap: str) -> int:
    """Three records from confluent-kafka (librdkafka: the newest versions both sides know)."""
    from confluent_kafka import Producer

    delivered: list[bool] = []
    # no KIP-714 telemetry: librdkafka sends GetTelemetrySubscriptions (key 71) only sometimes,
    # and the default 3.9 broker table does not accept it (the gate below must be deterministic)
    config = {
        "bootstrap.servers": bootstrap,
        "client.id": MODERN,
        "acks": "all",
        "enable.metrics.push": False,
    }
    producer = Producer(config)
    for i in range(3):
        producer.produce(TOPIC, f"modern-{i}".encode(), on_delivery=lambda err, _: delivered.append(not err))
    producer.flush(10)
    return sum(delivered)


@pytest.fixture(scope="module")
def capture(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Capture:
    reason = tcpdump_available()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("compat")
    tansu.create_topics([TOPIC], partitions=1)
    with Tcpdump(folder / "compat.pcap", [tansu.port]) as dump:
        old_outcome = old_producer(tansu.bootstrap)
        assert modern_producer(tansu.bootstrap) == 3
        time.sleep(0.2)
    dataset = folder / "compat.kwire"
    decoded = subprocess.run(
        [sys.executable, "-m", "kwire", "decode", str(dump.path), "-o", str(dataset)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert decoded.returncode == 0, decoded.stderr
    rows = ds.dataset(dataset / "exchanges", partitioning="hive").to_table().to_pylist()
    return Capture(dataset, rows, old_outcome)


def requests_by_client(rows: list[dict[str, Any]]) -> Counter[tuple[str, int, int]]:
    return Counter(
        (r["client_id"], r["api_key"], r["api_version"])
        for r in rows
        if r["status"] != "orphan_response" and r["api_key"] is not None and r["api_version"] is not None
    )


def rejected_by_hand(rows: list[dict[str, Any]], release: str) -> Counter[tuple[str, int, int]]:
    """The oracle: requests outside what ``release`` accepts, straight from the release table."""
    versions = load_broker_versions()
    return Counter(
        {
            triple: n
            for triple, n in requests_by_client(rows).items()
            if not versions.accepts_request(release, triple[1], triple[2])
        }
    )


def test_the_capture_holds_both_clients(capture: Capture) -> None:
    sent = requests_by_client(capture.rows)
    assert capture.old_outcome != "delivered"
    assert {(18, 0), (3, 1), (0, 2)} <= {(k, v) for c, k, v in sent if c == OLD}
    modern_produce = {v for c, k, v in sent if c == MODERN and k == 0}
    assert modern_produce and min(modern_produce) >= 3
    old_produce = [r for r in capture.rows if r["client_id"] == OLD and r["api_key"] == 0]
    assert [r["status"] for r in old_produce] == ["unanswered"] * len(old_produce)


@pytest.mark.parametrize("release", ["4.0", "0.9.0"])
def test_audit_matches_the_release_table(spark, capture: Capture, release: str) -> None:  # noqa: F811
    tables = load_tables(spark, capture.dataset)
    flagged = audit_release(
        tables.exchanges, release_table(spark, load_broker_versions(), [release])
    ).collect()
    got = Counter({(r["client_id"], r["api_key"], r["api_version"]): r["count"] for r in flagged})
    assert got == rejected_by_hand(capture.rows, release)

    reasons = {
        (r["client_id"], r["api_key"], r["api_version"]): (r["reason"], r["severity"]) for r in flagged
    }
    if release == "4.0":
        assert reasons[(OLD, 0, 2)] == ("advertised_but_rejected", "error")
        assert not any(client == MODERN for client, _, _ in reasons), "a modern client flagged for 4.0"
    else:
        # 0.9 has no ApiVersions at all (incident 1) and only Metadata v0
        assert reasons[(OLD, 18, 0)] == ("not_in_release", "error")
        assert reasons[(OLD, 3, 1)] == ("not_in_release", "error")


def test_old_broker_signature_on_real_traffic(spark, capture: Capture) -> None:  # noqa: F811
    tables = load_tables(spark, capture.dataset)
    found = unsupported_versions(tables.exchanges, tables.connections).collect()
    signature = {(r["client_id"], r["api_key"], r["api_version"], r["reason"]) for r in found}
    assert (OLD, 0, 2, "unanswered_then_closed") in signature
    assert not any(client == MODERN for client, *_ in signature)


@pytest.mark.parametrize("release", ["4.0", "3.9"])
def test_audit_command_is_a_gate(spark, capture: Capture, release: str) -> None:  # noqa: F811
    import typer

    app = typer.Typer()
    app.command()(audit)
    result = CliRunner().invoke(app, [str(capture.dataset), "--broker-version", release, "--json"])
    expected = rejected_by_hand(capture.rows, release)
    assert result.exit_code == (1 if expected else 0), result.output
    violations = json.loads(result.stdout)["violations"]
    assert (
        Counter({(v["client_id"], v["api_key"], v["api_version"]): v["count"] for v in violations})
        == expected
    )
    if release == "4.0":
        assert (OLD, 0, 2) in expected
    else:
        assert not expected, "3.9 accepts every version these two clients used: the passing gate"
