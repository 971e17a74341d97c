"""``kwire decode``: capture files in, a Parquet dataset out, a summary on the terminal."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from decoder.connection import DEFAULT_FRAME_LIMIT
from decoder.pcap import CaptureError, CaptureStats, NotACaptureError, iter_segments_merged
from decoder.tcp import TcpReassembler
from kwire.dataset import DatasetWriter
from kwire.pipeline import DecodeSummary, Row, StreamDecoder

__all__ = ["DecodeResult", "decode", "decode_captures"]


@dataclass
class DecodeResult:
    """Everything a decode run counted, and the capture error that stopped it, if any."""

    summary: DecodeSummary
    capture: CaptureStats
    error: CaptureError | None


def source_name(paths: Sequence[str | os.PathLike[str]]) -> str:
    """The ``source`` column: the capture file name (names joined by '+' when merged)."""
    return "+".join(Path(p).name for p in paths)


def decode_captures(
    paths: Sequence[str | os.PathLike[str]],
    on_exchange: Callable[[Row], None],
    on_connection: Callable[[Row], None],
    *,
    forced_ports: Iterable[int] = (),
    frame_limit: int = DEFAULT_FRAME_LIMIT,
    progress: Callable[[CaptureStats], None] | None = None,
) -> DecodeResult:
    """Decode capture files (merged by time) into rows handed to the two callbacks.

    A damaged capture does not raise: every row before the damage is delivered, open
    connections are closed as ``open_at_end``, and the error is returned in the result.
    """
    capture = CaptureStats()
    reassembler = TcpReassembler()
    streams = StreamDecoder(source_name(paths), on_exchange, on_connection,
                            forced_ports=forced_ports, frame_limit=frame_limit)
    feed = streams.feed
    last_ts = 0
    error: CaptureError | None = None
    try:
        for count, segment in enumerate(iter_segments_merged(paths, capture), 1):
            last_ts = segment.ts_ns
            for event in reassembler.feed(segment):
                feed(event)
            if progress is not None and count % 20_000 == 0:
                progress(capture)
    except CaptureError as exc:
        error = exc
    for event in reassembler.finish(last_ts):
        feed(event)
    return DecodeResult(streams.summary, capture, error)


def _print_summary(result: DecodeResult, out_dir: Path, console) -> None:
    from rich.table import Table

    summary, capture = result.summary, result.capture
    connections = ", ".join(f"{n} {kind}" for kind, n in summary.connections.most_common()) or "none"
    console.print(f"[bold]{capture.packets:,}[/] packets ({capture.tcp_segments:,} TCP), "
                  f"connections: {connections}")
    statuses = ", ".join(f"{n:,} {status}" for status, n in summary.statuses.most_common()) or "none"
    console.print(f"[bold]{summary.exchanges:,}[/] exchanges: {statuses}")
    if summary.resyncs or summary.gap_bytes or summary.skipped_bytes:
        console.print(f"capture gaps: {summary.gap_bytes:,} bytes; resyncs: {summary.resyncs}; "
                      f"bytes skipped finding frame boundaries: {summary.skipped_bytes:,}")
    skipped_packets = capture.non_tcp + capture.fragments + capture.unknown_link_type + capture.malformed
    if skipped_packets:
        console.print(f"packets not decoded: {capture.non_tcp:,} not TCP, {capture.fragments:,} fragments, "
                      f"{capture.unknown_link_type:,} unknown link type, {capture.malformed:,} malformed")
    if summary.apis:
        table = Table(title="top APIs", show_edge=False)
        table.add_column("api")
        table.add_column("exchanges", justify="right")
        for name, n in summary.apis.most_common(8):
            table.add_row(name, f"{n:,}")
        console.print(table)
    if summary.errors:
        console.print("error codes seen: " + ", ".join(f"{name} x{n:,}" for name, n in summary.errors.most_common(10)))
    console.print(f"dataset: {out_dir}")


def decode(
    files: Annotated[list[Path], typer.Argument(help="pcap / pcapng files (gzip ok); merged by time")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="dataset directory [default: <first file>.kwire]")] = None,
    port: Annotated[list[int] | None, typer.Option("--port", help="treat this TCP port as Kafka (repeatable)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing dataset directory")] = False,
    frame_limit: Annotated[int, typer.Option(help="largest Kafka frame accepted, bytes")] = DEFAULT_FRAME_LIMIT,
) -> None:
    """Decode Kafka traffic in capture files into a Parquet dataset (exchanges + connections)."""
    from rich.console import Console

    console = Console(stderr=True)
    for path in files:
        if not path.is_file():
            _fail(f"kwire decode: {path}: no such file")
    out_dir = out or Path(str(files[0]) + ".kwire")
    if out_dir.exists():
        if not overwrite:
            _fail(f"kwire decode: {out_dir} exists (use --overwrite to replace it)")
        shutil.rmtree(out_dir)
    total_bytes = sum(path.stat().st_size for path in files)
    writer = DatasetWriter(out_dir)
    progress_cb = None
    bar = None
    if console.is_terminal:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                       TimeRemainingColumn(), console=console, transient=True)
        task = bar.add_task("decoding", total=total_bytes)
        bar.start()

        def progress_cb(stats: CaptureStats) -> None:
            bar.update(task, completed=min(stats.bytes, total_bytes))

    try:
        result = decode_captures(files, writer.exchanges.append, writer.connections.append,
                                 forced_ports=port or (), frame_limit=frame_limit, progress=progress_cb)
    finally:
        if bar is not None:
            bar.stop()
        writer.close()
    if isinstance(result.error, NotACaptureError) and result.capture.packets == 0:
        shutil.rmtree(out_dir, ignore_errors=True)
        _fail(f"kwire decode: {result.error}")
    _print_summary(result, out_dir, console)
    if result.error is not None:
        _fail(f"kwire decode: {result.error} (kept the {result.summary.exchanges:,} exchanges decoded before it)")


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    raise typer.Exit(2)
