"""Time reading + TCP reassembly of a capture (the front half of `kwire decode`).

    python bench/read_capture.py [CAPTURE ...] [--size-mb 300] [--repeat 1] [--dpkt] [--no-tshark]

With no capture given, synthesizes a ~300 MB pcap of Kafka-like traffic (Ethernet/IPv4/TCP, MSS-sized
segments for big produce/fetch payloads, small metadata/heartbeat exchanges, delayed ACKs, handshakes and
FINs) in a temporary folder. Prints packets/s, MB/s and peak RSS for kwire's reader alone and for reader +
reassembler; with --dpkt also for a dpkt-object-per-packet reader (the alternative the hand-rolled reader
was measured against); if `tshark` is on PATH, times `tshark -r FILE -T fields -e frame.number` on the same
file and prints the speed ratio.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from decoder.pcap import CaptureStats, iter_segments
from decoder.tcp import StreamData, TcpReassembler

MSS = 1448
_ETH = bytes.fromhex("020000000001020000000002") + b"\x08\x00"


def _packet(src: int, sport: int, dst: int, dport: int, seq: int, ack: int, flags: int, payload) -> bytes:
    """One Ethernet/IPv4/TCP frame with a 12-byte timestamp option, as Linux sends them."""
    tcp = struct.pack(
        "!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 8 << 4, flags, 502, 0, 0
    ) + bytes.fromhex("0101080a0000000100000001")
    ip = struct.pack("!BBHHHBBHII", 0x45, 0, 20 + len(tcp) + len(payload), 0, 0x4000, 64, 6, 0, src, dst)
    return _ETH + ip + tcp + payload


class _Conn:
    def __init__(self, rng: random.Random, i: int) -> None:
        self.cip = 0x0A000000 | (1 << 8) | (i % 250 + 2)
        self.sip = 0x0A000000 | (0 << 8) | (i % 3 + 1)
        self.cport = 32768 + i
        self.sport = 9092
        self.cseq = rng.getrandbits(32)
        self.sseq = rng.getrandbits(32)
        self.corr = 0


def synthesize(path: Path, size_mb: int, seed: int = 1) -> int:
    """Write a Kafka-like pcap of about size_mb MB to path; return the packet count."""
    rng = random.Random(seed)
    pool = memoryview(rng.randbytes(4 << 20))
    target = size_mb << 20
    written = 24
    packets = 0
    ts = 1_700_000_000 * 1_000_000
    out: list[bytes] = []
    conns = [_Conn(rng, i) for i in range(64)]

    def emit(frame: bytes) -> None:
        nonlocal ts, written, packets
        ts += rng.randrange(2, 40)
        out.append(struct.pack("<IIII", ts // 1_000_000, ts % 1_000_000, len(frame), len(frame)) + frame)
        written += 16 + len(frame)
        packets += 1

    def handshake(c: _Conn) -> None:
        emit(_packet(c.cip, c.cport, c.sip, c.sport, c.cseq, 0, 0x02, b""))
        emit(_packet(c.sip, c.sport, c.cip, c.cport, c.sseq, c.cseq + 1, 0x12, b""))
        c.cseq += 1
        c.sseq += 1
        emit(_packet(c.cip, c.cport, c.sip, c.sport, c.cseq, c.sseq, 0x10, b""))

    def send(c: _Conn, client: bool, size: int) -> None:
        """A Kafka message: 4-byte size + api key/version/correlation id + body, MSS-segmented."""
        hdr = struct.pack("!ihhi", size - 4, 0 if size > 4000 else 3, 9, c.corr)
        off = rng.randrange(0, len(pool) - size)
        body = hdr + pool[off : off + size - len(hdr)].tobytes()
        for i, k in enumerate(range(0, size, MSS)):
            chunk = body[k : k + MSS]
            if client:
                emit(_packet(c.cip, c.cport, c.sip, c.sport, c.cseq, c.sseq, 0x18, chunk))
                c.cseq += len(chunk)
            else:
                emit(_packet(c.sip, c.sport, c.cip, c.cport, c.sseq, c.cseq, 0x18, chunk))
                c.sseq += len(chunk)
            if i % 2 == 1:  # delayed ACK every second segment
                if client:
                    emit(_packet(c.sip, c.sport, c.cip, c.cport, c.sseq, c.cseq, 0x10, b""))
                else:
                    emit(_packet(c.cip, c.cport, c.sip, c.sport, c.cseq, c.sseq, 0x10, b""))

    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
        for c in conns:
            handshake(c)
        while written < target:
            c = conns[rng.randrange(len(conns))]
            c.corr += 1
            kind = rng.random()
            if kind < 0.45:  # produce: 1-64 KB batch, small response
                send(c, True, rng.randrange(1000, 65536))
                send(c, False, rng.randrange(60, 200))
            elif kind < 0.9:  # fetch: small request, 0-256 KB response
                send(c, True, rng.randrange(80, 300))
                send(c, False, rng.randrange(100, 262144))
            else:  # metadata / heartbeat / offset commit
                send(c, True, rng.randrange(40, 400))
                send(c, False, rng.randrange(40, 2000))
            if len(out) > 4096:
                f.write(b"".join(out))
                out.clear()
        for c in conns:
            emit(_packet(c.cip, c.cport, c.sip, c.sport, c.cseq, c.sseq, 0x11, b""))
            emit(_packet(c.sip, c.sport, c.cip, c.cport, c.sseq, c.cseq + 1, 0x11, b""))
            emit(_packet(c.cip, c.cport, c.sip, c.sport, c.cseq + 1, c.sseq + 1, 0x10, b""))
        f.write(b"".join(out))
    return packets


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_read(path: Path) -> tuple[int, int]:
    """kwire reader alone: (segments, payload bytes)."""
    n = nbytes = 0
    for seg in iter_segments(path):
        n += 1
        nbytes += len(seg.payload)
    return n, nbytes


def run_reassemble(path: Path) -> tuple[int, int]:
    """kwire reader + reassembler: (events, delivered bytes)."""
    r = TcpReassembler()
    feed = r.feed
    nev = nbytes = 0
    last = 0
    for seg in iter_segments(path):
        last = seg.ts_ns
        for ev in feed(seg):
            nev += 1
            if ev.__class__ is StreamData:
                nbytes += len(ev.data)
    for ev in r.finish(last):
        nev += 1
        if ev.__class__ is StreamData:
            nbytes += len(ev.data)
    return nev, nbytes


def run_dpkt(path: Path) -> tuple[int, int]:
    """The alternative: a dpkt object per layer per packet."""
    import dpkt

    n = nbytes = 0
    with open(path, "rb") as f:
        for _ts, buf in dpkt.pcap.Reader(f):
            eth = dpkt.ethernet.Ethernet(buf)
            ip = eth.data
            if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP):
                n += 1
                nbytes += len(ip.data.data)
    return n, nbytes


def _timed(
    label: str, fn: Callable[[Path], tuple[int, int]], path: Path, packets: int, size: int
) -> tuple[float, float]:
    """Run fn once; print and return (wall seconds, CPU seconds)."""
    c0, t0 = time.process_time(), time.perf_counter()
    a, b = fn(path)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"{label:<24} {dt:6.2f} s wall {cpu:6.2f} s CPU  {packets / dt / 1e3:7.0f} kpackets/s"
        f" {size / dt / 1e6:7.1f} MB/s  ({a} items, {b} payload bytes)  peak RSS {_peak_rss_mb():.0f} MB"
    )
    return dt, cpu


def _best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("captures", nargs="*", type=Path)
    ap.add_argument("--size-mb", type=int, default=300, help="size of the synthesized capture")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dpkt", action="store_true", help="also time a dpkt-based reader")
    ap.add_argument("--no-tshark", action="store_true")
    args = ap.parse_args(argv)

    tmp = None
    paths = args.captures
    if not paths:
        tmp = tempfile.mkdtemp(prefix="kwire-bench-")
        p = Path(tmp) / "synthetic-kafka.pcap"
        t0 = time.perf_counter()
        count = synthesize(p, args.size_mb)
        print(
            f"synthesized {p} ({p.stat().st_size / 1e6:.0f} MB, {count} packets) in {time.perf_counter() - t0:.1f} s"
        )
        paths = [p]
    try:
        for path in paths:
            stats = CaptureStats()
            for _ in iter_segments(path, stats):
                pass
            packets, size = stats.packets, path.stat().st_size
            print(f"\n{path}: {size / 1e6:.1f} MB, {packets} packets ({stats.tcp_segments} TCP)")
            rep = range(args.repeat)
            best = _best([_timed("kwire read", run_read, path, packets, size) for _ in rep])
            best_r = _best(
                [_timed("kwire read+reassemble", run_reassemble, path, packets, size) for _ in rep]
            )
            if args.dpkt:
                d = _best([_timed("dpkt read", run_dpkt, path, packets, size) for _ in rep])
                print(
                    f"hand-rolled reader vs dpkt objects: {d[0] / best[0]:.1f}x faster ({d[1] / best[1]:.1f}x CPU)"
                )
            tshark = shutil.which("tshark")
            if tshark and not args.no_tshark:
                cmd = [tshark, "-r", str(path), "-T", "fields", "-e", "frame.number"]
                runs = []
                for _ in rep:
                    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                    dt = time.perf_counter() - t0
                    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
                    runs.append((dt, cpu))
                    print(
                        f"{'tshark -T fields':<24} {dt:6.2f} s wall {cpu:6.2f} s CPU  {packets / dt / 1e3:7.0f}"
                        f" kpackets/s {size / dt / 1e6:7.1f} MB/s"
                    )
                t = _best(runs)
                print(
                    f"kwire is faster than tshark by: read {t[0] / best[0]:.2f}x wall ({t[1] / best[1]:.2f}x CPU),"
                    f" read+reassemble {t[0] / best_r[0]:.2f}x wall ({t[1] / best_r[1]:.2f}x CPU)"
                )
            elif not args.no_tshark:
                print("tshark not on PATH: no comparison")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
