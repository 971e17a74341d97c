"""Splitting a decode's connections among worker processes (kwire.shards)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

import kwire.shards
from decoder.pcap import ACK, FIN, SYN, TcpSegment, iter_segments
from kwire.decode_command import plan_shards
from kwire.shards import ConnectionShards, ConnectionWeights, plan_parts, shard_of

CAPTURES = Path(__file__).resolve().parent.parent / "captures"

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


# ---------------------------------------------------------------------------------------------------------
# a plan from a first pass over the capture (kwire.shards.plan_parts)


def test_the_plan_spreads_the_heaviest_connections_first() -> None:
    weights = {1: 5, 2: 100, 3: 90, 4: 10, 5: 10, 6: 1}
    plan = plan_parts(weights, 2)
    assert plan[2] != plan[3]  # the two busy ones apart
    loads = [sum(w for key, w in weights.items() if plan[key] == part) for part in (0, 1)]
    assert loads == [110, 106]  # heaviest first, each to the lighter part (ties: the lower number)
    # the order of the pass does not matter
    assert plan_parts(dict(reversed(list(weights.items()))), 2) == plan
    assert plan_parts({}, 3) == {}


def test_a_plan_decides_before_the_rule() -> None:
    """The bootstrap case of the rule, planned: the producers' parts come from the plan; a pair
    the plan lacks is placed by the rule, the same way in every worker."""
    bootstrap, producer_a, producer_b, late = 52286, 52290, 52302, 52310
    weights = ConnectionWeights()
    for port, size, count in ((bootstrap, 300, 2), (producer_a, 500, 50), (producer_b, 500, 40)):
        for _ in range(count):
            weights.add(_segment(port, True, size))
    weights.add(_segment(late, True, 0, SYN))  # no payload: no weight, not planned
    assert len(weights.weights) == 3
    plan = plan_parts(weights.weights, 2)
    runs = []
    for _ in range(2):
        shards = ConnectionShards(2, plan)
        parts = [
            shards.part_of(_segment(port, True, 10)) for port in (bootstrap, producer_a, producer_b, late)
        ]
        assert parts[:3] == [plan[BROKER << 16 | port] for port in (bootstrap, producer_a, producer_b)]
        assert shards.part_of(_segment(producer_a, False, 0, FIN | ACK)) == parts[1]
        runs.append(parts)
    assert runs[0] == runs[1]
    assert runs[0][1] != runs[0][2]


def test_the_weights_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kwire.shards, "MAX_TRACKED", 8)
    weights = ConnectionWeights()
    for port in range(30000, 30100):
        weights.add(_segment(port, True, 1))
    weights.add(_segment(30000, False, 70_000))  # counted: one more unit per 64 KiB
    assert len(weights.weights) == 8 and weights.weights[BROKER << 16 | 30000] == 3


def test_the_plan_balances_a_real_capture() -> None:
    """tansu-mixed.pcap (four client libraries against Tansu, taken with tcpdump): in two parts the
    rule left 78% of the segments to one worker, because bootstrap connections were still open
    when the busy ones started; the plan splits them evenly, and every connection in one part."""
    capture = CAPTURES / "tansu-mixed.pcap"
    plan = plan_shards([capture], 2)
    assert plan is not None and len(plan) == 64
    for chosen in (plan, None):
        shards = ConnectionShards(2, chosen)
        loads, parts_of = [0, 0], {}
        for segment in iter_segments(capture):
            part = shards.part_of(segment)
            parts_of.setdefault(frozenset((segment.src_port, segment.dst_port)), set()).add(part)
            loads[part] += bool(segment.payload)
        assert all(len(parts) == 1 for parts in parts_of.values())
        share = max(loads) / sum(loads)
        if chosen is None:
            assert share > 0.75  # what the rule alone does here: the case the plan is for
        else:
            assert share < 0.51


def _weighed_in_python(path: Path) -> dict[int, int]:
    weights = ConnectionWeights()
    for segment in iter_segments(path):
        weights.add(segment)
    return weights.weights


@pytest.mark.parametrize(
    "path",
    sorted([*CAPTURES.glob("*.pcap"), *CAPTURES.glob("lab/**/capture.pcap*")]),
    ids=lambda p: p.name if p.parent == CAPTURES else p.parent.name,
)
def test_captures_weigh_the_same_in_the_compiled_loop(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pcap loop weighs the segments it reads in C (decoder/_pcapscan.c): the same weights as
    ConnectionWeights.add gives every segment, on every capture (pcapng and compressed ones too)."""
    weights = ConnectionWeights()
    weights.add_capture(path)
    assert weights.weights == _weighed_in_python(path)
    assert weights.weights


def test_compiled_weighing_keeps_the_bound_and_the_byte_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decoder import pcap

    if pcap._scan is None:
        pytest.skip("KWIRE_PURE_PYTHON=1: no compiled pcap loop")
    capture = CAPTURES / "tansu-mixed.pcap"
    for limit, unit in ((3, 1 << 16), (64, 100), (1, 1)):
        monkeypatch.setattr(kwire.shards, "MAX_TRACKED", limit)
        monkeypatch.setattr(kwire.shards, "_BYTES_PER_UNIT", unit)
        compiled = ConnectionWeights()
        compiled.add_capture(capture)
        assert compiled.weights == _weighed_in_python(capture)
        assert len(compiled.weights) == min(limit, 64)
    # cut in the middle of a record: weighed up to the damage, as the workers read it
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(capture.read_bytes()[:100_000])
    compiled = ConnectionWeights()
    with pytest.raises(pcap.CaptureError):
        compiled.add_capture(cut)
    reference = ConnectionWeights()
    with pytest.raises(pcap.CaptureError):
        for segment in iter_segments(cut):
            reference.add(segment)
    assert compiled.weights == reference.weights


def _capture_ends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The end times ``decode_captures`` closes its reassemblers at, as they come."""
    import kwire.decode_command as decode_command

    ends: list[int] = []

    class Reassembler(decode_command.TcpReassembler):
        def finish(self, end_ts_ns: int) -> list[Any]:
            ends.append(end_ts_ns)
            return super().finish(end_ts_ns)

    monkeypatch.setattr(decode_command, "TcpReassembler", Reassembler)
    return ends


@pytest.mark.parametrize("capture", ["tansu-mixed.pcap", "tansu-confluent.pcap"])
def test_parts_that_skip_other_parts_segments_decode_the_same(
    capture: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part of a split decode has the compiled pcap loop leave out the segments of the other
    parts' planned connections (decoder.pcap.SkipPairs): each part's exchange and connection rows,
    and its summary, are the same as when it drops them itself, and its open connections end at
    the capture's last packet either way."""
    import kwire.decode_command as decode_command
    from kwire.decode_command import decode_captures

    path = CAPTURES / capture
    plan = plan_shards([path], 2)
    assert plan is not None

    ends = _capture_ends(monkeypatch)

    def part(index: int) -> tuple[Any, ...]:
        exchanges: list[Any] = []
        connections: list[Any] = []
        result = decode_captures(
            [path], exchanges.append, connections.append, shard=(index, 2), shard_plan=plan
        )
        return exchanges, connections, result.summary, result.capture, ends[-1]

    skipping = [part(0), part(1)]
    with monkeypatch.context() as mp:
        mp.setattr(decode_command, "SkipPairs", lambda pairs: None)
        dropping = [part(0), part(1)]
    assert skipping == dropping
    assert all(rows for rows, *_ in skipping)
    assert set(ends) == {max(segment.ts_ns for segment in iter_segments(path))}


def test_a_damaged_capture_ends_at_its_last_packet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage ends a capture as its end does: the connections still open are closed at the last
    packet read before it (they were closed at time 0 before), whole or in parts."""
    from decoder.pcap import CaptureError
    from kwire.decode_command import decode_captures

    whole = (CAPTURES / "tansu-mixed.pcap").read_bytes()
    damaged = tmp_path / "damaged.pcap"
    damaged.write_bytes(whole[: len(whole) // 2] + b"\xff" * 64)  # a record header out of all bounds
    seen: list[int] = []
    with contextlib.suppress(CaptureError):
        seen.extend(segment.ts_ns for segment in iter_segments(damaged))
    assert seen
    ends = _capture_ends(monkeypatch)
    plan = plan_shards([damaged], 2)
    for shard in (None, (0, 2), (1, 2)):
        result = decode_captures([damaged], lambda row: None, lambda row: None, shard=shard, shard_plan=plan)
        assert result.error is not None
    assert ends == [max(seen)] * 3
