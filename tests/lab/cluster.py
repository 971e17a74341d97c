"""Start and stop real Apache Kafka clusters on loopback for the incident lab.

``KRaftCluster`` (4.1, 3.9): a controller quorum (process.roles=controller) plus broker
processes. ``ZkCluster`` (2.8, 0.10.2, 0.9): one ZooKeeper plus brokers. Every node has
its own loopback IP and they share one port, so the broker IP tells brokers apart as
in production. Each process runs in its own process group with its files under
``base_dir/<name>/``: ``server.properties``, ``stdout.log``/``stderr.log`` and the
log4j output ``server.log`` (leader changes, "Marking log dir offline", ...).

Every wait is bounded; ``stop()`` (also run by the context manager, ``__del__`` and an
atexit hook) ends every process by its pid: SIGTERM, a bounded wait, then SIGKILL.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from lab.kafka_dist import Release, ensure_kafka, release

__all__ = [
    "ClusterError",
    "KRaftCluster",
    "PartitionState",
    "PortInUseError",
    "ZkCluster",
    "api_versions",
    "metadata",
    "port_is_free",
    "random_cluster_id",
]

BROKER_HEAP = "384m"
CONTROLLER_HEAP = "256m"
ZOOKEEPER_HEAP = "128m"
TOOL_HEAP = "192m"
#: Lean JVM for a 2-core machine: serial GC, C1 only (starts faster, plenty for a lab).
JVM_BASE = (
    "-Xms32m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)
TOOL_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
#: Kafka's own layout, so scenario parsers see the same lines as on a real broker.
LOG_PATTERN = "[%d] %p %m (%c)%n"
CONTROLLER_ID_BASE = 100


class ClusterError(RuntimeError):
    """A cluster could not start, or a node did not answer in time."""


class PortInUseError(ClusterError):
    """An address:port the cluster needs is already bound."""


def _vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def random_cluster_id() -> str:
    """A random Kafka cluster id (base64url of 16 random bytes, as ``Uuid.randomUuid``)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def port_is_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound (SO_REUSEADDR, as the JVM does: TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


# --------------------------------------------------------------------------- wire probes


def _str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        value = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return value

    def int32s(self) -> list[int]:
        return [self.take(">i") for _ in range(self.take(">i"))]


def _round_trip(host: str, port: int, api_key: int, version: int, body: bytes, timeout: float) -> bytes:
    """One request/response on a fresh connection; returns the response body after the correlation id."""
    header = struct.pack(">hhi", api_key, version, 1) + _str("kwire-lab")
    frame = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size_raw = _recv_exact(sock, 4)
        (size,) = struct.unpack(">i", size_raw)
        payload = _recv_exact(sock, size)
    (corr,) = struct.unpack_from(">i", payload)
    if corr != 1:
        raise ClusterError(f"{host}:{port}: correlation id {corr} != 1")
    return payload[4:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        buf += chunk
    return bytes(buf)


def api_versions(host: str, port: int, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 round trip: ``{api_key: (min, max)}`` (Kafka >= 0.10). Raises on error."""
    r = _Reader(_round_trip(host, port, 18, 0, b"", timeout))
    error = r.take(">h")
    if error:
        raise ClusterError(f"{host}:{port}: ApiVersions error code {error}")
    out = {}
    for _ in range(r.take(">i")):
        key, lo, hi = r.take(">h"), r.take(">h"), r.take(">h")
        out[key] = (lo, hi)
    return out


@dataclass(frozen=True)
class PartitionState:
    """One partition as a broker's Metadata response shows it."""

    error: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass
class Metadata:
    """The parts of a Metadata response the lab uses."""

    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    controller_id: int = -1
    #: topic -> (topic error code, {partition: state})
    topics: dict[str, tuple[int, dict[int, PartitionState]]] = field(default_factory=dict)


def metadata(
    host: str, port: int, topics: Sequence[str] | None = (), version: int = 4, timeout: float = 5.0
) -> Metadata:
    """Metadata round trip (v0, v1 or v4). ``topics=()`` asks for none (v0: all), ``None`` for all.

    v4 never auto-creates topics; v0/v1 may when the broker has auto.create.topics.enable.
    """
    if version not in (0, 1, 4):
        raise ValueError("metadata(): version must be 0, 1 or 4")
    names = list(topics or [])
    if topics is None and version > 0:
        body = struct.pack(">i", -1)
    else:
        body = struct.pack(">i", len(names)) + b"".join(_str(t) for t in names)
    if version == 4:
        body += b"\x00"  # allow_auto_topic_creation = false
    r = _Reader(_round_trip(host, port, 3, version, body, timeout))
    md = Metadata()
    if version >= 3:
        r.take(">i")  # throttle_time_ms
    for _ in range(r.take(">i")):
        node_id, bhost, bport = r.take(">i"), r.string(), r.take(">i")
        if version >= 1:
            r.string()  # rack
        md.brokers[node_id] = (bhost or "", bport)
    if version >= 2:
        r.string()  # cluster_id
    if version >= 1:
        md.controller_id = r.take(">i")
    for _ in range(r.take(">i")):
        terr, name = r.take(">h"), r.string() or ""
        if version >= 1:
            r.take(">?")  # is_internal
        parts = {}
        for _ in range(r.take(">i")):
            perr, pid, leader = r.take(">h"), r.take(">i"), r.take(">i")
            replicas, isr = r.int32s(), r.int32s()
            parts[pid] = PartitionState(perr, leader, tuple(replicas), tuple(isr))
        md.topics[name] = (terr, parts)
    return md


# --------------------------------------------------------------------------- processes


_LIBC = ctypes.CDLL(None)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the JVM gets SIGKILL if the thread that
    # started it dies (pytest killed hard), so no orphan broker outlives its test run.
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _all_threads_stopped(pid: int) -> bool:
    """True when every thread of ``pid`` is in state T (stopped), per /proc."""
    try:
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            # the state follows the parenthesised command name, which may contain spaces
            if stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    except (OSError, IndexError):
        return True  # gone: nothing left to answer
    return True


def _write_properties(path: Path, props: Mapping[str, Any]) -> None:
    lines = []
    for key, value in props.items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"{key}={text}")
    path.write_text("\n".join(lines) + "\n")


def _log_config(rel: Release, directory: Path, logfile: Path | None) -> tuple[Path, str]:
    """Write a log4j config for one process; returns (path, the -D flag selecting it).

    ``logfile=None`` logs WARN and above to stderr (for one-shot tools).
    """
    if rel.logging == "log4j2":
        path = directory / "log4j2.properties"
        if logfile is None:
            appender = [
                "appender.out.type = Console",
                "appender.out.name = OUT",
                "appender.out.target = SYSTEM_ERR",
            ]
            level = "WARN"
        else:
            appender = [
                "appender.out.type = File",
                "appender.out.name = OUT",
                f"appender.out.fileName = {logfile}",
            ]
            level = "INFO"
        lines = [
            "status = warn",
            *appender,
            "appender.out.layout.type = PatternLayout",
            f"appender.out.layout.pattern = {LOG_PATTERN}",
            f"rootLogger.level = {level}",
            "rootLogger.appenderRef.out.ref = OUT",
            "logger.statechange.name = state.change.logger",
            f"logger.statechange.level = {level}",
            "logger.request.name = kafka.request.logger",
            "logger.request.level = WARN",
        ]
        path.write_text("\n".join(lines) + "\n")
        return path, f"-Dlog4j2.configurationFile={path}"
    path = directory / "log4j.properties"
    if logfile is None:
        appender = [
            "log4j.appender.out=org.apache.log4j.ConsoleAppender",
            "log4j.appender.out.Target=System.err",
        ]
        level = "WARN"
    else:
        appender = ["log4j.appender.out=org.apache.log4j.FileAppender", f"log4j.appender.out.File={logfile}"]
        level = "INFO"
    lines = [
        f"log4j.rootLogger={level}, out",
        *appender,
        "log4j.appender.out.layout=org.apache.log4j.PatternLayout",
        f"log4j.appender.out.layout.ConversionPattern={LOG_PATTERN}",
        f"log4j.logger.state.change.logger={level}",
        "log4j.logger.kafka.request.logger=WARN",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path, f"-Dlog4j.configuration=file:{path}"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ClusterError("java not found (set JAVA_HOME or put java on PATH)")
    return found


@dataclass
class _Node:
    name: str
    node_id: int | None
    role: str  # "broker", "controller" or "zookeeper"
    ip: str
    port: int
    dir: Path
    data_dirs: list[Path]
    main: str
    args: list[str]
    heap: str
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        """The last lines of its stderr, stdout and server.log, for error messages."""
        out = []
        for fname in ("stderr.log", "stdout.log", "server.log"):
            path = self.dir / fname
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    out.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(out)


_LIVE: weakref.WeakSet[_Cluster] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop(timeout=10.0)


class _Cluster:
    """Shared machinery: nodes, processes, per-node faults and topic helpers."""

    def __init__(
        self,
        version: str,
        base_dir: str | Path | None,
        broker_ips: Sequence[str],
        brokers: int,
        port: int,
        broker_config: Mapping[str, Any] | None,
        log_dirs_per_broker: int,
        die_with_parent: bool,
    ) -> None:
        self.release = release(version)
        if not 1 <= brokers <= len(broker_ips):
            raise ValueError(f"brokers={brokers}: need 1..{len(broker_ips)} (one loopback IP each)")
        if log_dirs_per_broker < 1:
            raise ValueError("log_dirs_per_broker must be >= 1")
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="kwire-lab-"))
        self.port = port
        self.broker_config = dict(broker_config or {})
        self.log_dirs_per_broker = log_dirs_per_broker
        self.die_with_parent = die_with_parent
        self.nodes: dict[int | str, _Node] = {}
        self._broker_ips = list(broker_ips[:brokers])
        self._home: Path | None = None
        self.start_seconds: float | None = None

    # ---- node layout

    def _add(self, node: _Node) -> None:
        self.nodes[node.node_id if node.node_id is not None else node.name] = node

    def _broker_node(self, node_id: int, ip: str, props: dict[str, Any]) -> tuple[_Node, dict[str, Any]]:
        name = f"broker-{node_id}"
        d = self.base_dir / name
        if self.log_dirs_per_broker == 1:
            data = [d / "data"]
        else:
            data = [d / f"data-{i}" for i in range(self.log_dirs_per_broker)]
        props = {**props, "log.dirs": ",".join(str(p) for p in data), **self.broker_config}
        return self._node(name, node_id, "broker", ip, self.port, data, props, BROKER_HEAP)

    def _node(
        self,
        name: str,
        node_id: int | None,
        role: str,
        ip: str,
        port: int,
        data: list[Path],
        props: Mapping[str, Any],
        heap: str,
        main: str = "kafka.Kafka",
        config_name: str = "server.properties",
    ) -> tuple[_Node, dict[str, Any]]:
        d = self.base_dir / name
        return _Node(name, node_id, role, ip, port, d, data, main, [str(d / config_name)], heap), dict(props)

    def _broker_defaults(self) -> dict[str, Any]:
        v = _vtuple(self.release.version)
        n = len(self._broker_ips)
        props: dict[str, Any] = {
            "num.partitions": 1,
            "offsets.topic.replication.factor": min(3, n),
            "offsets.topic.num.partitions": 5,
        }
        if v >= (0, 11):
            props |= {
                "group.initial.rebalance.delay.ms": 0,
                "transaction.state.log.replication.factor": min(3, n),
                "transaction.state.log.min.isr": min(2, n),
                "transaction.state.log.num.partitions": 5,
            }
        if v >= (4, 0):
            props |= {
                "share.coordinator.state.topic.replication.factor": min(3, n),
                "share.coordinator.state.topic.min.isr": min(2, n),
            }
        if v < (1, 0):
            props["delete.topic.enable"] = True
        return props

    # ---- lookups

    def node(self, node: int | str) -> _Node:
        """The node with this node id (brokers, controllers) or name ("zookeeper", "broker-1")."""
        if node in self.nodes:
            return self.nodes[node]
        for n in self.nodes.values():
            if n.name == node:
                return n
        raise KeyError(f"no node {node!r}; nodes: {sorted(n.name for n in self.nodes.values())}")

    @property
    def brokers(self) -> list[int]:
        """Broker node ids."""
        return [n.node_id for n in self.nodes.values() if n.role == "broker" and n.node_id is not None]

    @property
    def bootstrap(self) -> str:
        """``ip:port,...`` of every broker."""
        return ",".join(f"{self.node(b).ip}:{self.port}" for b in self.brokers)

    def broker_ip(self, node_id: int) -> str:
        """The loopback IP a node listens on (and advertises)."""
        return self.node(node_id).ip

    def log_path(self, node: int | str) -> Path:
        """The node's log4j file (``base_dir/<name>/server.log``)."""
        return self.node(node).dir / "server.log"

    def log_dirs(self, node: int | str) -> list[Path]:
        """The node's data directories (Kafka ``log.dirs`` / ZooKeeper ``dataDir``)."""
        return list(self.node(node).data_dirs)

    def pid(self, node: int | str) -> int | None:
        """The JVM's pid (also its process group id), or None when not running."""
        n = self.node(node)
        return n.proc.pid if n.alive and n.proc else None

    def rss(self) -> dict[str, int]:
        """Resident memory in bytes of every running process, by node name."""
        out = {}
        for n in self.nodes.values():
            if n.alive and n.proc:
                with contextlib.suppress(OSError):
                    for line in Path(f"/proc/{n.proc.pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            out[n.name] = int(line.split()[1]) * 1024
        return out

    def _metadata_version(self) -> int:
        v = _vtuple(self.release.version)
        return 0 if v < (0, 10) else 1 if v < (1, 0) else 4

    # ---- process control

    def _check_ports(self, nodes: Iterable[_Node]) -> None:
        busy = [f"{n.ip}:{n.port}" for n in nodes if not port_is_free(n.ip, n.port)]
        if busy:
            raise PortInUseError(f"address already in use: {', '.join(busy)} (another broker running?)")

    def _launch(self, node: _Node) -> None:
        rel = self.release
        assert self._home is not None
        node.dir.mkdir(parents=True, exist_ok=True)
        _, log_flag = _log_config(rel, node.dir, node.dir / "server.log")
        cmd = [
            _java(),
            f"-Xmx{node.heap}",
            *JVM_BASE,
            *rel.jvm_flags,
            log_flag,
            f"-Dkafka.logs.dir={node.dir}",
            "-cp",
            str(self._home / "libs" / "*"),
            node.main,
            *node.args,
        ]
        (node.dir / "command.txt").write_text(" ".join(cmd) + "\n")
        with open(node.dir / "stdout.log", "ab") as out, open(node.dir / "stderr.log", "ab") as err:
            node.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=node.dir,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        node.paused = False
        _LIVE.add(self)

    def _signal(self, node: _Node, sig: int) -> None:
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, sig)

    def _terminate(self, nodes: Sequence[_Node], timeout: float) -> None:
        """SIGTERM (and SIGCONT, for paused ones) to all at once, a bounded wait, then SIGKILL."""
        for n in nodes:
            self._signal(n, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
            self._signal(n, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for n in nodes:
            if n.proc is None:
                continue
            try:
                n.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(n, signal.SIGKILL)
                n.proc.wait(timeout=10)
            n.paused = False

    def pause(self, node: int | str) -> None:
        """SIGSTOP the node's process group (a hung broker: TCP stays open, nothing answers)."""
        n = self.node(node)
        self._signal(n, signal.SIGSTOP)
        n.paused = True
        # SIGSTOP reaches each JVM thread asynchronously: wait (bounded) until all are stopped,
        # or a request sent right after pause() may still be answered.
        if n.proc is not None:
            deadline = time.monotonic() + 5.0
            while not _all_threads_stopped(n.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.01)

    def resume(self, node: int | str) -> None:
        """SIGCONT a paused node."""
        n = self.node(node)
        self._signal(n, signal.SIGCONT)
        n.paused = False

    def kill(self, node: int | str) -> None:
        """SIGKILL the node's process group and reap it (a crash: no controlled shutdown)."""
        n = self.node(node)
        self._signal(n, signal.SIGKILL)
        if n.proc is not None:
            n.proc.wait(timeout=10)
        n.paused = False

    def stop_node(self, node: int | str, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop one node cleanly (SIGTERM, bounded wait, SIGKILL)."""
        self._terminate([self.node(node)], timeout)

    def restart(self, node: int | str, timeout: float = 60.0) -> None:
        """Stop the node if it runs (SIGTERM), start it again and wait until it answers."""
        n = self.node(node)
        self._terminate([n], STOP_TIMEOUT_S)
        self._check_ports([n])
        self._launch(n)
        self._wait_nodes([n], time.monotonic() + timeout, require_all_brokers=False)

    def stop(self, timeout: float = STOP_TIMEOUT_S, graceful: bool = True) -> None:
        """Stop every process: brokers first, then controllers / ZooKeeper, each group
        SIGTERMed at once with a bounded wait, then SIGKILL. ``graceful=False`` SIGKILLs
        everything at once: a fast teardown (ZooKeeper brokers stopping together retry
        controlled shutdown for ~15 s), the logs are complete either way."""
        for role in ("broker", "controller", "zookeeper"):
            group = [n for n in self.nodes.values() if n.role == role]
            self._terminate(group, timeout if graceful else 0.0)
        _LIVE.discard(self)

    def running(self) -> list[str]:
        """Names of nodes whose process is still alive."""
        return [n.name for n in self.nodes.values() if n.alive]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if any(n.alive for n in self.nodes.values()):
                self.stop(timeout=10.0)

    # ---- start / readiness

    def _prepare(self) -> None:
        """Write configs (and format storage, for KRaft) before any process starts."""
        raise NotImplementedError

    def start(self, timeout: float = 120.0) -> Self:
        """Fetch the release if needed, start every process and wait (bounded) until every
        broker answers Metadata listing all brokers. Raises ClusterError / PortInUseError."""
        if any(n.alive for n in self.nodes.values()):
            raise ClusterError("cluster already started")
        self._check_ports(self.nodes.values())
        self._home = ensure_kafka(self.release.version)
        t0 = time.monotonic()
        deadline = t0 + timeout
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._prepare()
            self._start_nodes(deadline)
        except BaseException:
            self.stop(timeout=10.0)
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _start_nodes(self, deadline: float) -> None:
        raise NotImplementedError

    def _raise_if_dead(self, nodes: Iterable[_Node]) -> None:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is not None:
                raise ClusterError(f"{n.name} exited with code {n.proc.returncode}\n{n.tail()}")

    def _wait_port(self, nodes: Sequence[_Node], deadline: float) -> None:
        pending = list(nodes)
        while pending:
            self._raise_if_dead(pending)
            for n in list(pending):
                with contextlib.suppress(OSError), socket.create_connection((n.ip, n.port), timeout=1.0):
                    pending.remove(n)
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{n.name} ({n.ip}:{n.port})" for n in pending)
                raise ClusterError(f"timed out waiting for {names} to accept connections")
            if pending:
                time.sleep(0.2)

    def _wait_nodes(self, nodes: Sequence[_Node], deadline: float, require_all_brokers: bool) -> None:
        """Brokers: wait until each answers Metadata that lists every broker (or, for a
        restart, itself). Other nodes: wait until their port accepts connections."""
        self._wait_port([n for n in nodes if n.role != "broker"], deadline)
        want_all = set(self.brokers)
        pending = [n for n in nodes if n.role == "broker"]
        last_error = ""
        while pending:
            self._raise_if_dead(pending)
            for n in list(pending):
                try:
                    md = metadata(n.ip, n.port, version=self._metadata_version(), timeout=2.0)
                except (OSError, ClusterError, struct.error) as exc:
                    last_error = f"{n.name}: {exc}"
                    continue
                need = want_all if require_all_brokers else {n.node_id}
                if need <= set(md.brokers):
                    pending.remove(n)
                else:
                    last_error = f"{n.name} sees brokers {sorted(md.brokers)}, wants {sorted(need)}"
            if pending and time.monotonic() > deadline:
                tails = "\n".join(n.tail(8) for n in pending)
                raise ClusterError(
                    f"timed out waiting for {', '.join(n.name for n in pending)} (last: {last_error})\n{tails}"
                )
            if pending:
                time.sleep(0.3)

    # ---- topics

    def _live_broker(self) -> _Node:
        for b in self.brokers:
            n = self.node(b)
            if n.alive and not n.paused:
                return n
        raise ClusterError("no running, unpaused broker to ask")

    def describe_topic(self, topic: str, via: int | None = None) -> dict[int, PartitionState]:
        """``{partition: PartitionState}`` from one running broker's Metadata (``via`` picks it)."""
        n = self.node(via) if via is not None else self._live_broker()
        md = metadata(n.ip, n.port, [topic], version=self._metadata_version())
        if topic not in md.topics:
            raise ClusterError(f"{n.name}: topic {topic!r} missing from Metadata response")
        error, parts = md.topics[topic]
        if error:
            raise ClusterError(f"{n.name}: topic {topic!r} Metadata error code {error}")
        return parts

    def describe_leaders(self, topic: str, via: int | None = None) -> dict[int, int]:
        """``{partition: leader node id}`` (-1 when a partition has no leader)."""
        return {p: s.leader for p, s in self.describe_topic(topic, via).items()}

    def wait_for_leaders(
        self, topic: str, timeout: float = 30.0, exclude: Iterable[int] = ()
    ) -> dict[int, int]:
        """Wait (bounded) until every partition has a leader not in ``exclude``; returns the leaders."""
        banned = {-1, *exclude}
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = self.describe_leaders(topic)
                if last and not banned & set(last.values()):
                    return last
            except (OSError, ClusterError, struct.error) as exc:
                last = exc
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out waiting for leaders of {topic!r} outside {sorted(banned)}: {last}"
                )
            time.sleep(0.3)

    def _tool(self, main: str, args: Sequence[str], timeout: float) -> str:
        """Run one of the release's command-line tools; returns stdout+stderr, raises on failure."""
        return self._tools([(main, args)], timeout)[0]

    def _tools(self, jobs: Sequence[tuple[str, Sequence[str]]], timeout: float) -> list[str]:
        """Run several tool JVMs at once (their start-up dominates); every one must succeed."""
        assert self._home is not None, "start() the cluster first"
        tools = self.base_dir / "tools"
        tools.mkdir(parents=True, exist_ok=True)
        _, log_flag = _log_config(self.release, tools, None)
        base = [_java(), f"-Xmx{TOOL_HEAP}", *JVM_BASE, *self.release.jvm_flags, log_flag]
        base += ["-cp", str(self._home / "libs" / "*")]
        running: list[tuple[str, Sequence[str], subprocess.Popen[bytes], Any]] = []
        with contextlib.ExitStack() as stack:
            try:
                for main, args in jobs:
                    out = stack.enter_context(tempfile.TemporaryFile(dir=tools))
                    proc = subprocess.Popen(
                        [*base, main, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=tools
                    )
                    running.append((main, args, proc, out))
                deadline = time.monotonic() + timeout
                outputs = []
                for main, args, proc, out in running:
                    try:
                        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        raise ClusterError(
                            f"{main} timed out after {timeout:.0f}s: {' '.join(args)}"
                        ) from None
                    out.seek(0)
                    text = out.read().decode(errors="replace")
                    if code != 0 or "Error while executing" in text:
                        raise ClusterError(
                            f"{main} {' '.join(args)} failed (exit {code}): {text.strip()[-2000:]}"
                        )
                    outputs.append(text)
                return outputs
            finally:
                for _, _, proc, _ in running:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(timeout=10)

    def _topic_target(self) -> list[str]:
        raise NotImplementedError

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        rf: int = 1,
        configs: Mapping[str, Any] | None = None,
        assignments: Sequence[Sequence[int]] | None = None,
        timeout: float = TOOL_TIMEOUT_S,
    ) -> dict[int, int]:
        """Create a topic with the release's own TopicCommand and wait until every partition
        has a leader. ``assignments[p]`` lists partition p's replicas (then partitions/rf are
        ignored). Returns ``{partition: leader}``."""
        args = [*self._topic_target(), "--create", "--topic", name]
        if assignments:
            args += ["--replica-assignment", ",".join(":".join(str(b) for b in reps) for reps in assignments)]
        else:
            args += ["--partitions", str(partitions), "--replication-factor", str(rf)]
        for key, value in (configs or {}).items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            args += ["--config", f"{key}={text}"]
        t0 = time.monotonic()
        self._tool(self.release.topic_command, args, timeout)
        return self.wait_for_leaders(name, timeout=max(10.0, timeout - (time.monotonic() - t0)))


class KRaftCluster(_Cluster):
    """A KRaft cluster (Kafka 3.9 / 4.1): ``controllers`` controller-only processes (node ids
    101, 102, ...) on ``controller_ips:controller_port`` and ``brokers`` broker-only processes
    (node ids 1, 2, ...) on ``broker_ips:port``, storage formatted with a random cluster id
    (static ``controller.quorum.voters``).

    ``broker_config`` / ``controller_config`` are merged last into server.properties (a
    ``None`` value drops a key), e.g. ``{"replica.high.watermark.checkpoint.interval.ms": 1000}``.
    ``log_dirs_per_broker > 1`` gives JBOD brokers (``data-0``, ``data-1``, ...).
    ``die_with_parent``: each JVM gets SIGKILL when the *thread* that launched it exits
    (PR_SET_PDEATHSIG), so a killed test run leaves no orphan; start and restart from a
    long-lived thread (the main one), or pass False.
    """

    def __init__(
        self,
        version: str = "4.1",
        brokers: int = 3,
        controllers: int = 3,
        base_dir: str | Path | None = None,
        broker_ips: Sequence[str] = ("127.0.0.2", "127.0.0.3", "127.0.0.4"),
        controller_ips: Sequence[str] = ("127.0.0.5", "127.0.0.6", "127.0.0.7"),
        port: int = 9092,
        controller_port: int = 9093,
        broker_config: Mapping[str, Any] | None = None,
        controller_config: Mapping[str, Any] | None = None,
        log_dirs_per_broker: int = 1,
        die_with_parent: bool = True,
    ) -> None:
        if release(version).mode != "kraft":
            raise ValueError(f"Kafka {release(version).version} has no KRaft mode here: use ZkCluster")
        super().__init__(
            version, base_dir, broker_ips, brokers, port, broker_config, log_dirs_per_broker, die_with_parent
        )
        if not 1 <= controllers <= len(controller_ips):
            raise ValueError(f"controllers={controllers}: need 1..{len(controller_ips)}")
        self.cluster_id = random_cluster_id()
        self.controller_port = controller_port
        self.controller_config = dict(controller_config or {})
        self._props: dict[str, dict[str, Any]] = {}
        voters = ",".join(
            f"{CONTROLLER_ID_BASE + i + 1}@{ip}:{controller_port}"
            for i, ip in enumerate(controller_ips[:controllers])
        )
        common = {
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
        for i, ip in enumerate(controller_ips[:controllers]):
            node_id = CONTROLLER_ID_BASE + i + 1
            name = f"controller-{node_id}"
            data = [self.base_dir / name / "data"]
            props = {
                "process.roles": "controller",
                "node.id": node_id,
                **common,
                "listeners": f"CONTROLLER://{ip}:{controller_port}",
                "log.dirs": str(data[0]),
                **self.controller_config,
            }
            node, props = self._node(
                name, node_id, "controller", ip, controller_port, data, props, CONTROLLER_HEAP
            )
            self._add(node)
            self._props[name] = props
        for i, ip in enumerate(self._broker_ips):
            props = {
                "process.roles": "broker",
                "node.id": i + 1,
                **common,
                "listeners": f"PLAINTEXT://{ip}:{port}",
                "advertised.listeners": f"PLAINTEXT://{ip}:{port}",
                "inter.broker.listener.name": "PLAINTEXT",
                **self._broker_defaults(),
            }
            node, props = self._broker_node(i + 1, ip, props)
            self._add(node)
            self._props[node.name] = props

    @property
    def controllers(self) -> list[int]:
        """Controller node ids."""
        return [n.node_id for n in self.nodes.values() if n.role == "controller" and n.node_id is not None]

    def _prepare(self) -> None:
        formats = []
        for node in self.nodes.values():
            node.dir.mkdir(parents=True, exist_ok=True)
            config = node.dir / "server.properties"
            _write_properties(config, self._props[node.name])
            if not (node.data_dirs[0] / "meta.properties").exists():
                args = ["format", "-t", self.cluster_id, "-c", str(config), "--ignore-formatted"]
                formats.append(("kafka.tools.StorageTool", args))
        self._tools(formats, TOOL_TIMEOUT_S)

    def _start_nodes(self, deadline: float) -> None:
        controllers = [n for n in self.nodes.values() if n.role == "controller"]
        brokers = [n for n in self.nodes.values() if n.role == "broker"]
        for n in [*controllers, *brokers]:
            self._launch(n)
        self._wait_nodes([*controllers, *brokers], deadline, require_all_brokers=True)

    def _topic_target(self) -> list[str]:
        return ["--bootstrap-server", ",".join(f"{self.node(b).ip}:{self.port}" for b in self.brokers)]


class ZkCluster(_Cluster):
    """A ZooKeeper-backed cluster (Kafka 2.8 / 0.10.2 / 0.9): one ZooKeeper (node name
    "zookeeper") on ``zookeeper_ip:zookeeper_port`` and ``brokers`` brokers (ids 1, 2, ...) on
    ``broker_ips:port``. Other parameters as for KRaftCluster."""

    def __init__(
        self,
        version: str = "2.8",
        brokers: int = 1,
        base_dir: str | Path | None = None,
        broker_ips: Sequence[str] = ("127.0.0.2", "127.0.0.3", "127.0.0.4"),
        zookeeper_ip: str = "127.0.0.10",
        zookeeper_port: int = 2181,
        port: int = 9092,
        broker_config: Mapping[str, Any] | None = None,
        log_dirs_per_broker: int = 1,
        die_with_parent: bool = True,
    ) -> None:
        if release(version).mode != "zk":
            raise ValueError(f"Kafka {release(version).version} runs in KRaft mode here: use KRaftCluster")
        super().__init__(
            version, base_dir, broker_ips, brokers, port, broker_config, log_dirs_per_broker, die_with_parent
        )
        self.zookeeper = f"{zookeeper_ip}:{zookeeper_port}"
        self._props: dict[str, dict[str, Any]] = {}
        zk_dir = self.base_dir / "zookeeper"
        zk_props = {
            "dataDir": zk_dir / "data",
            "clientPort": zookeeper_port,
            "clientPortAddress": zookeeper_ip,
            "tickTime": 2000,
            "maxClientCnxns": 0,
            "admin.enableServer": False,
            "4lw.commands.whitelist": "*",
        }
        zk, zk_props = self._node(
            "zookeeper",
            None,
            "zookeeper",
            zookeeper_ip,
            zookeeper_port,
            [zk_dir / "data"],
            zk_props,
            ZOOKEEPER_HEAP,
            main="org.apache.zookeeper.server.ZooKeeperServerMain",
            config_name="zoo.cfg",
        )
        self._add(zk)
        self._props["zookeeper"] = zk_props
        for i, ip in enumerate(self._broker_ips):
            props = {
                "broker.id": i + 1,
                "listeners": f"PLAINTEXT://{ip}:{port}",
                "advertised.listeners": f"PLAINTEXT://{ip}:{port}",
                "zookeeper.connect": self.zookeeper,
                "zookeeper.connection.timeout.ms": 30000,
                **self._broker_defaults(),
            }
            node, props = self._broker_node(i + 1, ip, props)
            self._add(node)
            self._props[node.name] = props

    def _prepare(self) -> None:
        for node in self.nodes.values():
            node.dir.mkdir(parents=True, exist_ok=True)
            _write_properties(Path(node.args[0]), self._props[node.name])
            for d in node.data_dirs:
                d.mkdir(parents=True, exist_ok=True)

    def _start_nodes(self, deadline: float) -> None:
        zk = self.node("zookeeper")
        self._launch(zk)
        self._wait_nodes([zk], deadline, require_all_brokers=False)
        brokers = [n for n in self.nodes.values() if n.role == "broker"]
        for n in brokers:
            self._launch(n)
        self._wait_nodes(brokers, deadline, require_all_brokers=True)

    def _topic_target(self) -> list[str]:
        if self.release.topic_command_zk:
            return ["--zookeeper", self.zookeeper]
        return ["--bootstrap-server", ",".join(f"{self.node(b).ip}:{self.port}" for b in self.brokers)]
