"""Rehearsing incident 4: KAFKA_STORAGE_ERROR (56) vs NOT_LEADER_OR_FOLLOWER (6) on one partition.

For each client library a producer writes three records to partition 0 through the proxy
while a rule answers Produce for that partition with the error for the first 2.5 seconds.
The recorded rows must show the injected errors (``injected=True``) and let us read how the
client reacted: how many Metadata requests it sent while being failed. Nothing may reach
the broker for an injected request: partition 0 ends up with exactly the delivered records.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from realkafka import TansuBroker
from spark_fixtures import spark  # noqa: F401

from proxy.embedded import ProxyThread, loopback_config
from proxy.inject import parse_rule
from spark_jobs.error_reaction import VERDICTS

pytestmark = pytest.mark.real

WINDOW = 2.5
RECORDS = 3
CLIENTS = ["kafka-python", "confluent", "aiokafka"]
CODES = (56, 6)


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


@dataclass
class Rehearsal:
    """One client library failed with one error code through the proxy, and what was recorded."""

    client: str
    code: int
    topic: str
    out_dir: Path
    outcomes: list[str]
    seconds: float
    injected_count: int
    records_in_partition: int

    @property
    def rows(self) -> list[dict[str, Any]]:
        table = ds.dataset(self.out_dir / "exchanges", partitioning="hive").to_table()
        return table.sort_by("request_time").to_pylist()


@pytest.fixture(scope="module")
def rehearse(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Rehearsal]:
    """``rehearse(client, code)``: run that rehearsal once per module (later calls reuse it)."""
    done: dict[tuple[str, int], Rehearsal] = {}

    def run(client: str, code: int) -> Rehearsal:
        if (client, code) in done:
            return done[(client, code)]
        topic = f"inject-{client}-{code}"
        out_dir = tmp_path_factory.mktemp(f"inject-{client}-{code}")
        tansu.create_topics([topic], partitions=2)
        rule = parse_rule(f"api=Produce,topic={topic},partition=0,error={code},for={WINDOW}s")
        config = loopback_config(tansu.port, out_dir, rules=[rule])
        with ProxyThread(config) as running:
            started = time.monotonic()
            outcomes = produce(client, running.address, topic)
            took = time.monotonic() - started
            injected_count = running.proxy.metrics.injected[(rule.text, "error")]
        done[(client, code)] = Rehearsal(
            client,
            code,
            topic,
            out_dir,
            outcomes,
            took,
            injected_count,
            records_in_partition(tansu.bootstrap, topic, 0),
        )
        return done[(client, code)]

    return run


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("client", CLIENTS)
def test_injected_partition_error(rehearse: Callable[[str, int], Rehearsal], client: str, code: int) -> None:
    run = rehearse(client, code)
    rows = run.rows
    injected = [r for r in rows if r["injected"]]
    assert injected and len(injected) == run.injected_count
    for row in injected:
        assert row["api_name"] == "Produce" and row["status"] == "ok"
        assert {(p["topic"], p["partition"], p["error_code"]) for p in row["partition_errors"]} == {
            (run.topic, 0, code)
        }
    assert not any(r["injected"] for r in rows if r["api_name"] != "Produce")
    # the client's reaction: Metadata requests between the first and the last injected error
    first, last = injected[0]["request_time"], injected[-1]["response_time"]
    refreshes = [r for r in rows if r["api_name"] == "Metadata" and first <= r["request_time"] <= last]
    delivered = run.outcomes.count("ok")
    print(
        f"\n{client} error {code}: {len(injected)} injected responses, {len(refreshes)} Metadata requests "
        f"while failed, outcomes {run.outcomes}, {run.seconds:.1f}s"
    )
    # nothing was written behind the client's back: the partition holds the delivered records only
    assert run.records_in_partition == delivered
    assert delivered == RECORDS  # every library retried past the window
    if len(injected) > 1:
        assert refreshes, f"{client} retried {code} without ever refreshing metadata"


def _identity(batch: dict[str, Any]) -> tuple:
    """A batch's identity as error_reaction follows it: producer id/epoch/sequence, else its CRC."""
    where = (batch["topic"] or batch["topic_id"], batch["partition"])
    if batch["producer_id"] is not None and batch["producer_id"] >= 0:
        return (*where, batch["producer_id"], batch["producer_epoch"], batch["base_sequence"])
    return (*where, "crc", batch["crc"])


def reaction_by_hand(rows: list[dict[str, Any]], error: dict[str, Any]) -> str:
    """The verdict for one injected error read straight off one rehearsal's rows: the same batch
    sent again after a Metadata request (refresh_then_retry), to another broker without one
    (retry_on_new_leader), to the same broker without one (retry_without_refresh), or never."""
    failed = {_identity(b) for b in error["batches"]}
    after = error["response_time"]
    resend = next(
        (
            r
            for r in rows
            if r["api_name"] == "Produce"
            and r["request_time"] > after
            and failed & {_identity(b) for b in r["batches"] or ()}
        ),
        None,
    )
    if resend is None:
        return "drop_or_unknown"
    if any(r["api_name"] == "Metadata" and after < r["request_time"] < resend["request_time"] for r in rows):
        return "refresh_then_retry"
    if (resend["broker_ip"], resend["broker_port"]) != (error["broker_ip"], error["broker_port"]):
        return "retry_on_new_leader"
    return "retry_without_refresh"


def test_error_reaction_verdicts_match_what_each_library_did(
    rehearse: Callable[[str, int], Rehearsal],
    spark,  # noqa: F811
    request: pytest.FixtureRequest,
) -> None:
    """Issue 4's headline on real traffic: per library, its reaction to 56 next to its reaction to 6,
    as the Spark job computes it from the batches each library sent, equals what the recorded rows
    show one error at a time."""
    from spark_jobs.common import load_tables
    from spark_jobs.error_reaction import error_reaction, error_reaction_headline, reaction_events

    runs = [rehearse(client, code) for client in CLIENTS for code in CODES]
    expected: dict[tuple[str, int], Counter[str]] = {}
    for run in runs:
        rows = run.rows
        for row in rows:
            if row["injected"]:
                assert row["batches"], "an injected error's request keeps its batches"
                code = row["partition_errors"][0]["error_code"]
                expected.setdefault((run.client, code), Counter())[reaction_by_hand(rows, row)] += 1

    tables = [load_tables(spark, run.out_dir) for run in runs]
    exchanges = functools.reduce(lambda a, b: a.unionByName(b), (t.exchanges for t in tables)).cache()
    connections = functools.reduce(lambda a, b: a.unionByName(b), (t.connections for t in tables))
    events = reaction_events(exchanges, connections, watched=CODES, codes=CODES).cache()
    request.addfinalizer(spark.catalog.clearCache)  # the session is shared
    got: dict[tuple[str, int], Counter[str]] = {}
    for r in events.collect():
        client = r["client_id"].removeprefix("inject-")
        verdict = "drop_or_unknown" if r["verdict"] in ("drop_without_retry", "unknown") else r["verdict"]
        got.setdefault((client, r["error_code"]), Counter())[verdict] += 1
    assert got == expected

    summary = error_reaction(events, exchanges)
    head = [r.asDict() for r in error_reaction_headline(summary).collect()]
    print("\nerror_reaction headline on injected traffic:")
    for client in CLIENTS:
        rows = [r for r in head if r["client_id"] == f"inject-{client}"]
        for code in CODES:
            # each rehearsal is its own run (source): one headline row per run that saw the code
            seen = [r for r in rows if r[f"errors_{code}"]]
            assert sum(r[f"errors_{code}"] for r in seen) == sum(expected[(client, code)].values())
            for r in seen:
                print(f"  {client:13} {code}: {r[f'reaction_{code}']}")
                assert r[f"reaction_{code}"] in VERDICTS and r[f"reaction_{code}"] != "unknown"
                if set(expected[(client, code)]) == {"refresh_then_retry"}:
                    assert r[f"reaction_{code}"] == "refresh_then_retry"
