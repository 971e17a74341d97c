"""The proxy's parts without a real broker: request heads, rules, built responses, rewriting,
and whole sessions against a scripted fake broker (ordering, injection, blind forwarding, SASL).
"""

from __future__ import annotations

import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

from decoder import message_codec as mc
from decoder import protocol
from decoder.connection import KafkaConnection
from decoder.events import ResponseReceived
from kwire.cli import app
from proxy import rewrite
from proxy.embedded import ProxyThread, loopback_config
from proxy.framing import parse_request_head
from proxy.inject import RuleError, RuleSet, build_error_response, load_rules, parse_duration, parse_rule
from proxy.server import Proxy, ProxyConfig, parse_address
from proxy.streams import capture_streams, split_frames

CAPTURES = sorted((Path(__file__).resolve().parent.parent / "captures").glob("*.pcap"))


# ---- building frames ---------------------------------------------------------------------


def request_frame(
    key: int, version: int, corr: int, body: dict[str, Any] | None = None, client_id: str | None = "unit"
) -> bytes:
    header = {"RequestApiKey": key, "RequestApiVersion": version, "CorrelationId": corr}
    if protocol.request_header_version(key, version) >= 1:
        header["ClientId"] = client_id
    return mc.encode_frame(
        "request",
        key,
        version,
        header,
        body if body is not None else mc.default_tree("request", key, version),
    )


def response_frame(key: int, version: int, corr: int, body: dict[str, Any]) -> bytes:
    return mc.encode_frame("response", key, version, {"CorrelationId": corr}, body)


def produce_request(
    version: int, corr: int, topic: str = "t", partitions: tuple[int, ...] = (0, 1), acks: int = 1
) -> bytes:
    body = mc.default_tree("request", 0, version)
    body["Acks"] = acks
    layout = protocol.layout("request", 0, version)[1]
    topic_fields = next(f for f in layout if f[0] == "TopicData")[5]
    entry = {f[0]: mc._default_value(f) for f in topic_fields if f[3] is None}
    if "Name" in entry:
        entry["Name"] = topic
    else:
        entry["TopicId"] = b"\x01" * 16
    entry["PartitionData"] = [{"Index": p, "Records": b""} for p in partitions]
    body["TopicData"] = [entry]
    return request_frame(0, version, corr, body)


def decode_response(key: int, version: int, request: bytes, response: bytes) -> dict[str, Any]:
    conn = KafkaConnection()
    conn.receive_data(0, request, 1)
    conn.receive_data(1, response, 2)
    [event] = [e for e in conn.events() if isinstance(e, ResponseReceived)]
    assert event.response.status == "ok", event.response.decode_error
    assert event.response.decode_error is None
    return event.response.fields


# ---- request heads ---------------------------------------------------------------------------


def test_request_head_reads_header_and_acks() -> None:
    for version in (3, 7, 9, 11):
        frame = produce_request(version, 42, acks=0)
        head = parse_request_head(frame, 0, len(frame))
        assert (head.api_key, head.api_version, head.correlation_id) == (0, version, 42)
        assert head.client_id == "unit" and head.acks == 0 and not head.expects_response
        assert head.size == len(frame)
    frame = request_frame(12, 0, 7)
    assert parse_request_head(frame, 0, 11) is None  # fewer than 12 bytes
    assert parse_request_head(frame, 0, 15) is None  # client id not complete yet
    head = parse_request_head(frame, 0, len(frame))
    assert head.client_id == "unit" and head.acks is None and head.expects_response
    with pytest.raises(ValueError):
        parse_request_head(struct.pack(">ihhi", -5, 0, 0, 0), 0, 12)


def test_request_head_from_real_captures() -> None:
    seen = 0
    for stream in capture_streams(CAPTURES[:2]):
        for frame in split_frames(stream.data[0]):
            head = parse_request_head(frame, 0, len(frame))
            key, version, corr = struct.unpack_from(">hhi", frame, 4)
            assert (head.api_key, head.api_version, head.correlation_id, head.size) == (
                key,
                version,
                corr,
                len(frame),
            )
            assert head.client_id and head.client_id.startswith("kwire-test")
            if key == 0:
                assert head.acks in (0, 1, -1)
            seen += 1
    assert seen > 50


# ---- rules ---------------------------------------------------------------------------------


def test_parse_rule_text_and_json(tmp_path: Path) -> None:
    rule = parse_rule("api=Produce,topic=t,partition=0,error=KAFKA_STORAGE_ERROR,rate=1,after=5s,for=30s")
    assert (rule.api_key, rule.topic, rule.partition, rule.action, rule.error_code) == (
        0,
        "t",
        0,
        "error",
        56,
    )
    assert (rule.rate, rule.after_s, rule.for_s) == (1.0, 5.0, 30.0)
    assert not rule.active(4.9) and rule.active(5.0) and rule.active(34.9) and not rule.active(35.0)
    assert parse_rule("api=1,latency=250ms").latency_s == pytest.approx(0.25)
    assert parse_rule("api=JoinGroup,client_id=x,close").action == "close"
    assert parse_rule("api=fetch,error=6").error_code == 6
    assert parse_duration("2m") == 120 and parse_duration("1.5") == 1.5
    for bad in (
        "api=Nope,error=1",
        "api=Produce",
        "api=Produce,error=1,close",
        "error=NOT_AN_ERROR",
        "api=Produce,error=1,rate=2",
        "api=Produce,error=1,colour=red",
    ):
        with pytest.raises(RuleError):
            parse_rule(bad)
    path = tmp_path / "rules.json"
    path.write_text('["api=Produce,error=56", {"api": "Fetch", "latency": "10ms", "rate": 0.5}]')
    rules = load_rules(path)
    assert [r.action for r in rules] == ["error", "latency"] and rules[1].rate == 0.5


def test_ruleset_matches_topic_partition_client_and_rate() -> None:
    rules = RuleSet(
        [
            parse_rule("api=Produce,topic=t,partition=1,error=56"),
            parse_rule("api=Heartbeat,client_id=c1,close"),
            parse_rule("api=Fetch,error=6,rate=0.5"),
        ],
        seed=1,
    )
    fields = {"TopicData": [{"topic": "t", "PartitionData": [{"partition": 0}, {"partition": 1}]}]}
    assert rules.decide(0, "x", fields, {}).error_code == 56
    other = {"TopicData": [{"topic": "t", "PartitionData": [{"partition": 0}]}]}
    assert rules.decide(0, "x", other, {}) is None
    assert rules.decide(12, "c1", None, {}).action == "close"
    assert rules.decide(12, "c2", None, {}) is None
    assert rules.may_apply(0) and not rules.may_apply(3)
    hits = sum(rules.decide(1, "x", None, {}) is not None for _ in range(400))
    assert 120 < hits < 280  # rate 0.5
    by_id = RuleSet([parse_rule("api=Fetch,topic=named,error=6")])
    fields = {"Topics": [{"topic_id": "AQEBAQEBAQEBAQEBAQEBAQ", "Partitions": [{"partition": 0}]}]}
    assert by_id.decide(1, None, fields, {"AQEBAQEBAQEBAQEBAQEBAQ": "named"}) is not None
    assert by_id.decide(1, None, fields, {}) is None


# ---- built error responses -------------------------------------------------------------------


@pytest.mark.parametrize("version", range(protocol.version_range(0)[0], protocol.version_range(0)[1] + 1))
def test_error_response_for_every_produce_version(version: int) -> None:
    request = produce_request(version, 9, partitions=(0, 1))
    response = build_error_response(0, version, 9, request, 56, {"AQEBAQEBAQEBAQEBAQEBAQ": "t"})
    fields = decode_response(0, version, request, response)
    [topic] = fields["Responses"]
    assert [p["partition"] for p in topic["PartitionResponses"]] == [0, 1]
    assert {p["error_code"] for p in topic["PartitionResponses"]} == {56}
    tree = mc.decode_frame("response", response, 0, version)[1]
    assert all(p["BaseOffset"] == -1 for p in tree["Responses"][0]["PartitionResponses"])


@pytest.mark.parametrize("version", range(4, protocol.version_range(1)[1] + 1))
def test_error_response_for_fetch_versions(version: int) -> None:
    body = mc.default_tree("request", 1, version)
    layout = protocol.layout("request", 1, version)[1]
    topic_fields = next(f for f in layout if f[0] == "Topics")[5]
    topic = {f[0]: mc._default_value(f) for f in topic_fields if f[3] is None}
    topic["Topic" if "Topic" in topic else "TopicId"] = "t" if "Topic" in topic else b"\x01" * 16
    part_fields = next(f for f in topic_fields if f[0] == "Partitions")[5]
    topic["Partitions"] = [
        {**{f[0]: mc._default_value(f) for f in part_fields if f[3] is None}, "Partition": 3}
    ]
    body["Topics"] = [topic]
    request = request_frame(1, version, 5, body)
    response = build_error_response(1, version, 5, request, 6)
    fields = decode_response(1, version, request, response)
    [part] = fields["Responses"][0]["Partitions"]
    assert part["partition"] == 3 and part["error_code"] == 6
    assert fields.get("error_code", 0) == 0  # the fetch as a whole did not fail
    tree = mc.decode_frame("response", response, 1, version)[1]
    partition = tree["Responses"][0]["Partitions"][0]
    assert partition.get("PreferredReadReplica", -1) == -1 and partition["HighWatermark"] == -1


@pytest.mark.parametrize(
    ("key", "version"),
    [(12, 0), (12, 4), (11, 5), (11, 9), (10, 1), (10, 4), (3, 12), (8, 8), (8, 9), (2, 7), (9, 8)],
)
def test_error_response_for_other_apis(key: int, version: int) -> None:
    request = request_frame(key, version, 77)
    if key == 10 and version >= 4:
        body = mc.default_tree("request", key, version)
        body["CoordinatorKeys"] = ["g1", "g2"]
        request = request_frame(key, version, 77, body)
    response = build_error_response(key, version, 77, request, 15)
    fields = decode_response(key, version, request, response)
    codes = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "error_code" in node:
                codes.append(node["error_code"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(fields)
    if key == 10 and version >= 4:
        assert [c["coordinator_key"] for c in fields["Coordinators"]] == ["g1", "g2"]
    if codes:
        assert set(codes) == {15}


# ---- rewriting ---------------------------------------------------------------------------------


def test_has_endpoints_follows_the_table() -> None:
    assert all(rewrite.has_endpoints(3, v) for v in range(0, 13))
    assert all(rewrite.has_endpoints(10, v) for v in range(0, 6))
    assert rewrite.has_endpoints(60, 0)
    assert rewrite.has_endpoints(0, 10) and not rewrite.has_endpoints(0, 9)  # KIP-951 node endpoints
    assert rewrite.has_endpoints(1, 16) and not rewrite.has_endpoints(1, 15)
    assert not rewrite.has_endpoints(18, 3) and not rewrite.has_endpoints(12, 4)


def test_per_version_caches_stay_bounded_under_made_up_versions() -> None:
    """A hostile client may name any (api key, version): the answers cached for them are bounded."""
    from decoder.skeleton import has_records

    for version in range(10_000):
        assert not rewrite.has_endpoints(3, 1000 + version)
        assert not has_records("request", 0, 1000 + version)
    assert rewrite.has_endpoints.cache_info().currsize <= 4096
    assert has_records.cache_info().currsize <= 4096
    assert rewrite.has_endpoints(3, 12)  # still right after the churn


def _capture_responses(key: int) -> list[tuple[int, bytes]]:
    out = []
    for stream in capture_streams(CAPTURES):
        versions = {}
        for frame in split_frames(stream.data[0]):
            k, v, corr = struct.unpack_from(">hhi", frame, 4)
            versions[corr] = (k, v)
        for frame in split_frames(stream.data[1]):
            corr = struct.unpack_from(">i", frame, 4)[0]
            if versions.get(corr, (None,))[0] == key:
                out.append((versions[corr][1], frame))
    return out


@pytest.mark.parametrize("key", [3, 10])
def test_rewrite_real_responses(key: int) -> None:
    responses = _capture_responses(key)
    assert responses
    for version, frame in responses:
        learned: list[rewrite.Endpoint] = []
        out = rewrite.rewrite_response(
            frame, key, version, lambda n, h, p: ("proxy.local", 30000 + n), learned
        )
        if not learned:  # e.g. FindCoordinator error answers carry no usable endpoint
            assert out is None
            continue
        assert learned[0][1:] == ("127.0.0.1", 9092)
        assert out is not None and struct.unpack_from(">i", out)[0] == len(out) - 4
        before = mc.decode_frame("response", frame, key, version)[1]
        after = mc.decode_frame("response", out, key, version)[1]
        hosts = [s for s in rewrite._tree_endpoints(after)]
        assert hosts and all(s["Host"] == "proxy.local" and s["Port"] == 30111 for s in hosts)
        for s in rewrite._tree_endpoints(before):
            s["Host"], s["Port"] = "proxy.local", 30111
        assert before == after  # nothing but host and port changed
    # an address that needs no change leaves the frame alone
    version, frame = responses[0]
    assert rewrite.rewrite_response(frame, key, version, lambda n, h, p: (h, p)) is None


def _with_correlation_id(frame: bytes, corr: int) -> bytes:
    return frame[:4] + struct.pack(">i", corr) + frame[8:]


@pytest.mark.parametrize("key", [3, 10])
def test_the_rewrite_memo_answers_as_rewrite_response_does(key: int) -> None:
    """Real Metadata and FindCoordinator answers: the memo's frame is rewrite_response's, for
    the answer it has seen and, with the other correlation id, for the same answer again."""
    memo = rewrite.RewriteMemo()
    local = {1: ("proxy.local", 30001)}

    def local_address(node: int, host: str, port: int) -> tuple[str, int]:
        return local.get(node, ("proxy.local", 30000 + node))

    seen = 0
    for version, frame in _capture_responses(key):
        plain = rewrite.rewrite_response(frame, key, version, local_address)
        assert memo.rewrite(frame, key, version, local_address, {}) == plain
        again = _with_correlation_id(frame, 0x7FFF0000 + seen)
        expected = rewrite.rewrite_response(again, key, version, local_address)
        hits = memo.hits
        assert memo.rewrite(again, key, version, local_address, {}) == expected
        assert memo.hits == hits + (plain is not None)  # answers naming no broker are not kept
        seen += 1
    assert seen and memo.hits
    # a broker now behind another listener: the remembered bytes are not used
    version, frame = next(
        (v, f) for v, f in _capture_responses(key) if rewrite.rewrite_response(f, key, v, local_address)
    )
    memo.rewrite(frame, key, version, local_address, {})
    local[111] = ("proxy.local", 31111)
    hits = memo.hits
    out = memo.rewrite(frame, key, version, local_address, {})
    assert memo.hits == hits and out == rewrite.rewrite_response(frame, key, version, local_address)
    assert b"proxy.local" in out and struct.pack(">i", 31111) in out


def test_the_rewrite_memo_learns_topic_ids_on_every_answer_and_stays_bounded() -> None:
    from decoder import message_codec as mc

    tree = mc.default_tree("response", 3, 12)
    tree["Brokers"] = [{"NodeId": 1, "Host": "b1", "Port": 9092, "Rack": None}]
    topic = {"ErrorCode": 0, "Name": "orders", "TopicId": bytes(range(16)), "IsInternal": False}
    tree["Topics"] = [{**topic, "Partitions": [], "TopicAuthorizedOperations": -2147483648}]
    payload = mc.encode_header("response", 1, {"CorrelationId": 7}) + mc.encode_message(
        "response", 3, 12, tree
    )
    frame = struct.pack(">i", len(payload)) + payload
    memo = rewrite.RewriteMemo(max_bytes=4096, max_frame=1024)
    to_proxy = lambda *_: ("127.0.0.1", 1)  # noqa: E731
    for _ in range(2):
        topics: dict[str, str] = {}
        assert memo.rewrite(frame, 3, 12, to_proxy, topics) is not None
        assert list(topics.values()) == ["orders"]
    assert memo.hits == 1
    for n in range(200):  # ever-new answers: the memo keeps at most max_bytes of them
        tree["Brokers"][0]["Host"] = f"broker-{n}.internal"
        payload = mc.encode_header("response", 1, {"CorrelationId": 7}) + mc.encode_message(
            "response", 3, 12, tree
        )
        memo.rewrite(struct.pack(">i", len(payload)) + payload, 3, 12, to_proxy, {})
        assert 0 < memo._bytes <= 4096
    tree["Topics"] = [{**topic, "Name": "x" * 2000, "Partitions": [], "TopicAuthorizedOperations": 0}]
    payload = mc.encode_header("response", 1, {"CorrelationId": 7}) + mc.encode_message(
        "response", 3, 12, tree
    )
    big = struct.pack(">i", len(payload)) + payload
    entries = dict(memo._entries)
    assert memo.rewrite(big, 3, 12, to_proxy, {}) is not None
    assert memo._entries == entries  # over max_frame: rewritten, not kept


def test_parse_address() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address("h", 9092) == ("h", 9092)
    assert parse_address("[::1]:5") == ("::1", 5)
    with pytest.raises(ValueError):
        parse_address("h")


# ---- whole sessions against a scripted broker -------------------------------------------------


class FakeBroker:
    """A threaded TCP server answering each request frame with ``handler(frame)`` (None: no answer),
    after ``delay`` seconds. ``raw=True`` echoes bytes back instead. Records what it received."""

    def __init__(
        self,
        handler: Callable[[bytes], bytes | None] | None = None,
        delay: float = 0.0,
        raw: bool = False,
        port: int = 0,
    ) -> None:
        self.handler = handler
        self.delay = delay
        self.raw = raw
        self.received: list[bytes] = []
        self.received_bytes = bytearray()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock = self.request
                sock.settimeout(10)
                buf = bytearray()
                while True:
                    try:
                        chunk = sock.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    outer.received_bytes += chunk
                    if outer.raw:
                        sock.sendall(chunk)
                        continue
                    buf += chunk
                    while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                        size = 4 + struct.unpack_from(">i", buf)[0]
                        frame = bytes(buf[:size])
                        del buf[:size]
                        outer.received.append(frame)
                        answer = outer.handler(frame) if outer.handler else None
                        if answer is not None:
                            time.sleep(outer.delay)
                            sock.sendall(answer)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True  # a broker restarted on its port

        self.server = Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scripted(frame: bytes) -> bytes | None:
    """Answers Heartbeat, Metadata (one broker: node 7 at this fake), SaslHandshake/Authenticate."""
    key, version, corr = struct.unpack_from(">hhi", frame, 4)
    body = mc.default_tree("response", key, version)
    if key == 3:
        body["Brokers"] = [{"NodeId": 7, "Host": "localhost", "Port": SCRIPTED_PORT[0], "Rack": None}]
        if version == 0:
            del body["Brokers"][0]["Rack"]
    elif key == 17:
        body["Mechanisms"] = ["PLAIN"]
    elif key == 0:
        return (
            None
            if parse_request_head(frame, 0, len(frame)).acks == 0
            else response_frame(key, version, corr, body)
        )
    return response_frame(key, version, corr, body)


SCRIPTED_PORT = [0]


def recv_frames(sock: socket.socket, count: int, timeout: float = 5.0) -> list[bytes]:
    sock.settimeout(timeout)
    buf = bytearray()
    frames = []
    while len(frames) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            size = 4 + struct.unpack_from(">i", buf)[0]
            frames.append(bytes(buf[:size]))
            del buf[:size]
    return frames


@pytest.fixture
def fake() -> Any:
    broker = FakeBroker(scripted, delay=0.05)
    SCRIPTED_PORT[0] = broker.port
    yield broker
    broker.close()


def proxy_config(broker_port: int, tmp_path: Path | None = None, **extra: Any) -> ProxyConfig:
    return loopback_config(broker_port, tmp_path, flush_seconds=0.2, **extra)


def test_injected_response_keeps_request_order(fake: FakeBroker, tmp_path: Path) -> None:
    config = proxy_config(
        fake.port, tmp_path, rules=[parse_rule("api=Produce,topic=t,partition=1,error=56")], metrics_port=0
    )
    produce = produce_request(7, 2, partitions=(0, 1))
    with (
        ProxyThread(config) as running,
        socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s,
    ):
        # pipelined: the broker answers 1 and 3 after 50 ms each; 2 is answered by the proxy
        s.sendall(
            request_frame(12, 0, 1)
            + produce
            + request_frame(12, 0, 3)
            + produce_request(7, 4, partitions=(0,))
        )
        frames = recv_frames(s, 4)
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{running.proxy.metrics_port}/metrics", timeout=5
        ).read()
    assert [struct.unpack_from(">i", f, 4)[0] for f in frames] == [1, 2, 3, 4]
    fields = decode_response(0, 7, produce, frames[1])
    assert {p["error_code"] for p in fields["Responses"][0]["PartitionResponses"]} == {56}
    # the broker never saw request 2: nothing was written behind the client's back
    assert [struct.unpack_from(">i", f, 8)[0] for f in fake.received] == [1, 3, 4]
    assert (
        b'kwire_proxy_injected_faults_total{rule="api=Produce,topic=t,partition=1,error=56",action="error"} 1'
        in metrics
    )
    assert b'kwire_proxy_requests_total{api="Heartbeat",api_key="0"' not in metrics
    assert b'api="Heartbeat",api_key="12",version="0",client_id="unit"} 2' in metrics
    table = ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table().sort_by("correlation_id")
    assert table["correlation_id"].to_pylist() == [1, 2, 3, 4]
    assert table["injected"].to_pylist() == [False, True, False, False]
    assert table["status"].to_pylist() == ["ok"] * 4


def test_latency_and_close_rules(fake: FakeBroker) -> None:
    config = proxy_config(
        fake.port,
        rules=[
            parse_rule("api=Heartbeat,client_id=slow,latency=300ms"),
            parse_rule("api=Heartbeat,client_id=cut,close"),
        ],
    )
    with ProxyThread(config) as running:
        port = running.proxy.listen_port
        with socket.create_connection(("127.0.0.1", port)) as s:
            started = time.monotonic()
            s.sendall(request_frame(12, 0, 1, client_id="slow") + request_frame(12, 0, 2, client_id="fast"))
            frames = recv_frames(s, 2)
            took = time.monotonic() - started
        assert [struct.unpack_from(">i", f, 4)[0] for f in frames] == [1, 2]
        assert took >= 0.3
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request_frame(12, 0, 5, client_id="cut"))
            assert recv_frames(s, 1) == []  # closed without an answer
    assert 5 not in [struct.unpack_from(">i", f, 8)[0] for f in fake.received]


def test_metadata_rewritten_and_broker_listener_serves(fake: FakeBroker, tmp_path: Path) -> None:
    with ProxyThread(proxy_config(fake.port, tmp_path, advertise="127.0.0.1")) as running:
        with socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s:
            request = request_frame(3, 9, 11)
            s.sendall(request)
            [frame] = recv_frames(s, 1)
        fields = decode_response(3, 9, request, frame)
        [broker] = fields["Brokers"]
        assert broker["node_id"] == 7 and broker["host"] == "127.0.0.1"
        assert broker["port"] == running.proxy.node_ports[7] != fake.port
        # the advertised listener reaches the same broker
        with socket.create_connection(("127.0.0.1", broker["port"])) as s:
            s.sendall(request_frame(12, 0, 12))
            [frame] = recv_frames(s, 1)
        assert struct.unpack_from(">i", frame, 4)[0] == 12
        assert running.proxy.metrics.rewrites[3] == 1
    table = ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table()
    brokers = [b for row in table["metadata_brokers"].to_pylist() if row for b in row]
    assert brokers and {b["host"] for b in brokers} == {"127.0.0.1"}  # rows show what the client saw


def test_unknown_api_and_garbage_pass_through_unchanged(tmp_path: Path) -> None:
    echo = FakeBroker(raw=True)
    try:
        with ProxyThread(proxy_config(echo.port, tmp_path)) as running:
            unknown = (
                struct.pack(">ihhi", 12, 999, 3, 1) + b"\x00\x02hi"
            )  # a well-framed request of an unknown api
            garbage = struct.pack(">i", -7) + bytes(range(256)) * 4
            for payload in (unknown * 3, unknown + garbage):
                with socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s:
                    s.settimeout(5)
                    s.sendall(payload)
                    got = bytearray()
                    while len(got) < len(payload):
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        got += chunk
                assert bytes(got) == payload
    finally:
        echo.close()
    # the stream with garbage went blind: recorded as not Kafka; its frames are kept all the same
    connections = ds.dataset(tmp_path / "connections", partitioning="hive").to_table().to_pylist()
    assert sorted(c["protocol"] for c in connections) == ["kafka", "other"]
    statuses = ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table()["status"].to_pylist()
    assert statuses.count("unknown_api") >= 4


def test_sasl_passes_through_and_credentials_are_not_recorded(fake: FakeBroker, tmp_path: Path) -> None:
    secret = b"\x00alice\x00s3cr3t-password"
    handshake = request_frame(17, 1, 1, {"Mechanism": "PLAIN"})
    authenticate = request_frame(36, 2, 2, {"AuthBytes": secret})
    with (
        ProxyThread(proxy_config(fake.port, tmp_path)) as running,
        socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s,
    ):
        s.sendall(handshake + authenticate)
        frames = recv_frames(s, 2)
    assert len(frames) == 2
    assert fake.received == [handshake, authenticate]  # forwarded unchanged
    table = ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table()
    assert "PLAIN" in table["sasl_mechanism"].to_pylist()
    for path in tmp_path.rglob("*.parquet"):
        assert b"s3cr3t" not in path.read_bytes()


def test_client_end_of_stream_still_gets_the_responses(fake: FakeBroker, tmp_path: Path) -> None:
    """A client that sends its requests and then ends its side (shutdown SHUT_WR) still gets
    every response, as on a direct connection: the proxy passes the end on, not a reset."""
    requests = request_frame(12, 0, 1) + request_frame(12, 0, 2)
    with ProxyThread(proxy_config(fake.port, tmp_path)) as running:
        with socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s:
            s.sendall(requests)
            s.shutdown(socket.SHUT_WR)
            frames = recv_frames(s, 3)  # the broker answers after 50 ms each; then the end
        assert [struct.unpack_from(">i", f, 4)[0] for f in frames] == [1, 2]
    assert bytes(fake.received_bytes) == requests
    [connection] = ds.dataset(tmp_path / "connections", partitioning="hive").to_table().to_pylist()
    assert connection["end_reason"] == "fin"
    table = ds.dataset(tmp_path / "exchanges", partitioning="hive").to_table()
    assert sorted(table["correlation_id"].to_pylist()) == [1, 2]
    assert set(table["status"].to_pylist()) == {"ok"}


def test_a_connection_that_carries_nothing_reads_as_kwire_decode_reads_it(
    fake: FakeBroker, tmp_path: Path
) -> None:
    """Connected and closed without a byte either way (a health check, a client giving up): no
    Kafka was seen, so the row says "other" with no Kafka counts, as kwire decode says of the same
    connection in a capture (a real-cluster comparison found the two rows differing)."""
    with (
        ProxyThread(proxy_config(fake.port, tmp_path)) as running,
        socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s,
    ):
        time.sleep(0.2)  # the proxy has accepted and connected upstream
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        assert s.recv(10) == b""
    assert not list(tmp_path.glob("exchanges/**/*.parquet"))
    [connection] = ds.dataset(tmp_path / "connections", partitioning="hive").to_table().to_pylist()
    assert (connection["bytes_to_broker"], connection["bytes_to_client"]) == (0, 0)
    assert connection["protocol"] == "other"
    assert [connection[c] for c in ("frames_to_broker", "frames_to_client", "resyncs", "client_id")] == [
        None
    ] * 4


def _unanswering_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full and never served: a connection attempt to it
    gets no answer (Linux drops the SYN) until the connecting side gives up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    time.sleep(0.1)
    return listener, fillers


def _only_connection(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The exchange rows and connection rows a proxy recorded in ``out``."""
    exchanges, connections = (
        ds.dataset(out / name, partitioning="hive").to_table().to_pylist()
        for name in ("exchanges", "connections")
    )
    return exchanges, connections


def test_requests_to_an_unreachable_broker_are_recorded(tmp_path: Path) -> None:
    """A client whose broker cannot be reached is cut off, and what it sent meanwhile is in the
    rows (unanswered), as a capture of that connection shows it; the connection's row starts
    when the client connected. Before: the event loop paused reading while connecting, so the
    request was not recorded, and the row's first packet was the time the connect failed."""
    listener, fillers = _unanswering_listener()
    request = request_frame(18, 0, 41, client_id="stranded")
    try:
        config = proxy_config(listener.getsockname()[1], tmp_path, connect_timeout=0.5)
        with ProxyThread(config) as running:
            with socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s:
                s.sendall(request)
                s.settimeout(5)
                try:
                    answer = s.recv(100)
                except ConnectionResetError:
                    answer = b""
                assert answer == b""  # cut off without an answer
            assert running.proxy.metrics.upstream_failures == 1
    finally:
        for sock in (*fillers, listener):
            sock.close()
    [row], [connection] = _only_connection(tmp_path)
    assert (row["correlation_id"], row["client_id"], row["status"]) == (41, "stranded", "unanswered")
    assert connection["bytes_to_broker"] == len(request) and connection["frames_to_broker"] == 1
    assert connection["end_reason"] == "rst"
    # the connection began before its request (not when the connect attempt failed, 0.5 s later)
    assert connection["first_packet_time"] <= row["request_time"]


@pytest.mark.parametrize("how", ["client_resets", "proxy_stops"])
def test_a_connection_that_ends_while_the_broker_is_connecting_is_recorded(tmp_path: Path, how: str) -> None:
    """A connection that ends before the proxy's upstream connection is made (a frozen broker
    whose SYN queue is full): the client gave up, or the proxy was stopped. The client made it
    all the same: it is in the rows, with what it sent, unanswered. Before, such a session was
    dropped unrecorded, and a real-cluster failover run found 29 client connections in the
    capture and 28 recorded."""
    listener, fillers = _unanswering_listener()
    broker_port = listener.getsockname()[1]
    request = request_frame(18, 0, 42, client_id="impatient")
    try:
        config = proxy_config(broker_port, tmp_path, connect_timeout=30)
        with ProxyThread(config) as running:
            s = socket.create_connection(("127.0.0.1", running.proxy.listen_port))
            s.sendall(request)
            deadline = time.monotonic() + 5
            while running.proxy.metrics.bytes_to_broker < len(request) and not running.proxy.sessions:
                assert time.monotonic() < deadline, "the proxy never accepted the client"
                time.sleep(0.02)
            time.sleep(0.3)  # the request is read and held while connecting
            if how == "client_resets":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
                deadline = time.monotonic() + 5
                while running.proxy.sessions:
                    assert time.monotonic() < deadline, "the session never ended"
                    time.sleep(0.02)
            assert running.proxy.metrics.upstream_failures == 0  # it never came to that
        s.close()
    finally:
        for sock in (*fillers, listener):
            sock.close()
    [row], [connection] = _only_connection(tmp_path)
    assert (row["correlation_id"], row["client_id"], row["status"]) == (42, "impatient", "unanswered")
    assert connection["bytes_to_broker"] == len(request) and connection["bytes_to_client"] == 0
    assert connection["broker_port"] == broker_port


def test_broker_listener_refuses_while_its_broker_does(tmp_path: Path) -> None:
    """A broker that refuses connections (it is down) gets a listener that refuses them too,
    until it accepts connections again: clients back off as on a direct connection. Before,
    the listener accepted every client and cut it off at once, and kafka-python 3.0 reconnected
    about 240 times a second to a killed broker of a real cluster (tests/test_proxy_real_cluster)."""
    address: list[int] = []

    def answer(frame: bytes) -> bytes | None:
        key, version, corr = struct.unpack_from(">hhi", frame, 4)
        body = mc.default_tree("response", key, version)
        if key == 3:
            body["Brokers"] = [{"NodeId": 7, "Host": "127.0.0.1", "Port": address[0], "Rack": None}]
        return response_frame(key, version, corr, body)

    broker = FakeBroker(answer)
    address.append(broker.port)

    def connect(port: int) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except ConnectionRefusedError:
            return None

    def heartbeat(sock: socket.socket, corr: int) -> list[bytes]:
        try:
            sock.sendall(request_frame(12, 0, corr))
            return recv_frames(sock, 1)
        except OSError:  # reset
            return []

    def until(check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    config = proxy_config(broker.port, tmp_path, advertise="127.0.0.1")
    with ProxyThread(config) as running:
        with socket.create_connection(("127.0.0.1", running.proxy.listen_port)) as s:
            s.sendall(request_frame(3, 9, 1))
            recv_frames(s, 1)
        node_port = running.proxy.node_ports[7]
        broker.close()  # the broker is down: its port refuses connections
        first = connect(node_port)
        assert first is not None  # the listener cannot know yet
        with first:
            assert heartbeat(first, 2) == []  # accepted, then cut off: the broker refused the proxy
        until(lambda: connect(node_port) is None, "the listener never refused")
        assert running.proxy.metrics.upstream_failures >= 1
        broker = FakeBroker(answer, port=address[0])  # back on its port
        try:

            def served() -> bool:
                sock = connect(node_port)
                if sock is None:
                    return False
                with sock:
                    return len(heartbeat(sock, 3)) == 1

            until(served, "the listener never reopened")
        finally:
            broker.close()


def test_io_threads_is_refused_by_the_api_saying_why() -> None:
    """One I/O model (the event loop): ``auto`` and ``asyncio`` are it; ``threads`` was removed."""
    loopback_config(1).check()
    loopback_config(1, io="asyncio").check()
    with pytest.raises(ValueError, match=r"^--io threads was removed: .*stalled other clients"):
        Proxy(loopback_config(1, io="threads"))
    with pytest.raises(ValueError, match="io must be one of auto, asyncio, not 'fibres'"):
        loopback_config(1, io="fibres").check()


def test_io_threads_on_the_command_line_exits_non_zero_with_one_line() -> None:
    """``kwire proxy --io threads`` (a script written for the removed path): one line, exit 2,
    before any broker is asked for, so nothing is started."""
    result = subprocess.run(
        [sys.executable, "-m", "kwire", "proxy", "--io", "threads"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("kwire proxy: --io threads was removed: ") and "use auto or asyncio" in line
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--io", "threads"], "--io threads was removed: "),
        (["--io", "fibres"], "io must be one of"),
        (["--max-memory-mb", "-1"], "--max-memory-mb -1: must be 0 (no limit) or more"),
        (["--inject", "api=Produce,error=NO_SUCH_ERROR"], "bad fault rule"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--listen", "127.0.0.1:99999"], "the port must be a number from 0 to 65535"),
        (["--bootstrap", "broker:notaport"], "the port must be a number from 0 to 65535"),
        (["--metrics-port", "70000"], "the port must be a number from 0 to 65535"),
        (
            ["--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"],
            "cannot load TLS certificate /nonexistent/c.pem with key /nonexistent/k.pem",
        ),
        (["--upstream-ca", "/nonexistent/ca.pem"], "cannot load CA bundle /nonexistent/ca.pem"),
    ],
)
def test_proxy_usage_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        app, ["proxy", "--bootstrap", "127.0.0.1:1", "--listen", "127.0.0.1:0", *args]
    )
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("kwire proxy: ") and message in line


@pytest.mark.parametrize("taken", ["--listen", "--metrics-port"])
def test_an_address_in_use_is_named_in_one_line(taken: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        value = f"127.0.0.1:{port}" if taken == "--listen" else str(port)
        result = CliRunner().invoke(
            app, ["proxy", "--bootstrap", "127.0.0.1:1", "--listen", "127.0.0.1:0", taken, value]
        )
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    what = "listen on" if taken == "--listen" else "serve metrics on"
    assert line.startswith(f"kwire proxy: cannot {what} 127.0.0.1:{port}: "), line
