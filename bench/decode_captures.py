"""Record the decode benchmark's captures: real clients against a real (Tansu) broker, tcpdump on lo.

    python bench/decode_captures.py [bulk|chatty|batch2mb ...] [--dir .cache/bench] [--force]

Each capture is made once into ``--dir`` (default ``.cache/bench`` in the repository, git-ignored)
and reused afterwards: a capture is only recorded when its file is missing (or with --force).
A ``NAME.json`` beside it says how it was made (client, settings, tcpdump's packet counts).

* ``bulk``: ordinary bulk traffic on one busy connection. One confluent-kafka producer
  (librdkafka), 100 records of 200 B per batch (``batch.num.messages=100``), linger 5 ms, acks=1,
  no compression, one partition, until the capture holds about 1.25 GB (about 60k Produce
  requests of 20 kB).
* ``chatty``: many small requests from several clients: two confluent-kafka producers sending one
  record per Produce request (each waits for its answer), a consumer fetching with a 1 ms fetch
  wait (many small, often empty Fetches), and a client asking for Metadata in a loop, until the
  capture holds about 150k Kafka frames.
* ``batch2mb``: the flattering case: two aiokafka producers with linger 20 ms and batches up to
  1 MB (requests of about 2 MB), until the capture holds about 1 GB.

The broker listens on a port from 41800-41899 (the range this project's benchmarks use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

RECORD = 200  # bytes per record value
PORTS = range(41800, 41900)
DEFAULT_DIR = REPO / ".cache" / "bench"
#: capture size at which recording stops, per kind
TARGET_BYTES = {"bulk": 1_250_000_000, "chatty": 45_000_000, "batch2mb": 1_000_000_000}
MAX_SECONDS = 900.0


class Capture:
    """tcpdump on loopback with a large kernel buffer (-B), so that bursts are not dropped."""

    def __init__(self, path: Path, port: int) -> None:
        binary = shutil.which("tcpdump") or shutil.which("tcpdump", path="/usr/sbin:/sbin")
        if binary is None:
            raise SystemExit("tcpdump not found (scripts/install-system-deps)")
        self.path = path
        self.command = [binary, "-i", "lo", "-B", "262144", "--immediate-mode", "-U", "-s", "0"]
        self.command += ["-w", str(path)]
        if os.geteuid() == 0:
            self.command += ["-Z", "root"]
        self.command.append(f"tcp port {port}")
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        self.proc: subprocess.Popen[bytes] | None = None
        self.report = ""

    def __enter__(self) -> Capture:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.log.seek(0)
            if b"listening on" in self.log.read():
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait(timeout=10)
        raise SystemExit(f"tcpdump did not start: {' '.join(self.command)}")

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        time.sleep(1.0)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.seek(0)
        self.report = " ".join(
            line.strip()
            for line in self.log.read().decode(errors="replace").splitlines()
            if "packets" in line
        )
        self.log.close()


# ---------------------------------------------------------------------------------------------------------
# clients (each runs in its own process until `stop` is set)


def _confluent_producer(config: dict[str, Any], topic: str, stop: Any, one_by_one: bool) -> None:
    from confluent_kafka import Producer

    producer = Producer(config)
    value = bytes(range(RECORD))
    while not stop.is_set():
        if one_by_one:
            producer.produce(topic, value)
            producer.flush(10)  # one record per request: wait for each answer
            continue
        for _ in range(5000):
            while True:
                try:
                    producer.produce(topic, value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.005)
        producer.poll(0)
    producer.flush(30)


def _producer_config(bootstrap: str, client_id: str, **settings: Any) -> dict[str, Any]:
    """A confluent-kafka producer's settings: acks=1, then ``settings``."""
    return {"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "1", **settings}


def bulk_producer(bootstrap: str, topic: str, stop: Any, index: int) -> None:
    """confluent-kafka, 100 records of 200 B per batch, linger 5 ms, one partition."""
    config = _producer_config(
        bootstrap,
        f"bench-bulk-{index}",
        **{"linger.ms": 5, "batch.num.messages": 100, "queue.buffering.max.kbytes": 65_536},
        **{"compression.type": "none"},
    )
    _confluent_producer(config, topic, stop, one_by_one=False)


def chatty_producer(bootstrap: str, topic: str, stop: Any, index: int) -> None:
    """confluent-kafka, one record per Produce request."""
    config = _producer_config(bootstrap, f"bench-chatty-producer-{index}", **{"linger.ms": 0})
    _confluent_producer(config, topic, stop, one_by_one=True)


def chatty_consumer(bootstrap: str, topic: str, stop: Any, index: int) -> None:
    """confluent-kafka consumer in a group, 1 ms fetch wait."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"bench-chatty-consumer-{index}",
            "group.id": f"bench-chatty-{index}",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 1,
            "fetch.min.bytes": 1,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            consumer.poll(0.05)
    finally:
        consumer.close()


def metadata_poller(bootstrap: str, topic: str, stop: Any, index: int) -> None:
    """confluent-kafka admin client asking for the topic's Metadata every 5 ms."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": f"bench-chatty-metadata-{index}"})
    while not stop.is_set():
        admin.list_topics(topic, timeout=5)
        time.sleep(0.005)


def batch2mb_producer(bootstrap: str, topic: str, stop: Any, index: int) -> None:
    """aiokafka, linger 20 ms, batches up to 1 MB (Produce v7, which tshark 4.0 dissects fully)."""

    async def run() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=f"bench-batch2mb-{index}",
            acks=1,
            linger_ms=20,
            max_batch_size=1_000_000,
            max_request_size=10_000_000,
        )
        await producer.start()
        try:
            value = bytes(range(RECORD))
            while not stop.is_set():
                for _ in range(5000):
                    await producer.send(topic, value)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


Client = Callable[[str, str, Any, int], None]
KINDS: dict[str, tuple[int, list[tuple[Client, int]]]] = {
    # kind: (partitions, [(client, index)])
    "bulk": (1, [(bulk_producer, 0)]),
    "chatty": (
        4,
        [(chatty_producer, 0), (chatty_producer, 1), (chatty_consumer, 0), (metadata_poller, 0)],
    ),
    "batch2mb": (4, [(batch2mb_producer, 0), (batch2mb_producer, 1)]),
}


def _free_bench_port() -> int:
    from realkafka import port_is_free

    for port in PORTS:
        if port_is_free(port):
            return port
    raise SystemExit(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


def record(kind: str, path: Path, target_bytes: int, max_seconds: float = MAX_SECONDS) -> dict[str, Any]:
    """Record real traffic of `kind` into `path` until it holds `target_bytes` (or time runs out)."""
    from realkafka import TansuBroker

    partitions, clients = KINDS[kind]
    topic = f"bench-{kind}"
    tmp = path.with_suffix(".partial")
    with TansuBroker(port=_free_bench_port()) as broker:
        broker.create_topics([topic], partitions=partitions)
        stop = multiprocessing.Event()
        started = time.monotonic()
        procs = [
            multiprocessing.Process(target=fn, args=(broker.bootstrap, topic, stop, i), daemon=True)
            for fn, i in clients
        ]
        try:
            with Capture(tmp, broker.port) as capture:
                for proc in procs:
                    proc.start()
                while time.monotonic() - started < max_seconds:
                    time.sleep(0.5)
                    if tmp.exists() and tmp.stat().st_size >= target_bytes:
                        break
                stop.set()
                for proc in procs:
                    proc.join(timeout=40)
        finally:
            stop.set()
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=10)
        seconds = time.monotonic() - started
    tmp.replace(path)
    return {
        "kind": kind,
        "clients": [fn.__name__ for fn, _ in clients],
        "client_doc": sorted({(fn.__doc__ or "").strip() for fn, _ in clients}),
        "partitions": partitions,
        "port": broker.port,
        "seconds": round(seconds, 1),
        "tcpdump": capture.report,
        "bytes": path.stat().st_size,
    }


def ensure(kind: str, directory: Path = DEFAULT_DIR, force: bool = False) -> Path:
    """The capture of `kind` in `directory`, recorded first when it is missing (or `force`)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{kind}.pcap"
    if path.exists() and not force:
        return path
    need = TARGET_BYTES[kind] * 1.2
    free = shutil.disk_usage(directory).free
    if free < need:
        raise SystemExit(f"{directory}: {free / 1e9:.1f} GB free, {kind} needs about {need / 1e9:.1f} GB")
    info = record(kind, path, TARGET_BYTES[kind])
    (directory / f"{kind}.json").write_text(json.dumps(info, indent=2) + "\n")
    print(
        f"recorded {path}: {info['bytes'] / 1e6:.1f} MB in {info['seconds']} s; {info['tcpdump']}", flush=True
    )
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kinds", nargs="*", metavar="KIND", help=f"some of {', '.join(KINDS)} (default: all)")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the captures are kept")
    ap.add_argument("--force", action="store_true", help="record again even if the file exists")
    args = ap.parse_args(argv)
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kind(s): {', '.join(sorted(unknown))}")
    for kind in args.kinds or list(KINDS):
        print(ensure(kind, args.dir, args.force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
