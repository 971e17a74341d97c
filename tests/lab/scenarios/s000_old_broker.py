"""000, old broker: current clients against a real Kafka 0.9.0.1 broker.

Incident 1 of DESIGN.md. A 0.9 broker does not know ApiVersions (key 18): its network
thread throws ArrayIndexOutOfBoundsException in ApiKeys.forId while turning that receive
into a request, and the catch-all around the processor's loop skips the rest of that
iteration (kafka/network/SocketServer.scala, 0.9.0.1, Processor.run). So, in that one poll:

* the ApiVersions request is neither answered nor closed;
* every request read after it is never dispatched (a *dropped* request); its connection is
  not muted, so a request the client pipelined behind it is read and answered later;
* every response that finished sending in that poll is never marked sent, so its
  connection stays muted for good (a *stuck* connection): nothing more is read from it,
  not even the client's FIN, and the broker's socket sits in CLOSE-WAIT.

One 0.9.0.1 broker with one network thread (every connection in one poll loop) serves
clients pinned to 0.9 that work (kafka-python ``api_version=0.9``, librdkafka with
``api.version.request=false`` and ``broker.version.fallback=0.9.0.1``, sarama 1.27.0 with
``Version=0.9.0.0``) and current clients that open every connection with ApiVersions and
never get an answer (librdkafka defaults: time out after 10 s and reconnect; Java
kafka-clients 2.8.2 and 4.1.1 and kafka-python 3 with api_version auto: after 30 s).
A new connection's first request is read in the first poll after the processor registers
it, so requests of *several clients connecting at once* share a poll. Twice the broker is
frozen (SIGSTOP) for a few seconds, as a long GC pause or a starved CPU would freeze it,
while a wave of clients starts and connects; when it wakes, their first requests, ApiVersions
among them, are read together.

The truth: what each client sent, got acked and failed, the lines of each client's own log
that say it timed out or reconnected, the broker's own log (each "Processor got uncaught
exception" with its cause), and the broker's sockets (``ss``) left in CLOSE-WAIT.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.cluster import ZkCluster
from lab.run import LabRun
from lab.scenarios import addresses
from lab.truth import broker_errors

NAME = "000-old-broker"
DESCRIPTION = (
    "Kafka 0.9.0.1 (ZooKeeper, one network thread): clients that open with ApiVersions (librdkafka, "
    "Java 2.8/4.1, kafka-python auto) connect at once with clients pinned to 0.9, twice, while the broker stalls"
)
KAFKA = "0.9"
TOPIC = "legacy"
PARTITIONS = 2
VALUE_SIZE = 40
#: Every client stops by RUN_S seconds into the run: librdkafka's 60 s socket.timeout.ms (its
#: client-side wait for a Produce response) after the second storm still ends inside it.
RUN_S = 105.0
#: Seconds into the run at which each wave of clients starts; waves 1 and 2 start while the
#: broker is frozen.
WAVES = {0: 0.0, 1: 8.0, 2: 30.0}
#: How long the broker stays frozen for a storm at most, and at least after every new client
#: has a connection open (so the first requests are all in the sockets).
STORM_MAX_S = 10.0
STORM_SETTLE_S = 1.0
BROKER_CONFIG = {"num.network.threads": 1}


@dataclass(frozen=True)
class Client:
    """One client of the scenario: its driver, whether it probes with ApiVersions, what it does."""

    driver: str
    wave: int
    probe: bool
    produce: int = 0
    rate: float = 0.0
    group: bool = True
    props: dict[str, Any] = field(default_factory=dict)


#: kafka-python pinned to 0.9: skips ApiVersions, speaks Produce/Fetch v1, groups v0.
KAFKA_PYTHON_09 = {"api_version": "0.9", "linger_ms": 0}
#: librdkafka pinned to 0.9. Its default session.timeout.ms (45 s) is above 0.9's
#: group.max.session.timeout.ms (30 s): JoinGroup would fail with INVALID_SESSION_TIMEOUT.
RDKAFKA_09 = {
    "api.version.request": "false",
    "broker.version.fallback": "0.9.0.1",
    "session.timeout.ms": 10000,
    "linger.ms": 0,
}
#: sarama pinned to 0.9 (Produce v0). sarama's consumer groups need 0.10.2+: it only produces.
SARAMA_09 = {"version": "0.9.0.0"}

CLIENTS: dict[str, Client] = {
    # up and running before any storm
    "kafka-python-0.9": Client("kafka-python", 0, False, 2000, 40.0, props=KAFKA_PYTHON_09),
    "sarama-0.9": Client("sarama-1.27.0", 0, False, 2000, 40.0, group=False, props=SARAMA_09),
    # storm 1
    "rdkafka-0.9": Client("confluent-kafka", 1, False, 1500, 40.0, props=RDKAFKA_09),
    "rdkafka-default-a": Client("confluent-kafka", 1, True, 20, 1.0),
    "java-2.8.2": Client("java-2.8.2", 1, True, 20, 1.0),
    "kafka-python-auto": Client("kafka-python", 1, True, 20, 1.0),
    # storm 2
    "rdkafka-0.9-late": Client("confluent-kafka", 2, False, 400, 20.0, props=RDKAFKA_09),
    "sarama-0.9-late": Client("sarama-1.27.0", 2, False, 400, 20.0, group=False, props=SARAMA_09),
    "rdkafka-default-b": Client("confluent-kafka", 2, True, 20, 1.0),
    "java-4.1.1": Client("java-4.1.1", 2, True, 20, 1.0),
}


# ------------------------------------------------------------------------- broker sockets


class SocketWatch:
    """Samples, once a second, the broker's TCP sockets on its listener (``ss``): how many
    are established and how many sit in CLOSE-WAIT (the client closed, the broker never
    read the FIN). Runs on a thread until ``stop()``; every ``ss`` call is bounded."""

    def __init__(self, ip: str, port: int, interval: float = 1.0) -> None:
        self.ip, self.port, self.interval = ip, port, interval
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="socket-watch", daemon=True)

    def sockets(self) -> list[tuple[str, str]]:
        """(state, peer) of every socket whose local end is the broker's listener."""
        out = subprocess.run(
            ["ss", "-tanH", "sport", "=", f":{self.port}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        found = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[3] == f"{self.ip}:{self.port}" and parts[0] != "LISTEN":
                found.append((parts[0], parts[4]))
        return found

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                states = Counter(state for state, _ in self.sockets())
                self.samples.append(
                    {
                        "ts": round(time.time(), 3),
                        **{k.lower().replace("-", "_"): v for k, v in states.items()},
                    }
                )
            self._stop.wait(self.interval)

    def start(self) -> SocketWatch:
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the samples and the sockets in CLOSE-WAIT now."""
        self._stop.set()
        self._thread.join(timeout=15)
        close_wait = sorted(peer for state, peer in self.sockets() if state == "CLOSE-WAIT")
        peak = max((s.get("close_wait", 0) for s in self.samples), default=0)
        return {
            "listener": f"{self.ip}:{self.port}",
            "close_wait_at_end": len(close_wait),
            "close_wait_peers_at_end": close_wait,
            "close_wait_peak": peak,
            "samples": self.samples,
        }


# ------------------------------------------------------------------------- truth extras


def error_summary(log_path: Path, since: float) -> dict[str, Any]:
    """The broker's ERROR lines since *since*, counted by (message, cause), with times."""
    errors = broker_errors(log_path, since)
    groups: dict[tuple[str, str], list[float]] = {}
    for e in errors:
        message = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+-\S+", "<connection>", e["message"])
        groups.setdefault((message, e["cause"] or ""), []).append(e["ts"])
    return {
        "count": len(errors),
        "by_message": [
            {"message": m, "cause": c, "count": len(ts), "first": min(ts), "last": max(ts), "times": ts[:200]}
            for (m, c), ts in sorted(groups.items(), key=lambda kv: -len(kv[1]))
        ],
    }


# ------------------------------------------------------------------------- the run


class OldBrokerRun(LabRun):
    """A LabRun whose read-back speaks 0.9: LabRun's verifier (kafka-clients 4.1.1) opens with
    ApiVersions and never gets an answer from 0.9, which would count every acked message lost."""

    def _read_back(self) -> list[Path]:
        files = []
        for topic in sorted(self.topics):
            client = self.start_client(
                "kafka-python",
                f"verify-{topic}",
                topic,
                consume=True,
                duration_s=60,
                idle_s=8,
                props=KAFKA_PYTHON_09,
            )
            client.wait(90)
            files.append(client.events)
        self.clients = [c for c in self.clients if not c.client_id.startswith("verify-")]
        return files


def _start(run: LabRun, client_id: str, elapsed: float) -> None:
    c = CLIENTS[client_id]
    run.start_client(
        c.driver,
        client_id,
        TOPIC,
        produce=c.produce,
        rate=c.rate,
        acks="1",
        size=VALUE_SIZE,
        consume=c.group,
        group=(f"{TOPIC}-probes" if c.probe else f"{TOPIC}-pinned") if c.group else None,
        idle_s=RUN_S,
        duration_s=RUN_S - elapsed,
        props=c.props,
    )


def _storm(cluster: ZkCluster, run: LabRun, watch: SocketWatch, wave: int, t0: float) -> dict[str, Any]:
    """Freeze the broker, start the wave's clients, wait (bounded) until each has a connection
    in the broker's accept queue or open, then wake the broker."""
    ids = [cid for cid, c in CLIENTS.items() if c.wave == wave]
    before = {peer for _, peer in watch.sockets()}
    run.mark("broker_stalled", node=1, signal="SIGSTOP", wave=wave)
    cluster.pause(1)
    for cid in ids:
        _start(run, cid, time.monotonic() - t0)
    deadline = time.monotonic() + STORM_MAX_S
    new: set[str] = set()
    # every client opens at least one connection; Java and librdkafka open two (producer, consumer)
    while time.monotonic() < deadline and len(new) < len(ids) + sum(CLIENTS[c].group for c in ids):
        time.sleep(0.2)
        new = {peer for _, peer in watch.sockets()} - before
    time.sleep(STORM_SETTLE_S)
    new = {peer for _, peer in watch.sockets()} - before
    cluster.resume(1)
    run.mark("broker_resumed", node=1, signal="SIGCONT", wave=wave, new_connections=len(new))
    return {"wave": wave, "clients": ids, "new_connections": sorted(new)}


def run(out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Run the scenario; write capture.pcap.gz and truth.json into *out_dir*; return the truth."""
    with ZkCluster(
        KAFKA, **addresses("zk"), brokers=1, base_dir=work_dir / "cluster", broker_config=BROKER_CONFIG
    ) as cluster:
        cluster.start(timeout=120)
        cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=1)
        with OldBrokerRun(NAME, cluster, work_dir / "run") as run:
            watch = SocketWatch(cluster.broker_ip(1), cluster.port).start()
            try:
                t0 = time.monotonic()
                storms = []
                for wave, at in sorted(WAVES.items()):
                    time.sleep(max(0.0, t0 + at - time.monotonic()))
                    if wave == 0:
                        for cid in (c for c, spec in CLIENTS.items() if spec.wave == 0):
                            _start(run, cid, 0.0)
                    else:
                        storms.append(_storm(cluster, run, watch, wave, t0))
                run.wait_clients()
            finally:
                sockets = watch.stop()
            errors = error_summary(cluster.log_path(1), run.started - 1)
            clients = {
                cid: {"driver": c.driver, "wave": c.wave, "probe": c.probe, "props": c.props}
                for cid, c in CLIENTS.items()
            }
            return run.finish(
                out_dir,
                extra={
                    "topic": TOPIC,
                    "description": DESCRIPTION,
                    "broker_config": BROKER_CONFIG,
                    "client_roles": clients,
                    "storms": storms,
                    "broker_errors": errors,
                    "broker_sockets": sockets,
                },
            )
