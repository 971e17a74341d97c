"""``kwire capture``, the passive sidecar (issue 19): real traffic on loopback while it runs, recorded
through the proxy's recorder; its rows equal ``kwire decode`` of a tcpdump capture of the same
traffic, it survives its capture program dying, serves the proxy's metrics, and stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from kwire.rowprint import _json_value

LAB = os.environ.get("KWIRE_LAB_NET", "127.0.19")
#: Columns that depend on when each tcpdump stamped a packet, or on who recorded it.
TIMED = ("source", "connection_id", "request_time", "response_time", "latency_us", "date", "injected")

pytestmark = pytest.mark.real


def _rows(dataset: Path) -> list[dict[str, Any]]:
    table = pads.dataset(dataset / "exchanges", format="parquet", partitioning="hive").to_table()
    return [{k: _json_value(v) for k, v in row.items()} for row in table.to_pylist()]


def _untimed(row: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in row.items() if k not in TIMED}, sort_keys=True)


def _children(pid: int) -> list[tuple[int, str]]:
    out = subprocess.run(
        ["ps", "--ppid", str(pid), "-o", "pid=,comm="], capture_output=True, text=True, timeout=10
    )
    return [(int(line.split()[0]), line.split()[1]) for line in out.stdout.splitlines() if line.strip()]


def _wait_for(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    return check()


def test_capture_records_real_traffic_like_decode_and_survives_restart(tmp_path: Path) -> None:
    from realkafka import (
        BrokerStartError,
        TansuBroker,
        Tcpdump,
        free_port,
        kafka_python_scenario,
        tcpdump_available,
    )

    reason = tcpdump_available()
    if reason:
        pytest.skip(reason)
    broker = TansuBroker()
    broker.host = f"{LAB}.2"
    try:
        broker.start()
    except BrokerStartError as exc:
        broker.close()
        pytest.skip(f"Tansu cannot start: {exc}")
    out = tmp_path / "deep" / "sidecar.kwire"
    metrics_host = f"{LAB}.3"
    metrics_port = free_port(metrics_host)
    sidecar = subprocess.Popen(
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
            f"host {broker.host} and tcp port {broker.port}",
            "--flush-seconds",
            "1",
            "--metrics-host",
            metrics_host,
            "--metrics-port",
            str(metrics_port),
        ],
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert sidecar.stderr is not None
        assert b"kwire capture: recording lo" in sidecar.stderr.readline()
        assert _wait_for(lambda: any(name == "tcpdump" for _, name in _children(sidecar.pid)), 10)
        time.sleep(1.0)  # tcpdump opening the interface
        with Tcpdump(tmp_path / "same.pcap", [broker.port]) as dump:
            kafka_python_scenario(broker.bootstrap, "m-sidecar")
        first = _wait_for(
            lambda: out.joinpath("exchanges").is_dir() and len(_rows(out)) >= 20 and _rows(out), 20
        )
        assert first, "the sidecar published rows while running"

        # its capture program dies (as when the interface goes away): it starts another, keeps recording
        (old,) = [pid for pid, name in _children(sidecar.pid) if name == "tcpdump"]
        os.kill(old, signal.SIGKILL)
        assert _wait_for(lambda: [p for p, n in _children(sidecar.pid) if n == "tcpdump" and p != old], 15)
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
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(30) == 0
    finally:
        if sidecar.poll() is None:
            os.killpg(sidecar.pid, signal.SIGKILL)
            sidecar.wait(10)
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
