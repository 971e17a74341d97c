"""TCP reassembly seen from the rows: re-packetised real captures must decode to the same rows.

The bundled captures are rewritten packet by packet (Ethernet/IPv4/TCP headers kept, sequence
numbers and lengths adjusted): segments split into pieces, pieces and segments delivered out of
order, segments and overlapping ranges retransmitted. None of that changes the bytes of either
stream, so ``decode_captures`` must produce exactly the original rows, field for field.

Then segments are dropped. The frames that lose bytes are worked out independently (each
direction's stream offsets from the packets, Kafka frames walked by their length prefixes), and
the rows must stay identical except for the exchanges those frames belong to, which must be
flagged (truncated, malformed, orphan_response), never shown as a clean exchange with wrong
values; the connection row counts the lost bytes, and a lost frame header makes a resync.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kwire.decode_command import decode_captures

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
NAMES = [
    "tansu-kafka-python.pcap",
    "tansu-confluent.pcap",
    "tansu-aiokafka.pcap",
    "tansu-kcat.pcap",
    "tansu-mixed.pcap",
]
FLAGGED = {"truncated", "malformed", "orphan_response"}
_M = 0xFFFFFFFF


@dataclass
class Packet:
    ts: tuple[int, int]  # seconds, fraction as in the file (exact: no float rounding)
    buf: bytes  # Ethernet / IPv4 (no options) / TCP

    @property
    def tcp_off(self) -> int:
        return 14 + 20 + (self.buf[14 + 20 + 12] >> 4) * 4

    @property
    def payload(self) -> bytes:
        return self.buf[self.tcp_off :]

    @property
    def seq(self) -> int:
        return struct.unpack_from("!I", self.buf, 38)[0]

    @property
    def flags(self) -> int:
        return self.buf[47]

    @property
    def flow(self) -> tuple[bytes, int, bytes, int]:
        sport, dport = struct.unpack_from("!HH", self.buf, 34)
        return self.buf[26:30], sport, self.buf[30:34], dport

    def with_data(self, seq: int, payload: bytes) -> Packet:
        """The same headers carrying `payload` at sequence number `seq`."""
        head = bytearray(self.buf[: self.tcp_off])
        struct.pack_into("!H", head, 16, len(head) - 14 + len(payload))
        struct.pack_into("!I", head, 38, seq & _M)
        return Packet(self.ts, bytes(head) + payload)


def read(path: Path) -> tuple[bytes, list[Packet]]:
    """The file header and the packets of a little-endian pcap (what tcpdump writes here)."""
    data = path.read_bytes()
    header, packets, at = data[:24], [], 24
    assert header[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1")
    while at < len(data):
        sec, frac, caplen, _wire = struct.unpack_from("<IIII", data, at)
        packets.append(Packet((sec, frac), data[at + 16 : at + 16 + caplen]))
        at += 16 + caplen
    assert all(p.buf[12:14] == b"\x08\x00" and p.buf[14] == 0x45 for p in packets)
    return header, packets


def write(path: Path, header: bytes, packets: list[Packet]) -> Path:
    with open(path, "wb") as f:
        f.write(header)
        for p in packets:
            f.write(struct.pack("<IIII", p.ts[0], p.ts[1], len(p.buf), len(p.buf)) + p.buf)
    return path


def decode(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    result = decode_captures([path], exchanges.append, connections.append)
    assert result.error is None
    return exchanges, connections, result


def _key(row: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))


def rows_multiset(rows: list[dict[str, Any]]) -> Counter[tuple]:
    return Counter(_key(r) for r in rows)


def row_diff(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> str:
    """Readable difference between two row lists: rows only on one side, and which fields differ."""
    left, right = (
        rows_multiset(expected) - rows_multiset(actual),
        rows_multiset(actual) - rows_multiset(expected),
    )
    lines = []
    for only, side in ((left, "expected only"), (right, "got only")):
        for key in only:
            row = dict(key)
            other = next(
                (
                    dict(k)
                    for k in (right if side == "expected only" else left)
                    if dict(k).get("connection_id") == row.get("connection_id")
                    and dict(k).get("correlation_id") == row.get("correlation_id")
                ),
                None,
            )
            fields = {
                k: (v, None if other is None else other.get(k))
                for k, v in row.items()
                if other is None or other.get(k) != v
            }
            lines.append(
                f"{side}: conn {row.get('connection_id')} corr {row.get('correlation_id')} "
                f"status {row.get('status')}: {fields}"
            )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def originals() -> dict[str, tuple[list[Packet], list[dict[str, Any]], list[dict[str, Any]]]]:
    out = {}
    for name in NAMES:
        header, packets = read(CAPTURES / name)
        exchanges, connections, _ = decode(CAPTURES / name)
        out[name] = (header, packets, exchanges, connections)
    return out


# ---------------------------------------------------------------------------------------------------------
# rewrites that keep every byte: split, reorder, retransmit


def with_handshake(packets: list[Packet]) -> set[tuple]:
    """Flows whose SYN is in the capture. Without it, the first byte seen is where the stream starts,
    so bytes of that flow cannot arrive out of order: older bytes coming later are retransmissions."""
    return {p.flow for p in packets if p.flags & 0x02}


def split(packets: list[Packet], rng: random.Random, pieces: int = 3) -> list[Packet]:
    """Cut every data segment into up to `pieces` parts (same timestamp), sometimes delivered backwards."""
    out = []
    synced = with_handshake(packets)
    for p in packets:
        data = p.payload
        if len(data) < 2 or p.flags & 0x07 or p.flow not in synced:  # SYN/FIN/RST segments stay whole
            out.append(p)
            continue
        cuts = sorted(rng.sample(range(1, len(data)), min(pieces - 1, len(data) - 1)))
        bounds = [0, *cuts, len(data)]
        parts = [p.with_data(p.seq + a, data[a:b]) for a, b in itertools.pairwise(bounds)]
        if rng.random() < 0.5:
            parts.reverse()
        out += parts
    return out


def reorder(packets: list[Packet], rng: random.Random) -> list[Packet]:
    """Deliver a data segment ahead of the one sent before it in the same direction. Between them may
    lie other connections' packets and the peer's pure ACKs, which move after both (a receiver cannot
    acknowledge bytes that have not reached it); never the peer's data, which the later segment may
    answer."""
    out = list(packets)
    synced = with_handshake(packets)
    i = 0
    while i < len(out):
        a = out[i]
        if a.payload and not a.flags & 0x07 and a.flow in synced:
            conn = {a.flow, (a.flow[2], a.flow[3], a.flow[0], a.flow[1])}
            j = i + 1
            while j < min(len(out), i + 8) and (
                out[j].flow not in conn
                or (out[j].flow != a.flow and not out[j].payload and not out[j].flags & 0x07)
            ):
                j += 1
            b = out[j] if j < len(out) else None
            if (
                b is not None
                and b.flow == a.flow
                and b.payload
                and not b.flags & 0x07
                and _disjoint(a, b)
                and rng.random() < 0.7
            ):
                out[i : j + 1] = [b, a, *out[i + 1 : j]]
                i = j + 1
                continue
        i += 1
    return out


def _disjoint(a: Packet, b: Packet) -> bool:
    """The two segments carry different bytes (swapping a retransmission ahead of the first copy would
    change which copy, and so which timestamp, the bytes come with)."""
    return (b.seq - a.seq) & _M >= len(a.payload) and (a.seq - b.seq) & _M >= len(b.payload)


def retransmit(packets: list[Packet], rng: random.Random) -> list[Packet]:
    """Send data again a few packets later: whole segments, and ranges straddling two segments."""
    out = list(packets)
    last_by_flow: dict[tuple, Packet] = {}
    inserts: list[tuple[int, Packet]] = []
    for i, p in enumerate(packets):
        if not p.payload or p.flags & 0x07:
            continue
        prev = last_by_flow.get(p.flow)
        last_by_flow[p.flow] = p
        r = rng.random()
        if r < 0.3:
            inserts.append((i + rng.randint(1, 4), p))
        elif r < 0.5 and prev is not None and (prev.seq + len(prev.payload)) & _M == p.seq:
            half = len(prev.payload) // 2
            joined = prev.payload[half:] + p.payload[: max(1, len(p.payload) // 2)]
            inserts.append((i + rng.randint(1, 4), prev.with_data(prev.seq + half, joined)))
    for at, p in sorted(inserts, key=lambda x: -x[0]):
        out.insert(min(at, len(out)), p)
    return out


REWRITES = {
    "split": lambda ps, rng: split(ps, rng),
    "split+reorder": lambda ps, rng: reorder(split(ps, rng), rng),
    "split+reorder+retransmit": lambda ps, rng: retransmit(reorder(split(ps, rng, 2), rng), rng),
    "retransmit": retransmit,
    "all": lambda ps, rng: retransmit(reorder(split(ps, rng, 4), rng), rng),
}


def in_time_order(packets: list[Packet]) -> list[Packet]:
    """The same packets with the timestamps re-dealt in file order, as a capture of reordered traffic
    has them (each packet stamped when it was captured)."""
    stamps = sorted(p.ts for p in packets)
    return [Packet(ts, p.buf) for ts, p in zip(stamps, packets, strict=True)]


def _without(rows: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in names} for r in rows]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rewrite", sorted(REWRITES))
def test_repacketised_capture_gives_identical_rows(
    name: str, rewrite: str, originals: dict, tmp_path: Path
) -> None:
    """Packets keep their own timestamps, so reordered files are not in time order (as merged files
    or multi-queue captures are not): every row, times included, must come out the same."""
    header, packets, exchanges, connections = originals[name]
    rng = random.Random(f"{name}/{rewrite}")
    changed = REWRITES[rewrite](packets, rng)
    assert [p.buf for p in changed] != [p.buf for p in packets]  # the rewrite did something
    got_exchanges, got_connections, result = decode(write(tmp_path / name, header, changed))
    assert rows_multiset(got_exchanges) == rows_multiset(exchanges), row_diff(exchanges, got_exchanges)
    # connection rows: the same, byte and frame counts included (gaps: none); last_packet_time is
    # checked on its own in test_last_packet_time_is_the_latest
    left, right = _without(connections, "last_packet_time"), _without(got_connections, "last_packet_time")
    assert rows_multiset(right) == rows_multiset(left), row_diff(left, right)
    assert result.summary.gap_bytes == 0 and result.summary.resyncs == _resyncs(connections)


@pytest.mark.parametrize("name", NAMES)
def test_reordered_capture_in_time_order(name: str, originals: dict, tmp_path: Path) -> None:
    """Reordered traffic as a capture really holds it (timestamps in file order): a frame's times (and
    so the connection ids, which start with the first packet's time) may now come from another
    packet, every other value must stay."""
    header, packets, exchanges, connections = originals[name]
    rng = random.Random(name)
    changed = in_time_order(retransmit(reorder(split(packets, rng, 3), rng), rng))
    got_exchanges, got_connections, _ = decode(write(tmp_path / name, header, changed))
    times = ("request_time", "response_time", "latency_us", "connection_id")  # the id holds the first time
    left, right = _without(exchanges, *times), _without(got_exchanges, *times)
    assert rows_multiset(right) == rows_multiset(left), row_diff(left, right)
    times = ("first_packet_time", "last_packet_time", "end_time", "connection_id")
    left, right = _without(connections, *times), _without(got_connections, *times)
    assert rows_multiset(right) == rows_multiset(left), row_diff(left, right)


def test_last_packet_time_is_the_latest(originals: dict, tmp_path: Path) -> None:
    """Two data packets of one connection, the second in the file stamped 1 s before the first:
    last_packet_time must be the later time, not the time of the packet that came last in the file."""
    header, packets, _exchanges, _connections = originals["tansu-kafka-python.pcap"]
    first = next(i for i, p in enumerate(packets) if p.payload)
    late = Packet((packets[first].ts[0] + 1, packets[first].ts[1]), packets[first].buf)
    ack = next(p for p in packets[first + 1 :] if not p.payload and p.flow[1] == 9092)
    capture = [*packets[:first], late, ack]
    _, connections, _ = decode(write(tmp_path / "late.pcap", header, capture))
    (conn,) = connections
    latest = late.ts[0] * 1_000_000 + late.ts[1]
    assert conn["last_packet_time"] == latest


def _resyncs(connections: list[dict[str, Any]]) -> int:
    return sum(c.get("resyncs") or 0 for c in connections)


# ---------------------------------------------------------------------------------------------------------
# losing bytes


@dataclass
class Frame:
    flow: tuple
    start: int  # stream offset
    end: int
    corr: int


def stream_frames(
    packets: list[Packet],
) -> tuple[dict[tuple, list[Frame]], dict[int, tuple[tuple, int, int]]]:
    """Kafka frames of every direction (walked by length prefix from the stream start) and, per packet
    index, the (flow, start, end) stream range its payload covers. Built from the packets alone."""
    base: dict[tuple, int] = {}
    streams: dict[tuple, dict[int, bytes]] = defaultdict(dict)
    ranges: dict[int, tuple[tuple, int, int]] = {}
    for i, p in enumerate(packets):
        if p.flags & 0x02:  # SYN: data starts at ISN + 1
            base.setdefault(p.flow, (p.seq + 1) & _M)
        if p.payload:
            b = base.setdefault(p.flow, p.seq)
            start = (p.seq - b) & _M
            streams[p.flow].setdefault(start, p.payload)
            ranges[i] = (p.flow, start, start + len(p.payload))
    frames: dict[tuple, list[Frame]] = {}
    for flow, pieces in streams.items():
        data = bytearray()
        for start in sorted(pieces):
            if start > len(data):
                break
            data += pieces[start][len(data) - start :]
        out, at = [], 0
        request = flow[3] == 9092
        while at + 12 <= len(data):
            size = struct.unpack_from(">i", data, at)[0]
            corr = struct.unpack_from(">i", data, at + (8 if request else 4))[0]
            out.append(Frame(flow, at, at + 4 + size, corr))
            at += 4 + size
        frames[flow] = out
    return frames, ranges


def affected_exchanges(packets: list[Packet], dropped: set[int]) -> set[tuple[int, int]]:
    """(client port, correlation id) of every exchange with a frame that loses bytes."""
    frames, ranges = stream_frames(packets)
    out = set()
    for i in dropped:
        flow, start, end = ranges[i]
        for f in frames[flow]:
            if f.start < end and start < f.end:
                client_port = flow[1] if flow[3] == 9092 else flow[3]
                out.add((client_port, f.corr))
    return out


def _check_loss(
    name: str, originals: dict, tmp_path: Path, drop: set[int], packets: list[Packet] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Drop packets `drop` (indexes into `packets`, the original capture's by default) and check the rows."""
    header, base_packets, exchanges, _connections = originals[name]
    packets = packets or base_packets
    hit = affected_exchanges(packets, drop)
    assert hit
    damaged = [p for i, p in enumerate(packets) if i not in drop]
    folder = tmp_path / f"drop-{min(drop)}"
    folder.mkdir(exist_ok=True)
    got, got_connections, result = decode(write(folder / name, header, damaged))  # same source name
    lost = sum(len(packets[i].payload) for i in drop)
    assert result.summary.gap_bytes == lost

    kept = [r for r in exchanges if (r["client_port"], r.get("correlation_id")) not in hit]
    expected = rows_multiset(kept)
    actual = rows_multiset(got)
    missing = expected - actual
    assert not missing, "rows changed though none of their frames lost a byte:\n" + row_diff(kept, got)
    extra = [r for r in got if _key(r) not in expected]
    assert extra, "the damage left no trace in the rows"
    for row in extra:
        assert (row["client_port"], row.get("correlation_id")) in hit or row.get("correlation_id") is None, (
            row
        )
        assert row["status"] in FLAGGED, f"a damaged exchange shown as {row['status']}: {row}"
    for port, corr in hit:  # no damaged exchange passes for a clean one
        assert not any(
            r["client_port"] == port and r.get("correlation_id") == corr and r["status"] == "ok" for r in got
        ), (port, corr)
    flows = {packets[i].flow for i in drop}
    for flow in flows:  # the connection rows count the lost bytes, in the right direction
        port = flow[1] if flow[3] == 9092 else flow[3]
        conns = [c for c in got_connections if c["client_port"] == port and c["protocol"] == "kafka"]
        gap = sum(c["gap_bytes_to_broker"] if flow[3] == 9092 else c["gap_bytes_to_client"] for c in conns)
        assert gap == sum(len(packets[i].payload) for i in drop if packets[i].flow == flow)
    return got, got_connections


def _data_indexes(packets: list[Packet], to_broker: bool) -> list[int]:
    """Data segments of one direction whose bytes no other packet carries (the capture's own
    retransmissions would make a drop lose nothing), not the first nor the last of their flow."""
    seen: Counter[tuple] = Counter((p.flow, p.seq, len(p.payload)) for p in packets if p.payload)
    by_flow: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(packets):
        if p.payload and not p.flags & 0x07 and (p.flow[3] == 9092) == to_broker:
            by_flow[p.flow].append(i)
    return [
        i
        for idx in by_flow.values()
        for i in idx[1:-1]
        if seen[(packets[i].flow, packets[i].seq, len(packets[i].payload))] == 1
    ]


_LOSS_CASES = [
    pytest.param(
        name,
        to_broker,
        id=f"{'request' if to_broker else 'response'}-lost-{name}",
        marks=[],
    )
    for name in NAMES
    for to_broker in (True, False)
]


@pytest.mark.parametrize(("name", "to_broker"), _LOSS_CASES)
def test_lost_segment_flags_only_its_exchanges(
    name: str, to_broker: bool, originals: dict, tmp_path: Path
) -> None:
    packets = originals[name][1]
    candidates = _data_indexes(packets, to_broker)
    rng = random.Random(f"{name}/{to_broker}")
    for index in rng.sample(candidates, min(3, len(candidates))):
        _check_loss(name, originals, tmp_path, {index})


@pytest.mark.parametrize("name", NAMES)
def test_lost_piece_mid_frame_keeps_alignment(name: str, originals: dict, tmp_path: Path) -> None:
    """The middle third of a frame is lost: the frame is truncated, the decoder knows where the next one
    starts (no resync needed), and the rest of the connection decodes as before."""
    packets = originals[name][1]
    rng = random.Random(name)
    big = max(
        _data_indexes(packets, False) + _data_indexes(packets, True), key=lambda i: len(packets[i].payload)
    )
    p = packets[big]
    third = len(p.payload) // 3
    pieces = [
        p.with_data(p.seq, p.payload[:third]),
        p.with_data(p.seq + third, p.payload[third : 2 * third]),
        p.with_data(p.seq + 2 * third, p.payload[2 * third :]),
    ]
    resplit = [*packets[:big], *pieces, *packets[big + 1 :]]
    del rng
    got, connections = _check_loss(name, originals, tmp_path, {big + 1}, resplit)
    flow = p.flow
    port = flow[1] if flow[3] == 9092 else flow[3]
    assert all(c["resyncs"] == 0 for c in connections if c["client_port"] == port)
    assert any(r["status"] == "truncated" and "missing" in (r.get("decode_error") or "") for r in got)


@pytest.mark.parametrize("name", NAMES)
def test_lost_frame_header_resyncs(name: str, originals: dict, tmp_path: Path) -> None:
    """The first bytes of a request (its header) are lost: the decoder hunts for the next request,
    counts a resync, and the response of the lost request becomes an orphan."""
    packets = originals[name][1]
    rng = random.Random(name)
    index = rng.choice(_data_indexes(packets, True))
    p = packets[index]
    head = [p.with_data(p.seq, p.payload[:6]), p.with_data(p.seq + 6, p.payload[6:])]
    resplit = [*packets[:index], *head, *packets[index + 1 :]]
    _got, connections = _check_loss(name, originals, tmp_path, {index}, resplit)
    assert sum(c["resyncs"] for c in connections if c["client_port"] == p.flow[1]) >= 1


# ---------------------------------------------------------------------------------------------------------
# Minimal reproductions of what the loss tests above found in the decoder (files this suite does not own).
# Each builds a short Kafka conversation packet by packet, leaves some bytes out, and states what the rows
# must say.

_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)  # pcap, microseconds, Ethernet


class Conversation:
    """One TCP connection 10.0.0.1:40000 -> 10.0.0.2:9092 (by default), built packet by packet with
    real seq/ack; `handshake=False` leaves out the SYN, SYN/ACK and ACK."""

    def __init__(
        self,
        client: bytes = b"\x0a\x00\x00\x01",
        client_port: int = 40000,
        broker_port: int = 9092,
        handshake: bool = True,
    ) -> None:
        self.packets: list[Packet] = []
        self.seq = [1000, 5000]  # next sequence number: client, broker
        self.t = 0
        self.dropped: set[int] = set()
        self.hosts = (client, b"\x0a\x00\x00\x02")
        self.ports = (client_port, broker_port)
        if handshake:
            self.send(0, b"", 0x02)  # SYN
            self.send(1, b"", 0x12)  # SYN/ACK
            self.send(0, b"", 0x10)

    def send(self, side: int, data: bytes, flags: int = 0x18, drop: bool = False) -> None:
        src, dst = self.hosts if side == 0 else self.hosts[::-1]
        sport, dport = self.ports if side == 0 else self.ports[::-1]
        ack = self.seq[1 - side] if flags & 0x10 else 0
        tcp = struct.pack(
            "!HHIIBBHHH", sport, dport, self.seq[side] & _M, ack & _M, 5 << 4, flags, 65535, 0, 0
        )
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40 + len(data), 0, 0x4000, 64, 6, 0, src, dst)
        buf = b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01\x08\x00" + ip + tcp + data
        self.t += 1000
        if drop:
            self.dropped.add(len(self.packets))
        self.packets.append(Packet((1_700_000_000 + self.t // 1_000_000, self.t % 1_000_000), buf))
        self.seq[side] += len(data) + (1 if flags & 0x03 else 0)

    def close(self) -> None:
        self.send(0, b"", 0x11)
        self.send(1, b"", 0x11)
        self.send(0, b"", 0x10)

    def kept(self) -> list[Packet]:
        """The packets the capture holds (all but the dropped ones)."""
        return [p for i, p in enumerate(self.packets) if i not in self.dropped]

    def decode(self, tmp_path: Path) -> list[dict[str, Any]]:
        rows, _, _ = decode(write(tmp_path / "conversation.pcap", _HEADER, self.kept()))
        return sorted(rows, key=lambda r: (r.get("correlation_id") or 0, r["status"]))


def _statuses(rows: list[dict[str, Any]]) -> list[tuple[int | None, str]]:
    return [(r.get("correlation_id"), r["status"]) for r in rows]


def test_ack_revealing_a_lost_request_comes_before_the_response(tmp_path: Path) -> None:
    from kafka_frames import heartbeat_v0, heartbeat_v0_response

    c = Conversation()
    c.send(0, heartbeat_v0(1), drop=True)  # lost by the capture
    c.send(1, b"", 0x10)  # the broker acknowledges it ...
    c.send(1, heartbeat_v0_response(1))  # ... and answers it
    c.send(0, heartbeat_v0(2))
    c.send(1, heartbeat_v0_response(2))  # its ACK is the first to cover request 2
    c.close()
    assert _statuses(c.decode(tmp_path)) == [(1, "orphan_response"), (2, "ok")]


def test_answer_to_acks0_produce_found_after_a_gap(tmp_path: Path) -> None:
    from kafka_frames import heartbeat_v0, heartbeat_v0_response, produce_v3, produce_v3_response

    c = Conversation()
    c.send(0, heartbeat_v0(1))
    c.send(1, heartbeat_v0_response(1), drop=True)  # lost
    c.send(0, produce_v3(2, acks=0))
    c.send(1, produce_v3_response(2, {0: 0}))  # a broker that answers acks=0 (Tansu)
    c.send(0, heartbeat_v0(3))
    c.send(1, heartbeat_v0_response(3))
    c.close()
    assert _statuses(c.decode(tmp_path)) == [
        (1, "truncated"),
        (2, "no_response_expected"),
        (2, "orphan_response"),
        (3, "ok"),
    ]


def test_hunt_for_a_response_checks_more_than_its_correlation_id(tmp_path: Path) -> None:
    """After losing the first 2 bytes of response 1, the bytes 00 06 00 00 | 00 01 00 00 inside it read
    as a 393,216-byte response to pending request 65536: the hunt must not take that on its correlation id
    alone (it would swallow the real response 65536), but check the frame decodes as that request's answer."""
    from kafka_frames import heartbeat_v0, heartbeat_v0_response

    c = Conversation()
    c.send(0, heartbeat_v0(1))
    c.send(0, heartbeat_v0(65536))
    response = heartbeat_v0_response(1)  # 00 00 00 06 | 00 00 00 01 | 00 00
    c.send(1, response[:2], drop=True)  # the capture loses its first 2 bytes
    c.send(1, response[2:])
    c.send(1, heartbeat_v0_response(65536))
    c.close()
    assert _statuses(c.decode(tmp_path)) == [(1, "truncated"), (65536, "ok")]


def test_hunt_does_not_stop_inside_a_request_body(tmp_path: Path) -> None:
    """After losing a Produce request's first 6 bytes, its body holds plausible-looking headers (timeout
    30000 read as a length, then Produce v1 and client id 't' from the topic name; a Produce v0 inside the
    record batch): the hunt must accept only a frame that is all there and decodes, so the next request
    (and with it the connection) is still recognised."""
    from kafka_frames import (
        heartbeat_v0,
        heartbeat_v0_response,
        produce_v3,
        produce_v3_response,
        record_batch,
    )

    c = Conversation()
    produce = produce_v3(1, acks=1, batches=(record_batch(5, payload=b"v" * 40),))
    c.send(0, produce[:6], drop=True)  # the request's header is lost ...
    c.send(0, produce[6:])  # ... the rest of it arrives
    c.send(1, produce_v3_response(1, {0: 0}))
    c.send(0, heartbeat_v0(2))
    c.send(1, heartbeat_v0_response(2))
    c.close()
    rows = c.decode(tmp_path)
    assert _statuses(rows) == [(1, "orphan_response"), (2, "ok")]


def test_response_after_a_gap_whose_request_was_lost_is_an_orphan(tmp_path: Path) -> None:
    """Hunting after a gap while a request is pending: a whole response right at the end of the gap, whose
    request the capture also lost, is aligned and complete; it is kept as an orphan, not skipped without a
    row (as tcpdump dropping packets does to live captures)."""
    from kafka_frames import heartbeat_v0, heartbeat_v0_response

    c = Conversation()
    c.send(0, heartbeat_v0(1))
    c.send(1, heartbeat_v0_response(1), drop=True)  # lost: request 1 stays pending
    c.send(0, heartbeat_v0(2), drop=True)  # lost too
    c.send(1, heartbeat_v0_response(2))  # complete, right after the gap, its request unseen
    c.send(0, heartbeat_v0(3))
    c.send(1, b"", 0x10)
    c.send(1, heartbeat_v0_response(3))
    c.close()
    assert _statuses(c.decode(tmp_path)) == [(1, "truncated"), (2, "orphan_response"), (3, "ok")]
