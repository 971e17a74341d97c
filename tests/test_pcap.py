"""decoder.pcap: capture files -> TcpSegments.

Packets are built with scapy (an independent encoder); the file containers are written here by hand so
that every variant (byte order, magic, pcapng options, damage) is under the test's control. Real captures
from other projects come from shared/public-captures, with expected values read off tshark.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import lzma
import shutil
import struct
import subprocess
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import (
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
)
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether, Loopback
from scapy.packet import raw

from decoder import pcap
from decoder.pcap import (
    ACK,
    FIN,
    NS,
    PSH,
    SYN,
    CaptureError,
    CaptureStats,
    NotACaptureError,
    TcpSegment,
    TruncatedCaptureError,
    iter_segments,
    iter_segments_merged,
)

PUBLIC = Path(__file__).resolve().parents[2] / "shared" / "public-captures"
if not PUBLIC.is_dir():
    PUBLIC = Path("/work/shared/public-captures")

T0 = 1_700_000_000_123_456_000  # a timestamp with whole microseconds


# --- building captures ---------------------------------------------------------------------------------


def eth(payload) -> bytes:
    return raw(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / payload)


def tcp4(
    data: bytes = b"hello",
    sport: int = 40000,
    dport: int = 9092,
    seq: int = 1000,
    ack: int = 2000,
    flags="PA",
):
    return (
        IP(src="10.0.0.1", dst="10.0.0.2")
        / TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags)
        / data
    )


def tcp6(data: bytes = b"hello6", ext=None):
    ip = IPv6(src="2001:db8::1", dst="2001:db8:0:0:1::2")
    if ext is not None:
        ip = ip / ext
    return ip / TCP(sport=40001, dport=9093, seq=7, ack=8, flags="A") / data


def pcap_file(
    records: list[tuple[int, bytes] | tuple[int, bytes, int]],
    link: int = 1,
    *,
    endian: str = "<",
    nano: bool = False,
    snaplen: int = 262144,
    modified: bool = False,
) -> bytes:
    """A pcap file; records are (ts_ns, frame[, wire length])."""
    magic = 0xA1B2CD34 if modified else 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, snaplen, link)]
    for rec in records:
        ts, frame = rec[0], rec[1]
        wire = rec[2] if len(rec) > 2 else len(frame)
        frac = ts % 10**9 if nano else ts % 10**9 // 1000
        out.append(struct.pack(endian + "IIII", ts // 10**9, frac, len(frame), wire))
        if modified:
            out.append(struct.pack(endian + "iHBx", 2, 0x0800, 0))
        out.append(frame)
    return b"".join(out)


def _pad(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def block(btype: int, body: bytes, e: str = "<") -> bytes:
    body = _pad(body)
    n = len(body) + 12
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def option(code: int, value: bytes, e: str = "<") -> bytes:
    return struct.pack(e + "HH", code, len(value)) + _pad(value)


def shb(e: str = "<") -> bytes:
    return block(0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1), e)


def idb(link: int, e: str = "<", tsresol: int | None = None, tsoffset: int | None = None) -> bytes:
    opts = b""
    if tsresol is not None:
        opts += option(9, bytes([tsresol]), e)
    if tsoffset is not None:
        opts += option(14, struct.pack(e + "q", tsoffset), e)
    if opts:
        opts += option(0, b"", e)
    return block(1, struct.pack(e + "HHI", link, 0, 262144) + opts, e)


def epb(ifid: int, units: int, frame: bytes, e: str = "<", wire: int | None = None) -> bytes:
    hdr = struct.pack(e + "IIIII", ifid, units >> 32, units & 0xFFFFFFFF, len(frame), wire or len(frame))
    return block(6, hdr + frame, e)


def write(tmp_path: Path, data: bytes, name: str = "c.pcap") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def read(path: Path) -> tuple[list[TcpSegment], CaptureStats]:
    stats = CaptureStats()
    return list(iter_segments(path, stats)), stats


def fields(s: TcpSegment) -> tuple:
    return (s.ts_ns, s.src_ip, s.src_port, s.dst_ip, s.dst_port, s.seq, s.ack, s.flags, s.payload)


V4 = (T0, "10.0.0.1", 40000, "10.0.0.2", 9092, 1000, 2000, PSH | ACK, b"hello")


# --- the segment type ----------------------------------------------------------------------------------


def test_fast_constructor_builds_real_frozen_segments(tmp_path: Path) -> None:
    [seg], _ = read(write(tmp_path, pcap_file([(T0, eth(tcp4()))])))
    assert type(seg) is TcpSegment
    assert seg == TcpSegment(*V4)
    assert hash(seg) == hash(TcpSegment(*V4))
    assert type(seg.payload) is bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        seg.seq = 5  # type: ignore[misc]
    assert not hasattr(seg, "__dict__")


# --- link types ----------------------------------------------------------------------------------------

LINK_CASES = {
    "ethernet": (1, lambda p: eth(p)),
    "vlan": (1, lambda p: eth(Dot1Q(vlan=42) / p)),
    "qinq": (1, lambda p: eth(Dot1AD(vlan=5) / Dot1Q(vlan=7) / p)),
    "sll": (113, lambda p: raw(CookedLinux(pkttype=0, lladdrtype=1, lladdrlen=6, src=b"\x02" * 6) / p)),
    "sll-vlan": (113, lambda p: raw(CookedLinux(proto=0x8100) / Dot1Q(vlan=3) / p)),
    "sll2": (276, lambda p: raw(CookedLinuxV2(ifindex=1, lladdrtype=1, lladdrlen=6, src=b"\x02" * 6) / p)),
    "null-le": (0, lambda p: raw(Loopback() / p)),  # scapy writes the family little-endian
    "null-be": (0, lambda p: struct.pack(">I", 2) + raw(p)),
    "loop": (108, lambda p: struct.pack(">I", 2) + raw(p)),
    "raw-101": (101, lambda p: raw(p)),
    "raw-12": (12, lambda p: raw(p)),
    "raw-14": (14, lambda p: raw(p)),
    "ipv4-228": (228, lambda p: raw(p)),
}


@pytest.mark.parametrize("case", sorted(LINK_CASES))
def test_link_types_ipv4(tmp_path: Path, case: str) -> None:
    link, frame = LINK_CASES[case]
    segs, stats = read(write(tmp_path, pcap_file([(T0, frame(tcp4()))], link)))
    assert [fields(s) for s in segs] == [V4]
    assert (stats.packets, stats.tcp_segments, stats.non_tcp, stats.malformed) == (1, 1, 0, 0)


# RFC 5952: of two equal runs of zero groups, the first is the one written "::".
V6 = (T0, "2001:db8::1", 40001, "2001:db8::1:0:0:2", 9093, 7, 8, ACK, b"hello6")

LINK6_CASES = {
    "ethernet": (1, lambda p: eth(p)),
    "vlan": (1, lambda p: eth(Dot1Q(vlan=42) / p)),
    "sll": (113, lambda p: raw(CookedLinux() / p)),
    "sll2": (276, lambda p: raw(CookedLinuxV2() / p)),
    "null-netbsd": (0, lambda p: struct.pack("<I", 24) + raw(p)),
    "null-freebsd": (0, lambda p: struct.pack("<I", 28) + raw(p)),
    "null-darwin-be": (0, lambda p: struct.pack(">I", 30) + raw(p)),
    "loop-openbsd": (108, lambda p: struct.pack(">I", 24) + raw(p)),
    "raw-101": (101, lambda p: raw(p)),
    "ipv6-229": (229, lambda p: raw(p)),
}


@pytest.mark.parametrize("case", sorted(LINK6_CASES))
def test_link_types_ipv6(tmp_path: Path, case: str) -> None:
    link, frame = LINK6_CASES[case]
    segs, _ = read(write(tmp_path, pcap_file([(T0, frame(tcp6()))], link)))
    assert [fields(s) for s in segs] == [V6]


def test_ipv6_extension_headers_are_skipped(tmp_path: Path) -> None:
    ext = IPv6ExtHdrHopByHop() / IPv6ExtHdrRouting() / IPv6ExtHdrDestOpt() / IPv6ExtHdrFragment(offset=0, m=1)
    later_fragment = IPv6ExtHdrFragment(offset=185, m=0)
    frames = [(T0, eth(tcp6(ext=ext))), (T0 + 1000, eth(tcp6(ext=later_fragment)))]
    segs, stats = read(write(tmp_path, pcap_file(frames)))
    assert [fields(s) for s in segs] == [V6]
    assert (stats.packets, stats.tcp_segments, stats.fragments) == (2, 1, 1)


def test_ipv4_fragments_first_kept_others_counted(tmp_path: Path) -> None:
    first = (
        IP(src="10.0.0.1", dst="10.0.0.2", flags="MF", frag=0) / TCP(sport=1, dport=2, seq=3) / (b"x" * 16)
    )
    later = IP(src="10.0.0.1", dst="10.0.0.2", proto=6, flags=0, frag=5) / (b"y" * 16)
    segs, stats = read(write(tmp_path, pcap_file([(T0, eth(first)), (T0, eth(later))])))
    assert [(s.src_port, s.dst_port, s.seq, s.payload) for s in segs] == [(1, 2, 3, b"x" * 16)]
    assert (stats.packets, stats.tcp_segments, stats.fragments, stats.non_tcp) == (2, 1, 1, 0)


def test_non_tcp_is_counted_and_skipped(tmp_path: Path) -> None:
    frames = [
        eth(ARP(psrc="10.0.0.1", pdst="10.0.0.2")),
        eth(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=53, dport=53) / b"dns"),
        eth(IP(src="10.0.0.1", dst="10.0.0.2") / ICMP()),
        eth(IPv6(src="::1", dst="::2") / UDP()),
        eth(tcp4()),
        raw(Ether(type=0x88CC) / (b"lldp" * 10)),
    ]
    segs, stats = read(write(tmp_path, pcap_file([(T0, f) for f in frames])))
    assert [fields(s) for s in segs] == [V4]
    assert (stats.packets, stats.tcp_segments, stats.non_tcp, stats.malformed) == (6, 1, 5, 0)


def test_ethernet_padding_is_not_payload(tmp_path: Path) -> None:
    frame = eth(tcp4(b"", flags="A"))
    assert len(frame) == 54
    padded = frame + b"\xee" * 6  # what a NIC hands up for a minimum-size frame
    segs, _ = read(write(tmp_path, pcap_file([(T0, padded)])))
    assert segs[0].payload == b""
    assert segs[0].flags == ACK


def test_ip_options_tcp_options_and_ns_flag(tmp_path: Path) -> None:
    pkt = (
        IP(src="10.0.0.1", dst="10.0.0.2", options=b"\x01\x01\x01\x00")
        / TCP(
            sport=5,
            dport=6,
            seq=1,
            ack=2,
            flags="SE",
            options=[("MSS", 1460), ("SAckOK", b""), ("WScale", 7)],
        )
        / b"tfo"
    )
    tcp_bytes = bytearray(raw(pkt))
    tcp_bytes[24 + 12] |= 1  # NS lives in the low bit of the data-offset byte
    segs, _ = read(write(tmp_path, pcap_file([(T0, eth(IP(bytes(tcp_bytes))))])))
    assert [(s.src_port, s.flags, s.payload) for s in segs] == [(5, SYN | 0x40 | NS, b"tfo")]


def test_tso_packet_with_zero_ip_length_takes_captured_bytes(tmp_path: Path) -> None:
    frame = bytearray(eth(tcp4(b"z" * 3000)))
    frame[16:18] = b"\0\0"
    segs, _ = read(write(tmp_path, pcap_file([(T0, bytes(frame))])))
    assert segs[0].payload == b"z" * 3000


def test_malformed_headers_are_counted(tmp_path: Path) -> None:
    good = eth(tcp4())
    bad_offset = bytearray(good)
    bad_offset[34 + 12] = 0x40  # TCP data offset 4 words < 5
    frames = [
        good[:20],  # IPv4 header cut
        good[:40],  # TCP header cut
        bytes(bad_offset),
        good[:10],  # Ethernet header cut
        raw(IP(src="1.2.3.4", dst="5.6.7.8", version=5) / TCP()),  # raw link, unknown IP version
    ]
    links = [1, 1, 1, 1, 101]
    for i, (f, link) in enumerate(zip(frames, links, strict=True)):
        segs, stats = read(write(tmp_path, pcap_file([(T0, f, len(good))], link), f"m{i}.pcap"))
        assert segs == []
        assert (stats.packets, stats.malformed) == (1, 1), i


def test_snap_length_cut_keeps_partial_payload(tmp_path: Path) -> None:
    frame = eth(tcp4(b"a" * 1000))
    segs, stats = read(write(tmp_path, pcap_file([(T0, frame[:96], len(frame))], snaplen=96)))
    assert segs[0].payload == b"a" * 42
    assert (stats.snapped, stats.tcp_segments) == (1, 1)


def test_unknown_link_type_counted(tmp_path: Path) -> None:
    segs, stats = read(write(tmp_path, pcap_file([(T0, eth(tcp4()))] * 3, link=147)))
    assert segs == []
    assert (stats.packets, stats.unknown_link_type) == (3, 3)


def test_ip_text_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pcap, "_IP_CACHE_MAX", 4)
    pcap._ip4_text.clear()
    frames = [(T0, eth(IP(src=f"10.1.0.{i}", dst="10.0.0.2") / TCP())) for i in range(10)]
    segs, _ = read(write(tmp_path, pcap_file(frames)))
    assert [s.src_ip for s in segs] == [f"10.1.0.{i}" for i in range(10)]
    assert len(pcap._ip4_text) <= 4


# --- pcap variants ------------------------------------------------------------------------------------


@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize("nano", [False, True])
def test_pcap_byte_orders_and_resolutions(tmp_path: Path, endian: str, nano: bool) -> None:
    ts = [1_700_000_000_123_456_789, 1_700_000_001_000_000_001]
    segs, stats = read(write(tmp_path, pcap_file([(t, eth(tcp4())) for t in ts], endian=endian, nano=nano)))
    expect = ts if nano else [t // 1000 * 1000 for t in ts]
    assert [s.ts_ns for s in segs] == expect
    assert stats.bytes == 24 + 2 * (16 + 59)


def test_modified_pcap(tmp_path: Path) -> None:
    segs, _ = read(write(tmp_path, pcap_file([(T0, eth(tcp4()))] * 2, modified=True)))
    assert [fields(s) for s in segs] == [V4, V4]


def test_pcap_from_dpkt_writer(tmp_path: Path) -> None:
    """A file written by dpkt (another implementation of the container) reads the same."""
    dpkt = pytest.importorskip("dpkt")
    p = tmp_path / "dpkt.pcap"
    with open(p, "wb") as f:
        w = dpkt.pcap.Writer(f, nano=True)
        w.writepkt(eth(tcp4()), ts=1_700_000_000.123456)
        w.writepkt(eth(tcp6()), ts=1_700_000_001.5)
    segs, _ = read(p)
    assert [s.payload for s in segs] == [b"hello", b"hello6"]
    assert abs(segs[0].ts_ns - 1_700_000_000_123_456_000) < 1000
    assert segs[1].ts_ns == 1_700_000_001_500_000_000


# --- pcapng ---------------------------------------------------------------------------------------------


def test_pcapng_interfaces_with_different_link_types_and_resolutions(tmp_path: Path) -> None:
    data = b"".join(
        [
            shb(),
            idb(1),  # Ethernet, default microseconds
            idb(113, tsresol=9),  # SLL, nanoseconds
            idb(101, tsresol=0x80 | 20, tsoffset=10),  # raw IP, 2^-20 s, +10 s
            idb(276, tsresol=12),  # SLL2, picoseconds
            epb(0, 1_700_000_000_123_456, eth(tcp4(b"a"))),
            epb(1, 1_700_000_000_123_456_789, raw(CookedLinux() / tcp4(b"b"))),
            epb(2, (1_700_000_000 << 20) + (1 << 19), raw(tcp6(b"c"))),
            epb(3, 12_345_678_901_234_567, raw(CookedLinuxV2() / tcp4(b"d"))),
            block(5, b"\0" * 12),  # interface statistics: skipped
            block(0x40000BAD, b"custom"),  # unknown block: skipped
        ]
    )
    segs, stats = read(write(tmp_path, data, "c.pcapng"))
    assert [(s.payload, s.ts_ns) for s in segs] == [
        (b"a", 1_700_000_000_123_456_000),
        (b"b", 1_700_000_000_123_456_789),
        (b"c", 1_700_000_010_500_000_000),
        (b"d", 12_345_678_901_234),
    ]
    assert stats.bytes == len(data)


def test_pcapng_sections_of_different_byte_order_and_precision(tmp_path: Path) -> None:
    data = b"".join(
        [
            shb("<"),
            idb(1, "<", tsresol=3),  # milliseconds
            epb(0, 1_700_000_000_123, eth(tcp4(b"ms")), "<"),
            shb(">"),  # new section: interfaces start over, big-endian now
            idb(113, ">", tsresol=9),
            epb(0, 1_700_000_000_000_000_007, raw(CookedLinux() / tcp4(b"ns")), ">"),
        ]
    )
    segs, _ = read(write(tmp_path, data, "c.pcapng"))
    assert [(s.payload, s.ts_ns) for s in segs] == [
        (b"ms", 1_700_000_000_123_000_000),
        (b"ns", 1_700_000_000_000_000_007),
    ]


def test_pcapng_simple_and_obsolete_packet_blocks(tmp_path: Path) -> None:
    frame = eth(tcp4(b"spb"))
    t = 1_700_000_000_000_001
    pb_body = struct.pack("<HHIIII", 0, 0, t >> 32, t & 0xFFFFFFFF, len(frame), len(frame)) + frame
    data = b"".join(
        [
            shb(),
            idb(1),
            epb(0, 1_700_000_000_000_000, eth(tcp4(b"epb"))),
            block(3, struct.pack("<I", len(frame)) + frame),  # no timestamp: takes the previous one
            block(2, pb_body),
        ]
    )
    segs, _ = read(write(tmp_path, data, "c.pcapng"))
    assert [(s.payload, s.ts_ns) for s in segs] == [
        (b"epb", 1_700_000_000_000_000_000),
        (b"spb", 1_700_000_000_000_000_000),
        (b"spb", 1_700_000_000_000_001_000),
    ]


def test_pcapng_snapped_packet(tmp_path: Path) -> None:
    frame = eth(tcp4(b"q" * 100))
    data = shb() + idb(1) + epb(0, 5, frame[:60], wire=len(frame))
    segs, stats = read(write(tmp_path, data, "c.pcapng"))
    assert segs[0].payload == b"q" * 6
    assert stats.snapped == 1


# --- compression ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "compress",
    [gzip.compress, bz2.compress, lzma.compress, lambda b: gzip.compress(b[:100]) + gzip.compress(b[100:])],
    ids=["gzip", "bzip2", "xz", "gzip-two-members"],
)
def test_compressed_captures(tmp_path: Path, compress) -> None:
    plain = pcap_file([(T0 + i, eth(tcp4(bytes([i]) * i))) for i in range(50)])
    segs, stats = read(write(tmp_path, compress(plain), "capture.bin"))  # no telling extension
    assert [s.payload for s in segs] == [bytes([i]) * i for i in range(50)]
    assert stats.bytes == len(plain)
    ng = shb() + idb(1) + epb(0, 3, eth(tcp4()))
    segs, _ = read(write(tmp_path, compress(ng), "ng.bin"))
    assert [s.payload for s in segs] == [b"hello"]


def test_truncated_gzip_yields_good_packets_then_raises(tmp_path: Path) -> None:
    plain = pcap_file([(T0 + i * 1000, eth(tcp4(b"p" * 200))) for i in range(400)])
    gz = gzip.compress(plain, compresslevel=1)
    p = write(tmp_path, gz[: len(gz) // 2], "cut.pcap.gz")
    got = []
    with pytest.raises(TruncatedCaptureError) as info:
        got.extend(iter_segments(p))
    assert 0 < len(got) < 400
    assert [s.ts_ns for s in got] == [T0 + i * 1000 for i in range(len(got))]
    assert all(s.payload == b"p" * 200 for s in got)
    assert str(p) in str(info.value)
    assert "gzip" in str(info.value)
    # Everything the compressed half holds is handed over before the error: the records cover the
    # decompressed prefix up to the last whole record.
    prefix = zlib_prefix(gz[: len(gz) // 2])
    assert len(got) == (len(prefix) - 24) // (16 + len(eth(tcp4(b"p" * 200))))


def zlib_prefix(data: bytes) -> bytes:
    import zlib

    return zlib.decompressobj(31).decompress(data)


def test_corrupt_gzip_crc_raises(tmp_path: Path) -> None:
    gz = bytearray(gzip.compress(pcap_file([(T0, eth(tcp4()))])))
    gz[-6] ^= 0xFF  # CRC32 trailer
    p = write(tmp_path, bytes(gz), "crc.pcap.gz")
    with pytest.raises(TruncatedCaptureError, match="corrupt compressed data"):
        list(iter_segments(p))


# --- not a capture / damaged -------------------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    p = write(tmp_path, b"", "empty.pcap")
    with pytest.raises(NotACaptureError, match=r"empty\.pcap: empty file"):
        list(iter_segments(p))


def test_empty_gzip(tmp_path: Path) -> None:
    with pytest.raises(NotACaptureError, match="empty file"):
        list(iter_segments(write(tmp_path, gzip.compress(b""), "e.gz")))


def test_text_file(tmp_path: Path) -> None:
    p = write(tmp_path, b"# Kafka capture notes\nnothing here\n", "notes.pcap")
    with pytest.raises(NotACaptureError, match=r"notes\.pcap: not a pcap or pcapng file \(text"):
        list(iter_segments(p))


def test_gzipped_text_and_zstd(tmp_path: Path) -> None:
    with pytest.raises(NotACaptureError, match="not a pcap"):
        list(iter_segments(write(tmp_path, gzip.compress(b"hello world"), "t.gz")))
    with pytest.raises(NotACaptureError, match="zstd"):
        list(iter_segments(write(tmp_path, b"\x28\xb5\x2f\xfd" + b"\0" * 20, "z.pcap")))


def test_missing_file_is_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list(iter_segments(tmp_path / "nope.pcap"))


def test_cut_mid_record_yields_everything_before(tmp_path: Path) -> None:
    frame = eth(tcp4())
    whole = pcap_file([(T0 + i * 1000, frame) for i in range(5)])
    p = write(tmp_path, whole[:-10], "cut.pcap")
    got = []
    with pytest.raises(TruncatedCaptureError) as info:
        got.extend(iter_segments(p))
    assert len(got) == 4
    offset = 24 + 4 * (16 + len(frame))
    assert (
        str(info.value)
        == f"{p}: cut mid-record ({16 + len(frame) - 10} of {16 + len(frame)} bytes) at byte {offset}"
    )
    assert "\n" not in str(info.value)


def test_cut_in_record_header_and_file_header(tmp_path: Path) -> None:
    whole = pcap_file([(T0, eth(tcp4()))] * 2)
    p = write(tmp_path, whole[: 24 + 16 + 59 + 7], "h.pcap")
    with pytest.raises(TruncatedCaptureError, match=r"header: 7 of 16 bytes\) at byte 99$"):
        list(iter_segments(p))
    p = write(tmp_path, whole[:10], "f.pcap")
    with pytest.raises(TruncatedCaptureError, match="pcap file header"):
        list(iter_segments(p))


def _quick_and_small(fn) -> None:
    tracemalloc.start()
    t = time.perf_counter()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - t < 2
    assert peak < 32 << 20, peak


@pytest.mark.parametrize("length", [0xFFFFFFFF, 0x7FFFFFFF, 300_000])
def test_huge_record_length_raises_quickly(tmp_path: Path, length: int) -> None:
    good = pcap_file([(T0, eth(tcp4()))])
    p = write(tmp_path, good + struct.pack("<IIII", 1, 2, length, length) + b"\0" * 100, "huge.pcap")
    got = []

    def run() -> None:
        with pytest.raises(
            TruncatedCaptureError, match=f"corrupt record length {length} .* at byte {len(good)}"
        ):
            got.extend(iter_segments(p))

    _quick_and_small(run)
    assert len(got) == 1


@pytest.mark.parametrize("length", [0xFFFFFFF0, 13, 0x7FFFFFFC])
def test_pcapng_bad_block_length_raises_quickly(tmp_path: Path, length: int) -> None:
    good = shb() + idb(1) + epb(0, 1, eth(tcp4()))
    p = write(tmp_path, good + struct.pack("<II", 6, length) + b"\0" * 64, "huge.pcapng")
    got = []

    def run() -> None:
        with pytest.raises(
            TruncatedCaptureError, match=f"bad block: type 0x6 with length {length} at byte {len(good)}"
        ):
            got.extend(iter_segments(p))

    _quick_and_small(run)
    assert len(got) == 1


def test_pcapng_damage(tmp_path: Path) -> None:
    base = shb() + idb(1)
    frame = eth(tcp4())
    mismatch = bytearray(epb(0, 1, frame))
    mismatch[-4:] = struct.pack("<I", 999)
    cases = {
        "trailing length mismatch": base + bytes(mismatch),
        "packet of 500 bytes on interface 0": base
        + block(6, struct.pack("<IIIII", 0, 0, 1, 500, 500) + frame),  # caplen larger than the block
        "on interface 3": base + epb(3, 1, frame),  # undefined interface
        "cut mid-record": base + epb(0, 1, frame)[:-5],
        "byte-order magic": base + block(0x0A0D0D0A, b"\0" * 16),
    }
    for i, (why, data) in enumerate(cases.items()):
        p = write(tmp_path, data, f"d{i}.pcapng")
        with pytest.raises(TruncatedCaptureError, match=why):
            list(iter_segments(p))


def test_pcapng_magic_without_byte_order_magic(tmp_path: Path) -> None:
    with pytest.raises(NotACaptureError, match="no byte-order magic"):
        list(iter_segments(write(tmp_path, b"\x0a\x0d\x0d\x0a" + b"x" * 40, "n.pcapng")))


def test_pcapng_unsupported_version(tmp_path: Path) -> None:
    data = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 2, 0, -1))
    with pytest.raises(NotACaptureError, match="pcapng version 2"):
        list(iter_segments(write(tmp_path, data, "v2.pcapng")))


# --- chunk boundaries -----------------------------------------------------------------------------------


def _mixed_frames(n: int) -> list[tuple[int, bytes]]:
    out = []
    for i in range(n):
        payload = bytes([i % 251]) * (i * 37 % 1500)
        pkt = tcp4(payload, seq=i) if i % 3 else tcp6(payload)
        out.append((T0 + i * 1000, eth(pkt) if i % 5 else eth(Dot1Q(vlan=i) / pkt)))
    return out


@pytest.mark.parametrize("chunk", [1, 7, 100, 1013, 4096])
def test_records_straddling_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    frames = _mixed_frames(300)
    p1 = write(tmp_path, pcap_file(frames), "a.pcap")
    ng = shb() + idb(1) + b"".join(epb(0, t // 1000, f) for t, f in frames)
    p2 = write(tmp_path, ng, "a.pcapng")
    p3 = write(tmp_path, gzip.compress(ng), "a.gz")
    for p in (p1, p2, p3):
        ref, ref_stats = read(p)
        assert [s.ts_ns for s in ref] == [t for t, _ in frames]
        monkeypatch.setattr(pcap, "_CHUNK", chunk)
        got, got_stats = read(p)
        monkeypatch.undo()
        assert got == ref
        assert got_stats == ref_stats


# --- merging and stats -----------------------------------------------------------------------------------


def test_merged_by_timestamp_with_summed_stats(tmp_path: Path) -> None:
    a = write(tmp_path, pcap_file([(T0 + t * 1000, eth(tcp4(b"a%d" % t))) for t in (1, 4, 5)]), "a.pcap")
    b_data = (
        shb() + idb(1, tsresol=9) + b"".join(epb(0, T0 + t * 1000, eth(tcp4(b"b%d" % t))) for t in (2, 3, 6))
    )
    b = write(tmp_path, b_data, "b.pcapng")
    stats = CaptureStats()
    got = [s.payload for s in iter_segments_merged([a, b], stats)]
    assert got == [b"a1", b"b2", b"b3", b"a4", b"a5", b"b6"]
    assert (stats.files, stats.packets, stats.tcp_segments) == (2, 6, 6)


def test_stats_are_exact_when_consumer_stops_early(tmp_path: Path) -> None:
    p = write(tmp_path, pcap_file([(T0, eth(tcp4()))] * 10 + [(T0, eth(ARP()))]))
    stats = CaptureStats()
    it = iter_segments(p, stats)
    next(it)
    next(it)
    it.close()
    assert (stats.packets, stats.tcp_segments) == (2, 2)


# --- hostile input never escapes as anything but CaptureError ------------------------------------------

_SEED_PCAP = pcap_file(_mixed_frames(12))
_SEED_PCAPNG = (
    shb()
    + idb(1)
    + idb(113, tsresol=9)
    + b"".join(epb(i % 2, t, f) for i, (t, f) in enumerate(_mixed_frames(8)))
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.sampled_from([_SEED_PCAP, _SEED_PCAPNG]),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=12),
    cut=st.integers(0, 20_000),
)
def test_fuzzed_captures_fail_cleanly(tmp_path: Path, which: bytes, edits, cut: int) -> None:
    data = bytearray(which)
    for pos, val in edits:
        data[pos % len(data)] = val
    p = write(tmp_path, bytes(data[: max(cut, 4)]), "fuzz.bin")
    t = time.perf_counter()
    try:
        for seg in iter_segments(p):
            assert type(seg) is TcpSegment
            assert 0 <= seg.src_port < 65536 and 0 <= seg.seq < 2**32
    except CaptureError:
        pass
    assert time.perf_counter() - t < 2


# --- real captures from other projects --------------------------------------------------------------------

# file -> (TCP packets, sum of TCP payload lengths, first and last timestamp in ns), read off tshark 4.0
PUBLIC_EXPECTED = {
    "arkime_kafka.pcap": (5, 79, 1483521857_249545000, 1483521857_532924000),
    "deepflow_00-produce-v2.pcap": (2, 171, 1479416797_793608000, 1479416797_809715000),
    "deepflow_00-produce-v7-sw8.pcap": (9, 381, 1700037570_339155000, 1700037570_436796000),
    "deepflow_00-produce-v9.pcap": (2, 215, 1726216598_023065000, 1726216598_024684000),
    "deepflow_01-fetch-v12-ok.pcap": (2, 141, 1726216598_025612000, 1726216598_525222000),
    "deepflow_01-fetch-v12-perf.pcap": (2, 98, 1636356237_847084000, 1636356238_351913000),
    "deepflow_01-fetch-v12-unknown.pcap": (2, 98, 1647312695_000000000, 1647312708_000000000),
    "deepflow_11-join-group-v7.pcap": (2, 224, 1715759817_611946000, 1715759817_614902000),
    "deepflow_13-leave-group-v4.pcap": (2, 174, 1715757818_151113000, 1715757818_153852000),
    "deepflow_14-sync-group-v5.pcap": (2, 281, 1715759817_627252000, 1715759817_630174000),
    "deepflow_18-api-versions-v3.pcap": (2, 492, 1636356181_420012000, 1636356181_424953000),
    "deepflow_mixed-with-unsupported.pcap": (9, 462, 1750674724_414568000, 1750674724_915724000),
    "gosniffer_kafka.pcap": (20, 1290, 1594302849_427434000, 1594302849_441648000),
    "ndpi_kafka.pcapng": (41, 4345, 1681844706_292198000, 1703132769_960435569),
}


def public(name: str) -> Path:
    if not PUBLIC.is_dir():
        pytest.skip(f"public captures folder not found ({PUBLIC})")
    return PUBLIC / name


@pytest.mark.parametrize("name", sorted(PUBLIC_EXPECTED))
def test_public_captures(name: str) -> None:
    segs, stats = read(public(name))
    n, total, first, last = PUBLIC_EXPECTED[name]
    assert (len(segs), sum(len(s.payload) for s in segs), segs[0].ts_ns, segs[-1].ts_ns) == (
        n,
        total,
        first,
        last,
    )
    assert (stats.packets, stats.non_tcp, stats.malformed) == (n, 0, 0)


def test_ndpi_interfaces_of_different_precision() -> None:
    """ndpi_kafka.pcapng has a microsecond interface and a nanosecond (if_tsresol=9) one."""
    segs, _ = read(public("ndpi_kafka.pcapng"))
    assert fields(segs[0])[:8] == (
        1681844706_292198000,
        "172.16.17.101",
        49280,
        "172.30.0.237",
        9092,
        3261918481,
        3062477882,
        PSH | ACK,
    )
    assert segs[0].payload[:8] == bytes.fromhex("0000001500120000")  # ApiVersions v0 request
    ns = segs[22]
    assert (ns.ts_ns, ns.src_ip, ns.src_port, ns.dst_port, ns.flags) == (
        1703132756_328165530,
        "127.0.0.1",
        46136,
        9092,
        SYN,
    )
    assert segs[-1].flags == ACK and segs[-2].flags & FIN


def test_gosniffer_odd_wire_lengths_are_not_snapped() -> None:
    """go-sniffer's file records wire lengths *shorter* than captured ones; that is not a snap cut."""
    segs, stats = read(public("gosniffer_kafka.pcap"))  # also: Linux cooked (SLL) link type
    assert stats.snapped == 0
    assert [len(s.payload) for s in segs if s.payload] == [47, 79, 1124, 40]
    flows = Counter((s.src_ip, s.src_port, s.dst_ip, s.dst_port) for s in segs)
    assert flows == {
        ("127.0.0.1", 57372, "127.0.0.1", 9092): 6,
        ("127.0.0.1", 57373, "127.0.0.1", 9092): 6,
        ("127.0.0.1", 9092, "127.0.0.1", 57372): 4,
        ("127.0.0.1", 9092, "127.0.0.1", 57373): 4,
    }


@pytest.mark.real
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not on PATH")
def test_against_tshark(tmp_path: Path) -> None:
    """Every field of every segment, for the public captures and hand-made link types, against tshark."""
    files = [public(n) for n in sorted(PUBLIC_EXPECTED)]
    # All hand-made link types in one pcapng, one interface each: tshark checks the multi-interface path too.
    cases = [(link, frame(tcp4())) for link, frame in LINK_CASES.values()]
    cases += [(link, frame(tcp6())) for link, frame in LINK6_CASES.values()]
    ng = shb() + b"".join(idb(link, tsresol=9) for link, _ in cases)
    ng += b"".join(epb(i, T0 + i, frame) for i, (_, frame) in enumerate(cases))
    files.append(write(tmp_path, ng, "links.pcapng"))
    for f in files:
        out = subprocess.run(
            ["tshark", "-r", str(f), "-o", "tcp.relative_sequence_numbers:FALSE", "-Y", "tcp", "-T", "fields"]
            + [
                x
                for e in ("ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport")
                for x in ("-e", e)
            ]
            + ["-e", "tcp.seq", "-e", "tcp.ack", "-e", "tcp.flags", "-e", "tcp.len", "-E", "separator=,"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        expect = []
        for line in out:
            s4, s6, sp, d4, d6, dp, seq, ack, fl, ln = line.split(",")
            expect.append(
                (s4 or s6, int(sp), d4 or d6, int(dp), int(seq), int(ack or 0), int(fl, 16), int(ln))
            )
        got = [
            (s.src_ip, s.src_port, s.dst_ip, s.dst_port, s.seq, s.ack, s.flags, len(s.payload))
            for s in read(f)[0]
        ]
        assert expect, f.name
        assert got == expect, f.name
