"""A warm Spark server (``kwire sql DATASET --serve``) in a process of its own, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kwire.sql_command import find_server

KWIRE = [sys.executable, "-m", "kwire"]


@contextlib.contextmanager
def warm_server(dataset: Path, port: int, timeout: float = 300, **popen) -> Iterator[subprocess.Popen]:
    """Start ``kwire sql DATASET --serve --port PORT`` in a process group of its own and yield
    it once it serves ``dataset`` (``find_server``); stop it at the end if it still runs
    (SIGTERM, then SIGKILL to the group). ``popen``: more ``subprocess.Popen`` arguments."""
    server = subprocess.Popen(
        [*KWIRE, "sql", str(dataset), "--serve", "--port", str(port)], start_new_session=True, **popen
    )
    try:
        deadline = time.monotonic() + timeout
        while find_server(dataset) is None:
            if server.poll() is not None:
                raise RuntimeError(f"kwire sql --serve exited {server.returncode}: {server.communicate()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kwire sql --serve did not serve {dataset} in {timeout:.0f} s")
            time.sleep(0.5)
        yield server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.communicate(timeout=30)
