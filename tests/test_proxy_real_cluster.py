"""``kwire proxy`` in front of a real 3-broker Kafka 4.1 cluster, through a broker failover.

One run for the module (``proxied``): a KRaft cluster (3 brokers, 1 controller, Kafka 4.1.1
from Maven Central; ``lab.cluster``) at ``lab.scenarios.addresses()`` (set
``KWIRE_LAB_NET`` to move it), a ``kwire proxy`` on
``<net>.100:9092`` with broker N's listener on ``<net>.100:9100+N``, and real clients that
only know the proxy's address: acks=all producers (Java kafka-clients 4.1.1, librdkafka
through confluent-kafka, sarama 1.43.3) and a consumer group (Java 4.1.1, kafka-python).
Scenario 001's failover, shortened: broker 2 frozen (SIGSTOP) for ``FROZEN_FOR`` = 12 s
(001 freezes 30 s; 12 s is past the 9 s broker session timeout, so the controller fences it
and leadership moves just the same), then SIGKILLed and restarted; once it is back in sync a
preferred-leader election (Kafka's LeaderElectionCommand) moves its partitions back, so
clients still on the interim leaders get NOT_LEADER_OR_FOLLOWER with the new leader's
endpoint (KIP-951) in Produce and Fetch responses. Two tcpdumps: the near
side (anything to or from the proxy's address) and the far side (the cluster's listeners,
``lab.run``'s capture). The checks:

1. **Clients stay on the proxy.** Every near connection is to a proxy listener and every
   broker address a client was told (Metadata, FindCoordinator, the KIP-951 endpoints of
   Produce/Fetch) is a proxy listener. On the far side every connection that carries a
   client's request is paired with exactly one near connection (``proxy_sides.pair_streams``:
   by the listener's broker, opening time and request bytes); the rest is broker-to-broker
   traffic and the lab's own Metadata probes (by client id), and connections that carried
   no byte at all to the restarting broker (the lab's readiness probes, the proxy's own).
   While the killed broker refused connections, so did the proxy's listener for it (clients
   back off as on a direct connection), and it accepted none in between.
2. **Producers keep delivering.** Per producer, by its own events and the read-back after
   the run (``lab.run``): sent = acked, nothing failed, nothing lost; the group consumed
   every acked message. The victim's partitions moved to other leaders and back, and each
   was produced to through the proxy listener of its leader of the moment, both times.
3. **Byte-exact forwarding.** Per pair: the request bytes identical, the response frames
   identical except those whose api/version can carry broker addresses, which must decode
   equal once host and port are blanked, each far endpoint (node N at its broker address)
   shown to the client as the proxy's listener for N. A side may hold a prefix of the
   other's bytes only when a side was reset (the killed broker).
4. **Recorded rows = ``kwire decode`` of the near capture.** Rows pair by (connection,
   correlation id, api key), a connection named by its client port and the time of its first
   packet (``proxy_sides.same_connections``: the kernel may reuse a client port for a
   connection to another listener); every column is equal (api, version, correlation id, client
   id, status, error codes, partition errors, sizes, topics, metadata brokers and
   partitions, coordinators, ...) except those in ``proxy_sides.ROW_FIELDS_THAT_DIFFER``:
   source, connection id, client ip, broker ip/port (the recorded broker must be one the
   listener forwards to), date, latency, and request/response times, which must be within
   1 s of each other. A near row the proxy lacks is allowed only when it is an unanswered
   request beyond the bytes the proxy read from that client (the proxy stops reading a
   connection it has ended, the client may still be sending), or on a connection whose
   recorded row counts bytes the recorder skipped (it runs on idle CPU, and fell behind while
   the clients started: seen in CI and here); its rows there may be ``gap`` rows with nulls
   for what it did not see, and nine rows in ten at least must be recorded in full. Connection rows: client id,
   protocol, bytes, frames, gaps and resyncs equal (counting those unread requests), first
   packet within 1 s; end reasons differ by point of view and are reported, not compared.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from proxy_load import api_versions_v0
from proxy_sides import (
    BytesReport,
    compare_connections,
    compare_pair,
    compare_rows,
    micros,
    nearest_in_time,
    pair_streams,
    request_heads,
    same_connections,
    skipped_bytes,
    unread_requests,
)
from realkafka import Tcpdump, tcpdump_available

from proxy.embedded import KWIRE_MAIN, ProxyProcess
from proxy.streams import CapturedStream, capture_streams

pytestmark = pytest.mark.real

TOPIC = "orders"
PARTITIONS = 6
VICTIM = 2
PRODUCERS = ("java-4.1.1", "confluent-kafka", "sarama-1.43.3")
CONSUMERS = ("java-4.1.1", "kafka-python")
GROUP = "orders-readers"
#: Per producer: MESSAGES at RATE per second, so producing lasts 60 s, through the failover and back.
MESSAGES = 1200
RATE = 20.0
FREEZE_AT = 6.0
FROZEN_FOR = 12.0
LISTEN_PORT = 9092
NODE_PORT_BASE = 9100
#: Lab client ids that reach brokers directly, by design: the cluster's readiness and leader
#: probes, and the admin client of Kafka's LeaderElectionCommand.
LAB_CLIENT_ID = re.compile(r"^(kwire-lab|adminclient-\d+)$")
#: Broker-to-broker traffic on the broker listener (replica fetchers and the like).
BROKER_CLIENT_ID = re.compile(r"^broker-\d+-")
US = 1_000_000


@dataclass
class ProxiedRun:
    """What the module's run left behind, with the derived views the tests share."""

    work: Path
    net: str
    brokers: dict[int, str]  # node id -> ip
    truth: dict[str, Any]
    proxy_code: int | None
    proxy_log: str
    near_pcap: Path
    far_pcap: Path
    near_dropped: int | None
    recorded_dir: Path
    leaders_before: dict[int, int]
    leaders_during: dict[int, int]  # after the victim's restart
    leaders_after: dict[int, int]  # after the preferred-leader election
    timeline: dict[str, float] = field(default_factory=dict)
    client_ids: set[str] = field(default_factory=set)
    exit_codes: dict[str, int] = field(default_factory=dict)  # client id -> the driver's exit code

    @property
    def proxy_host(self) -> str:
        return f"{self.net}.100"

    def proxy_address(self, node: int) -> tuple[str, int]:
        return self.proxy_host, NODE_PORT_BASE + node

    def broker_address(self, node: int) -> tuple[str, int]:
        return self.brokers[node], 9092

    def routes(self, listener: tuple[str, int]) -> set[tuple[str, int]]:
        """Broker addresses a connection to this proxy listener may be forwarded to."""
        host, port = listener
        if host != self.proxy_host:
            return set()
        if port == LISTEN_PORT:
            return {self.broker_address(n) for n in self.brokers}
        node = port - NODE_PORT_BASE
        return {self.broker_address(node)} if node in self.brokers else set()

    @cached_property
    def near(self) -> list[CapturedStream]:
        return capture_streams([self.near_pcap])

    @cached_property
    def refused(self) -> list[CapturedStream]:
        """Near connections the proxy refused: reset, no byte from the proxy (a closed listener).
        The client may have written first: a connection still in the listener's backlog when the
        proxy closes it has finished its handshake in the kernel, and the client's request (a
        knock came 0.7 ms after the proxy's first refusal, in CI) is reset unread. The proxy
        never accepted it, so it has no row. An accepted connection whose broker refuses it is
        ended with a FIN first, and recorded; a request the client sends after that FIN is
        answered with a RST (in CI: FIN 1 ms after the handshake, the client's request 8 ms
        later, reset), so the FIN is what tells it from a refused one."""
        return [s for s in self.near if not s.data[1] and s.how == "rst" and not s.server_closed_first]

    @cached_property
    def accepted(self) -> list[CapturedStream]:
        """Near connections the proxy accepted."""
        refused = {id(s) for s in self.refused}
        return [s for s in self.near if id(s) not in refused]

    @cached_property
    def far(self) -> list[CapturedStream]:
        """Far-side connections to the brokers' listener (not the controllers')."""
        ips = set(self.brokers.values())
        return [s for s in capture_streams([self.far_pcap]) if s.server[0] in ips and s.server[1] == 9092]

    def table(self, directory: Path, name: str) -> list[dict[str, Any]]:
        return ds.dataset(directory / name, partitioning="hive").to_table().to_pylist()

    @cached_property
    def recorded(self) -> list[dict[str, Any]]:
        return self.table(self.recorded_dir, "exchanges")

    @cached_property
    def recorded_connections(self) -> list[dict[str, Any]]:
        return self.table(self.recorded_dir, "connections")

    @cached_property
    def decoded_dir(self) -> Path:
        """``kwire decode`` of the near capture, run as a user would."""
        out = self.work / "near-decoded"
        subprocess.run(
            [
                sys.executable,
                "-c",
                KWIRE_MAIN,
                "decode",
                str(self.near_pcap),
                "-o",
                str(out),
                "-q",
                "--overwrite",
            ],
            check=True,
            timeout=300,
        )
        return out

    @cached_property
    def decoded(self) -> list[dict[str, Any]]:
        return self.table(self.decoded_dir, "exchanges")

    @cached_property
    def decoded_connections(self) -> list[dict[str, Any]]:
        return self.table(self.decoded_dir, "connections")

    @cached_property
    def decoded_id(self) -> dict[int, str]:
        """The decoded connection id of each near stream, by ``id(stream)``: the same client
        and listener ports, the first packets nearest in time. A client port alone does not
        name a connection: the kernel gives one to a new connection to another listener."""
        pairs = nearest_in_time(
            self.near,
            self.decoded_connections,
            lambda s: ((s.client[1], s.server[1]), s.opened_ns // 1000),
            lambda c: ((c["client_port"], c["broker_port"]), micros(c["first_packet_time"])),
        )
        return {id(stream): connection["connection_id"] for stream, connection in pairs}

    @cached_property
    def recorded_as(self) -> dict[str, str]:
        """The decoded connection id of each recorded connection id (``same_connections``),
        among the connections the proxy accepted."""
        refused = {self.decoded_id[id(s)] for s in self.refused}
        accepted = [c for c in self.decoded_connections if c["connection_id"] not in refused]
        return same_connections(self.recorded_connections, accepted)

    def at(self, kind: str) -> int:
        """Time of a timeline mark, µs."""
        return int(self.timeline[kind] * US)


def _wait_in_sync(cluster: Any, node: int, timeout: float) -> None:
    """Wait (bounded) until ``node`` is in the ISR of every partition of the topic."""
    deadline = time.monotonic() + timeout
    while True:
        states = cluster.describe_topic(TOPIC)
        if all(node in state.isr for state in states.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"broker {node} not back in sync: {states}")
        time.sleep(0.5)


def _elect_preferred_leaders(cluster: Any, work: Path) -> None:
    """Kafka's own LeaderElectionCommand: a preferred election on the topic's partitions."""
    partitions = work / "election.json"
    partitions.write_text(
        json.dumps({"partitions": [{"topic": TOPIC, "partition": p} for p in range(PARTITIONS)]})
    )
    # lab.cluster has no public election helper; _tool runs one of the release's tools (bounded)
    cluster._tool(
        "org.apache.kafka.tools.LeaderElectionCommand",
        [
            "--bootstrap-server",
            cluster.bootstrap,
            "--election-type",
            "preferred",
            "--path-to-json-file",
            str(partitions),
        ],
        90.0,
    )


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _listener_closed(log: str, node: int) -> tuple[int, int]:
    """(closed, reopened) times in µs of broker ``node``'s listener, from the proxy's log."""
    times: dict[str, int] = {}
    for line in log.splitlines():
        stamp = _LOG_TIME.match(line)
        if stamp is None:
            continue
        for kind, text in (("closed", f"broker {node} ("), ("reopened", f"broker {node} accepts")):
            if text in line and ("refuses connections" in line or kind == "reopened"):
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                times.setdefault(kind, int(when * US))
    assert times.keys() == {"closed", "reopened"}, f"broker {node}'s listener was not closed and reopened"
    return times["closed"], times["reopened"]


def _knock(address: tuple[str, int], timeout: float = 10.0) -> str:
    """Come to ``address`` as a client does: connect, send an ApiVersions v0 request (client id
    ``kwire-lab``, the lab's own), and wait (bounded) for an answer or the end of the connection.
    What happened, for the scenario's timeline."""
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.sendall(api_versions_v0(1, b"kwire-lab"))
            answer = sock.recv(65536)
    except OSError as exc:
        return f"{type(exc).__name__}"
    return f"{len(answer)} bytes back" if answer else "closed"


def _client_ids(stream: CapturedStream) -> set[str | None]:
    return {h.client_id for h in request_heads(stream.data[0])}


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> ProxiedRun:
    if reason := tcpdump_available():
        pytest.skip(reason)
    from lab.cluster import KRaftCluster, port_is_free
    from lab.run import LabRun
    from lab.scenarios import addresses

    work = tmp_path_factory.mktemp("proxy-cluster")
    placed = addresses()
    net = placed["broker_ips"][0].rsplit(".", 1)[0]
    proxy_host = f"{net}.100"
    ports = [LISTEN_PORT, *(NODE_PORT_BASE + n for n in (1, 2, 3))]
    busy = [p for p in ports if not port_is_free(proxy_host, p)]
    if busy:
        pytest.fail(f"proxy ports busy on {proxy_host}: {busy} (another run? set KWIRE_LAB_NET)")
    config = {"min.insync.replicas": 2, "default.replication.factor": 3}
    recorded_dir = work / "recorded"
    bootstrap = f"{proxy_host}:{LISTEN_PORT}"
    with KRaftCluster(
        "4.1",
        **placed,
        brokers=3,
        controllers=1,
        base_dir=work / "cluster",
        broker_config=config,
    ) as cluster:
        cluster.start(timeout=240)
        before = cluster.create_topic(TOPIC, partitions=PARTITIONS, rf=3, configs={"min.insync.replicas": 2})
        brokers = {n: cluster.broker_ip(n) for n in cluster.brokers}
        args = ["--listen", bootstrap, "--broker-port-base", str(NODE_PORT_BASE), "-o", str(recorded_dir)]
        args += ["--flush-seconds", "2"]
        for node in sorted(brokers):  # the victim is not first: a frozen broker still accepts connections
            args += ["--bootstrap", f"{brokers[node]}:9092"]
        near = Tcpdump(work / "near.pcap", [LISTEN_PORT], bpf=f"tcp and host {proxy_host}")
        proxy = ProxyProcess(args, log_path=work / "proxy.log")
        with proxy, near, LabRun("proxy-001", cluster, work / "run") as run:
            total = MESSAGES * len(PRODUCERS)
            duration = MESSAGES / RATE + 45
            client_ids = set()
            for name in PRODUCERS:
                client = run.start_client(
                    name,
                    f"{name}-producer",
                    TOPIC,
                    produce=MESSAGES,
                    rate=RATE,
                    acks="all",
                    duration_s=duration,
                    bootstrap=bootstrap,
                )
                client_ids.add(client.client_id)
            for name in CONSUMERS:
                client = run.start_client(
                    name,
                    f"{name}-consumer",
                    TOPIC,
                    consume=True,
                    group=GROUP,
                    expect=total,
                    idle_s=20,
                    duration_s=duration + 15,
                    bootstrap=bootstrap,
                )
                client_ids.add(client.client_id)
            time.sleep(FREEZE_AT)
            run.mark("broker_paused", node=VICTIM)
            cluster.pause(VICTIM)
            time.sleep(FROZEN_FOR)
            run.mark("broker_killed", node=VICTIM)
            cluster.kill(VICTIM)
            # A client comes to the killed broker's listener while the broker refuses connections,
            # so that every run sees the proxy close that listener and reopen it (real clients
            # mostly move to the new leaders first, and then none comes).
            knocked = _knock((proxy_host, NODE_PORT_BASE + VICTIM))
            run.mark("knocked", node=VICTIM, outcome=knocked)
            run.mark("broker_restarting", node=VICTIM)
            cluster.restart(VICTIM, timeout=120)
            run.mark("broker_started", node=VICTIM)
            during = cluster.describe_leaders(TOPIC)
            # leadership back to the preferred replicas once the victim has caught up: clients
            # still on the old leaders get NOT_LEADER_OR_FOLLOWER with the new leader's endpoint
            # (KIP-951), which the proxy rewrites in Produce and Fetch responses
            _wait_in_sync(cluster, VICTIM, timeout=60)
            run.mark("preferred_election")
            _elect_preferred_leaders(cluster, work)
            codes = run.wait_clients()
            after = cluster.describe_leaders(TOPIC)
            run.mark("clients_done", codes=codes)
            proxy_code = proxy.terminate()
            near.stop()
            truth = run.finish(
                work / "out",
                extra={"leaders_before": before, "leaders_during": during, "leaders_after": after},
            )
        timeline = {e["kind"]: e["ts"] for e in truth["timeline"]}
        return ProxiedRun(
            work=work,
            net=net,
            brokers=brokers,
            truth=truth,
            proxy_code=proxy_code,
            proxy_log=proxy.log,
            near_pcap=near.path,
            far_pcap=run.tcpdump.path,
            near_dropped=near.dropped,
            recorded_dir=recorded_dir,
            leaders_before=before,
            leaders_during=during,
            leaders_after=after,
            timeline=timeline,
            client_ids=client_ids,
            exit_codes=codes,
        )


def _report(line: str) -> None:
    """A figure of the run, printed (``pytest -rP`` shows it)."""
    print(f"proxy on a real cluster: {line}")


def test_clients_stay_on_the_proxy(proxied: ProxiedRun) -> None:
    run = proxied
    assert run.proxy_code == 0, run.proxy_log[-3000:]
    assert "could not rewrite" not in run.proxy_log
    assert run.truth["capture_dropped"] == 0 and run.near_dropped == 0
    # near side: clients only ever connected to proxy listeners ...
    assert run.near and all(run.routes(s.server) for s in run.near), {s.server for s in run.near}
    # every near stream is one connection of the decoded capture, and every recorded one too
    assert len(set(run.decoded_id.values())) == len(run.near) == len(run.decoded_connections)
    assert len(set(run.recorded_as.values())) == len(run.recorded_connections)
    # ... and were only ever told proxy addresses
    told = Counter()
    for row in run.decoded:
        for broker in row.get("metadata_brokers") or ():
            told[(broker["host"], broker["port"])] += 1
        for coordinator in row.get("coordinators") or ():
            if coordinator["port"] and coordinator["port"] > 0:
                told[(coordinator["host"], coordinator["port"])] += 1
    assert set(told) == {run.proxy_address(n) for n in run.brokers}, told

    # far side: every connection with a client's request came from the proxy, one per client connection
    clients, lab, inter_broker, empty, unknown = [], [], [], [], []
    for stream in run.far:
        ids = _client_ids(stream)
        if ids & run.client_ids:
            clients.append(stream)
        elif not stream.data[0] and not stream.data[1]:
            empty.append(stream)
        elif ids and all(i and LAB_CLIENT_ID.match(i) for i in ids):
            lab.append(stream)
        elif ids and all(i and BROKER_CLIENT_ID.match(i) for i in ids):
            inter_broker.append(stream)
        else:
            unknown.append(stream)
    assert not unknown, [(s.client, s.server, _client_ids(s)) for s in unknown]
    # near connections the proxy refused (reset, no byte from it): its listener for the killed broker
    # was closed while that broker refused connections (proxy.server: upstream_refused)
    refused, accepted = run.refused, run.accepted
    pairs, lonely_near, lonely_far = pair_streams(accepted, [*clients, *empty], run.routes)
    assert not lonely_near, [(s.client, s.server, len(s.data[0])) for s in lonely_near]
    assert not [s for s in lonely_far if s in clients], "a client reached a broker without the proxy"
    # what is left carried nothing: the lab's readiness probes and the proxy's own (to see when
    # the broker accepts connections again), to the restarting broker
    victim = run.broker_address(VICTIM)
    killed, started = run.at("broker_killed"), run.at("broker_started") + 2 * US
    for stream in [*lonely_far, *refused]:
        assert stream.server in (victim, run.proxy_address(VICTIM)), (stream.client, stream.server)
        assert killed <= stream.opened_ns // 1000 <= started, (stream.client, stream.server)
    # the proxy closed that listener once the broker refused it, and reopened it once the
    # broker accepted connections again; meanwhile it accepted no client (no connect-and-cut storm).
    # The proxy meets the refusal only when a client comes to that listener while its broker is
    # down: the scenario's knock (``_knock``) makes sure one does.
    came = [
        s
        for s in accepted
        if s.server == run.proxy_address(VICTIM) and killed <= s.opened_ns // 1000 <= started
    ]
    assert came or refused, "no client came to the killed broker's listener, not even the knock"
    closed, reopened = _listener_closed(run.proxy_log, VICTIM)
    assert killed - US <= closed < reopened <= started, (closed, reopened)
    margin = 50_000  # µs: the log's millisecond clock against tcpdump's
    storm = [
        s.opened_ns // 1000
        for s in accepted
        if s.server == run.proxy_address(VICTIM) and closed + margin < s.opened_ns // 1000 < reopened - margin
    ]
    assert not storm, storm
    assert len(pairs) == len(run.recorded_connections)
    # each pair's far side is the broker the proxy says it forwarded that client to
    recorded_broker = {
        run.recorded_as[c["connection_id"]]: (c["broker_ip"], c["broker_port"])
        for c in run.recorded_connections
    }
    assert all(recorded_broker[run.decoded_id[id(p.near)]] == p.far.server for p in pairs)
    listeners = Counter(p.near.server[1] for p in pairs)
    assert set(listeners) == {LISTEN_PORT, *(NODE_PORT_BASE + n for n in run.brokers)}, listeners
    _report(
        f"{len(pairs)} client connections paired across the proxy ({dict(sorted(listeners.items()))} by listener), "
        f"{len(refused)} refused by the killed broker's listener, closed {(reopened - closed) / US:.1f} s; far side also "
        f"{len(inter_broker)} broker-to-broker, {len(lab)} lab tool, {len(lonely_far)} empty connections (probes)"
    )


def test_producers_keep_delivering_through_the_failover(proxied: ProxiedRun) -> None:
    run = proxied
    truth = run.truth
    assert truth["read_back"]
    assert set(run.exit_codes.values()) == {0}, run.exit_codes
    acked_total = 0
    for name in PRODUCERS:
        client = truth["clients"][f"{name}-producer"]
        assert client["sent"] == MESSAGES, (name, client)
        assert client["acked"] == client["sent"], (name, client)
        assert client["failed"] == client["unresolved"] == client["lost"] == 0, (name, client)
        acked_total += client["acked"]
    # the group consumed every acked message between its members
    consumed: set[str] = set()
    for path in (run.work / "run" / "clients").glob("*-consumer.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if event.get("event") == "consume":
                    consumed.add(event["id"])
    assert len(consumed) == acked_total
    # leadership left the victim and the producers followed it, through the new leaders' listeners;
    # then it came back (the preferred election) and they followed it back
    moved = {p: run.leaders_during[p] for p, leader in run.leaders_before.items() if leader == VICTIM}
    assert moved and VICTIM not in moved.values(), (run.leaders_before, run.leaders_during)
    assert run.leaders_after == run.leaders_before
    for partition, leader in moved.items():
        assert _produced_through(
            run, partition, leader, run.at("broker_paused"), run.at("preferred_election")
        )
        assert _produced_through(run, partition, VICTIM, run.at("preferred_election"), None)
    # the frozen broker left Produce requests unanswered, as the proxy recorded them
    frozen = [
        r
        for r in run.recorded
        if r["api_name"] == "Produce"
        and r["broker_ip"] == run.brokers[VICTIM]
        and r["status"] == "unanswered"
    ]
    # (until the killed process was reaped and its connections reset)
    assert frozen and all(
        run.at("broker_paused") - 2 * US <= micros(r["request_time"]) <= run.at("broker_restarting")
        for r in frozen
    )
    errors = Counter(
        (r["client_id"], r["api_name"], p["error_code"])
        for r in run.recorded
        for p in r["partition_errors"] or ()
        if p["error_code"]
    )
    _report(
        f"{len(PRODUCERS)} producers sent/acked {acked_total}/{acked_total}, lost 0, group consumed {len(consumed)}; "
        f"leaders moved {moved} and back; {len(frozen)} Produce unanswered by the frozen broker; "
        f"partition errors seen {dict(errors)}"
    )


def _produced_through(run: ProxiedRun, partition: int, node: int, since: int, until: int | None) -> bool:
    """Whether a client produced to ``partition`` through the proxy's listener for ``node``
    (and had it acked) between the two times (µs)."""
    for row in run.decoded:
        if row["api_name"] != "Produce" or row["broker_port"] != NODE_PORT_BASE + node:
            continue
        sent = micros(row["request_time"])
        if sent < since or (until is not None and sent > until):
            continue
        if any(p["partition"] == partition and p["error_code"] == 0 for p in row["partition_errors"] or ()):
            return True
    return False


def test_forwarding_is_byte_exact_except_rewritten_addresses(proxied: ProxiedRun) -> None:
    run = proxied
    clients = [s for s in run.far if _client_ids(s) & run.client_ids or not (s.data[0] or s.data[1])]
    pairs, _, _ = pair_streams(run.accepted, clients, run.routes)
    total = BytesReport()
    gapped = 0
    for pair in pairs:
        if pair.near.gap_bytes or pair.far.gap_bytes:
            gapped += 1  # tcpdump lost packets: the streams cannot be compared
            continue
        total.add(compare_pair(pair, run.proxy_address, run.broker_address))
    assert gapped == 0
    assert not total.problems, total.problems[:20]
    assert total.frames_rewritten > 0 and total.endpoints_rewritten > 0
    assert total.frames_identical > 1000
    assert any(api.startswith(("Metadata", "FindCoordinator")) for api in total.rewritten_apis)
    # KIP-951: after the election the old leaders answer NOT_LEADER_OR_FOLLOWER with the new
    # leader's endpoint (Java 4.1 Produce v13 and Fetch v18, librdkafka Produce v10)
    assert any(api.startswith(("Produce", "Fetch")) for api in total.rewritten_apis), total.rewritten_apis
    _report(
        f"byte-exact over {total.pairs} pairs: {total.request_bytes} request + {total.response_bytes} response "
        f"bytes, {total.frames_identical} frames identical, {total.frames_rewritten} rewritten "
        f"({total.endpoints_rewritten} endpoints; {dict(total.rewritten_apis)}), "
        f"{total.frames_decoded - total.frames_rewritten} decoded and unchanged, {total.cut_short} cut short by a reset"
    )


def test_recorded_rows_equal_kwire_decode_of_the_client_side(proxied: ProxiedRun) -> None:
    run = proxied
    damaged = {s.client[1] for s in run.near if s.gap_bytes}
    assert not damaged
    read = {run.recorded_as[c["connection_id"]]: c["bytes_to_broker"] for c in run.recorded_connections}
    unread = {}
    for stream in run.near:
        connection = run.decoded_id[id(stream)]
        unread[connection] = unread_requests(stream.data[0], read.get(connection, 0))
    # The recorder runs on CPU nobody else wants (proxy.recorder_worker): on a saturated machine
    # (CI, five clients starting beside four JVMs) it can fall behind and skip bytes, and says so
    # in the connection's gap bytes. Its rows must then claim only what it saw.
    gapped = {run.recorded_as[c["connection_id"]] for c in run.recorded_connections if skipped_bytes(c)}
    report = compare_rows(
        run.recorded,
        run.decoded,
        lambda port: run.routes((run.proxy_host, port)),
        unread=unread,
        recorded_as=run.recorded_as,
        gapped=gapped,
    )
    assert not report.problems, report.problems[:20]
    assert report.compared + report.unpaired_gap_rows == len(run.recorded) and report.compared > 1000
    skipped = sum(map(len, report.skipped.values()))
    # a light load: nine rows in ten at least are recorded in full, or the comparison says little
    assert report.compared - report.gap_rows >= 0.9 * len(run.decoded), (skipped, report.gap_rows)
    assert {r["client_id"] for r in run.recorded} >= run.client_ids
    assert not any(r["injected"] for r in run.recorded)  # no fault rules: the broker answered every one
    refused = {run.decoded_id[id(s)] for s in run.refused}  # never accepted: the proxy has no row for them
    decoded_connections = [c for c in run.decoded_connections if c["connection_id"] not in refused]
    assert all(c["bytes_to_client"] == 0 for c in run.decoded_connections if c["connection_id"] in refused)
    connections, ends, problems = compare_connections(
        run.recorded_connections, decoded_connections, report.unread, recorded_as=run.recorded_as
    )
    assert not problems, problems[:20]
    _report(
        f"rows: {report.compared} recorded = decoded ({dict(report.statuses)}), "
        f"{sum(map(len, report.unread.values()))} client-side rows sent after the proxy ended the connection, "
        f"max time delta {report.max_time_delta_us} µs; {connections} connections equal "
        f"(end reasons recorded/decoded: {dict(ends)})"
    )
    _report(
        f"recorder fell behind: {len(gapped)} connections with skipped bytes "
        f"({sum(skipped_bytes(c) for c in run.recorded_connections)}), {skipped} rows not recorded, "
        f"{report.gap_rows + report.unpaired_gap_rows} gap rows; "
        + " ".join(line.split(" INFO ", 1)[-1] for line in run.proxy_log.splitlines() if " stopped: " in line)
    )
