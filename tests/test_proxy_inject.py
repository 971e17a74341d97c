"""Rehearsing incident 4: KAFKA_STORAGE_ERROR (56) vs NOT_LEADER_OR_FOLLOWER (6) on one partition.

For each client library a producer writes three records to partition 0 through the proxy
while a rule answers Produce for that partition with the error for the first 2.5 seconds.
The recorded rows must show the injected errors (``injected=True``) and let us read how the
client reacted: how many Metadata requests it sent while being failed. Nothing may reach
the broker for an injected request: partition 0 ends up with exactly the delivered records.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from realkafka import TansuBroker

from proxy.embedded import ProxyThread
from proxy.inject import parse_rule
from proxy.server import ProxyConfig

pytestmark = pytest.mark.real

WINDOW = 2.5
RECORDS = 3
REPORT: dict[str, Any] = {}


def produce(client: str, bootstrap: str, topic: str) -> list[str]:
    """Send RECORDS records to partition 0, one at a time; the outcome of each."""
    outcomes: list[str] = []
    if client == "kafka-python":
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=f"inject-{client}",
            acks=1,
            retries=100,
            retry_backoff_ms=200,
            request_timeout_ms=5000,
        )
        try:
            for i in range(RECORDS):
                try:
                    producer.send(topic, value=b"v%d" % i, partition=0).get(timeout=15)
                    outcomes.append("ok")
                except Exception as exc:
                    outcomes.append(repr(exc))
        finally:
            producer.close(timeout=5)
    elif client == "confluent":
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"inject-{client}",
                "acks": "1",
                "message.timeout.ms": 15000,
                "retry.backoff.ms": 200,
            }
        )
        for i in range(RECORDS):
            producer.produce(
                topic,
                value=b"v%d" % i,
                partition=0,
                on_delivery=lambda err, _m: outcomes.append("ok" if err is None else str(err)),
            )
            producer.flush(20)
    else:
        from aiokafka import AIOKafkaProducer

        async def run() -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                client_id=f"inject-{client}",
                acks=1,
                retry_backoff_ms=200,
                request_timeout_ms=5000,
            )
            await asyncio.wait_for(producer.start(), 15)
            try:
                for i in range(RECORDS):
                    try:
                        await asyncio.wait_for(producer.send_and_wait(topic, b"v%d" % i, partition=0), 15)
                        outcomes.append("ok")
                    except Exception as exc:
                        outcomes.append(repr(exc))
            finally:
                await asyncio.wait_for(producer.stop(), 15)

        asyncio.run(run())
    return outcomes


def records_in_partition(bootstrap: str, topic: str, partition: int) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="inject-check",
        enable_auto_commit=False,
        request_timeout_ms=10_000,
    )
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        count = 0
        deadline = time.monotonic() + 8
        idle_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - idle_since < 1.5:
            batch = consumer.poll(timeout_ms=300)
            if batch:
                count += sum(len(v) for v in batch.values())
                idle_since = time.monotonic()
        return count
    finally:
        consumer.close()


@pytest.mark.parametrize("code", [56, 6])
@pytest.mark.parametrize("client", ["kafka-python", "confluent", "aiokafka"])
def test_injected_partition_error(tansu: TansuBroker, tmp_path: Path, client: str, code: int) -> None:
    topic = f"inject-{client}-{code}"
    tansu.create_topics([topic], partitions=2)
    rule = parse_rule(f"api=Produce,topic={topic},partition=0,error={code},for={WINDOW}s")
    config = ProxyConfig(
        bootstrap=[("127.0.0.1", tansu.port)],
        listen=("127.0.0.1", 0),
        broker_port_base=0,
        out_dir=tmp_path,
        flush_seconds=1,
        rules=[rule],
    )
    with ProxyThread(config) as running:
        started = time.monotonic()
        outcomes = produce(client, running.address, topic)
        took = time.monotonic() - started
        injected_count = running.proxy.metrics.injected[(rule.text, "error")]
    rows = (
        ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table().sort_by("request_time").to_pylist()
    )
    injected = [r for r in rows if r["injected"]]
    assert injected and len(injected) == injected_count
    for row in injected:
        assert row["api_name"] == "Produce" and row["status"] == "ok"
        assert {(p["topic"], p["partition"], p["error_code"]) for p in row["partition_errors"]} == {
            (topic, 0, code)
        }
    assert not any(r["injected"] for r in rows if r["api_name"] != "Produce")
    # the client's reaction: Metadata requests between the first and the last injected error
    first, last = injected[0]["request_time"], injected[-1]["response_time"]
    refreshes = [r for r in rows if r["api_name"] == "Metadata" and first <= r["request_time"] <= last]
    delivered = outcomes.count("ok")
    REPORT[f"{client} {code}"] = {
        "injected": len(injected),
        "metadata_during": len(refreshes),
        "delivered": delivered,
        "outcomes": outcomes,
        "seconds": round(took, 2),
    }
    print(
        f"\n{client} error {code}: {len(injected)} injected responses, {len(refreshes)} Metadata requests "
        f"while failed, outcomes {outcomes}, {took:.1f}s"
    )
    # nothing was written behind the client's back: the partition holds the delivered records only
    assert records_in_partition(tansu.bootstrap, topic, 0) == delivered
    assert delivered == RECORDS  # every library retried past the window
    if len(injected) > 1:
        assert refreshes, f"{client} retried {code} without ever refreshing metadata"
