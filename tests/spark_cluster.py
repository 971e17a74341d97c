"""A Spark standalone cluster on loopback (a master and workers) from the pyspark installation.

    with StandaloneCluster(tmp_path, workers=2) as cluster:
        cluster.submit(["spark_jobs/submit.py", dataset, out])      # spark-submit --master cluster.url

Every daemon listens on 127.0.0.1 on ports probed free in 41900-41999; the cluster's settings
(no UIs but the daemons', small memory, the JVM's first JIT tier) are in a ``spark-defaults.conf``
of its own ``SPARK_CONF_DIR``, so a submit command is the one the README shows, with only
``--master`` added. Each daemon runs in its own process group (its executors with it) and is
stopped by that group on exit, even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
PORT_RANGE = range(41900, 42000)
_LEAN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class ClusterError(RuntimeError):
    """The cluster did not come up, or a submitted application failed."""


def free_ports(count: int, candidates: range = PORT_RANGE) -> list[int]:
    """``count`` ports of ``candidates`` that 127.0.0.1 can bind now, each followed by a free
    neighbour (Spark tries port + 1 when a port is taken by an executor of the same host)."""
    found: list[int] = []
    for port in candidates:
        if len(found) == count:
            break
        if found and port <= found[-1] + 1:
            continue
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        found.append(port)
    if len(found) < count:
        raise ClusterError(f"fewer than {count} free port pairs in {candidates}")
    return found


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) under ``root``."""

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "768m") -> None:
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        (self.master_port, self.master_ui, self.driver_port, self.block_port, *self.worker_ports) = (
            free_ports(4 + 2 * workers)
        )
        self.url = f"spark://127.0.0.1:{self.master_port}"
        self.conf_dir = root / "conf"
        self._write_conf()

    def _write_conf(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        settings = {
            "spark.master.rest.enabled": "false",
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.port": str(self.driver_port),
            "spark.blockManager.port": str(self.block_port),
            "spark.port.maxRetries": "8",
            "spark.driver.memory": "1g",
            "spark.executor.memory": "512m",
            "spark.driver.extraJavaOptions": _LEAN_JVM,
            "spark.executor.extraJavaOptions": _LEAN_JVM,
            "spark.worker.cleanup.enabled": "false",
        }
        text = "".join(f"{k} {v}\n" for k, v in settings.items())
        (self.conf_dir / "spark-defaults.conf").write_text(text)

    def env(self) -> dict[str, str]:
        """The environment of the daemons and of ``spark-submit``: loopback, this cluster's conf,
        and this interpreter (with kwire installed) as the driver's and executors' Python."""
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_MASTER_HOST": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": _LEAN_JVM,
            "PYSPARK_PYTHON": sys.executable,
        }

    def _start(self, name: str, args: list[str]) -> Path:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env(),
                    cwd=self.root,
                    start_new_session=True,
                )
            )
        self.logs.append(log)
        return log

    def _wait_for(self, log: Path, text: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.read_text(errors="replace").count(text) >= count:
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        raise ClusterError(f"no {count} x {text!r} in {log.name} within {timeout:.0f}s:\n{self.tail()}")

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker is registered."""
        master = self._start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.master_port)),
                *("--webui-port", str(self.master_ui)),
            ],
        )
        self._wait_for(master, "I have been elected leader", 1, timeout)
        for i in range(self.workers):
            rpc, ui = self.worker_ports[2 * i], self.worker_ports[2 * i + 1]
            self._start(
                f"worker{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    *("--host", "127.0.0.1", "--port", str(rpc), "--webui-port", str(ui)),
                    *("--cores", str(self.cores), "--memory", self.memory),
                    *("--work-dir", str(self.root / f"work{i}")),
                ],
            )
        self._wait_for(master, "Registering worker", self.workers, timeout)
        return self

    def submit(self, args: list[str], *, cwd: Path, timeout: float = 600.0) -> str:
        """``spark-submit --master URL ARGS`` from ``cwd``; its output (ClusterError if it fails)."""
        cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.url, *args]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env(),
            cwd=cwd,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            raise ClusterError(f"spark-submit {args} ran past {timeout:.0f}s:\n{self.tail()}") from None
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise ClusterError(f"spark-submit {args} exited {proc.returncode}:\n{text[-4000:]}")
        return text

    def executors_launched(self) -> list[int]:
        """Executors each worker launched so far (from its log)."""
        return [
            log.read_text(errors="replace").count("Asked to launch executor")
            for log in self.logs
            if log.name.startswith("worker")
        ]

    def tail(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
        )

    def stop(self) -> None:
        """Stop every daemon's process group (workers first: their executors go with them)."""
        for proc in reversed(self.procs):
            _stop_group(proc)
        self.procs.clear()

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):  # children (an executor) may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=grace)
