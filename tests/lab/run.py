"""One lab run: a real cluster, real clients, a tcpdump capture and the truth of what happened.

A scenario (``lab/scenarios/*.py``) starts a cluster, opens a ``LabRun`` over it, starts
client drivers, acts on brokers (pause, kill, fail a log dir) while ``mark``-ing each act on
the run's timeline, and ends the run. Ending it stops the capture, reads every produced
topic back to its end with a verifying consumer (not captured), and writes into the output
folder:

* ``capture.pcap.gz``: client-broker and broker-broker traffic, as tcpdump saw it;
* ``truth.json``: per client sent/acked/failed/lost/duplicated (``lab.truth``), the broker
  facts from the brokers' logs, and the timeline;
* ``clients/*.jsonl`` and ``*.log``: the drivers' own records, kept for whoever doubts the truth.

Every wait is bounded, and every process started here is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from realkafka import Tcpdump

from lab.clients import driver_argv
from lab.truth import broker_facts, client_log_facts, client_truth, read_back_ids, read_events

__all__ = ["VERIFIER", "ClientProc", "LabRun"]

#: The client that reads every topic back after a run (uncaptured) to find lost messages.
VERIFIER = "java-4.1.1"
#: Kafka's listener ports in every lab cluster: brokers and controllers.
KAFKA_PORTS = (9092, 9093)


@dataclass
class ClientProc:
    """One running driver."""

    name: str
    client_id: str
    proc: subprocess.Popen[bytes]
    events: Path
    log: Path
    stderr: Path
    deadline: float

    def wait(self, timeout: float) -> int:
        """Wait for the driver to exit; kill it (and its children) when *timeout* passes."""
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            return self.proc.wait(timeout=10)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class LabRun:
    """Capture and clients over one cluster; see the module docstring."""

    def __init__(
        self, name: str, cluster: Any, work_dir: Path, *, ports: tuple[int, ...] = KAFKA_PORTS
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.clients_dir = self.work_dir / "clients"
        self.clients_dir.mkdir(exist_ok=True)
        self.timeline: list[dict[str, Any]] = []
        self.clients: list[ClientProc] = []
        self.topics: set[str] = set()
        self.tcpdump = Tcpdump(
            self.work_dir / "capture.pcap", list(ports), bpf=server_side_filter(cluster, ports)
        )
        self.started = 0.0

    # -- capture ------------------------------------------------------------------------
    def __enter__(self) -> LabRun:
        self.tcpdump.start()
        self.started = time.time()
        self.mark("capture_started")
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self.clients:
            if client.proc.poll() is None:
                _kill_group(client.proc)
                client.proc.wait(timeout=10)
        self.tcpdump.stop()

    def mark(self, kind: str, **fields: Any) -> None:
        """Put an act of the scenario on the timeline (now, on this machine's clock)."""
        self.timeline.append({"ts": round(time.time(), 6), "kind": kind, **fields})

    # -- clients ------------------------------------------------------------------------
    def start_client(
        self,
        name: str,
        client_id: str,
        topic: str,
        *,
        duration_s: float = 60.0,
        produce: int = 0,
        rate: float = 0.0,
        acks: str = "all",
        consume: bool = False,
        group: str | None = None,
        expect: int | None = None,
        idle_s: float | None = None,
        size: int | None = None,
        props: dict[str, Any] | None = None,
        bootstrap: str | None = None,
    ) -> ClientProc:
        """Start driver *name* as *client_id*; it stops by itself within *duration_s*."""
        events = self.clients_dir / f"{client_id}.jsonl"
        log = self.clients_dir / f"{client_id}.log"
        stderr = self.clients_dir / f"{client_id}.stderr"
        argv = [
            *driver_argv(name),
            "--bootstrap",
            bootstrap or self.cluster.bootstrap,
            "--client-id",
            client_id,
        ]
        argv += ["--topic", topic, "--duration-s", f"{duration_s:g}", "--out", str(events), "--log", str(log)]
        if produce:
            argv += ["--produce", str(produce), "--rate", f"{rate:g}", "--acks", acks]
            self.topics.add(topic)
        if consume:
            argv.append("--consume")
        if group:
            argv += ["--group", group]
        if expect is not None:
            argv += ["--expect", str(expect)]
        if idle_s is not None:
            argv += ["--idle-s", f"{idle_s:g}"]
        if size is not None:
            argv += ["--size", str(size)]
        for key, value in (props or {}).items():
            argv += ["--prop", f"{key}={value}"]
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
        client = ClientProc(name, client_id, proc, events, log, stderr, time.monotonic() + duration_s + 30)
        self.clients.append(client)
        self.mark("client_started", client=name, client_id=client_id, topic=topic)
        return client

    def wait_clients(self, grace_s: float = 30.0) -> dict[str, int]:
        """Wait for every driver (each within its own duration plus *grace_s*); their exit codes."""
        codes = {}
        for client in self.clients:
            codes[client.client_id] = client.wait(client.deadline + grace_s - time.monotonic())
        return codes

    # -- the end ------------------------------------------------------------------------
    def finish(
        self, out_dir: Path, *, extra: dict[str, Any] | None = None, read_back: bool = True
    ) -> dict[str, Any]:
        """Stop capturing, read topics back, write capture.pcap.gz, truth.json and client records."""
        self.wait_clients()
        self.mark("capture_stopped")
        self.tcpdump.stop()
        verify_files = self._read_back() if read_back else []
        read = read_back_ids(verify_files) if read_back else None
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        with (
            (self.work_dir / "capture.pcap").open("rb") as raw,
            gzip.open(out_dir / "capture.pcap.gz", "wb", 9) as gz,
        ):
            shutil.copyfileobj(raw, gz)
        truth = self.truth(read, extra or {})
        (out_dir / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
        kept = out_dir / "clients"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(self.clients_dir, kept, ignore=shutil.ignore_patterns("*.stderr"))
        return truth

    def _read_back(self) -> list[Path]:
        """Each produced topic read from the earliest offset to its end, outside the capture."""
        files = []
        for topic in sorted(self.topics):
            client = self.start_client(
                VERIFIER, f"verify-{topic}", topic, consume=True, duration_s=60, idle_s=8
            )
            client.wait(90)
            files.append(client.events)
        # the verifier's own records are not the run's clients
        self.clients = [c for c in self.clients if not c.client_id.startswith("verify-")]
        return files

    def truth(self, read: Counter[str] | None, extra: dict[str, Any]) -> dict[str, Any]:
        """The truth document (see the module docstring)."""
        clients: dict[str, Any] = {}
        for client in self.clients:
            summary = client_truth(client.events, read)
            facts = client_log_facts(summary.library, client.log)
            consumed = {e["id"] for e in read_events(client.events) if e.get("event") == "consume"}
            clients[client.client_id] = {
                "driver": client.name,
                **summary.as_dict(),
                "log": facts,
                "consumed": len(consumed),
            }
        brokers = {}
        for node in self.cluster.brokers:
            facts = broker_facts(node, self.cluster.log_path(node))
            brokers[str(node)] = {
                "ip": self.cluster.broker_ip(node),
                "facts": _summarise_facts(facts.facts, self.started),
            }
        return {
            "scenario": self.name,
            "kafka_version": self.cluster.release.version,
            "started": self.started,
            "capture_packets": self.tcpdump.packets,
            "capture_dropped": self.tcpdump.dropped,
            "timeline": self.timeline,
            "clients": clients,
            "brokers": brokers,
            "read_back": read is not None,
            **extra,
        }


def server_side_filter(cluster: Any, ports: tuple[int, ...]) -> str:
    """A capture filter for the cluster's own listeners: its nodes' addresses *and* ports.

    Every connection on loopback leaves from 127.0.0.1, so the filter names the server side
    of each packet; another lab cluster on the same ports elsewhere in 127/8 stays out.
    """
    servers = sorted({node.ip for node in cluster.nodes.values()})
    hosts = " or ".join(servers)
    port_list = " or ".join(str(p) for p in ports)
    return f"tcp and ((dst host ({hosts}) and dst port ({port_list})) or (src host ({hosts}) and src port ({port_list})))"


def _summarise_facts(facts: list[dict[str, Any]], since: float) -> dict[str, Any]:
    """Facts of the run only (not of start-up), grouped by kind; long lists keep counts and examples."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for fact in facts:
        if fact["ts"] >= since - 1:
            grouped.setdefault(fact["kind"], []).append(fact)
    return {
        kind: {"count": len(items), "first": items[0], "last": items[-1], "items": items[:50]}
        for kind, items in grouped.items()
    }
