"""``kwire proxy`` header timeouts and stale temporary files (issue 18, item 7).

Header timeout (``--header-timeout-s``, ``ProxyConfig.header_timeout``): a connection whose
first request, or any later request header once begun, is not complete within the timeout is
closed and counted (``kwire_proxy_header_timeouts_total``). Checked on both I/O paths with a
real proxy in front of Tansu and raw sockets: a connection that sends nothing, one that sends
half a header and stops, and one that sends a byte every 0.3 s (a slowloris: a per-byte idle
timer would never fire) are closed; a header split over two writes, a connection idle between
requests, a raw long-poll Fetch outstanding for three timeouts and a real consumer
(kafka-python, fetch.max.wait 2.5 s against a 1 s timeout) are not. With the timeout off the
half header stays open.

Stale temporary files: a real dataset writer is SIGKILLed while it writes a file (its
``.part-*.parquet.tmp`` stays); a proxy started on that directory removes it and leaves finished
files alone; while another proxy runs on the directory, nothing is removed (its temporary files
are not stale). The last proxy is the real ``kwire proxy`` command, SIGKILLed under load.

Proxies listen on 127.0.6.1 (this suite's loopback range); every wait is bounded.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from realkafka import TansuBroker
from typer.testing import CliRunner

from decoder import message_codec as mc
from kwire.cli import app
from proxy import outdir
from proxy.embedded import ProxyProcess, ProxyThread
from proxy.server import ProxyConfig

pytestmark = pytest.mark.real

HOST = "127.0.6.1"
TIMEOUT = 1.0
#: Longest wait for the proxy to close a connection (the sweep closes it within 1.25 timeouts).
CLOSE_WAIT = 10.0


def config(broker: TansuBroker, out: Path | None = None, **extra: Any) -> ProxyConfig:
    return ProxyConfig(
        bootstrap=[("127.0.0.1", broker.port)],
        listen=(HOST, 0),
        broker_port_base=0,
        out_dir=out,
        flush_seconds=0.2,
        connect_timeout=3,
        **{"header_timeout": TIMEOUT, **extra},
    )


def request(key: int, version: int, corr: int, client_id: str = "timeouts", **body: Any) -> bytes:
    tree = mc.default_tree("request", key, version) | body
    header = {
        "RequestApiKey": key,
        "RequestApiVersion": version,
        "CorrelationId": corr,
        "ClientId": client_id,
    }
    return mc.encode_frame("request", key, version, header, tree)


def api_versions(corr: int, client_id: str = "timeouts") -> bytes:
    return request(18, 0, corr, client_id)


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


def round_trip(sock: socket.socket, frame: bytes) -> int:
    """Send a request, read its response: the response's correlation id."""
    sock.sendall(frame)
    return struct.unpack_from(">i", read_frame(sock), 4)[0]


def closed_by_proxy(sock: socket.socket, wait: float = CLOSE_WAIT) -> bool:
    """Whether the proxy closes ``sock`` (end of stream or reset) within ``wait`` seconds; these
    connections never sent a whole request, so nothing else can arrive on them."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def test_unfinished_headers_are_closed_and_waiting_clients_are_not(
    tansu: TansuBroker, tmp_path: Path
) -> None:
    tansu.create_topics(["timeouts-empty"], partitions=1)
    out = tmp_path / "ds"
    with ProxyThread(config(tansu, out)) as running:
        port = running.proxy.listen_port
        silent = connect(port)  # never sends a byte
        partial = connect(port)
        partial.sendall(api_versions(1, "half")[:7])  # length, api key, half the version
        crawled: list[str] = []

        def crawl() -> None:  # a byte every 0.3 s: the frame would take about 9 s
            with connect(port) as sock:
                frame = api_versions(2, "crawler")
                try:
                    for i in range(len(frame)):
                        sock.sendall(frame[i : i + 1])
                        time.sleep(0.3)
                    crawled.append("answered" if round_trip(sock, b"") == 2 else "wrong")
                except OSError:
                    crawled.append("closed")

        crawler = threading.Thread(target=crawl)
        crawler.start()
        with connect(port) as split, connect(port) as idle, connect(port) as poller:
            # a header in two writes, within the timeout
            frame = api_versions(3, "split")
            split.sendall(frame[:6])
            time.sleep(TIMEOUT * 0.3)
            assert round_trip(split, frame[6:]) == 3
            # idle between requests for three timeouts, then used again
            assert round_trip(idle, api_versions(4, "idle")) == 4
            # a long-poll Fetch outstanding for three timeouts (Tansu holds it for MaxWaitMs)
            fetch = request(
                1,
                4,
                5,
                "poller",
                ReplicaId=-1,
                MaxWaitMs=int(TIMEOUT * 3000),
                MinBytes=1,
                MaxBytes=1 << 20,
                Topics=[
                    {
                        "Topic": "timeouts-empty",
                        "Partitions": [{"Partition": 0, "FetchOffset": 0, "PartitionMaxBytes": 1 << 20}],
                    }
                ],
            )
            poller.settimeout(TIMEOUT * 3 + 10)
            started = time.monotonic()
            assert round_trip(poller, fetch) == 5
            waited = time.monotonic() - started
            time.sleep(max(0.0, TIMEOUT * 3 - waited))
            assert closed_by_proxy(silent) and closed_by_proxy(partial)
            assert round_trip(idle, api_versions(6, "idle")) == 6
            assert round_trip(poller, api_versions(7, "poller")) == 7
            assert round_trip(split, api_versions(8, "split")) == 8
        crawler.join(30)
        assert crawled == ["closed"]
        timeouts = running.proxy.metrics.header_timeouts
        page = running.proxy.metrics.render()
        silent.close()
        partial.close()
    assert waited >= TIMEOUT * 2  # the Fetch really was outstanding for longer than the timeout
    assert timeouts == 3
    assert "kwire_proxy_header_timeouts_total 3" in page
    connections = ds.dataset(out / "connections", partitioning="hive").to_table().to_pylist()
    by_client: dict[str | None, list[str]] = {}
    for row in connections:
        by_client.setdefault(row["client_id"], []).append(row["end_reason"])
    # the closed ones: no client id read (silent, half), the crawler's header never finished
    assert sorted(by_client.pop(None)) == ["rst", "rst", "rst"]
    assert set(by_client) == {"split", "idle", "poller"}


def test_with_the_timeout_off_a_half_header_waits(tansu: TansuBroker) -> None:
    with ProxyThread(config(tansu, header_timeout=None)) as running:
        assert running.proxy._header_sweeper is None
        with connect(running.proxy.listen_port) as sock:
            frame = api_versions(1, "patient")
            sock.sendall(frame[:7])
            assert not closed_by_proxy(sock, TIMEOUT * 2.5)
            assert round_trip(sock, frame[7:]) == 1
        assert running.proxy.metrics.header_timeouts == 0


def test_a_real_consumer_long_polling_is_never_timed_out(tansu: TansuBroker) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = "timeouts-poll"
    tansu.create_topics([topic], partitions=1)
    with ProxyThread(config(tansu)) as running:
        bootstrap = f"{HOST}:{running.proxy.listen_port}"
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            client_id="long-poller",
            fetch_max_wait_ms=int(TIMEOUT * 2500),
            auto_offset_reset="earliest",
            request_timeout_ms=30_000,
        )
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + TIMEOUT * 6
            while time.monotonic() < deadline:  # an empty topic: every Fetch waits 2.5 s
                for records in consumer.poll(timeout_ms=500).values():
                    got += [r.value for r in records]
            producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="long-poll-producer")
            producer.send(topic, b"after-the-wait").get(timeout=20)
            producer.close(timeout=10)
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    got += [r.value for r in records]
        finally:
            consumer.close()
        timeouts = running.proxy.metrics.header_timeouts
    assert got == [b"after-the-wait"]
    assert timeouts == 0


# ---- stale temporary files ------------------------------------------------------------------

_DYING_WRITER = """
import sys, time
from kwire.dataset import DatasetWriter
writer = DatasetWriter(sys.argv[1], row_group_rows=1)
writer.connections.append({"date": "2026-11-25", "source": "dead", "connection_id": "a"})
writer.roll()  # a finished file
writer.connections.append({"date": "2026-11-25", "source": "dead", "connection_id": "b"})
print("writing", flush=True)  # the second file is open under its temporary name
time.sleep(60)
"""


def leave_a_stale_file(out: Path) -> Path:
    """A real dataset writer SIGKILLed while it writes: the temporary file it leaves."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _DYING_WRITER, str(out)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stale = outdir.stale_files(out)
    assert len(stale) == 1 and stale[0].name.endswith(".parquet.tmp")
    return stale[0]


def test_stale_temporary_files_are_removed_at_start(tansu: TansuBroker, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    stale = leave_a_stale_file(out)
    finished = sorted(out.rglob("*.parquet"))
    assert len(finished) == 1
    with ProxyThread(config(tansu, out)) as first:
        assert not stale.exists()
        # a second proxy on the same directory while the first runs: a file being written now
        # (standing in for the first proxy's) is not stale, and stays
        stand_in = stale.with_name(".part-live-00000.parquet.tmp")
        stand_in.write_bytes(b"being written")
        with ProxyThread(config(tansu, out)) as second, connect(first.proxy.listen_port) as sock:
            assert stand_in.exists()
            assert round_trip(sock, api_versions(1, "first")) == 1
            with connect(second.proxy.listen_port) as other:
                assert round_trip(other, api_versions(2, "second")) == 2
    assert stand_in.exists()  # both stopped: it is stale now, for the next start
    assert pq.read_table(finished[0]).num_rows == 1  # the finished file is untouched
    assert (out / outdir.LOCK_NAME).exists()

    # the real command, SIGKILLed while it records; the next start leaves nothing behind
    args = ["--bootstrap", tansu.bootstrap, "--listen", f"{HOST}:0", "-o", str(out)]
    args += ["--broker-port-base", "0", "--flush-seconds", "0.05"]
    proc = ProxyProcess(args).start()
    try:
        assert not stand_in.exists()
        assert "removed 1 unfinished file(s)" in proc.log
        with connect(proc.port or 0) as sock:
            corr = 0
            deadline = time.monotonic() + 20
            before = set((out / "exchanges").glob("*/part-*.parquet"))
            while set((out / "exchanges").glob("*/part-*.parquet")) == before and time.monotonic() < deadline:
                assert round_trip(sock, api_versions(corr, "killed")) == corr
                corr += 1
            for more in range(corr, corr + 100):  # and more, rolled every 50 ms, as it is killed
                assert round_trip(sock, api_versions(more, "killed")) == more
            proc.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            proc.proc.wait(10)  # type: ignore[union-attr]
    finally:
        proc.kill()
    restarted = ProxyProcess(args).start()
    try:
        leftovers = outdir.stale_files(out)
    finally:
        code = restarted.terminate()
    assert leftovers == [] and code == 0
    assert not list(out.rglob("*.tmp"))
    rows = ds.dataset(out / "exchanges", partitioning="hive").to_table().to_pylist()
    assert any(r["client_id"] == "killed" for r in rows)  # what was rolled before the kill is readable


def test_bad_timeout_and_token_flags_are_refused(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["proxy", "--bootstrap", "127.0.0.1:1", "--listen", f"{HOST}:0"]
    result = runner.invoke(app, [*base, "--header-timeout-s", "-1"])
    assert result.exit_code == 2 and "--header-timeout-s" in result.stderr
    result = runner.invoke(app, [*base, "--metrics-token-file", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "--metrics-token-file" in result.stderr
    (tmp_path / "blank").write_text("  \n")
    result = runner.invoke(app, [*base, "--metrics-token-file", str(tmp_path / "blank")])
    assert result.exit_code == 2 and "one word" in result.stderr
    result = runner.invoke(app, [*base, "--metrics-client-ids", "-3"])
    assert result.exit_code == 2 and "--metrics-client-ids" in result.stderr


def _kwire_refusing(*args: str) -> subprocess.CompletedProcess[str]:
    """``kwire ARGS`` in a process of its own, bounded: a command that wrongly accepts its input
    and starts serving fails the test at the timeout instead of hanging it."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "kwire", *args], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"kwire {' '.join(args)} ran on instead of refusing its input")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--flush-seconds", "0"),
        ("--flush-seconds", "nan"),
        ("--flush-seconds", "inf"),
        ("--flush-rows", "0"),
        ("--max-queue-mb", "0"),
        ("--max-pending-rows", "0"),
    ],
)
def test_recorder_bounds_that_bound_nothing_are_refused_by_proxy_and_capture(
    tmp_path: Path, flag: str, value: str
) -> None:
    """A flush window of 0 (a file per turn), NaN or infinity (a SIGKILL's loss unbounded), or a
    queue of nothing: one line and exit 2 (the proxy took them; capture took NaN and infinity)."""
    proxy = _kwire_refusing("proxy", "--bootstrap", "127.0.0.1:1", "--listen", f"{HOST}:0", flag, value)
    assert proxy.returncode == 2 and f"{flag} " in proxy.stderr and "more than 0" in proxy.stderr, (
        proxy.stderr
    )
    if flag == "--max-pending-rows":
        return  # the sidecar has no such option
    capture = _kwire_refusing("capture", "-i", "lo", "-o", str(tmp_path / "c.kwire"), flag, value)
    assert capture.returncode == 2 and f"{flag} " in capture.stderr, capture.stderr


def test_an_address_that_cannot_be_used_is_one_line_in_the_resolvers_or_the_os_words(tmp_path: Path) -> None:
    """A name that does not resolve said "Unknown error -2" (a resolver code read as an errno)."""
    for listen in ("999.1.1.1:5", "no-such-host.invalid:5"):
        result = _kwire_refusing("proxy", "--bootstrap", "127.0.0.1:1", "--listen", listen)
        assert result.returncode == 2, result.stderr
        assert f"cannot listen on {listen}: " in result.stderr and "Unknown error" not in result.stderr
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _kwire_refusing("proxy", "--bootstrap", "127.0.0.1:1", "--listen", f"{HOST}:{port}")
        assert result.returncode == 2 and os.strerror(errno.EADDRINUSE) in result.stderr, result.stderr
    sidecar = _kwire_refusing(
        "capture",
        "-i",
        "lo",
        "-o",
        str(tmp_path / "c.kwire"),
        "--metrics-port",
        "0",
        "--metrics-host",
        "999.1.1.1",
    )
    assert sidecar.returncode == 2 and "Unknown error" not in sidecar.stderr, sidecar.stderr
