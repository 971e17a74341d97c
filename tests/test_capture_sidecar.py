"""``kwire capture``, the passive sidecar (issue 19): real traffic on loopback while it runs, recorded
through the proxy's recorder; its rows equal ``kwire decode`` of a tcpdump capture of the same
traffic, it survives its capture program dying, serves the proxy's metrics, and stops cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
from realkafka import capturing_tcpdump, descendants, kill_if_running

from kwire.rowprint import _json_value

LAB = os.environ.get("KWIRE_LAB_NET", "127.0.19")
#: Columns that depend on when each tcpdump stamped a packet, or on who recorded it.
TIMED = ("source", "connection_id", "request_time", "response_time", "latency_us", "date", "injected")

pytestmark = pytest.mark.real


def _rows(dataset: Path) -> list[dict[str, Any]]:
    table = pads.dataset(dataset / "exchanges", format="parquet", partitioning="hive").to_table()
    return [{k: _json_value(v) for k, v in row.items()} for row in table.to_pylist()]


def _status_counts(dataset: Path) -> dict[str, int]:
    """How many rows of each status ``dataset`` holds (for failure messages)."""
    if not (dataset / "exchanges").is_dir():
        return {}
    statuses = pads.dataset(dataset / "exchanges", format="parquet", partitioning="hive").to_table(
        columns=["status"]
    )
    out: dict[str, int] = {}
    for status in statuses.column("status").to_pylist():
        out[status] = out.get(status, 0) + 1
    return out


def _untimed(row: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in TIMED}, sort_keys=True)


def _wait_for(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    return check()


def _start_on_lo(out: Path, broker: Any, more: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``kwire capture`` on lo, recording ``broker``'s traffic to ``out``."""
    bpf = f"host {broker.host} and tcp port {broker.port}"
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kwire",
            "capture",
            "-i",
            "lo",
            "-o",
            out,
            "--port",
            str(broker.port),
            "-f",
            bpf,
            *more,
        ],
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _capturing(sidecar: subprocess.Popen[bytes]) -> int:
    """Once the sidecar records and its tcpdump captures: that tcpdump's pid."""
    assert sidecar.stderr is not None
    assert b"kwire capture: recording lo" in sidecar.stderr.readline()
    return capturing_tcpdump(sidecar.pid)


def _stopped_cleanly(sidecar: subprocess.Popen[bytes]) -> None:
    """SIGTERM: the sidecar writes its last rows and exits 0."""
    sidecar.send_signal(signal.SIGTERM)
    assert sidecar.wait(30) == 0


def test_capture_records_real_traffic_like_decode_and_survives_restart(tmp_path: Path) -> None:
    from realkafka import (
        Tcpdump,
        free_port,
        kafka_python_scenario,
        started_tansu,
        tcpdump_available,
    )

    reason = tcpdump_available()
    if reason:
        pytest.skip(reason)
    broker = started_tansu(f"{LAB}.2")
    out = tmp_path / "deep" / "sidecar.kwire"
    metrics_host = f"{LAB}.3"
    metrics_port = free_port(metrics_host)
    sidecar = _start_on_lo(
        out,
        broker,
        ["--flush-seconds", "1", "--metrics-host", metrics_host, "--metrics-port", str(metrics_port)],
    )
    try:
        _capturing(sidecar)
        with Tcpdump(tmp_path / "same.pcap", [broker.port]) as dump:
            kafka_python_scenario(broker.bootstrap, "m-sidecar")
        first = _wait_for(
            lambda: out.joinpath("exchanges").is_dir() and len(_rows(out)) >= 20 and _rows(out), 20
        )
        assert first, "the sidecar published rows while running"

        # its capture program dies (as when the interface goes away): it starts another, keeps recording
        (old,) = [pid for pid, name in descendants(sidecar.pid) if name == "tcpdump"]
        os.kill(old, signal.SIGKILL)
        assert _wait_for(lambda: [p for p, n in descendants(sidecar.pid) if n == "tcpdump" and p != old], 15)
        time.sleep(1.0)
        before = len(_rows(out))
        kafka_python_scenario(broker.bootstrap, "m-sidecar-2")
        assert _wait_for(lambda: len(_rows(out)) >= before + 20, 20), "rows after the restart"

        page = (
            urllib.request.urlopen(f"http://{metrics_host}:{metrics_port}/metrics", timeout=10)
            .read()
            .decode()
        )
        for name in (
            "kwire_proxy_request_latency_seconds_bucket",
            "kwire_proxy_rows_written_total",
            "kwire_proxy_response_errors_total",
        ):
            assert name in page, name
        # requests counted as the proxy counts them (kwire.sidecar_requests)
        assert 'kwire_proxy_requests_total{api="Produce",api_key="0"' in page
        assert 'client_id="kwire-test-kafka-python"' in page
        _stopped_cleanly(sidecar)
    finally:
        kill_if_running(sidecar)
        broker.close()
    rows = _rows(out)
    assert not list(out.rglob("*.tmp")), "every file renamed into place"
    decoded = subprocess.run(
        [sys.executable, "-m", "kwire", "decode", dump.path, "-T", "jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    from_file = [json.loads(line) for line in decoded.stdout.splitlines()]
    assert len(from_file) >= 20
    recorded = {_untimed(r) for r in rows}
    missing = [r for r in from_file if _untimed(r) not in recorded]
    assert not missing, missing[:2]
    assert any(r["client_id"] == "kwire-test-kafka-python" for r in rows)


# ---- an interface that goes down, comes back, goes away -----------------------------------------

#: Run in the namespace: a kafka-python producer (topic created first), 5 records, acks=1.
_CLIENT = """
import sys
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError
bootstrap, client_id = sys.argv[1], sys.argv[2]
admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id, request_timeout_ms=10000)
try:
    admin.create_topics([NewTopic("netns-t", 1, 1)])
except TopicAlreadyExistsError:
    pass
admin.close()
producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, acks=1, request_timeout_ms=10000)
for i in range(5):
    producer.send("netns-t", b"record %d" % i).get(timeout=20)
producer.close(timeout=10)
"""
#: Run in the namespace: GET a URL; prints the status, then the body.
_GET = """
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
except OSError as e:
    print(0); print(e)
"""
NETNS_BROKER, NETNS_ADMIN, NETNS_ADMIN_AWAY, NETNS_ADMIN_WAIT = 41650, 41651, 41652, 41653


def _requests_by_client(page: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in page.splitlines():
        if line.startswith("kwire_proxy_requests_total{"):
            client = line.split('client_id="', 1)[1].split('"', 1)[0]
            out[client] = out.get(client, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def test_capture_counts_requests_and_survives_its_interface_going_down_and_away(tmp_path: Path) -> None:
    """In a network namespace of its own (traffic on its 127.0.0.1): a broker, ``kwire capture -i lo``
    with a real client before and after ``lo`` goes down and up (tcpdump keeps running through it;
    the requests are counted as the proxy counts them: one per row), and a second sidecar on a veth
    that is deleted and made again (tcpdump exits; the sidecar starts it again, with bounded pauses,
    once the interface is back: /ready says which); a third, ``--wait-for-interface``, started on a
    veth that does not exist yet, waits for it."""
    import shutil

    from realkafka import BrokerStartError, tansu_binary, tcpdump_available

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    reason = tcpdump_available()
    if reason:
        pytest.skip(reason)
    try:
        tansu = tansu_binary()
    except BrokerStartError as exc:
        pytest.skip(str(exc))
    ns = f"kwire-sidecar-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True, timeout=10).returncode:
        pytest.skip("cannot make a network namespace here")

    def inside(*command: str, timeout: float = 60) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", ns, *command], capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def get(port: int, path: str) -> tuple[int, str]:
        status, _, body = inside(sys.executable, "-c", _GET, f"http://127.0.0.1:{port}{path}").partition("\n")
        return int(status), body

    def start(*command: str, log: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    def sidecar(
        interface: str, out: str, port: int, admin: int, log: str, *more: str
    ) -> subprocess.Popen[bytes]:
        return start(
            sys.executable, "-m", "kwire", "capture", "-i", interface, "-o", str(tmp_path / out),
            "--port", str(port), "--flush-seconds", "1", "--metrics-port", str(admin), *more, log=log,
        )  # fmt: skip

    def log(name: str) -> str:
        return (tmp_path / name).read_text(errors="replace")

    started: list[subprocess.Popen[bytes]] = []
    bootstrap = f"127.0.0.1:{NETNS_BROKER}"
    try:
        inside("ip", "link", "set", "lo", "up")
        inside("ip", "link", "add", "kwv0", "type", "veth", "peer", "name", "kwv1")
        inside("ip", "link", "set", "kwv0", "up")
        url = f"tcp://{bootstrap}"
        start(tansu, "broker", "--listener-url", url, "--advertised-listener-url", url,
              "--storage-engine", "memory://tansu/", log="tansu.log")  # fmt: skip
        on_lo = sidecar("lo", "lo.kwire", NETNS_BROKER, NETNS_ADMIN, "lo.log")
        away = sidecar("kwv0", "away.kwire", 9092, NETNS_ADMIN_AWAY, "away.log")
        waiting = sidecar("kwv2", "wait.kwire", 9092, NETNS_ADMIN_WAIT, "wait.log", "--wait-for-interface")
        assert _wait_for(lambda: "kwire capture: recording lo" in log("lo.log"), 20), log("lo.log")
        assert _wait_for(lambda: get(NETNS_ADMIN, "/ready")[0] == 200, 20)
        assert _wait_for(lambda: get(NETNS_ADMIN_AWAY, "/ready")[0] == 200, 20)
        time.sleep(1.0)  # tcpdump opening the interface

        inside(sys.executable, "-c", _CLIENT, bootstrap, "kw-before")
        inside("ip", "link", "set", "lo", "down")
        time.sleep(1.0)
        assert on_lo.poll() is None
        inside("ip", "link", "set", "lo", "up")
        inside(sys.executable, "-c", _CLIENT, bootstrap, "kw-after")

        def seen() -> tuple[dict[str, int], dict[str, int]]:
            rows = _rows(tmp_path / "lo.kwire") if (tmp_path / "lo.kwire" / "exchanges").is_dir() else []
            by_rows = {c: sum(r["client_id"] == c for r in rows) for c in ("kw-before", "kw-after")}
            page = get(NETNS_ADMIN, "/metrics")[1]
            return by_rows, {c: n for c, n in _requests_by_client(page).items() if c in by_rows}

        def counted() -> Any:
            by_rows, by_metrics = seen()
            return by_rows if by_rows == by_metrics and min(by_rows.values()) >= 10 else None

        counts = _wait_for(counted, 30)
        # every request counted once, as in the rows
        assert counts, (seen(), log("lo.log")[-2000:], _status_counts(tmp_path / "lo.kwire"))
        # a quiet link: nothing skipped, though tcpdump's ring hands packets over up to 1.5 s late
        connections = pads.dataset(tmp_path / "lo.kwire" / "connections", partitioning="hive").to_table()
        skipped = [c for c in connections.to_pylist() if c["gap_bytes_to_broker"] or c["gap_bytes_to_client"]]
        assert connections.num_rows >= 4 and not skipped, skipped

        # the veth goes away: its tcpdump exits, the sidecar keeps trying (pauses up to 5 s)
        inside("ip", "link", "del", "kwv0")
        assert _wait_for(lambda: "capture on kwv0 stopped" in log("away.log"), 15), log("away.log")
        assert _wait_for(lambda: get(NETNS_ADMIN_AWAY, "/ready")[0] == 503, 15)
        assert away.poll() is None
        inside("ip", "link", "add", "kwv0", "type", "veth", "peer", "name", "kwv1")
        inside("ip", "link", "set", "kwv0", "up")
        status, body = _wait_for(
            lambda: (lambda r: r if r[0] == 200 else None)(get(NETNS_ADMIN_AWAY, "/ready")), 20
        )
        assert status == 200 and "capturing on kwv0" in body

        # the interface that did not exist when its sidecar started: it kept trying, and now captures
        assert waiting.poll() is None, log("wait.log")
        assert "capture on kwv2 stopped" in log("wait.log") and get(NETNS_ADMIN_WAIT, "/ready")[0] == 503
        inside("ip", "link", "add", "kwv2", "type", "veth", "peer", "name", "kwv3")
        inside("ip", "link", "set", "kwv2", "up")
        assert _wait_for(lambda: get(NETNS_ADMIN_WAIT, "/ready")[0] == 200, 20), log("wait.log")
        for proc in (on_lo, away, waiting):
            _stopped_cleanly(proc)
    finally:
        for proc in started:
            kill_if_running(proc)
        # whatever is left in the namespace: a sidecar killed above leaves its tcpdump running (a
        # session of its own), and in a namespace about to go it would never see a packet again
        left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
        for pid in left.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    assert not list((tmp_path / "lo.kwire").rglob("*.tmp"))


@pytest.mark.parametrize(
    ("what", "args", "reason", "hint"),
    [
        ("no such interface", ["-i", "kwnosuch0"], "kwnosuch0", True),
        ("a filter tcpdump cannot compile", ["-i", "lo", "-f", "tcp port"], "filter", False),
    ],
)
def test_capture_that_cannot_start_says_why_in_one_line_and_exits_2(
    tmp_path: Path, what: str, args: list[str], reason: str, hint: bool
) -> None:
    """A capture program that fails on its first start will not get better by itself: the sidecar
    says why in one line and exits 2 (it used to retry forever, one warning every 5 s). Only a
    missing interface gets the hint of ``--wait-for-interface``."""
    from realkafka import tcpdump_available

    why = tcpdump_available()
    if why:
        pytest.skip(why)
    done = subprocess.run(
        [sys.executable, "-m", "kwire", "capture", *args, "-o", str(tmp_path / "out.kwire")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (what, done.stderr[-2000:])
    last = lines[-1]
    assert last.startswith("kwire capture: cannot capture on ") and reason in last, (what, lines)
    assert ("--wait-for-interface" in last) == hint, (what, last)
    assert not any("WARNING" in line or "Traceback" in line for line in lines), lines


def test_capture_keeps_a_burst_sent_while_tcpdump_is_stopped_and_stopped_right_after(tmp_path: Path) -> None:
    """1,500 ApiVersions round trips while the sidecar's tcpdump is stopped (SIGSTOP: about 6,000
    packets wait in the kernel's ring), then SIGTERM as soon as tcpdump runs again: every exchange
    is recorded. The ring must hold the burst (no --immediate-mode, see kwire.live), and the stop
    must wait for the ring's last block, which reaches tcpdump up to a second late."""
    from realkafka import api_versions_round_trips, started_tansu, tcpdump_available

    reason = tcpdump_available()
    if reason:
        pytest.skip(reason)
    broker = started_tansu(f"{LAB}.2")
    out = tmp_path / "burst.kwire"
    sidecar = _start_on_lo(out, broker)
    n = 1500
    try:
        tcpdump = _capturing(sidecar)
        os.kill(tcpdump, signal.SIGSTOP)
        try:
            api_versions_round_trips(broker.host, broker.port, n, "burst")
        finally:
            os.kill(tcpdump, signal.SIGCONT)
        _stopped_cleanly(sidecar)
    finally:
        kill_if_running(sidecar)
        broker.close()
    ours = [r for r in _rows(out) if r["client_id"] == "burst"]
    assert sorted(r["correlation_id"] for r in ours) == list(range(n))
    assert {r["status"] for r in ours} == {"ok"}
