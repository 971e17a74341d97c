"""``kwire decode``: capture files in, a Parquet dataset out, a summary on the terminal.

``decode_captures`` is the whole decode with no I/O of its own besides reading the captures:
segments (``decoder.pcap``) -> TCP reassembly (``decoder.tcp``) -> ``kwire.pipeline.StreamDecoder``
-> rows handed to two callbacks. The Spark decode job and the tests call it directly.

``decode`` is the command. What it promises a user:

* Every file is checked before anything is written: a missing, unreadable or non-capture file (also
  the second of several) stops it with one line on stderr and exit code 2, and no dataset.
* The dataset is built in a temporary folder beside the target and moved into place at the end, so
  an existing dataset is replaced (``--overwrite``) only by a complete new one, and ``--overwrite``
  refuses to delete a folder that is not a kwire dataset.
* A capture that turns out damaged (cut mid-packet, corrupt record) keeps every row decoded before
  the damage: summary on stdout, one line on stderr saying what happened, exit code 2.
* Ctrl-C keeps what was decoded so far (exit code 130). Any other failure (disk full, ...) is one
  line on stderr and exit code 2, never a traceback, and leaves no partial dataset behind.
* The summary goes to stdout (``--quiet`` drops it); a progress bar shows on stderr when it is a
  terminal, only.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from decoder.connection import DEFAULT_FRAME_LIMIT
from decoder.pcap import (
    CaptureError,
    CaptureStats,
    NotACaptureError,
    SkipPairs,
    TcpSegment,
    iter_segments,
)
from decoder.tcp import TcpReassembler
from kwire.pipeline import DecodeSummary, Row, StreamDecoder
from kwire.shards import ConnectionShards, ConnectionWeights, plan_parts

if TYPE_CHECKING:
    from kwire.dataset import DatasetWriter

__all__ = ["DecodeResult", "decode", "decode_captures", "source_names"]

#: Exit codes of ``kwire decode``.
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 2, 130
_PROGRESS_EVERY = 4096  # segments between progress callbacks
_DATASET_PARTS = {"exchanges", "connections"}


@dataclass
class DecodeResult:
    """Everything a decode run counted, and the capture error that stopped it, if any."""

    summary: DecodeSummary
    capture: CaptureStats
    error: CaptureError | None


def source_names(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The ``source`` of each capture: its file name, or as many of its parent folders as it takes to
    tell it from the others (``001-broker-drops-out/capture.pcap.gz``), so that every file decoded in
    one run keeps a source of its own."""
    parts = [Path(p).absolute().parts for p in paths]
    depth = [1] * len(parts)
    while True:
        names = ["/".join(pp[-d:]) for pp, d in zip(parts, depth, strict=True)]
        clash = {n for n in names if names.count(n) > 1}
        grow = [i for i, n in enumerate(names) if n in clash and depth[i] < len(parts[i])]
        if not grow:
            return names
        for i in grow:
            depth[i] += 1


def decode_captures(
    paths: Sequence[str | os.PathLike[str]],
    on_exchange: Callable[[Row], None],
    on_connection: Callable[[Row], None],
    *,
    forced_ports: Iterable[int] = (),
    frame_limit: int = DEFAULT_FRAME_LIMIT,
    progress: Callable[[CaptureStats], None] | None = None,
    shard: tuple[int, int] | None = None,
    shard_plan: dict[int, int] | None = None,
) -> DecodeResult:
    """Decode capture files into rows handed to the two callbacks.

    Each file is a run of its own: its own ``source`` (:func:`source_names`), its own TCP
    reassembly (the same 4-tuple in two files is two connections); the files' segments are
    merged by time, so rows come out in time order across files.

    A damaged capture does not raise: every row before the damage is delivered, open
    connections are closed as ``open_at_end``, and the error is returned in the result (so is
    an I/O error reading a file). Errors raised by the callbacks propagate.

    ``shard=(k, n)`` decodes only the connections of part k of n (see ``kwire.shards``; every
    part is given the same ``shard_plan``, :func:`plan_shards`); the n parts together give
    exactly the rows of the whole.
    """
    capture = CaptureStats()
    names = source_names(paths)
    runs = [
        (
            TcpReassembler(),
            StreamDecoder(
                name, on_exchange, on_connection, forced_ports=forced_ports, frame_limit=frame_limit
            ),
        )
        for name in names
    ]
    last_ts = [0] * len(runs)
    error: CaptureError | None = None
    part, parts = shard or (0, 1)
    shards = ConnectionShards(parts, shard_plan) if parts > 1 else None
    try:
        if len(runs) == 1:  # the common case, without tagging each segment with its file
            reassembler, streams = runs[0]
            rfeed, feed = reassembler.feeder(), streams.feed
            # the other parts' planned connections: the compiled pcap loop need not make their segments
            skip = (
                SkipPairs({pair for pair, p in shard_plan.items() if p != part})
                if shards and shard_plan
                else None
            )
            segments = _read_errors_as_damage(iter_segments(paths[0], capture, skip), names[0])
            top = 0
            try:
                for count, segment in enumerate(segments, 1):
                    ts = segment.ts_ns
                    if ts > top:
                        top = ts
                    if shards is None or shards.part_of(segment) == part:
                        for event in rfeed(segment):
                            feed(event)
                    if progress is not None and count % _PROGRESS_EVERY == 0:
                        progress(capture)
            finally:  # damage too ends the capture at the last time seen
                last_ts[0] = max(top, skip.last_ts_ns) if skip is not None else top
        else:
            feeds = [(reassembler.feeder(), streams.feed) for reassembler, streams in runs]
            for count, (index, segment) in enumerate(_merged(paths, names, capture), 1):
                ts = segment.ts_ns
                if ts > last_ts[index]:
                    last_ts[index] = ts
                if shards is None or shards.part_of(segment) == part:
                    rfeed, feed = feeds[index]
                    for event in rfeed(segment):
                        feed(event)
                if progress is not None and count % _PROGRESS_EVERY == 0:
                    progress(capture)
    except CaptureError as exc:
        error = exc
    summary = DecodeSummary()
    for (reassembler, streams), end in zip(runs, last_ts, strict=True):
        for event in reassembler.finish(end):
            streams.feed(event)
        summary.add(streams.summary)
    if progress is not None:
        progress(capture)
    return DecodeResult(summary, capture, error)


def _merged(
    paths: Sequence[str | os.PathLike[str]], names: Sequence[str], capture: CaptureStats
) -> Iterator[tuple[int, TcpSegment]]:
    """(file index, segment) of several captures merged by time (each file in its own order; at
    equal times the earlier file first). An error in any file ends the merge when it is reached."""

    def tagged(index: int) -> Iterator[tuple[int, int, TcpSegment]]:
        for segment in _read_errors_as_damage(iter_segments(paths[index], capture), names[index]):
            yield segment.ts_ns, index, segment

    for _, index, segment in heapq.merge(*(tagged(i) for i in range(len(paths))), key=_time_and_file):
        yield index, segment


def _time_and_file(item: tuple[int, int, TcpSegment]) -> tuple[int, int]:
    return item[0], item[1]


def _read_errors_as_damage(segments: Iterator[TcpSegment], name: str) -> Iterator[TcpSegment]:
    """The segments; a file that cannot be read on (I/O error) ends them like damage does. (Only
    reading is covered: an OSError raised by a callback, such as a full disk, propagates.)"""
    try:
        yield from segments
    except OSError as exc:
        raise CaptureError(f"{exc.filename or name}: read error: {exc.strerror or exc}") from exc


# ---------------------------------------------------------------------------------------------------------
# the command


class _WorkerError(Exception):
    """A worker process failed; the message names the exception it raised."""


class _Failure(Exception):
    """A problem the command reports in one line and exits on."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _ending_notice(quiet: bool) -> Callable[[], None]:
    """What the first Ctrl-C of a live capture prints while the capture program is ended."""

    def notice() -> None:
        if not quiet:
            print(
                "kwire decode: stopping: reading what the capture still holds (Ctrl-C again to stop now)",
                file=sys.stderr,
            )

    return notice


def _check_capture(path: Path) -> None:
    """Stop on a file that cannot be decoded at all; damage further in is found (and kept) later."""
    if not path.exists():
        raise _Failure(f"{path}: no such file")
    if path.is_dir():
        raise _Failure(f"{path}: is a directory, not a capture file")
    segments = iter_segments(path)
    try:
        next(segments, None)
    except NotACaptureError as exc:
        raise _Failure(str(exc)) from None
    except CaptureError:
        pass  # damaged after its start: decode what is there
    except OSError as exc:
        raise _Failure(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        segments.close()


def _prepare_output(out_dir: Path, overwrite: bool, defaulted: bool = False) -> Path:
    """Check the target and return the temporary folder to build the dataset in."""
    if out_dir.exists() or out_dir.is_symlink():
        if not out_dir.is_dir():
            raise _Failure(f"{out_dir} exists and is not a directory")
        if not overwrite:
            raise _Failure(f"{out_dir} exists (use --overwrite to replace it)")
        foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in _DATASET_PARTS)
        if foreign:
            raise _Failure(
                f"{out_dir} is not a kwire dataset (it holds {', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); not replacing it"
            )
    parent = out_dir.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _Failure(f"cannot create {parent}: {exc.strerror or exc}") from None
    staging = parent / f".{out_dir.name}.kwire-tmp-{os.getpid()}"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    except OSError as exc:
        hint = " (use -o to write the dataset elsewhere)" if defaulted else ""
        raise _Failure(f"cannot create {out_dir}: {exc.strerror or exc}{hint}") from None
    return staging


def _publish(staging: Path, out_dir: Path) -> None:
    """Move the finished dataset into place (replacing an old one)."""
    try:
        if out_dir.exists():
            old = staging.with_name(staging.name + "-old")
            os.replace(out_dir, old)
            os.replace(staging, out_dir)
            if old.is_symlink():  # the target was a link to a dataset elsewhere: the link goes only
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out_dir)
    except OSError as exc:
        raise _Failure(f"cannot move the dataset into {out_dir}: {exc.strerror or exc}") from None


def _print_summary(result: DecodeResult, out_dir: Path, console: Any) -> None:
    from rich.table import Table

    summary, capture = result.summary, result.capture
    connections = ", ".join(f"{n:,} {kind}" for kind, n in summary.connections.most_common()) or "none"
    console.print(
        f"[bold]{capture.packets:,}[/] packets ({capture.tcp_segments:,} TCP) in {capture.files} "
        f"file{'s' if capture.files != 1 else ''}; connections: {connections}"
    )
    statuses = ", ".join(f"{n:,} {status}" for status, n in summary.statuses.most_common()) or "none"
    console.print(f"[bold]{summary.exchanges:,}[/] exchanges: {statuses}")
    if summary.resyncs or summary.gap_bytes or summary.skipped_bytes:
        console.print(
            f"capture gaps: {summary.gap_bytes:,} bytes; resyncs: {summary.resyncs:,}; "
            f"bytes skipped finding frame boundaries: {summary.skipped_bytes:,}"
        )
    skipped_packets = capture.non_tcp + capture.fragments + capture.unknown_link_type + capture.malformed
    if skipped_packets:
        console.print(
            f"packets not decoded: {capture.non_tcp:,} not TCP, {capture.fragments:,} fragments, "
            f"{capture.unknown_link_type:,} unknown link type, {capture.malformed:,} malformed"
        )
    if capture.snapped:
        console.print(f"{capture.snapped:,} packets were cut by the capture's snap length")
    if summary.apis:
        table = Table(title="top APIs", show_edge=False)
        table.add_column("api")
        table.add_column("exchanges", justify="right")
        for name, n in summary.apis.most_common(8):
            table.add_row(name, f"{n:,}")
        console.print(table)
    if summary.errors:
        console.print(
            "error codes seen: " + ", ".join(f"{name} x{n:,}" for name, n in summary.errors.most_common(10))
        )
    if not summary.exchanges:
        tls = summary.connections.get("tls", 0)
        hint = f" ({tls:,} TLS connections: kwire cannot read inside TLS)" if tls else ""
        console.print(
            f"no Kafka traffic found{hint}; if a broker listens on an unusual port, try --port PORT"
        )
    console.print(f"dataset: {out_dir}")


def decode(
    files: Annotated[
        list[str] | None,
        typer.Argument(
            help="pcap / pcapng files (gzip, bzip2, xz ok), merged by time, each keeping its own source; "
            "'-' reads a pcap or pcapng stream from standard input (tcpdump -w - | kwire decode -)",
            show_default=False,
        ),
    ] = None,
    read: Annotated[
        list[str] | None,
        typer.Option("-r", "--read", help="a capture file, as the arguments are (repeatable; tshark's -r)"),
    ] = None,
    interface: Annotated[
        str | None,
        typer.Option(
            "-i",
            "--interface",
            help="capture live on this interface, through tcpdump (or dumpcap); needs CAP_NET_RAW",
        ),
    ] = None,
    capture_filter: Annotated[
        str | None,
        typer.Option("-f", "--capture-filter", help="BPF capture filter for -i, e.g. 'tcp port 9092'"),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "-o",
            "--out",
            help="dataset directory, parent folders created; '-' prints the rows on stdout instead "
            "[default: <first file>.kwire when no -T is given]",
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[
        str | None,
        typer.Option(
            "-T",
            "--format",
            help="print the exchanges on stdout: table, json, jsonl, csv or fields (tab-separated) "
            "[default without -o: a dataset for files, a table for '-' and -i]",
            show_default=False,
        ),
    ] = None,
    fields: Annotated[
        list[str] | None,
        typer.Option(
            "-e",
            "--field",
            help="a column to print (repeatable, or comma-separated); 'errors', 'client' and 'broker' "
            "are made for printing [default: a summary for table/fields, every column otherwise]",
            show_default=False,
        ),
    ] = None,
    display_filter: Annotated[
        str | None,
        typer.Option(
            "-Y",
            "--filter",
            help="print only the exchanges matching this SQL WHERE expression (DuckDB), e.g. "
            "\"api_name = 'Produce' AND has_error('KAFKA_STORAGE_ERROR')\"",
            show_default=False,
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("-c", "--count", min=1, help="stop after this many exchanges (printed, when printing)"),
    ] = None,
    port: Annotated[
        list[int] | None,
        typer.Option("--port", min=1, max=65535, help="treat this TCP port as a Kafka broker's (repeatable)"),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace an existing dataset directory")
    ] = False,
    frame_limit: Annotated[
        int, typer.Option(min=64, help="largest Kafka frame accepted, bytes")
    ] = DEFAULT_FRAME_LIMIT,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no summary; errors only")] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "-j",
            "--jobs",
            min=1,
            max=64,
            help="worker processes (connections are split among them; same rows either way) "
            "[default: one per CPU, up to 4, for plain captures of 16 MB or more of small frames; "
            "one when printing rows or reading a stream]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Decode Kafka traffic (capture files, a stream on stdin, or a live interface) into a Parquet
    dataset (exchanges + connections), or print the exchanges (-T).

    With files and neither -T nor -o, the dataset goes to <first file>.kwire and a summary is
    printed (the next step, kwire analyze, reads the dataset); a stream or an interface with
    neither prints a table. -Y, -e and -c shape what is printed; the dataset keeps every exchange
    decoded (-c also stops the decode).

    Exit codes: 0 done; 2 bad input, a file could not be read, or a capture is damaged (the rows
    before the damage are kept); 130 interrupted (the rows decoded so far are printed / kept).
    """
    try:
        inputs = [*(files or []), *(read or [])]
        code = _route(
            inputs,
            interface,
            capture_filter,
            out,
            output_format,
            fields,
            display_filter,
            count,
            port or [],
            overwrite,
            frame_limit,
            quiet,
            jobs,
        )
    except _Failure as failure:
        print(f"kwire decode: {failure}", file=sys.stderr)
        code = failure.code
    if code:
        raise typer.Exit(code)


def _columns(fields: list[str] | None, fmt: str) -> list[str]:
    from kwire.rowprint import TABLE_COLUMNS
    from kwire.rowtable import ALL_COLUMNS, PARQUET_COLUMNS

    if not fields:
        return list(TABLE_COLUMNS if fmt in ("table", "fields") else PARQUET_COLUMNS)
    names = [name.strip() for field in fields for name in field.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALL_COLUMNS]
    if unknown:
        raise _Failure(f"-e {unknown[0]}: no such column (columns: {', '.join(ALL_COLUMNS)})")
    return names


def _route(
    inputs: list[str],
    interface: str | None,
    capture_filter: str | None,
    out: str | None,
    fmt: str | None,
    fields: list[str] | None,
    display_filter: str | None,
    count: int | None,
    ports: list[int],
    overwrite: bool,
    frame_limit: int,
    quiet: bool,
    jobs: int | None,
) -> int:
    """Check the flags together, then decode to a dataset, to stdout, or both."""
    from kwire.rowprint import FORMATS

    if interface is not None and inputs:
        raise _Failure("give capture files or -i INTERFACE, not both")
    if interface is None and not inputs:
        raise _Failure("no input: give capture files, '-' for standard input, or -i INTERFACE")
    if capture_filter is not None and interface is None:
        raise _Failure("-f filters a live capture: it goes with -i (for files, use -Y)")
    if "-" in inputs and len(inputs) > 1:
        raise _Failure("'-' (standard input) cannot be combined with other inputs")
    if fmt is not None and fmt not in FORMATS:
        raise _Failure(f"-T {fmt}: unknown format (one of {', '.join(FORMATS)})")
    stream = interface is not None or inputs == ["-"]
    to_stdout = out == "-"
    printing = fmt is not None or to_stdout or (out is None and stream)
    out_dir = None if out in (None, "-") else Path(out)
    if out is None and not printing:
        out_dir = Path(inputs[0] + ".kwire")
    if not printing:
        for flag, given in (("-Y", display_filter), ("-e", fields)):
            if given:
                raise _Failure(f"{flag} chooses what is printed: add -T FORMAT (or -o -)")
    if (printing or stream) and jobs is not None and jobs > 1:
        raise _Failure("--jobs: printing rows or reading a stream decodes in one process")
    if not printing and not stream and count is None:
        given = None if out is None else Path(out)
        return _decode([Path(p) for p in inputs], given, ports, overwrite, frame_limit, quiet, jobs)
    return _decode_rows(
        inputs,
        interface,
        capture_filter,
        out_dir,
        fmt or "table",
        fields,
        display_filter,
        count,
        ports,
        overwrite,
        frame_limit,
        quiet or printing,
        printing,
    )


def _decode_rows(
    inputs: list[str],
    interface: str | None,
    capture_filter: str | None,
    out_dir: Path | None,
    fmt: str,
    fields: list[str] | None,
    display_filter: str | None,
    count: int | None,
    ports: list[int],
    overwrite: bool,
    frame_limit: int,
    quiet: bool,
    printing: bool,
) -> int:
    """Decode files or a stream in this process, printing the exchanges as they come and/or
    writing the dataset; Ctrl-C prints what was decoded, keeps the dataset, and exits 130."""
    from kwire.decode_rows import Enough, RowSink, stdout_gone
    from kwire.live import (
        RING_DELAY_S,
        CaptureProgram,
        CaptureProgramError,
        EndOnInterrupt,
        decode_stream,
        stdin_segments,
    )
    from kwire.rowfilter import FilterError, RowFilter
    from kwire.rowprint import RowPrinter

    sink = None
    if printing:
        columns = _columns(fields, fmt)
        try:
            row_filter = RowFilter(display_filter, columns) if display_filter else None
        except FilterError as exc:
            raise _Failure(f"-Y: {exc}") from None
        sink = RowSink(RowPrinter(fmt, columns, sys.stdout), row_filter, count)
    paths = [Path(p) for p in inputs if p != "-"]
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise _Failure(f"{path}: given twice")
        seen.add(path.resolve())
        _check_capture(path)
    if out_dir is not None and out_dir.resolve() in seen:
        raise _Failure(f"{out_dir}: the output would replace an input file")
    program = None
    program_failure = ""
    if interface is not None:
        try:
            # rows printed as they come are watched: each shows when its packets arrive; a dataset
            # alone wants the larger ring (see kwire.live.capture_command)
            program = CaptureProgram(interface, capture_filter, immediate=sink is not None)
        except (CaptureProgramError, OSError) as exc:
            raise _Failure(f"-i {interface}: {exc}") from None
    staging = _prepare_output(out_dir, overwrite) if out_dir is not None else None
    writer = None
    if staging is not None:
        writer = decode_writer(staging)
    written = 0
    decoded = 0

    def on_exchange(row: dict[str, Any]) -> None:
        nonlocal written, decoded
        decoded += 1
        if writer is not None:
            writer.exchanges.append(row)
            written += 1
        if sink is not None:
            sink.add(row)
        elif count is not None and decoded >= count:
            raise Enough

    on_connection = writer.connections.append if writer is not None else (lambda row: None)
    interrupted = enough = gone = False
    error = None
    summary = None
    try:
        try:
            if paths:
                result = decode_captures(
                    paths, on_exchange, on_connection, forced_ports=ports, frame_limit=frame_limit
                )
                summary, capture, error = result.summary, result.capture, result.error
            else:
                capture = CaptureStats()
                name = "-" if program is None else interface
                fd = None
                try:
                    if program is not None:
                        from decoder.pcap import iter_stream_segments

                        segments = iter_stream_segments(program.stdout, interface or "-", capture)
                        fd = program.stdout.fileno()
                    else:
                        segments = stdin_segments(capture)
                        fd = sys.stdin.fileno()
                    tick = None if sink is None else (lambda: sink.ready(fd))
                    with contextlib.ExitStack() as stack:
                        if program is not None:
                            # Ctrl-C ends tcpdump once its ring's last packets are read: kept
                            drain = 0.0 if sink is not None else RING_DELAY_S
                            ending = stack.enter_context(
                                EndOnInterrupt(program, drain, _ending_notice(quiet))
                            )
                        summary, error = decode_stream(
                            segments,
                            "stdin" if name == "-" else str(name),
                            on_exchange,
                            on_connection,
                            forced_ports=ports,
                            frame_limit=frame_limit,
                            after_segment=tick,
                        )
                    interrupted = program is not None and ending.interrupted
                finally:
                    if program is not None:
                        program_failure = program.failure(timeout=0.5) if capture.packets == 0 else ""
                if isinstance(error, NotACaptureError):
                    if program is not None:
                        raise _Failure(f"-i {interface}: {program_failure}")
                    raise _Failure(f"standard input: {str(error).removeprefix('-: ')}")
            if sink is not None:
                sink.flush()
        except Enough:
            enough = True
        except KeyboardInterrupt:
            interrupted = True
            if sink is not None:
                with contextlib.suppress(Enough, BrokenPipeError):
                    sink.flush()
        except BrokenPipeError:
            gone = True
        if sink is not None and not gone:
            try:
                sink.printer.close()
            except BrokenPipeError:
                gone = True
    finally:
        if program is not None:
            program.stop()
        if gone:
            stdout_gone()
        if writer is not None:
            try:
                writer.close()
                for table in _DATASET_PARTS:
                    (staging / table).mkdir(exist_ok=True)  # type: ignore[operator]
                _publish(staging, out_dir)  # type: ignore[arg-type]
            except OSError as exc:
                shutil.rmtree(staging, ignore_errors=True)  # type: ignore[arg-type]
                raise _Failure(f"writing {out_dir} failed: {exc.strerror or exc}") from None
    if interrupted:
        kept = f"; kept the {written:,} exchanges written so far in {out_dir}" if out_dir is not None else ""
        print(f"kwire decode: interrupted{kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not quiet and summary is not None and out_dir is not None:
        from rich.console import Console

        _print_summary(DecodeResult(summary, capture, error), out_dir, Console(soft_wrap=True))
    if error is not None and not enough:
        print(f"kwire decode: {error} (kept the {decoded:,} exchanges decoded before it)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


#: Rows a decode converts to Arrow at once, as they come: few row dicts are alive at a time.
#: Held until a whole row group was there (64,000 rows), the bench's bulk capture (60k rows)
#: decoded in 2.01-2.03 s at 268 MB RSS; converted 8,192 at a time, 1.78-1.81 s at 164 MB.
_DECODE_BATCH_ROWS = 4096
#: A decode's row groups (split among its parts: their converted rows together stay within
#: one), each written on a thread of its own while decoding goes on (``DatasetWriter``'s
#: ``background``). Smaller than the dataset writer's default so that a capture of a few ten
#: thousand exchanges has one written while it decodes: bulk then 1.58-1.68 s (the files 0.4%
#: smaller, zstd seeing fewer rows at once: 1,350 against 1,355 KB).
_DECODE_ROW_GROUP_ROWS = 32768


@dataclass
class _Part:
    """What one part of a decode produced (the whole decode, with one part)."""

    summary: DecodeSummary
    capture: CaptureStats
    error: CaptureError | None
    rows: int  # exchange rows written
    interrupted: bool


def decode_writer(staging: Path, parts: int = 1, prefix: str | None = None) -> DatasetWriter:
    """The dataset writer of a decode (or of one of its ``parts``): rows converted as they come,
    row groups written on a thread of their own."""
    from kwire.dataset import DatasetWriter

    return DatasetWriter(
        staging,
        row_group_rows=max(8192, _DECODE_ROW_GROUP_ROWS // parts),
        batch_rows=_DECODE_BATCH_ROWS,
        background=True,
        prefix=prefix,
    )


def _decode_part(
    files: Sequence[Path],
    staging: Path,
    part: int,
    parts: int,
    ports: Sequence[int],
    frame_limit: int,
    plan: dict[int, int] | None,
    progress: Callable[[CaptureStats], None] | None,
) -> _Part:
    """Decode part `part` of `parts` of the connections (``plan``: :func:`plan_shards`) into a
    dataset writer of its own."""
    writer = decode_writer(staging, parts)
    result = None
    try:
        result = decode_captures(
            files,
            writer.exchanges.append,
            writer.connections.append,
            forced_ports=ports,
            frame_limit=frame_limit,
            progress=progress,
            shard=(part, parts) if parts > 1 else None,
            shard_plan=plan,
        )
    except KeyboardInterrupt:
        pass
    finally:
        writer.close()
    if result is None:
        return _Part(DecodeSummary(), CaptureStats(), None, writer.exchanges.rows_written, True)
    return _Part(result.summary, result.capture, result.error, writer.exchanges.rows_written, False)


def _part_process(channel: Any, stop: Any, progress_bytes: Any, args: tuple[Any, ...]) -> None:
    """A worker process: decode one part, send back its _Part (or what went wrong)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent says when to stop (stop is set)
    part = args[2]

    def progress(stats: CaptureStats) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        if part == 0:
            progress_bytes.value = stats.bytes

    try:
        channel.send(("done", _decode_part(*args, progress)))
    except OSError as exc:
        channel.send(("oserror", exc.errno, exc.strerror or str(exc), exc.filename))
    except BaseException as exc:
        channel.send(("error", type(exc).__name__, str(exc)))
    finally:
        channel.close()


def _decode_in_parts(
    files: Sequence[Path],
    staging: Path,
    parts: int,
    ports: Sequence[int],
    frame_limit: int,
    progress: Callable[[int], None] | None,
) -> _Part:
    """Decode with `parts` worker processes, each taking the connections of one part (``kwire.shards``)
    and writing its own Parquet files; merge what they counted. Every worker reads the whole capture
    (reading is a small share of the work) and decodes only its part."""
    import multiprocessing
    from multiprocessing.connection import wait

    import kwire.dataset  # noqa: F401  (imported once here, not again in every worker)

    try:
        plan = plan_shards(files, parts)  # inherited by the forked workers, not sent
    except KeyboardInterrupt:  # Ctrl-C before any worker started: nothing written yet
        return _Part(DecodeSummary(), CaptureStats(), None, 0, True)
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    progress_bytes = context.Value("q", 0, lock=False)
    workers, channels = [], {}
    for part in range(parts):
        receiver, sender = context.Pipe(duplex=False)
        args = (files, staging, part, parts, ports, frame_limit, plan)
        worker = context.Process(target=_part_process, args=(sender, stop, progress_bytes, args), daemon=True)
        worker.start()
        sender.close()
        workers.append(worker)
        channels[receiver] = part
    answers: dict[int, tuple[Any, ...]] = {}
    interrupted = False
    try:
        while len(answers) < parts:
            try:
                for channel in wait(list(channels), timeout=0.2):
                    try:
                        answers[channels.pop(channel)] = channel.recv()  # type: ignore[index]
                    except EOFError:  # the worker died without a word (killed)
                        answers[channels.pop(channel)] = ("error", "WorkerDied", "a decode worker died")  # type: ignore[index]
                if progress is not None:
                    progress(progress_bytes.value)
            except KeyboardInterrupt:
                interrupted = True
                stop.set()  # the workers finish their files and answer
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    for kind, *details in answers.values():
        if kind == "oserror":
            errno, strerror, filename = details
            raise OSError(errno, strerror, filename)
        if kind == "error":
            raise _WorkerError(f"{details[0]}: {details[1]}")
    results = [answers[part][1] for part in range(parts)]
    merged = _Part(DecodeSummary(), results[0].capture, results[0].error, 0, interrupted)
    for result in results:
        merged.summary.add(result.summary)
        merged.rows += result.rows
        merged.interrupted |= result.interrupted
    return merged


def plan_shards(files: Sequence[Path], parts: int) -> dict[int, int] | None:
    """Which part decodes each connection (``kwire.shards.plan_parts``), from a first pass over
    the capture that weighs every connection's segments (the chatty benchmark capture: 0.03 s,
    0.09 s before the compiled pcap loop weighed them itself, against 2 s of decoding). None, and the
    workers assign connections as they meet them, for compressed captures (the pass would
    decompress everything once more). A damaged capture is weighed up to the damage."""
    if any(_compressed(path) for path in files):
        return None
    weights = ConnectionWeights()
    for path in files:
        with contextlib.suppress(CaptureError, OSError):  # the workers meet it too, and report it
            weights.add_capture(path)
    return plan_parts(weights.weights, parts)


def _compressed(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(6).startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd"))


def default_jobs(files: Sequence[Path]) -> int:
    """Worker processes for a decode: one per CPU (at most 4) when the work is in many small frames;
    one for small inputs, compressed ones (each worker would decompress everything again) and bulk
    traffic (big segments: reading the capture, which every worker does in full, is most of the
    work there). Bulk is told by the mean TCP payload of the first 4,000 segments (> 4 KiB)."""
    if sum(path.stat().st_size for path in files) < 16 << 20:
        return 1
    if any(_compressed(path) for path in files):
        return 1
    segments = payload = 0
    try:
        for segment in iter_segments(files[0]):
            if segment.payload:
                segments += 1
                payload += len(segment.payload)
                if segments == 4000:
                    break
    except CaptureError:
        pass
    if not segments or payload / segments > 4096:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 4))


def _decode(
    files: list[Path],
    out: Path | None,
    ports: list[int],
    overwrite: bool,
    frame_limit: int,
    quiet: bool,
    jobs: int | None,
) -> int:
    seen: set[Path] = set()
    for path in files:
        resolved = path.resolve()
        if resolved in seen:
            raise _Failure(f"{path}: given twice")
        seen.add(resolved)
        _check_capture(path)
    out_dir = out if out is not None else Path(str(files[0]) + ".kwire")
    if out_dir.resolve() in seen:
        raise _Failure(f"{out_dir}: the output would replace an input file")
    parts = jobs if jobs is not None else default_jobs(files)
    staging = _prepare_output(out_dir, overwrite, defaulted=out is None)

    bar = None
    update: Callable[[int], None] | None = None
    stderr = None  # rich only when it shows something: its import (15 ms) would delay a quiet decode
    if not quiet:
        from rich.console import Console

        stderr = Console(stderr=True)
    if stderr is not None and stderr.is_terminal:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        total = sum(path.stat().st_size for path in files)
        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=stderr,
            transient=True,
        )
        task = bar.add_task("decoding", total=total)

        def update(done: int) -> None:
            if not bar.live.is_started:  # started on first use: after any worker is forked (a thread)
                bar.start()
            bar.update(task, completed=min(done, total))

    try:
        try:
            if parts == 1:
                progress = None if update is None else (lambda stats: update(stats.bytes))  # type: ignore[misc]
                result = _decode_part(files, staging, 0, 1, ports, frame_limit, None, progress)
            else:
                result = _decode_in_parts(files, staging, parts, ports, frame_limit, update)
        finally:
            if bar is not None:
                bar.stop()
        for table in _DATASET_PARTS:  # a table with no rows is an empty folder, not a missing one
            (staging / table).mkdir(exist_ok=True)
        _publish(staging, out_dir)
    except OSError as exc:  # writing the dataset failed (disk full, permissions, ...)
        shutil.rmtree(staging, ignore_errors=True)
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise _Failure(f"writing {out_dir} failed: {exc.strerror or exc}{where}") from None
    except Exception as exc:  # a bug: one line for the user, the traceback on request
        shutil.rmtree(staging, ignore_errors=True)
        if os.environ.get("KWIRE_DEBUG"):
            raise
        what = str(exc) if isinstance(exc, _WorkerError) else f"{type(exc).__name__}: {exc}"
        raise _Failure(f"internal error: {what} (set KWIRE_DEBUG=1 for the traceback)") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if result.interrupted:
        print(
            f"kwire decode: interrupted; kept the {result.rows:,} exchanges written so far in {out_dir}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if not quiet:

        class SummaryConsole(Console):
            def on_broken_pipe(self) -> None:  # `kwire decode ... | head`: the reader left, carry on
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                self.quiet = True

        _print_summary(
            DecodeResult(result.summary, result.capture, result.error),
            out_dir,
            SummaryConsole(soft_wrap=True),
        )
    if result.error is not None:
        print(
            f"kwire decode: {result.error} (kept the {result.summary.exchanges:,} exchanges decoded before it)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK
