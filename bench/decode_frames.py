"""How fast the sans-io stream decoder turns bytes into events, on real Kafka frames.

Takes the request/response frames of the bundled real captures (kafka-python, confluent-kafka,
aiokafka and kcat against Tansu: produce, fetch, metadata, heartbeat, offset commit, ...),
rewrites correlation ids so copies stay distinct, and feeds the resulting streams through
``KafkaConnection`` in 64 KiB chunks, one process, one core. Prints frames/s and MB/s for the
whole mix and for small frames only (< 200 bytes).

    python bench/decode_frames.py [--frames 400000] [--capture captures/tansu-mixed.pcap ...]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from decoder.connection import KafkaConnection  # noqa: E402
from decoder.pcap import iter_segments  # noqa: E402
from decoder.tcp import StreamData, TcpReassembler  # noqa: E402
from kwire.runtime import tune_gc  # noqa: E402


def frames_of(stream: bytes) -> list[bytes]:
    out, at = [], 0
    while at + 4 <= len(stream):
        size = struct.unpack_from(">i", stream, at)[0]
        if size < 0 or at + 4 + size > len(stream):
            break
        out.append(stream[at : at + 4 + size])
        at += 4 + size
    return out


def exchanges(paths: list[Path]) -> list[tuple[bytes, bytes | None]]:
    """(request frame, response frame or None) pairs from the captures, matched by correlation id."""
    pairs = []
    for path in paths:
        reassembler = TcpReassembler()
        streams: dict[int, list[bytearray]] = {}
        for segment in iter_segments(path):
            for event in reassembler.feed(segment):
                if isinstance(event, StreamData):
                    streams.setdefault(event.conn_id, [bytearray(), bytearray()])[event.direction] += (
                        event.data
                    )
        for up, down in streams.values():
            responses = {struct.unpack_from(">i", f, 4)[0]: f for f in frames_of(bytes(down))}
            for request in frames_of(bytes(up)):
                corr = struct.unpack_from(">i", request, 8)[0]
                pairs.append((request, responses.get(corr)))
    return pairs


def build_streams(pairs: list[tuple[bytes, bytes | None]], total_frames: int) -> tuple[bytes, bytes, int]:
    up, down = bytearray(), bytearray()
    frames = 0
    corr = 0
    while frames < total_frames:
        for request, response in pairs:
            corr += 1
            up += request[:8] + struct.pack(">i", corr) + request[12:]
            frames += 1
            if response is not None:
                down += response[:4] + struct.pack(">i", corr) + response[8:]
                frames += 1
    return bytes(up), bytes(down), frames


def run(up: bytes, down: bytes, chunk: int = 65536) -> tuple[float, int]:
    conn = KafkaConnection()
    events = 0
    start = time.process_time()  # CPU time: the figure that does not depend on other load
    # Interleave so responses follow their requests, as on the wire.
    step = chunk
    for at in range(0, max(len(up), len(down)) + step, step):
        conn.receive_data(0, up[at : at + step], at)
        events += len(conn.events())
        conn.receive_data(1, down[at : at + step], at)
        events += len(conn.events())
    conn.receive_close(1 << 62)
    events += len(conn.events())
    return time.process_time() - start, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400_000)
    parser.add_argument("--capture", type=Path, action="append")
    args = parser.parse_args()
    paths = args.capture or sorted((REPO / "captures").glob("tansu-*.pcap"))
    pairs = exchanges(paths)
    pairs = [(q, r) for q, r in pairs if r is not None]  # unanswered ones would pile up as pending
    small = [(q, r) for q, r in pairs if len(q) < 200 and len(r) < 200]
    print(
        f"{len(pairs)} answered real exchanges from {len(paths)} captures; "
        f"{len(small)} with both frames < 200 bytes"
    )
    streams = {
        label: build_streams(chosen, args.frames)
        for label, chosen in (("real mix", pairs), ("small frames", small))
    }
    for gc_setting in ("default GC", "tuned GC (kwire.runtime.tune_gc, as the commands run)"):
        if gc_setting.startswith("tuned"):
            tune_gc()
        print(gc_setting)
        for label, (up, down, frames) in streams.items():
            run(up[: 1 << 20], down[: 1 << 20])  # warm up: compile the layouts used
            seconds, _events = run(up, down)
            megabytes = (len(up) + len(down)) / 1e6
            print(
                f"  {label:>12}: {frames:,} frames, {megabytes:,.1f} MB in {seconds:.2f} s CPU -> "
                f"{frames / seconds:,.0f} frames/s, {megabytes / seconds:,.1f} MB/s"
            )


if __name__ == "__main__":
    main()
