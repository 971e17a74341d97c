"""Many-connection Kafka load from raw sockets, in its own process (tests and ``bench/proxy_overhead.py``).

``N`` connections each keep ``depth`` requests in flight (ApiVersions v0 and Metadata v1 for
no topic, alternating: real requests a real broker answers, small frames, so the recorder
has many exchanges to decode per MB), for ``seconds``. Every response is checked against
the correlation id it should carry. Prints one JSON object: requests sent and answered,
round-trip p50/p99 in ms, and the wall-clock second of every answer (``answered_at``,
rounded to 10 ms, as counts) so a test can tell which exchanges ended before a given time.

With ``--rate R`` each connection instead sends one request at a time, R a second (an open
loop below saturation: the latency a client sees at that load, not a queue's length).

``--producers P --consumers C`` add real clients (confluent-kafka, 1 KB records, acks=all,
topic ``load``), for bytes: the raw connections make many small exchanges, these make MBs.

Usage: ``python tests/proxy_load.py HOST:PORT [--conns 175] [--depth 4] [--seconds 8] [--rate R] [--bind IP]``.
Run as a subprocess, so the load does not share the GIL of the proxy it loads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import threading
import time
from collections import Counter
from typing import Any

_HEAD = struct.Struct(">i")


def api_versions_v0(corr: int, client_id: bytes) -> bytes:
    payload = struct.pack(">hhih", 18, 0, corr, len(client_id)) + client_id
    return _HEAD.pack(len(payload)) + payload


def metadata_v1_none(corr: int, client_id: bytes) -> bytes:
    """Metadata v1 asking for no topic (an empty array): brokers only."""
    payload = struct.pack(">hhih", 3, 1, corr, len(client_id)) + client_id + struct.pack(">i", 0)
    return _HEAD.pack(len(payload)) + payload


def request_frame(corr: int, client_id: bytes) -> bytes:
    return (api_versions_v0 if corr % 2 == 0 else metadata_v1_none)(corr, client_id)


async def _paced(
    index: int,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    interval: float,
    stop_at: float,
    out: dict[str, Any],
) -> None:
    """One request at a time, one every ``interval`` seconds (a late answer delays the next)."""
    client_id = b"load-%d" % index
    corr = 0
    due = time.perf_counter() + interval * (index % 97) / 97  # spread the connections out
    while due < stop_at:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        started = time.perf_counter()
        writer.write(request_frame(corr, client_id))
        out["sent"] += 1
        head = await reader.readexactly(4)
        body = await reader.readexactly(_HEAD.unpack(head)[0])
        if _HEAD.unpack_from(body)[0] != corr:
            out["wrong"] += 1
        out["rtt"].append(time.perf_counter() - started)
        out["answered"] += 1
        out["answered_at"][round(time.time(), 2)] += 1
        corr += 1
        due = max(due + interval, time.perf_counter())


async def _connection(
    index: int,
    host: str,
    port: int,
    depth: int,
    stop_at: float,
    bind: str | None,
    out: dict[str, Any],
    interval: float = 0.0,
) -> None:
    client_id = b"load-%d" % index
    reader, writer = await asyncio.open_connection(host, port, local_addr=(bind, 0) if bind else None)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if interval:
        try:
            await _paced(index, reader, writer, interval, stop_at, out)
        except (OSError, asyncio.IncompleteReadError) as exc:
            out["errors"].append(f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()
        return
    sent: dict[int, float] = {}
    corr = 0
    try:
        for _ in range(depth):
            sent[corr] = time.perf_counter()
            writer.write(request_frame(corr, client_id))
            corr += 1
        out["sent"] += depth
        while sent:
            head = await reader.readexactly(4)
            body = await reader.readexactly(_HEAD.unpack(head)[0])
            got = _HEAD.unpack_from(body)[0]
            started = sent.pop(got, None)
            if started is None:
                out["wrong"] += 1
                continue
            now = time.perf_counter()
            out["rtt"].append(now - started)
            out["answered"] += 1
            out["answered_at"][round(time.time(), 2)] += 1
            if now < stop_at:
                sent[corr] = time.perf_counter()
                writer.write(request_frame(corr, client_id))
                corr += 1
                out["sent"] += 1
    except (OSError, asyncio.IncompleteReadError) as exc:
        out["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        writer.close()


def _producer(bootstrap: str, topic: str, index: int, stop_at: float, out: dict[str, Any]) -> None:
    """confluent-kafka producing 1 KB records as fast as it goes until ``stop_at``."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "client.id": f"load-producer-{index}",
            "message.timeout.ms": 60_000,
        }
    )

    def report(err: Any, _msg: Any) -> None:
        out["delivered" if err is None else "produce_errors"] += 1

    record = b"x" * 1024
    while time.perf_counter() < stop_at:
        try:
            producer.produce(topic, record, on_delivery=report)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)


def _consumer(bootstrap: str, topic: str, index: int, stop_at: float, out: dict[str, Any]) -> None:
    """confluent-kafka consuming ``topic`` from the start until ``stop_at``."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"load-group-{index}",
            "client.id": f"load-consumer-{index}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    try:
        while time.perf_counter() < stop_at:
            for msg in consumer.consume(500, 0.2):
                if msg.error() is None:
                    out["consumed"] += 1
    finally:
        consumer.close()


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_load(
    host: str,
    port: int,
    conns: int,
    depth: int,
    seconds: float,
    bind: str | None = None,
    rate: float = 0.0,
    producers: int = 0,
    consumers: int = 0,
) -> dict[str, Any]:
    """Drive the load; the summary (see the module doc). ``rate`` > 0: each connection sends
    that many requests a second, one at a time (open loop), instead of keeping ``depth`` in flight."""
    out: dict[str, Any] = dict(sent=0, answered=0, wrong=0, delivered=0, produce_errors=0, consumed=0)
    out.update(rtt=[], errors=[], answered_at=Counter())
    stop_at = time.perf_counter() + seconds
    tasks = []
    clients = []
    bootstrap = f"{host}:{port}"
    for kind, count in ((_producer, producers), (_consumer, consumers)):
        for i in range(count):
            thread = threading.Thread(target=kind, args=(bootstrap, "load", i, stop_at, out), daemon=True)
            thread.start()
            clients.append(thread)
    for i in range(conns):
        interval = 1.0 / rate if rate > 0 else 0.0
        tasks.append(asyncio.create_task(_connection(i, host, port, depth, stop_at, bind, out, interval)))
        if i % 50 == 49:
            await asyncio.sleep(0.01)  # do not overrun the listen backlog
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), seconds + 60)
    for thread in clients:
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 90)
    rtt = out.pop("rtt")
    out["p50_ms"] = _quantile(rtt, 0.5) * 1000
    out["p99_ms"] = _quantile(rtt, 0.99) * 1000
    out["answered_at"] = sorted(out["answered_at"].items())
    out["errors"] = out["errors"][:5]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target")
    parser.add_argument("--conns", type=int, default=175)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--bind", default=None)
    parser.add_argument("--producers", type=int, default=0, help="confluent-kafka producers (topic 'load')")
    parser.add_argument("--consumers", type=int, default=0, help="confluent-kafka consumers of 'load'")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s per connection, one at a time")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    result = asyncio.run(
        run_load(
            host,
            int(port),
            args.conns,
            args.depth,
            args.seconds,
            args.bind,
            args.rate,
            args.producers,
            args.consumers,
        )
    )
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
