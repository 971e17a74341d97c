"""Running a proxy from other Python code: in a background thread, or as a ``kwire proxy`` process.

Used by the tests and the benchmark; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.server import Proxy, ProxyConfig

__all__ = ["KWIRE_MAIN", "ProxyProcess", "ProxyThread", "loopback_config"]

#: Python code that runs the ``kwire`` command line (for ``python -c``).
KWIRE_MAIN = "from kwire.cli import app; app()"


def loopback_config(
    broker_port: int, out_dir: Path | None = None, flush_seconds: float = 1.0, **extra: Any
) -> ProxyConfig:
    """A proxy for one broker on 127.0.0.1, every listener on an OS-chosen port (tests and benchmarks)."""
    return ProxyConfig(
        bootstrap=[("127.0.0.1", broker_port)],
        listen=("127.0.0.1", 0),
        broker_port_base=0,
        out_dir=out_dir,
        flush_seconds=flush_seconds,
        **extra,
    )


class ProxyThread:
    """A ``Proxy`` on its own event loop in a daemon thread: ``with ProxyThread(config) as p:``."""

    def __init__(self, config: ProxyConfig, start_timeout: float = 10.0) -> None:
        self.config = config
        self.start_timeout = start_timeout
        self.proxy: Proxy | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    def start(self) -> ProxyThread:
        self._thread = threading.Thread(target=self._main, name="kwire-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.start_timeout):
            raise RuntimeError("proxy did not start in time")
        if self._error is not None:
            raise RuntimeError(f"proxy failed to start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        async def run() -> None:
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.proxy = Proxy(self.config)
            try:
                await self.proxy.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()
            await self.proxy.stop()

        asyncio.run(run())

    @property
    def address(self) -> str:
        assert self.proxy is not None
        return f"{self.config.listen[0]}:{self.proxy.listen_port}"

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        """Run ``fn()`` on the proxy's loop and return its result."""
        assert self.loop is not None
        done = threading.Event()
        box: list[Any] = []

        def wrapper() -> None:
            try:
                box.append(fn())
            finally:
                done.set()

        self.loop.call_soon_threadsafe(wrapper)
        if not done.wait(timeout):
            raise TimeoutError("proxy loop did not answer")
        return box[0] if box else None

    def stop(self, timeout: float = 30.0) -> None:
        if self.loop is not None and self._stop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("proxy did not stop in time")

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProxyProcess:
    """``kwire proxy ARGS`` as a child process; ``start()`` returns once it listens."""

    def __init__(
        self,
        args: Sequence[str],
        start_timeout: float = 20.0,
        log_path: str | os.PathLike[str] | None = None,
        launcher: Sequence[str] | None = None,
    ) -> None:
        """``launcher``: the command that stands for ``kwire`` (default: the venv's ``kwire``)."""
        self.args = list(args)
        self.launcher = list(launcher) if launcher else None
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(log_path) if log_path else None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._log: Any = None

    def start(self) -> ProxyProcess:
        kwire = Path(sys.executable).with_name("kwire")
        command = self.launcher or ([str(kwire)] if kwire.exists() else [sys.executable, "-c", KWIRE_MAIN])
        if self.log_path is None:
            import tempfile

            self._log = tempfile.NamedTemporaryFile(prefix="kwire-proxy-", suffix=".log", delete=False)  # noqa: SIM115
            self.log_path = Path(self._log.name)
        else:
            self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*command, "proxy", *self.args], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            text = self.log
            match = re.search(r"kwire proxy: listening on \S+:(\d+)(?:, metrics on \S+:(\d+))?", text)
            if match:
                self.port = int(match.group(1))
                self.metrics_port = int(match.group(2)) if match.group(2) else None
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"kwire proxy exited with {self.proc.returncode}:\n{text[-2000:]}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"kwire proxy did not start:\n{self.log[-2000:]}")

    @property
    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; the exit code (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def children(self) -> list[int]:
        """Process ids of the proxy's children (its recorder process, ``proxy.recorder_worker``)."""
        assert self.proc is not None
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                except OSError:  # gone meanwhile
                    continue
                if parent == str(self.proc.pid):
                    found.append(int(entry.name))
        return found

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.terminate()
        if self._log is not None:
            self._log.close()
