"""Splitting a decode's connections among worker processes (kwire.shards)."""

from __future__ import annotations

import pytest

import kwire.shards
from decoder.pcap import ACK, FIN, SYN, TcpSegment
from kwire.shards import ConnectionShards, shard_of

BROKER = 9092


def _segment(client_port: int, to_broker: bool, size: int = 0, flags: int = ACK) -> TcpSegment:
    ends = (("10.0.0.1", client_port), ("10.0.0.2", BROKER))
    (src_ip, src_port), (dst_ip, dst_port) = ends if to_broker else ends[::-1]
    return TcpSegment(0, src_ip, src_port, dst_ip, dst_port, 0, 0, flags, b"x" * size)


def test_every_packet_of_a_connection_lands_in_one_part() -> None:
    shards = ConnectionShards(3)
    parts: dict[int, set[int]] = {}
    for round_ in range(5):
        for port in range(40000, 40012, 2):
            for to_broker in (True, False):
                parts.setdefault(port, set()).add(shards.part_of(_segment(port, to_broker, 10 * round_)))
    assert all(len(seen) == 1 for seen in parts.values())
    assert {part for seen in parts.values() for part in seen} == {0, 1, 2}


def test_two_busy_connections_after_a_bootstrap_one_go_to_different_parts() -> None:
    """A client's bootstrap connection, then two producers: the producers must not share a part
    (with a hash of the ports they do half the time: that left one worker with all the work)."""
    shards = ConnectionShards(2)
    bootstrap, producer_a, producer_b = 52286, 52290, 52302
    shards.part_of(_segment(bootstrap, True, 0, SYN))
    shards.part_of(_segment(bootstrap, True, 300))
    shards.part_of(_segment(bootstrap, False, 2000))
    part_a = shards.part_of(_segment(producer_a, True, 0, SYN))
    shards.part_of(_segment(producer_a, True, 40))
    part_b = shards.part_of(_segment(producer_b, True, 0, SYN))
    assert part_a != part_b
    for _ in range(100):
        assert shards.part_of(_segment(producer_a, True, 500)) == part_a
        assert shards.part_of(_segment(producer_b, True, 500)) == part_b


def test_a_closed_connection_frees_its_part() -> None:
    shards = ConnectionShards(2)
    first = shards.part_of(_segment(40000, True, 100))
    second = shards.part_of(_segment(40002, True, 10))
    assert first != second
    assert shards.part_of(_segment(40000, True, 0, FIN | ACK)) == first
    # one connection open in each part before the FIN, now none in `first`
    assert shards.part_of(_segment(40004, True)) == first
    assert shards.part_of(_segment(40000, False, 0, FIN | ACK)) == first  # late packets stay put


def test_the_table_of_port_pairs_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kwire.shards, "MAX_TRACKED", 8)
    shards = ConnectionShards(4)
    for port in range(30000, 31000):
        part = shards.part_of(_segment(port, True, 1))
        if port >= 30008:
            assert part == shard_of(port, BROKER, 4)
    assert len(shards._part_of) == 8
