"""TLS on both sides of the proxy, with a self-signed certificate made by the test (openssl).

Two proxies in a chain: clients talk plaintext to proxy A, A talks TLS to proxy B
(``--upstream-tls --upstream-ca``), B terminates TLS (``--tls-cert/--tls-key``) and talks
plaintext to Tansu. A real client round trip through the chain exercises both contexts and
the address rewriting of both proxies; a TLS client talking to B directly checks that B
records plaintext Kafka from inside TLS.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from realkafka import TansuBroker, kafka_python_scenario, self_signed_certificate

from proxy.embedded import ProxyThread, loopback_config

pytestmark = pytest.mark.real


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    return self_signed_certificate(tmp_path)


def test_tls_both_sides(tansu: TansuBroker, tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    inner_out, outer_out = tmp_path / "inner", tmp_path / "outer"
    inner = loopback_config(
        tansu.port,
        inner_out,
        tls_cert=cert,
        tls_key=key,
    )
    with ProxyThread(inner) as b:
        outer = loopback_config(b.proxy.listen_port, outer_out, upstream_tls=True, upstream_ca=cert)
        with ProxyThread(outer) as a:
            summary = kafka_python_scenario(a.address, "tls-chain", messages_per_step=1, timeout=20)
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": b.address,
                "security.protocol": "ssl",
                "ssl.ca.location": str(cert),
                "group.id": "tls-direct",
                "auto.offset.reset": "earliest",
                "client.id": "tls-direct",
            }
        )
        try:
            consumer.assign([TopicPartition("tls-chain", p, OFFSET_BEGINNING) for p in (0, 1)])
            got = 0
            for _ in range(40):
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    got += 1
                if got >= summary["acked"]:
                    break
        finally:
            consumer.close()
    assert summary["errors"] == []
    assert summary["consumed"] >= summary["acked"] > 0
    assert got >= summary["acked"]
    inner_rows = ds.dataset(inner_out / "exchanges", partitioning="hive").to_table().to_pylist()
    outer_rows = ds.dataset(outer_out / "exchanges", partitioning="hive").to_table().to_pylist()
    assert {r["status"] for r in inner_rows} <= {
        "ok",
        "no_response_expected",
        "orphan_response",
        "unanswered",
    }
    clients = {r["client_id"] for r in inner_rows}
    assert {"kwire-test-kafka-python", "tls-direct"} <= clients  # decoded from inside TLS
    # the chain forwards every exchange of the scenario: the same requests at both proxies (the
    # inner one may also see Tansu's replies to acks=0 Produce arrive after the client left)
    from collections import Counter

    outer_seen = Counter((r["api_key"], r["correlation_id"], r["status"]) for r in outer_rows)
    inner_seen = Counter(
        (r["api_key"], r["correlation_id"], r["status"])
        for r in inner_rows
        if r["client_id"] == "kwire-test-kafka-python"
    )
    assert not outer_seen - inner_seen
    assert {status for _k, _c, status in inner_seen - outer_seen} <= {"orphan_response"}
    assert sum(outer_seen.values()) > 20
