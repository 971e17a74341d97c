"""A SASL password never reaches any output: rows, events, Parquet bytes, logs, metrics.

A marker password travels every SASL path a Kafka client can take:

* SaslHandshake v0 and then the KIP-43 token exchange *unframed* (a 4-byte length and the raw
  token, no Kafka header) for PLAIN, SCRAM, OAUTHBEARER and GSSAPI;
* a Kafka 0.9 GSSAPI client's raw token with no handshake at all (first byte 0x60);
* SaslHandshake v1 and SaslAuthenticate v0, v1 and v2 (``auth_bytes``), also failing;

through (a) the sans-io decoder fed whole chunks and single bytes, (b) ``kwire decode`` of a
pcap built packet by packet (whole segments and 1-byte segments, with and without the SYN) and
(c) ``kwire proxy`` (both I/O paths) in front of a real Apache Kafka 4.1 broker doing SASL/PLAIN,
with real clients (kafka-python forced to SaslHandshake v0, kafka-python, confluent-kafka) and
raw sockets writing and reading one byte at a time, then ``kwire decode`` of tcpdump's capture
of that traffic; GSSAPI, which needs a Kerberos KDC, goes through the proxy to a scripted broker. Every output is searched for the marker and for every 4-byte piece of it: as
text, as bytes, and as the big-endian integer four password bytes would make (the leak this
guards against showed as ``api_version = 80``, the password's first byte, and a correlation id
made of four more).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from test_decode_reassembly import _HEADER, Conversation, Packet, write
from typer.testing import CliRunner

from decoder import message_codec as mc
from decoder import protocol
from decoder.connection import KafkaConnection
from decoder.events import (
    BROKER_TO_CLIENT,
    CLIENT_TO_BROKER,
    MalformedFrame,
    OrphanResponse,
    Resync,
    SaslExchange,
)
from kwire.cli import app
from kwire.rows import ConnectionInfo, ExchangeRows

MARKER = b"kw1re-S3CRET-m4rk3r"
#: Every 4-byte piece of the marker (any longer piece contains one).
PIECES = tuple(MARKER[i : i + 4] for i in range(len(MARKER) - 3))
_PIECE_INTS = {struct.unpack(">i", p)[0] for p in PIECES} | {struct.unpack(">I", p)[0] for p in PIECES}
_PIECE_INTS_LE = {struct.unpack("<i", p)[0] for p in PIECES}

UP, DOWN = CLIENT_TO_BROKER, BROKER_TO_CLIENT
CLIENT_ID = "sasl-test"
#: PLAIN's token: authzid NUL authcid NUL password. A one-letter user name puts the password's first
#: byte where a request header has its api version, and four more where the correlation id is.
PLAIN_TOKEN = b"\x00u\x00" + MARKER


# ---- finding the marker -----------------------------------------------------------------------


def leaks(value: Any, where: str = "") -> list[str]:
    """Where ``value`` (rows, events, text, bytes, nested) shows the marker or a piece of it."""
    found: list[str] = []
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        found += [f"{where}: bytes hold {p!r}" for p in PIECES if p in raw]
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogateescape")
        found += [f"{where}: text holds {p!r}" for p in PIECES if p in raw]
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if value in _PIECE_INTS or value in _PIECE_INTS_LE:
            found.append(f"{where}: integer {value} is four password bytes")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += leaks(item, f"{where}.{key}")
    elif isinstance(value, list | tuple | set | frozenset):
        for index, item in enumerate(value):
            found += leaks(item, f"{where}[{index}]")
    elif dataclasses.is_dataclass(value):
        name = type(value).__name__
        for field in dataclasses.fields(value):
            found += leaks(getattr(value, field.name), f"{where}{name}.{field.name}")
    return found


def files_leaks(folder: Path) -> list[str]:
    """Marker pieces in the raw bytes of every file under ``folder``."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        found += leaks(path.read_bytes(), str(path.relative_to(folder)))
    return found


def test_the_leak_finder_finds_what_the_issue_saw() -> None:
    """The checks below can fail: the old decoder's reading of PLAIN's token is caught."""
    version, corr = struct.unpack_from(">hi", PLAIN_TOKEN, 2)
    assert leaks({"api_version": version, "correlation_id": corr})  # the four bytes after 'k'
    assert leaks("user=u pass=" + MARKER.decode()[3:9])
    assert leaks(b"\x00" + MARKER[-4:])
    assert not leaks({"client_id": CLIENT_ID, "sasl_mechanism": "PLAIN", "correlation_id": 3})


# ---- the conversations ------------------------------------------------------------------------


def raw(token: bytes) -> bytes:
    """A KIP-43 unframed token: its length, then the bytes."""
    return struct.pack(">i", len(token)) + token


def _iter_pieces(data: bytes) -> Iterator[bytes]:
    yield from (data[i : i + 1] for i in range(len(data)))


def request(key: int, version: int, corr: int, body: dict[str, Any] | None = None) -> bytes:
    header: dict[str, Any] = {"RequestApiKey": key, "RequestApiVersion": version, "CorrelationId": corr}
    if protocol.request_header_version(key, version) >= 1:
        header["ClientId"] = CLIENT_ID
    tree = mc.default_tree("request", key, version) | (body or {})
    return mc.encode_frame("request", key, version, header, tree)


def response(key: int, version: int, corr: int, body: dict[str, Any] | None = None) -> bytes:
    tree = mc.default_tree("response", key, version) | (body or {})
    return mc.encode_frame("response", key, version, {"CorrelationId": corr}, tree)


def handshake(version: int, mechanism: str, error: int = 0) -> list[tuple[int, bytes]]:
    return [
        (UP, request(17, version, 1, {"Mechanism": mechanism})),
        (DOWN, response(17, version, 1, {"ErrorCode": error, "Mechanisms": ["PLAIN", mechanism]})),
    ]


def after(corr: int) -> list[tuple[int, bytes]]:
    """A Metadata exchange: what a client does once authenticated."""
    return [(UP, request(3, 1, corr)), (DOWN, response(3, 1, corr))]


def authenticate(version: int, error: int = 0) -> list[tuple[int, bytes]]:
    answer: dict[str, Any] = {"ErrorCode": error, "AuthBytes": b"" if not error else MARKER}
    if error:
        answer["ErrorMessage"] = "Authentication failed: Invalid username or password"
    return [
        *handshake(1, "PLAIN"),
        (UP, request(36, version, 2, {"AuthBytes": PLAIN_TOKEN})),
        (DOWN, response(36, version, 2, answer)),
    ]


GSSAPI_FIRST = b"\x60\x82\x02\x10\x06\x09\x2a\x86\x48\x86\xf7\x12\x01\x02\x02\x01\x00" + MARKER * 3
SCRAM_FIRST = b"n,,n=u,r=fyko+d2lbbFgONRv9qkxdawL"

#: The SaslExchange event a conversation ends in: (mechanism, after a handshake, client tokens,
#: broker tokens, how it ended).
Exchange = tuple[str, bool, int, int, str]

#: name -> (steps, expected rows as (api_key, api_version, correlation_id, status), the unframed
#: token exchange or None when there is none)
SCENARIOS: dict[str, tuple[list[tuple[int, bytes]], list[tuple[int, int, int, str]], Exchange | None]] = {
    "v0-plain": (
        [*handshake(0, "PLAIN"), (UP, raw(PLAIN_TOKEN)), (DOWN, raw(b"")), *after(2)],
        [(17, 0, 1, "ok"), (3, 1, 2, "ok")],
        ("PLAIN", True, 1, 1, "complete"),
    ),
    "v0-scram": (
        [
            *handshake(0, "SCRAM-SHA-256"),
            (UP, raw(SCRAM_FIRST)),
            (DOWN, raw(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=" + MARKER + b",i=4096")),
            (UP, raw(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=" + MARKER)),
            (DOWN, raw(b"v=" + MARKER)),
            *after(2),
        ],
        [(17, 0, 1, "ok"), (3, 1, 2, "ok")],
        ("SCRAM-SHA-256", True, 2, 2, "complete"),
    ),
    "v0-oauthbearer": (  # a mechanism without a fixed number of rounds
        [
            *handshake(0, "OAUTHBEARER"),
            (UP, raw(b"n,,\x01auth=Bearer " + MARKER + b"\x01\x01")),
            (DOWN, raw(b"")),
            *after(2),
        ],
        [(17, 0, 1, "ok"), (3, 1, 2, "ok")],
        ("OAUTHBEARER", True, 1, 1, "complete"),
    ),
    "v0-gssapi": (  # several rounds, the client's last token unanswered
        [
            *handshake(0, "GSSAPI"),
            (UP, raw(GSSAPI_FIRST)),
            (DOWN, raw(b"\x6f\x81\x90" + MARKER)),
            (UP, raw(b"")),
            (DOWN, raw(b"\x05\x04\x01\xff\x00\x0c" + MARKER)),
            (UP, raw(b"\x05\x04\x00\xff\x00\x0c" + MARKER)),
            *after(2),
        ],
        [(17, 0, 1, "ok"), (3, 1, 2, "ok")],
        ("GSSAPI", True, 3, 2, "complete"),
    ),
    "no-handshake-gssapi": (  # a Kafka 0.9 client: GSSAPI tokens straight after connecting
        [
            (UP, raw(GSSAPI_FIRST)),
            (DOWN, raw(b"\x6f\x81\x90" + MARKER)),
            (UP, raw(b"")),
            (DOWN, raw(b"\x05\x04\x01\xff\x00\x0c" + MARKER)),
            (UP, raw(b"\x05\x04\x00\xff\x00\x0c" + MARKER)),
            *after(2),
        ],
        [(3, 1, 2, "ok")],
        ("GSSAPI", False, 3, 2, "complete"),
    ),
    "v0-token-sent-before-the-answer": (  # the token right behind the handshake, in one write
        [
            (UP, request(17, 0, 1, {"Mechanism": "PLAIN"}) + raw(PLAIN_TOKEN)),
            (DOWN, response(17, 0, 1, {"Mechanisms": ["PLAIN"]})),
            (DOWN, raw(b"")),
            *after(2),
        ],
        [(17, 0, 1, "ok"), (3, 1, 2, "ok")],
        ("PLAIN", True, 1, 1, "complete"),
    ),
    "v0-plain-rejected": (  # a wrong password: the broker closes the connection
        [*handshake(0, "PLAIN"), (UP, raw(PLAIN_TOKEN))],
        [(17, 0, 1, "ok")],
        ("PLAIN", True, 1, 0, "closed"),
    ),
    **{
        f"authenticate-v{v}": (
            [*authenticate(v), *after(3)],
            [(17, 1, 1, "ok"), (36, v, 2, "ok"), (3, 1, 3, "ok")],
            None,
        )
        for v in (0, 1, 2)
    },
    **{
        f"authenticate-v{v}-failed": (
            authenticate(v, error=58),
            [(17, 1, 1, "ok"), (36, v, 2, "ok")],
            None,
        )
        for v in (0, 1, 2)
    },
}


def feed(steps: list[tuple[int, bytes]], one_byte: bool) -> KafkaConnection:
    conn = KafkaConnection()
    ts = 1_700_000_000_000_000_000
    for direction, data in steps:
        for piece in _iter_pieces(data) if one_byte else [data]:
            ts += 1000
            conn.receive_data(direction, piece, ts)
    conn.receive_close(ts + 1000)
    return conn


def row_keys(rows: Iterable[dict[str, Any]]) -> list[tuple[int, int, int, str]]:
    keys = [(r.get("api_key"), r.get("api_version"), r.get("correlation_id"), r["status"]) for r in rows]
    return sorted(keys, key=repr)


def check_rows(rows: list[dict[str, Any]], expected: list[tuple[int, int, int, str]]) -> None:
    """Exactly the expected exchanges, every one of an api and version the table knows."""
    assert row_keys(rows) == sorted(expected, key=repr), rows
    for row in rows:
        assert protocol.is_known(row["api_key"], row["api_version"]), row


# ---- (a) the sans-io decoder -------------------------------------------------------------------


def decode_steps(conn: KafkaConnection) -> tuple[list[Any], list[dict[str, Any]]]:
    events = conn.events()
    builder = ExchangeRows(ConnectionInfo("unit", "c1", "10.0.0.1", 40000, "10.0.0.2", 9092))
    return events, [row for row in map(builder.row, events) if row is not None]


@pytest.mark.parametrize("one_byte", [False, True], ids=["chunks", "1-byte"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_decoder_never_emits_the_password(name: str, one_byte: bool) -> None:
    steps, expected, exchange = SCENARIOS[name]
    events, rows = decode_steps(feed(steps, one_byte))
    assert leaks(events) == [], name
    assert leaks(repr(events)) == []
    assert leaks(rows) == []
    check_rows(rows, expected)
    told = [e for e in events if isinstance(e, SaslExchange)]
    assert [(e.mechanism, e.handshake, e.client_frames, e.server_frames, e.ended) for e in told] == (
        [exchange] if exchange else []
    )
    assert not [e for e in events if isinstance(e, MalformedFrame | OrphanResponse | Resync)], events


def test_a_refused_mechanism_leaves_the_stream_to_kafka_frames() -> None:
    """SaslHandshake v0 answered UNSUPPORTED_SASL_MECHANISM: no token follows, the next request
    (another handshake, say) is decoded as usual and no exchange is reported."""
    steps = [*handshake(0, "GSSAPI", error=33), *handshake(1, "PLAIN")]
    events, rows = decode_steps(feed(steps, one_byte=False))
    assert not [e for e in events if isinstance(e, SaslExchange)]
    assert sorted((r["api_version"], r["error_code"]) for r in rows) == [(0, 33), (1, 0)]


def test_a_gap_inside_the_tokens_ends_them_and_the_hunt_finds_the_next_request() -> None:
    token = raw(PLAIN_TOKEN)
    conn = KafkaConnection()
    ts = 1_700_000_000_000_000_000
    for direction, data in handshake(0, "PLAIN"):
        conn.receive_data(direction, data, ts)
    conn.receive_gap(UP, 3, ts)  # the capture lost the token's first 3 bytes
    conn.receive_data(UP, token[3:], ts)
    conn.receive_data(DOWN, raw(b""), ts)
    for direction, data in after(2):
        conn.receive_data(direction, data, ts)
    conn.receive_close(ts)
    events, rows = decode_steps(conn)
    assert leaks(events) == [] and leaks(rows) == []
    check_rows(rows, [(17, 0, 1, "ok"), (3, 1, 2, "ok")])
    (told,) = [e for e in events if isinstance(e, SaslExchange)]
    assert (told.client_frames, told.server_frames, told.ended) == (0, 1, "gap")


def test_a_token_cut_by_the_end_of_the_capture_is_counted_not_read() -> None:
    conn = feed([*handshake(0, "PLAIN"), (UP, raw(PLAIN_TOKEN)[:15])], one_byte=False)
    events, rows = decode_steps(conn)
    assert leaks(events) == [] and leaks(rows) == []
    check_rows(rows, [(17, 0, 1, "ok")])
    (told,) = [e for e in events if isinstance(e, SaslExchange)]
    assert (told.mechanism, told.client_frames, told.client_bytes, told.ended) == (
        "PLAIN",
        1,
        len(raw(PLAIN_TOKEN)),
        "closed",
    )


def test_a_token_with_a_kafka_looking_header_is_still_a_token() -> None:
    """Without a fixed token count (GSSAPI), a client frame ends the tokens only if it decodes as
    a request: a header that merely looks right (Metadata v1, a client id) is not enough."""
    lookalike = struct.pack(">hhi", 3, 1, 7) + struct.pack(">h", 4) + b"evil" + MARKER
    steps = [*handshake(0, "GSSAPI"), (UP, raw(lookalike)), (DOWN, raw(b"")), *after(2)]
    for one_byte in (False, True):
        events, rows = decode_steps(feed(steps, one_byte))
        assert leaks(events) == [] and leaks(rows) == []
        check_rows(rows, [(17, 0, 1, "ok"), (3, 1, 2, "ok")])
        (told,) = [e for e in events if isinstance(e, SaslExchange)]
        assert (told.client_frames, told.server_frames, told.ended) == (1, 1, "complete")


# ---- (b) kwire decode of a capture -------------------------------------------------------------


def capture_of(
    names: Iterable[str], one_byte: bool, folder: Path, syn: bool = True
) -> tuple[Path, dict[int, str]]:
    """One pcap holding a connection per scenario (client port -> scenario name); ``syn`` False:
    the capture started after the connections opened (no SYN, so no known frame boundary)."""
    packets: list[Packet] = []
    ports: dict[int, str] = {}
    for index, name in enumerate(names):
        port = 40000 + index
        ports[port] = name
        c = Conversation(client_port=port, handshake=syn)
        for side, data in SCENARIOS[name][0]:
            for piece in _iter_pieces(data) if one_byte else [data]:
                c.send(side, piece)
        c.close()
        packets += [Packet((p.ts[0] + 10 * index, p.ts[1]), p.buf) for p in c.kept()]
    name = f"sasl-{'bytes' if one_byte else 'chunks'}{'' if syn else '-no-syn'}.pcap"
    return write(folder / name, _HEADER, packets), ports


def dataset_rows(folder: Path, table: str) -> list[dict[str, Any]]:
    return ds.dataset(folder / table, format="parquet", partitioning="hive").to_table().to_pylist()


@pytest.mark.parametrize("one_byte", [False, True], ids=["segments", "1-byte-segments"])
@pytest.mark.parametrize("forced", [False, True], ids=["detected", "port-9092"])
def test_kwire_decode_never_writes_the_password(one_byte: bool, forced: bool, tmp_path: Path) -> None:
    pcap, ports = capture_of(sorted(SCENARIOS), one_byte, tmp_path)
    out = tmp_path / "out"
    args = ["decode", str(pcap), "-o", str(out)] + (["--port", "9092"] if forced else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert leaks(result.stdout + result.stderr) == []
    assert files_leaks(out) == []
    rows = dataset_rows(out, "exchanges")
    connections = dataset_rows(out, "connections")
    assert leaks(rows) == [] and leaks(connections) == []
    protocols = {c["client_port"]: c["protocol"] for c in connections}
    for port, name in ports.items():
        expected = SCENARIOS[name][1]
        if name == "no-handshake-gssapi" and not forced:
            # Its first bytes are no Kafka request: detection calls it "other", decodes nothing.
            assert protocols[port] == "other"
            expected = []
        check_rows([r for r in rows if r["client_port"] == port], expected)


@pytest.mark.parametrize("forced", [False, True], ids=["detected", "port-9092"])
def test_kwire_decode_of_connections_caught_mid_way(forced: bool, tmp_path: Path) -> None:
    """Without the SYN the decoder hunts for frame boundaries, and a hunt takes only frames that
    check out as Kafka: a token is never read as a request. (It can take a *broker* token for an
    orphan response when it cannot know a SASL exchange is under way: a Kafka 0.9 GSSAPI
    connection caught mid-way; then 4 bytes of that token show as the correlation id.)"""
    pcap, ports = capture_of(sorted(SCENARIOS), False, tmp_path, syn=False)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["decode", str(pcap), "-o", str(out)] + (["--port", "9092"] if forced else [])
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert leaks(result.stdout + result.stderr) == [] and files_leaks(out) == []
    rows = dataset_rows(out, "exchanges")
    assert leaks(rows) == [] and leaks(dataset_rows(out, "connections")) == []
    for port, name in ports.items():
        mine = [r for r in rows if r["client_port"] == port]
        if name in ("no-handshake-gssapi", "v0-token-sent-before-the-answer"):
            # no handshake to see / a handshake the hunt cannot check (what follows it is no request)
            assert [r for r in mine if r["status"] == "ok"] == [r for r in mine if r["api_key"] == 3]
        else:
            check_rows(mine, SCENARIOS[name][1])


# ---- talking to a proxy through a socket ------------------------------------------------------

WAIT = 10.0  # seconds any socket read may take


def send_slowly(sock: socket.socket, data: bytes) -> None:
    """One byte per write, each its own segment (the proxy reads them one at a time)."""
    for byte in _iter_pieces(data):
        sock.sendall(byte)
        time.sleep(0.0005)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, read one at a time; fewer if the peer closes."""
    out = bytearray()
    while len(out) < n:
        byte = sock.recv(1)
        if not byte:
            break
        out += byte
    return bytes(out)


def recv_frame(sock: socket.socket) -> bytes:
    head = recv_exactly(sock, 4)
    assert len(head) == 4, "the connection closed"
    return head + recv_exactly(sock, struct.unpack(">i", head)[0])


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# ---- metrics labels come from the protocol table only ------------------------------------------


def label_values(page: str) -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for line in page.splitlines():
        if not line.startswith("#"):
            for name, value in re.findall(r'(\w+)="([^"]*)"', line):
                values.setdefault(name, set()).add(value)
    return values


def check_labels(page: str) -> None:
    """Api names, api keys, versions and error codes: known to the table, or ``other``."""
    values = label_values(page)
    names = set(protocol.API_NAMES.values())
    assert values.get("api", set()) <= names | {"other"}, values["api"]
    assert values.get("api_key", set()) <= {str(k) for k in protocol.API_NAMES} | {"other"}
    versions = {str(v) for key in protocol.API_NAMES for v in range(100) if protocol.is_known(key, v)}
    assert values.get("version", set()) <= versions | {"other"}
    assert values.get("code", set()) <= {str(c) for c in protocol.ERRORS} | {"other"}


def test_metric_labels_are_known_values_or_other() -> None:
    from proxy.metrics import Metrics

    metrics = Metrics()
    metrics.count_request(3, 1, "app")
    metrics.count_request(3, 1, "\x00\x07\ufffd")  # not text: not a label either
    metrics.count_request(3, 999, "app")  # a version the table does not know: nor its client id
    metrics.count_request(0x7500, 0x7500, "kw1r")  # what the unframed PLAIN token made of a header
    metrics.observe_response(0x7500, 0.001, [31337])
    metrics.observe_response(36, 0.002, [58, 31337])
    page = metrics.render()
    check_labels(page)
    assert leaks(page) == [] and "29952" not in page and "31337" not in page and "999" not in page
    assert 'api="Metadata",api_key="3",version="1",client_id="app"} 1' in page
    assert 'api="Metadata",api_key="3",version="1",client_id="other"} 1' in page
    assert 'api="Metadata",api_key="3",version="other",client_id="other"} 1' in page
    assert 'api="other",api_key="other",version="other",client_id="other"} 1' in page
    assert 'kwire_proxy_response_errors_total{api="SaslAuthenticate",code="58"' in page
    assert 'kwire_proxy_response_errors_total{api="SaslAuthenticate",code="other",error="other"} 1' in page
    assert 'kwire_proxy_request_latency_seconds_count{api="other"} 1' in page


def test_malformed_frames_through_the_proxy_mint_no_label(tmp_path: Path) -> None:
    """Frames of unknown apis and versions, and bytes that are no frame at all, go through a
    proxy (to a broker that echoes them): its metrics hold only table values and ``other``."""
    from proxy.embedded import ProxyThread, loopback_config

    class Echo(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(WAIT)
            with contextlib.suppress(OSError):
                while chunk := self.request.recv(65536):
                    self.request.sendall(chunk)

    unknown_key = struct.pack(">ihhi", 14, 0x7500, 0x7500, 0x6B773172) + struct.pack(">h", 4) + b"kw1r"
    unknown_version = struct.pack(">ihhi", 14, 3, 999, 7) + struct.pack(">h", 4) + b"zzzz"
    garbage = struct.pack(">i", -7) + bytes(range(256))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo) as echo:
        echo.daemon_threads = True
        threading.Thread(target=echo.serve_forever, daemon=True).start()
        try:
            with ProxyThread(loopback_config(echo.server_address[1], tmp_path)) as running:
                for payload in (unknown_key + unknown_version, unknown_version + garbage):
                    with socket.create_connection(
                        ("127.0.0.1", running.proxy.listen_port), timeout=WAIT
                    ) as s:
                        s.sendall(payload)
                        assert recv_exactly(s, len(payload)) == payload
                page = running.proxy.metrics.render()
        finally:
            echo.shutdown()
    check_labels(page)
    assert leaks(page) == [] and "29952" not in page and "999" not in page and "zzzz" not in page
    assert 'version="other",client_id="other"} 2' in page


class ScriptedBroker(socketserver.ThreadingTCPServer):
    """A stand-in broker for a mechanism the real one cannot do here (GSSAPI needs a Kerberos KDC):
    it answers SaslHandshake v0, then each client frame from a script, by raw socket."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, script: list[bytes | None]) -> None:
        """``script``: per client frame after the handshake, the bytes to answer (None: none)."""
        self.script = script
        self.received: list[bytes] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock = self.request
                sock.settimeout(WAIT)
                with contextlib.suppress(OSError, AssertionError):
                    first = recv_frame(sock)
                    outer.received.append(first)
                    corr = struct.unpack_from(">i", first, 8)[0]
                    sock.sendall(response(17, 0, corr, {"Mechanisms": ["GSSAPI"]}))
                    for answer in outer.script:
                        outer.received.append(recv_frame(sock))
                        if answer is not None:
                            sock.sendall(answer)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_proxy_cuts_gssapi_tokens_by_length_only(tmp_path: Path) -> None:
    """GSSAPI after SaslHandshake v0 (no fixed token count), with a token whose first bytes look
    like a Metadata request header, written one byte at a time: the proxy forwards it all, records
    no byte of it, mints no label from it, and decodes the request that follows."""
    from proxy.embedded import ProxyThread, loopback_config

    lookalike = struct.pack(">hhi", 3, 1, 7) + struct.pack(">h", 4) + b"evil" + MARKER
    script = [raw(b"\x6f\x81\x90" + MARKER), raw(b""), response(3, 1, 2)]
    client_frames = [raw(GSSAPI_FIRST), raw(lookalike), request(3, 1, 2)]
    broker = ScriptedBroker(script)
    try:
        config = loopback_config(broker.server_address[1], tmp_path / "out", flush_seconds=0.2)
        with ProxyThread(config) as running:
            with socket.create_connection(("127.0.0.1", running.proxy.listen_port), timeout=WAIT) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                send_slowly(sock, request(17, 0, 1, {"Mechanism": "GSSAPI"}))
                assert recv_frame(sock) == response(17, 0, 1, {"Mechanisms": ["GSSAPI"]})
                for frame, answer in zip(client_frames, script, strict=True):
                    send_slowly(sock, frame)
                    assert recv_frame(sock) == answer
            page = running.proxy.metrics.render()
    finally:
        broker.shutdown()
        broker.server_close()
    assert broker.received[1:] == client_frames  # forwarded unchanged
    check_labels(page)
    assert leaks(page) == [] and "evil" not in page
    assert 'api="Metadata",api_key="3",version="1",client_id="sasl-test"} 1' in page
    assert files_leaks(tmp_path / "out") == []
    rows = dataset_rows(tmp_path / "out", "exchanges")
    assert leaks(rows) == []
    check_rows(rows, [(17, 0, 1, "ok"), (3, 1, 2, "ok")])
    (connection,) = dataset_rows(tmp_path / "out", "connections")
    assert connection["protocol"] == "kafka" and connection["frames_to_broker"] == 4


# ---- (c) kwire proxy in front of a real broker doing SASL/PLAIN ---------------------------------

KAFKA = "4.1"
BROKER_IP, CONTROLLER_IP = "127.0.3.2", "127.0.3.5"
SASL_PORT = 9094  # the broker's SASL_PLAINTEXT listener (its PLAINTEXT one, 9092, serves the lab's checks)
SASL_BROKER = f"{BROKER_IP}:{SASL_PORT}"
USER = "u"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Apache Kafka broker (KRaft, one broker, one controller) with a SASL/PLAIN listener
    knowing user ``u`` with the marker as its password."""
    from lab.cluster import ClusterError, KRaftCluster
    from lab.kafka_dist import KafkaFetchError

    listeners = f"PLAINTEXT://{BROKER_IP}:9092,SASL_PLAINTEXT://{SASL_BROKER}"
    jaas = (
        f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{MARKER.decode()}";'
    )
    cluster = KRaftCluster(
        KAFKA,
        brokers=1,
        controllers=1,
        base_dir=tmp_path_factory.mktemp("sasl-kafka"),
        broker_ips=(BROKER_IP,),
        controller_ips=(CONTROLLER_IP,),
        broker_config={
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        },
    )
    try:
        cluster.start(timeout=180)
    except (ClusterError, KafkaFetchError) as exc:
        cluster.stop()
        pytest.skip(f"no real Kafka {KAFKA} broker here: {exc}")
    try:
        yield SASL_BROKER
    finally:
        cluster.stop()


def real_client(mode: str, bootstrap: str) -> None:
    """Authenticate with a real client library and fetch metadata (run in a child process)."""
    password = MARKER.decode()
    if mode.startswith("kafka-python"):
        from kafka import KafkaConsumer

        options: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": USER,
            "sasl_plain_password": password,
            "request_timeout_ms": 10_000,
        }
        if mode == "kafka-python-v0":  # a 0.10.0 client: SaslHandshake v0, then the unframed token
            options["api_version"] = (0, 10, 0)
        consumer = KafkaConsumer(**options)
        print("topics:", sorted(consumer.topics()))
        consumer.close()
    else:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {
                "bootstrap.servers": bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": USER,
                "sasl.password": password,
            }
        )
        print("brokers:", sorted(admin.list_topics(timeout=10).brokers))


def run_real_client(mode: str, bootstrap: str) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_sasl_never_recorded as t; "
        "t.real_client(sys.argv[2], sys.argv[3])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), mode, bootstrap],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0 and ("topics:" in done.stdout or "brokers:" in done.stdout), (
        mode,
        done.stdout,
        done.stderr[-3000:],
    )


def raw_session(name: str, port: int) -> tuple[int, list[tuple[int, int, int, str]]]:
    """One hand-driven SASL session through the proxy, written and read one byte at a time.

    Returns the client port and the rows it must leave (api key, version, correlation id, status).
    """
    good = b"\x00" + USER.encode() + b"\x00" + MARKER
    wrong = b"\x00x\x00" + MARKER  # the marker as the password of a user the broker does not know
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = sock.getsockname()[1]
        if name == "gssapi-without-handshake":  # a 0.9 client: Kafka 4 just closes the connection
            send_slowly(sock, raw(GSSAPI_FIRST))
            assert closed_by_peer(sock)
            return local, []
        if name == "v0-unsupported-mechanism-token-pipelined":
            send_slowly(
                sock, request(17, 0, 1, {"Mechanism": "OAUTHBEARER"}) + raw(b"n,,\x01auth=Bearer " + MARKER)
            )
            answer = mc.decode_frame("response", recv_frame(sock), 17, 0)[1]
            assert answer["ErrorCode"] == 33  # UNSUPPORTED_SASL_MECHANISM
            assert closed_by_peer(sock)
            return local, [(17, 0, 1, "ok")]
        if name.startswith("v0"):
            send_slowly(sock, request(17, 0, 1, {"Mechanism": "PLAIN"}))
            assert mc.decode_frame("response", recv_frame(sock), 17, 0)[1]["ErrorCode"] == 0
            send_slowly(sock, raw(wrong if name.endswith("wrong-password") else good))
            if name.endswith("wrong-password"):  # no answer in v0: the broker closes
                assert closed_by_peer(sock)
                return local, [(17, 0, 1, "ok")]
            assert recv_frame(sock) == raw(b"")  # PLAIN's (empty) answer
            corr = 2
            rows = [(17, 0, 1, "ok")]
        else:  # authenticate-vN[-wrong-password]
            version = int(name.split("-")[1][1:])
            send_slowly(sock, request(17, 1, 1, {"Mechanism": "PLAIN"}))
            assert mc.decode_frame("response", recv_frame(sock), 17, 1)[1]["ErrorCode"] == 0
            bad = name.endswith("wrong-password")
            send_slowly(sock, request(36, version, 2, {"AuthBytes": wrong if bad else good}))
            answer = mc.decode_frame("response", recv_frame(sock), 36, version)[1]
            rows = [(17, 1, 1, "ok"), (36, version, 2, "ok")]
            if bad:
                assert answer["ErrorCode"] == 58  # SASL_AUTHENTICATION_FAILED
                assert closed_by_peer(sock)
                return local, rows
            assert answer["ErrorCode"] == 0
            corr = 3
        send_slowly(sock, request(3, 4, corr))  # authenticated: an ordinary request
        header, body = mc.decode_frame("response", recv_frame(sock), 3, 4)
        assert header["CorrelationId"] == corr and [b["NodeId"] for b in body["Brokers"]] == [1]
        return local, [*rows, (3, 4, corr, "ok")]


RAW_SESSIONS = (
    "v0",
    "v0-wrong-password",
    "v0-unsupported-mechanism-token-pipelined",
    "gssapi-without-handshake",
    *(f"authenticate-v{v}" for v in (0, 1, 2)),
    *(f"authenticate-v{v}-wrong-password" for v in (0, 1, 2)),
)
REAL_CLIENTS = ("kafka-python-v0", "kafka-python", "confluent-kafka")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as page:
        return page.read().decode()


def check_metrics(page: str) -> None:
    """Every request label names an api and version the table knows (nothing counted as other)."""
    names = {name: key for key, name in protocol.API_NAMES.items()}
    lines = [line for line in page.splitlines() if line.startswith("kwire_proxy_requests_total{")]
    assert lines
    for line in lines:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        key = names[labels["api"]]
        assert labels["api_key"] == str(key) and protocol.is_known(key, int(labels["version"])), line


@pytest.mark.real
def test_kwire_proxy_never_records_the_password(sasl_broker: str, tmp_path: Path, capture: Any) -> None:
    from proxy.embedded import ProxyProcess

    out = tmp_path / "dataset"
    args = ["-b", sasl_broker, "--listen", "127.0.0.1:0", "--broker-port-base", "0", "-o", str(out)]
    args += ["--metrics-port", "0", "--flush-seconds", "0.3", "--log-level", "debug"]
    expected: dict[int, list[tuple[int, int, int, str]]] = {}
    with (
        capture(SASL_PORT, name="broker-side") as dump,
        ProxyProcess(args, log_path=tmp_path / "proxy.log") as proxy,
    ):
        assert proxy.port is not None and proxy.metrics_port is not None
        for mode in REAL_CLIENTS:
            run_real_client(mode, f"127.0.0.1:{proxy.port}")
        for name in RAW_SESSIONS:
            port, rows = raw_session(name, proxy.port)
            expected[port] = rows
        page = scrape(proxy.metrics_port)
        assert proxy.terminate() == 0
    log = proxy.log
    assert "forwarding blindly" not in log and "Traceback" not in log, log[-3000:]

    # the metrics page, the log, every dataset file and every value in it
    assert leaks(page) == [] and leaks(log) == []
    check_metrics(page)
    assert files_leaks(out) == []
    rows = dataset_rows(out, "exchanges")
    connections = dataset_rows(out, "connections")
    assert leaks(rows) == [] and leaks(connections) == []
    assert {c["protocol"] for c in connections} == {"kafka"}  # every stream understood to its end
    assert len(connections) >= len(RAW_SESSIONS) + len(REAL_CLIENTS)
    for row in rows:
        assert protocol.is_known(row["api_key"], row["api_version"]), row
        assert row["status"] in ("ok", "unanswered"), row
    for port, want in expected.items():
        check_rows([r for r in rows if r["client_port"] == port], want)
    versions = {(r["api_key"], r["api_version"]) for r in rows if r["api_key"] in (17, 36)}
    assert {(17, 0), (17, 1), (36, 0), (36, 1), (36, 2)} <= versions
    assert {r["sasl_mechanism"] for r in rows if r["api_key"] == 17} == {"PLAIN", "OAUTHBEARER"}

    # (b) again, on the real traffic: kwire decode of what tcpdump saw between proxy and broker
    assert dump.packets
    decoded = tmp_path / "decoded"
    result = CliRunner().invoke(app, ["decode", str(dump.path), "-o", str(decoded)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert leaks(result.stdout + result.stderr) == [] and files_leaks(decoded) == []
    again = dataset_rows(decoded, "exchanges")
    assert leaks(again) == [] and leaks(dataset_rows(decoded, "connections")) == []
    assert sorted(row_keys(again)) == sorted(row_keys(rows))
