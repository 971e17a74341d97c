"""Where ``kwire decode``'s time goes, stage by stage, on one capture (one process, no workers).

    python bench/decode_profile.py [CAPTURE] [--cprofile N]

CAPTURE defaults to the benchmark's bulk capture (``bench/decode_captures.py bulk``). Each stage is
run on its own, from the start of the file, and timed in CPU seconds (``time.process_time``), so
the differences between lines are what each stage adds:

* import: starting a fresh interpreter and importing what ``kwire decode`` imports;
* read: ``decoder.pcap.iter_segments`` alone (pcap records to TCP segments);
* + tcp: and ``decoder.tcp.TcpReassembler``;
* + decode: and ``kwire.pipeline.StreamDecoder`` (Kafka framing, compiled layouts, row values);
* of which rows: ``kwire.rows.ExchangeRows.row`` on the same events (``decoder.extract`` inside);
* arrow: converting the exchange rows to Arrow as ``kwire.dataset`` does (row groups of 64,000);
* parquet: writing those batches with zstd, as the dataset writer does.

Per-exchange microseconds are printed beside each. ``--cprofile N`` also runs the whole decode
(``_decode_part``, as ``kwire decode -j 1`` does) under cProfile and prints the top N functions by
own time (cProfile's overhead inflates small functions: use it for the ranking, the stages for
the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import decode_captures  # noqa: E402 - bench/ is the script's own folder

from decoder.events import ResponseReceived  # noqa: E402
from decoder.pcap import iter_segments  # noqa: E402
from decoder.tcp import TcpReassembler  # noqa: E402
from kwire.pipeline import StreamDecoder  # noqa: E402
from kwire.rows import ConnectionInfo, ExchangeRows  # noqa: E402


def _cpu(fn: Any) -> tuple[float, Any]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def import_seconds() -> float:
    """CPU seconds a fresh interpreter spends starting and importing what ``kwire decode`` imports."""
    code = (
        "from kwire.arrowstart import import_pyarrow_without_numpy, skip_pandas_probe\n"
        "import_pyarrow_without_numpy()\n"  # as `kwire decode` does (kwire.cli.entry)
        "skip_pandas_probe()\n"
        "import kwire.cli, kwire.decode_command, kwire.dataset, decoder.connection, kwire.pipeline"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stages(path: Path) -> None:
    """Print each stage's CPU seconds and microseconds per exchange."""

    def read() -> int:
        return sum(1 for _ in iter_segments(path))

    def tcp() -> int:
        reassembler = TcpReassembler()
        n = 0
        for segment in iter_segments(path):
            for _event in reassembler.feed(segment):
                n += 1
        return n

    rows: list[dict[str, Any]] = []
    events: list[Any] = []

    def decode(keep_events: bool = False) -> int:
        reassembler = TcpReassembler()
        streams = StreamDecoder(path.name, rows.append, lambda row: None)
        if keep_events:  # (an untimed pass: holding every event slows the decode down)
            drain = streams._drain

            def keep(conn: Any, new: list[Any]) -> None:
                events.extend(new)
                drain(conn, new)

            streams._drain = keep  # type: ignore[method-assign]
        feed = streams.feed
        last = 0
        for segment in iter_segments(path):
            last = segment.ts_ns
            for event in reassembler.feed(segment):
                feed(event)
        for event in reassembler.finish(last):
            feed(event)
        return streams.summary.exchanges

    def rows_only() -> int:
        builder = ExchangeRows(ConnectionInfo(path.name, "c", None, None, None, None))
        return sum(1 for event in events if builder.row(event) is not None)

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kwire.rowarrow import compiled_plan, record_batch
    from kwire.schema import EXCHANGES_SCHEMA

    schema = EXCHANGES_SCHEMA.remove(EXCHANGES_SCHEMA.get_field_index("date"))
    batches: list[Any] = []

    def arrow() -> int:
        plan = compiled_plan(schema)
        for start in range(0, len(rows), 64_000):
            batches.append(record_batch(rows[start : start + 64_000], schema, plan))
        return len(batches)

    def parquet() -> int:
        with (
            tempfile.TemporaryDirectory() as tmp,
            pq.ParquetWriter(Path(tmp) / "x.parquet", schema, compression="zstd") as writer,
        ):
            writer.write_table(pa.Table.from_batches(batches, schema=schema), row_group_size=64_000)
        return len(batches)

    imports = import_seconds()
    t_read, segments = _cpu(read)
    t_tcp, _ = _cpu(tcp)
    t_decode, exchanges = _cpu(decode)
    rows.clear()
    decode(keep_events=True)
    t_rows, _ = _cpu(rows_only)
    t_arrow, _ = _cpu(arrow)
    t_parquet, _ = _cpu(parquet)
    per = 1e6 / max(exchanges, 1)
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB, {segments:,} TCP segments, {exchanges:,} exchanges")
    lines = [
        ("start + import", imports),
        ("read", t_read),
        ("+ tcp (adds)", t_tcp - t_read),
        ("+ decode (adds)", t_decode - t_tcp),
        ("  of which rows/extract", t_rows),
        ("arrow conversion", t_arrow),
        ("parquet write", t_parquet),
    ]
    total = imports + t_decode + t_arrow + t_parquet
    for label, seconds in lines:
        print(
            f"  {label:28} {seconds:6.2f} s  {seconds * per:6.1f} us/exchange  {100 * seconds / total:5.1f}%"
        )
    print(f"  {'total':28} {total:6.2f} s  {total * per:6.1f} us/exchange")
    responses = sum(1 for event in events if type(event) is ResponseReceived)
    print(f"  ({responses:,} request/response pairs among {len(events):,} decoder events)")


def profile(path: Path, top: int) -> None:
    """The whole decode of one process under cProfile: the top functions by own time."""
    from kwire.decode_command import _decode_part

    with tempfile.TemporaryDirectory() as tmp:
        profiler = cProfile.Profile()
        profiler.enable()
        _decode_part([path], Path(tmp), 0, 1, [], 100 << 20, None, None)
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    from kwire.arrowstart import import_pyarrow_without_numpy, skip_pandas_probe
    from kwire.runtime import tune_gc

    tune_gc()  # as the kwire command does
    import_pyarrow_without_numpy()  # as `kwire decode` does
    skip_pandas_probe()  # as `kwire decode` does (else the arrow stage holds pyarrow's pandas import)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capture", nargs="?", type=Path, help="default: the benchmark's bulk capture")
    ap.add_argument("--cprofile", type=int, metavar="N", help="also print cProfile's top N functions")
    args = ap.parse_args(argv)
    path = args.capture or decode_captures.ensure("bulk")
    stages(path)
    if args.cprofile:
        profile(path, args.cprofile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
