"""How ``kwire decode`` tells Kafka connections from others, and who is the client (kwire/pipeline.py).

Conversations are built packet by packet (``test_decode_reassembly.Conversation``): with and
without the TCP handshake, with bytes lost before the decision, with the broker speaking first,
and with protocols that are not Kafka on Kafka's port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kafka_frames import api_versions_v0, api_versions_v0_response, heartbeat_v0, heartbeat_v0_response
from test_decode_reassembly import _HEADER, Conversation, write

from kwire.decode_command import decode_captures
from kwire.pipeline import SNIFF_LIMIT
from kwire.shards import shard_of

# An ApiVersions v0 response whose api list holds "00 00 00 0c 00 07 00 00 ...": read as a request
# that is a well-formed ControlledShutdown v0 (12 bytes, header v0, no client id). Real brokers
# list (6, 0, 12), (7, 0, 3) one after the other.
APIS = ((0, 0, 9), (1, 0, 13), (3, 0, 12), (6, 0, 12), (7, 0, 3), (12, 0, 4), (18, 0, 3))


def decode(path: Path, **kwargs: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    result = decode_captures([path], exchanges.append, connections.append, **kwargs)
    assert result.error is None
    return exchanges, connections


def statuses(rows: list[dict[str, Any]]) -> list[tuple[int | None, str]]:
    return sorted((r.get("correlation_id"), r["status"]) for r in rows)


def test_handshake_seen(tmp_path: Path) -> None:
    c = Conversation()
    c.send(0, api_versions_v0(1))
    c.send(1, api_versions_v0_response(1, apis=APIS))
    c.send(0, heartbeat_v0(2))
    c.send(1, heartbeat_v0_response(2))
    c.close()
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert statuses(rows) == [(1, "ok"), (2, "ok")]
    assert (conn["protocol"], conn["client_port"], conn["broker_port"], conn["syn_seen"]) == (
        "kafka",
        40000,
        9092,
        True,
    )
    assert conn["connection_id"] == f"{1_700_000_000_001_000}-40000-9092"  # first packet time, ports


def test_no_handshake_broker_speaks_first(tmp_path: Path) -> None:
    """The capture starts with the broker's answer (its ApiVersions list hides a valid-looking
    ControlledShutdown v0 request): still the client is the side that sends requests."""
    c = Conversation(handshake=False)
    c.send(1, api_versions_v0_response(7, apis=APIS))  # answer to a request before the capture
    c.send(0, heartbeat_v0(8))
    c.send(1, heartbeat_v0_response(8))
    c.send(0, heartbeat_v0(9))
    c.send(1, heartbeat_v0_response(9))
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert (conn["protocol"], conn["client_port"], conn["broker_port"]) == ("kafka", 40000, 9092)
    assert statuses(rows) == [(7, "orphan_response"), (8, "ok"), (9, "ok")]
    assert not any(r.get("api_name") == "ControlledShutdown" for r in rows)


def test_no_handshake_one_sided(tmp_path: Path) -> None:
    """Only the client's side was captured: decided at the connection's end, requests unanswered."""
    c = Conversation(handshake=False)
    for corr in (1, 2, 3):
        c.send(0, heartbeat_v0(corr))
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert conn["protocol"] == "kafka" and conn["client_port"] == 40000
    assert [r["api_name"] for r in rows] == ["Heartbeat"] * 3


def test_first_request_lost_before_the_decision(tmp_path: Path) -> None:
    """Handshake seen, but the client's first request is missing: the handshake still names the
    client, the broker's answer to the lost request is an orphan, the rest decodes."""
    c = Conversation()
    c.send(0, heartbeat_v0(1), drop=True)
    c.send(1, heartbeat_v0_response(1))
    c.send(0, heartbeat_v0(2))
    c.send(1, b"", 0x10)  # the broker's ACK shows request 1 was sent
    c.send(1, heartbeat_v0_response(2))
    c.close()
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert (conn["protocol"], conn["client_port"]) == ("kafka", 40000)
    assert statuses(rows) == [(1, "orphan_response"), (2, "ok")]
    assert conn["gap_bytes_to_broker"] == len(heartbeat_v0(1))


@pytest.mark.parametrize(
    "first",
    [b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n", b"SSH-2.0-OpenSSH_9.2\r\n", b"\x00" * 40],
    ids=["http", "ssh", "zeros"],
)
def test_not_kafka_on_the_kafka_port(first: bytes, tmp_path: Path) -> None:
    c = Conversation()
    c.send(0, first)
    c.send(1, b"HTTP/1.1 400 Bad Request\r\n\r\n")
    c.close()
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert rows == [] and conn["protocol"] == "other"
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()), forced_ports=[9092])
    assert conn["protocol"] == "kafka" and not any(r["status"] == "ok" for r in rows)


def test_tls_without_handshake(tmp_path: Path) -> None:
    c = Conversation(handshake=False)
    c.send(0, b"\x17\x03\x03\x00\x30" + bytes(48))  # application data records, mid-session
    c.send(1, b"\x17\x03\x03\x00\x20" + bytes(32))
    _, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert conn["protocol"] == "tls"


def test_undecided_connection_gives_up_at_the_sniff_limit(tmp_path: Path) -> None:
    """No handshake and no plausible Kafka for SNIFF_LIMIT bytes: 'other', nothing held beyond that."""
    c = Conversation(handshake=False)
    chunk = bytes(range(256)) * 5
    for _ in range(SNIFF_LIMIT // len(chunk) + 2):
        c.send(0, chunk)
    c.send(0, heartbeat_v0(1))  # Kafka after the limit is not looked at any more
    rows, (conn,) = decode(write(tmp_path / "c.pcap", _HEADER, c.kept()))
    assert conn["protocol"] == "other" and rows == []


def test_connection_ids_unique_when_time_and_ports_clash(tmp_path: Path) -> None:
    """Two clients on other hosts, same ports, same microsecond: -2 makes the second id unique."""
    a = Conversation(client=b"\x0a\x00\x00\x01")
    b = Conversation(client=b"\x0a\x00\x00\x03")
    for c in (a, b):
        c.send(0, heartbeat_v0(1))
        c.send(1, heartbeat_v0_response(1))
    packets = [p for pair in zip(a.packets, b.packets, strict=True) for p in pair]  # same times
    _, connections = decode(write(tmp_path / "c.pcap", _HEADER, packets))
    ids = sorted(c["connection_id"] for c in connections)
    assert ids == ["1700000000001000-40000-9092", "1700000000001000-40000-9092-2"]


def test_shards_keep_connections_whole_and_spread_even_ports() -> None:
    """Both directions of a connection land in the same part; Linux's even client ports spread out."""
    for ports in ((40000, 9092), (51234, 9092), (9092, 36333)):
        assert shard_of(*ports, 4) == shard_of(*reversed(ports), 4)
    parts = [shard_of(port, 9092, 2) for port in range(40000, 41000, 2)]
    assert 0.4 < parts.count(0) / len(parts) < 0.6
