"""The proxy under faults: broker killed and restarted, clients that reset mid-frame or crawl,
200 connections at once, and the proxy itself SIGKILLed (its Parquet output stays readable).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from realkafka import TansuBroker, free_port

from proxy.embedded import ProxyProcess, ProxyThread, loopback_config
from proxy.server import ProxyConfig

pytestmark = pytest.mark.real


def api_versions_v0(corr: int, client_id: bytes = b"fault-test") -> bytes:
    payload = struct.pack(">hhih", 18, 0, corr, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


def metadata_v1(corr: int, client_id: bytes = b"fault-test") -> bytes:
    payload = struct.pack(">hhih", 3, 1, corr, len(client_id)) + client_id + struct.pack(">i", -1)
    return struct.pack(">i", len(payload)) + payload


def read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    head = exactly(4)
    return head + exactly(struct.unpack(">i", head)[0])


def config(broker: TansuBroker | int, out: Path | None = None, **extra: Any) -> ProxyConfig:
    port = broker if isinstance(broker, int) else broker.port
    return loopback_config(port, out, flush_seconds=0.5, connect_timeout=3, **extra)


def rows(out: Path, table: str = "exchanges") -> list[dict[str, Any]]:
    return ds.dataset(out / table, partitioning="hive").to_table().to_pylist()


def test_broker_killed_and_restarted_under_load(tmp_path: Path) -> None:
    port = free_port()
    broker = TansuBroker(port=port).start()
    from confluent_kafka import Producer

    delivered: list[float] = []
    failed: list[str] = []
    stop = threading.Event()
    try:
        with ProxyThread(config(port, tmp_path)) as running:
            producer = Producer(
                {
                    "bootstrap.servers": running.address,
                    "client.id": "fault-load",
                    "acks": "all",
                    "linger.ms": 5,
                    "message.timeout.ms": 20000,
                    "reconnect.backoff.max.ms": 500,
                    "topic.metadata.refresh.interval.ms": 1000,
                }
            )

            def load() -> None:
                deadline = time.monotonic() + 12
                while not stop.is_set() and time.monotonic() < deadline:
                    producer.produce(
                        "fault-load",
                        value=b"x" * 1000,
                        on_delivery=lambda err, _m: (
                            delivered.append(time.monotonic()) if err is None else failed.append(str(err))
                        ),
                    )
                    producer.poll(0.005)
                producer.flush(20)

            worker = threading.Thread(target=load)
            worker.start()
            time.sleep(2)
            before_kill = len(delivered)
            broker.proc.kill()  # SIGKILL
            broker.proc.wait(5)
            killed_at = time.monotonic()
            time.sleep(1.0)
            broker = TansuBroker(port=port).start()
            time.sleep(3)
            stop.set()
            worker.join(30)
            assert not worker.is_alive()
            # the proxy still serves: a fresh connection gets an answer
            with socket.create_connection(("127.0.0.1", running.proxy.listen_port), timeout=5) as s:
                s.settimeout(5)
                s.sendall(api_versions_v0(99))
                assert struct.unpack_from(">i", read_frame(s), 4)[0] == 99
            broken = running.proxy.metrics.connections_total
    finally:
        stop.set()
        broker.close()
    assert before_kill > 0
    assert any(t > killed_at + 1.0 for t in delivered), f"nothing delivered after the restart ({failed[:3]})"
    connections = rows(tmp_path, "connections")
    assert len(connections) == broken
    assert any(c["end_reason"] in ("rst", "fin") and c["client_id"] == "fault-load" for c in connections)
    exchanges = rows(tmp_path)
    produced = [r for r in exchanges if r["api_name"] == "Produce" and r["status"] == "ok"]
    assert len(produced) > 0


def test_reset_mid_frame_and_slowloris_do_not_disturb_others(tansu: TansuBroker, tmp_path: Path) -> None:
    with ProxyThread(config(tansu, tmp_path)) as running:
        address = ("127.0.0.1", running.proxy.listen_port)
        # a client that sends half a frame and resets the connection
        reset = socket.create_connection(address)
        frame = metadata_v1(1, b"resetter")
        reset.sendall(frame[:-3])  # the header and client id, not the whole body
        time.sleep(0.1)
        reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        reset.close()
        # a slowloris: one byte every 20 ms, and a second one that never finishes its frame
        slow_answer: list[int] = []

        def slowloris() -> None:
            with socket.create_connection(address) as s:
                s.settimeout(10)
                for byte in api_versions_v0(7, b"slowloris"):
                    s.sendall(bytes([byte]))
                    time.sleep(0.02)
                slow_answer.append(struct.unpack_from(">i", read_frame(s), 4)[0])

        stuck = socket.create_connection(address)
        stuck.sendall(api_versions_v0(1, b"stuck")[:9])
        crawler = threading.Thread(target=slowloris)
        crawler.start()
        # meanwhile a normal client does round trips without noticing
        latencies = []
        with socket.create_connection(address) as s:
            s.settimeout(5)
            for corr in range(60):
                started = time.perf_counter()
                s.sendall(api_versions_v0(corr, b"normal"))
                assert struct.unpack_from(">i", read_frame(s), 4)[0] == corr
                latencies.append(time.perf_counter() - started)
        crawler.join(15)
        stuck.close()
        assert slow_answer == [7]
    latencies.sort()
    assert latencies[int(len(latencies) * 0.95)] < 0.1
    exchanges = rows(tmp_path)
    by_client = {}
    for row in exchanges:
        by_client.setdefault(row["client_id"], []).append(row)
    assert len(by_client["normal"]) == 60 and {r["status"] for r in by_client["normal"]} == {"ok"}
    assert [r["status"] for r in by_client["slowloris"]] == ["ok"]
    assert [r["status"] for r in by_client["resetter"]] == ["truncated"]
    connections = rows(tmp_path, "connections")
    assert "rst" in {c["end_reason"] for c in connections if c["client_id"] == "resetter"}


def test_200_concurrent_connections_keep_their_order(tansu: TansuBroker, tmp_path: Path) -> None:
    connections, per_connection = 200, 10

    async def one(port: int, index: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            frames = [
                (metadata_v1 if i % 2 else api_versions_v0)(index * 1000 + i, b"many")
                for i in range(per_connection)
            ]
            writer.write(b"".join(frames))  # pipelined
            await writer.drain()
            got = []
            for _ in range(per_connection):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                body = await reader.readexactly(size)
                got.append(struct.unpack_from(">i", body)[0])
            return got
        finally:
            writer.close()

    async def main(port: int) -> list[Any]:
        return await asyncio.wait_for(
            asyncio.gather(*(one(port, i) for i in range(connections)), return_exceptions=True), 60
        )

    with ProxyThread(config(tansu, tmp_path, metrics_port=0)) as running:
        results = asyncio.run(main(running.proxy.listen_port))
        peak = running.proxy.metrics.connections_total
        metrics = running.proxy.metrics
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    for index, got in enumerate(results):
        assert got == [index * 1000 + i for i in range(per_connection)]
    assert peak == connections
    every = rows(tmp_path)
    exchanges = [r for r in every if r["client_id"] == "many"]
    # the recorder keeps up, or says where it did not: skipped bytes are counted and the rows
    # around them are gaps, never false unanswered/truncated/orphan rows (on a loaded 2-core
    # machine it fell behind here: 1,220 of 2,000 recorded)
    assert {r["status"] for r in every} <= {"ok", "gap"}
    assert {r["status"] for r in exchanges} <= {"ok", "gap"}
    if len(exchanges) < connections * per_connection:
        assert metrics.dropped_bytes > 0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: nothing may have reaped it yet)."""
    try:
        return (Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_output_readable_after_proxy_sigkill(tansu: TansuBroker, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    proc = ProxyProcess(
        [
            "--bootstrap",
            tansu.bootstrap,
            "--listen",
            "127.0.0.1:0",
            "-o",
            str(out),
            "--broker-port-base",
            "0",
            "--flush-seconds",
            "0.3",
        ]
    ).start()
    sent = 0
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as s:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                s.sendall(api_versions_v0(sent, b"sigkill"))
                read_frame(s)
                sent += 1
            workers = proc.children()  # the recorder process
            proc.proc.kill()  # SIGKILL while traffic flows
            proc.proc.wait(10)
    finally:
        proc.kill()
    assert len(workers) == 1
    deadline = time.monotonic() + 30  # it is killed with the proxy: no process is left behind
    while _alive(workers[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(workers[0])
    files = sorted(out.rglob("*.parquet"))
    assert files, "no file was rolled before the kill"
    for path in files:
        assert pq.read_table(path).num_rows >= 0  # every visible file is complete
    leftovers = [p for p in out.rglob("*") if p.is_file() and p not in files]
    assert all(p.name.startswith(".") for p in leftovers)  # unfinished files stay hidden
    recorded = [r for r in rows(out) if r["client_id"] == "sigkill"]
    assert 0 < len(recorded) <= sent
    assert [r["correlation_id"] for r in sorted(recorded, key=lambda r: r["correlation_id"])] == list(
        range(len(recorded))
    )  # what was written is a gap-free prefix: only the last window is lost
