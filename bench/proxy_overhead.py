"""What ``kwire proxy`` costs: the same load direct to Tansu, through kwire proxy, through tansu proxy.

One run, one Tansu broker (memory storage), three paths to it:

* ``direct``: clients talk to the broker;
* ``kwire``: ``kwire proxy`` with recording on (``-o`` a temporary dataset, 10 s flushes);
* ``tansu``: Tansu's own Kafka proxy (``<tansu> proxy``), from the same binary.

For each path (confluent-kafka, 1 KB records, acks=all):

1. throughput: produce ``--records`` records as fast as the producer goes, then consume them;
2. latency at moderate load: ``--rate`` records/s one at a time (linger.ms=0) for
   ``--seconds``; p50/p99 from produce() to the delivery report;
3. proxy CPU (user+system from /proc) during the throughput phase, per MB/s forwarded.

Usage: ``python bench/proxy_overhead.py [--records 20000] [--rate 300] [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from realkafka import TansuBroker, free_port, tansu_binary  # noqa: E402

from proxy.embedded import ProxyProcess  # noqa: E402

RECORD = b"x" * 1024


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def throughput(bootstrap: str, topic: str, records: int, pid: int | None) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 200_000,
            "message.timeout.ms": 60_000,
            "client.id": "bench-producer",
        }
    )
    delivered = [0]
    errors: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            errors.append(str(err))

    cpu0, started = cpu_seconds(pid), time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, RECORD, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    produce_s = time.perf_counter() - started
    produce_cpu = cpu_seconds(pid) - cpu0

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{topic}",
            "client.id": "bench-consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            "fetch.max.bytes": 8 << 20,
        }
    )
    consumer.subscribe([topic])
    got = 0
    first = None
    cpu1 = cpu_seconds(pid)
    deadline = time.perf_counter() + 120
    while got < delivered[0] and time.perf_counter() < deadline:
        for msg in consumer.consume(1000, 0.5):
            if msg.error() is None:
                if first is None:
                    first = time.perf_counter()
                got += 1
    consume_s = time.perf_counter() - (first or time.perf_counter())
    consume_cpu = cpu_seconds(pid) - cpu1
    consumer.close()
    mb = delivered[0] * len(RECORD) / 1e6
    return {
        "delivered": delivered[0],
        "errors": len(errors),
        "consumed": got,
        "produce_mb_s": mb / produce_s,
        "produce_msgs_s": delivered[0] / produce_s,
        "consume_mb_s": got * len(RECORD) / 1e6 / consume_s if consume_s > 0 else float("nan"),
        "proxy_cpu_produce_s": produce_cpu,
        "proxy_cpu_consume_s": consume_cpu,
        "proxy_cores_per_mb_s": (produce_cpu / produce_s) / (mb / produce_s) if pid else 0.0,
    }


def latency(bootstrap: str, topic: str, rate: int, seconds: float) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "client.id": "bench-latency",
            "message.timeout.ms": 30_000,
        }
    )
    samples: list[float] = []
    producer.produce(topic, RECORD)  # warm up connections and metadata
    producer.flush(10)

    def report(err: Any, msg: Any, sent: float) -> None:
        if err is None:
            samples.append(time.perf_counter() - sent)

    interval = 1.0 / rate
    started = time.perf_counter()
    count = int(rate * seconds)
    for i in range(count):
        target = started + i * interval
        while (now := time.perf_counter()) < target:
            producer.poll(max(0.0, min(target - now, 0.001)))
        sent = time.perf_counter()
        producer.produce(topic, RECORD, on_delivery=lambda err, msg, sent=sent: report(err, msg, sent))
        producer.poll(0)
    producer.flush(30)
    return {
        "rate": rate,
        "samples": len(samples),
        "p50_ms": percentile(samples, 0.5) * 1e3,
        "p99_ms": percentile(samples, 0.99) * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=300, help="records/s in the latency phase")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the latency phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    results: dict[str, Any] = {}
    workdir = Path(tempfile.mkdtemp(prefix="kwire-bench-"))
    with TansuBroker() as broker:
        modes = ["direct", "kwire", "tansu"]
        for mode in modes:
            pid = None
            proxy: Any = None
            tansu_proc = None
            if mode == "direct":
                bootstrap = broker.bootstrap
            elif mode == "kwire":
                proxy = ProxyProcess(
                    [
                        "--bootstrap",
                        broker.bootstrap,
                        "--listen",
                        "127.0.0.1:0",
                        "--broker-port-base",
                        "0",
                        "-o",
                        str(workdir / "dataset"),
                        "--log-level",
                        "warning",
                    ]
                ).start()
                bootstrap, pid = f"127.0.0.1:{proxy.port}", proxy.proc.pid
            else:
                port = free_port()
                tansu_proc = subprocess.Popen(
                    [
                        tansu_binary(),
                        "proxy",
                        "--listener-url",
                        f"tcp://127.0.0.1:{port}",
                        "--advertised-listener-url",
                        f"tcp://127.0.0.1:{port}",
                        "--origin-url",
                        f"tcp://{broker.bootstrap}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "NO_COLOR": "1"},
                )
                time.sleep(1.0)
                bootstrap, pid = f"127.0.0.1:{port}", tansu_proc.pid
            try:
                print(
                    f"[{mode}] throughput ({args.records} x 1 KB, acks=all) ...", file=sys.stderr, flush=True
                )
                result = throughput(bootstrap, f"bench-{mode}", args.records, pid)
                print(
                    f"[{mode}] latency at {args.rate}/s for {args.seconds:.0f}s ...",
                    file=sys.stderr,
                    flush=True,
                )
                result.update(latency(bootstrap, f"bench-lat-{mode}", args.rate, args.seconds))
                results[mode] = result
            finally:
                if proxy is not None:
                    result["kwire_exit_code"] = proxy.terminate()
                    rows = 0
                    try:
                        import pyarrow.dataset as ds

                        rows = ds.dataset(workdir / "dataset" / "exchanges", partitioning="hive").count_rows()
                    except Exception:
                        pass
                    result["rows_recorded"] = rows
                if tansu_proc is not None:
                    tansu_proc.terminate()
                    tansu_proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)

    direct = results["direct"]
    header = (
        f"{'path':8} {'produce MB/s':>12} {'% direct':>9} {'consume MB/s':>12} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'+p99 ms':>8} {'proxy cores/(MB/s)':>19}"
    )
    print(header)
    for mode, r in results.items():
        print(
            f"{mode:8} {r['produce_mb_s']:12.1f} {100 * r['produce_mb_s'] / direct['produce_mb_s']:8.0f}% "
            f"{r['consume_mb_s']:12.1f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
            f"{r['p99_ms'] - direct['p99_ms']:8.2f} {r['proxy_cores_per_mb_s']:19.4f}"
        )
    if "kwire" in results:
        print(
            f"kwire rows recorded: {results['kwire'].get('rows_recorded')}, exit code "
            f"{results['kwire'].get('kwire_exit_code')}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
