"""``kwire analyze``, ``kwire audit`` and ``kwire sql``: the Spark side of the command line.

Registered on the ``kwire`` typer app in :mod:`kwire.cli`. Bad input (no dataset, unknown job
or Kafka release) exits 2 with a one-line error; ``audit`` exits 1 when it finds requests the
target release would not accept (a CI gate), 0 when none.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kwire.sql_command import error_line, sql, warm_session

__all__ = ["analyze", "audit", "sql"]

_err = Console(stderr=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    _err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _check_dataset(dataset: Path) -> None:
    if not dataset.is_dir():
        raise _fail(f"no dataset at {dataset}")
    if not (dataset / "exchanges").is_dir() and not (dataset / "connections").is_dir():
        raise _fail(f"{dataset} is not a kwire dataset (no exchanges/ or connections/ inside)")


def _versions(path: Path | None):
    from spark_jobs.kafka_versions import load_broker_versions

    try:
        return load_broker_versions(path)
    except (OSError, ValueError, KeyError) as exc:
        raise _fail(f"cannot read Kafka versions table {path}: {exc}") from None


def _resolve(versions, wanted: list[str]) -> list[str]:
    out = []
    for v in wanted:
        rel = versions.resolve(v)
        if rel is None:
            raise _fail(f"unknown Kafka release {v!r}; known: {', '.join(versions.releases)}")
        out.append(rel)
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):  # 4 significant digits, and never an exponent for a large value
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    if hasattr(v, "strftime"):  # microseconds kept: exchanges a few microseconds apart stay apart
        return v.strftime("%Y-%m-%d %H:%M:%S.%f" if hasattr(v, "microsecond") else "%Y-%m-%d")
    return str(v)


def _console() -> Console:
    """The stdout console. Not a terminal (a pipe, a CI log): wide enough that a table keeps
    one line per row rather than folding every cell at 80 columns."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)
    return console


def _rich_table(
    title: str, rows: list[dict[str, Any]], columns: list[str], limit: int, *, merge_client: bool = True
) -> Table:
    """``rows`` as a table of ``columns``; with ``merge_client``, the client id, address and
    software columns become one ``client`` column (as the findings name clients)."""
    from spark_jobs.report import display_cells

    cells = display_cells(columns, _fmt, merge_client=merge_client)
    table = Table(title=f"{title} ({len(rows)} rows)", title_justify="left", show_lines=False)
    for header, _ in cells:
        table.add_column(header, overflow="fold")
    for r in rows[:limit]:
        table.add_row(*[cell(r) for _, cell in cells])
    return table


_LOCAL_HELP = "start a local Spark session even when `kwire sql DATASET --serve` serves the dataset"


@contextlib.contextmanager
def _spark_errors() -> Iterator[None]:
    """Spark failing on the data (a damaged Parquet file, a task that fails) as one line and
    exit 1, not a Python and a Java stack trace; kwire's own errors keep their traceback."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except (Py4JError, PySparkException) as exc:
        raise _fail(f"Spark failed: {error_line(exc)}", 1) from None


def _session(dataset: Path, master: str | None, local: bool, app: str, sized: bool = True):
    """The Spark session to run on and where it runs: the dataset's warm server (``kwire sql
    --serve``) unless ``master`` or ``local`` says otherwise, else a new session (a JVM start).
    ``sized``: a new session gets settings for the dataset's size."""
    from spark_jobs.driver_warmup import dataset_warm_up
    from spark_jobs.session import build_session, dataset_bytes

    data_bytes = dataset_bytes(dataset)
    if master is None and not local:
        spark = warm_session(dataset, data_bytes)
        if spark is not None:
            return spark, "the warm server"
    try:
        session = build_session(
            master, app, data_bytes=data_bytes if sized else None, warm_up=dataset_warm_up(dataset)
        )
        return session, None
    except Exception as exc:  # the JVM's own lines, if it printed any, came first
        raise _fail(f"Spark did not start: {error_line(exc)}", 1) from None


def analyze(
    dataset: Annotated[Path, typer.Argument(help="dataset directory (exchanges/, connections/)")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="report directory [default: DATASET/report; with --source, DATASET/report-SOURCE]",
        ),
    ] = None,
    master: Annotated[
        str | None, typer.Option(help="Spark master URL [default: the dataset's warm server, else local[*]]")
    ] = None,
    local: Annotated[bool, typer.Option("--local", help=_LOCAL_HELP)] = False,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="comma-separated analyses to run [default: all] (was --jobs, which elsewhere means worker processes)",
        ),
    ] = None,
    broker_version: Annotated[
        list[str] | None,
        typer.Option("--broker-version", help="also check requests against this Kafka release (repeatable)"),
    ] = None,
    kafka_versions: Annotated[
        Path | None, typer.Option(help="broker_api_versions.json [default: shared copy, else bundled table]")
    ] = None,
    top: Annotated[int, typer.Option(help="clients in the printed summary, most affected first")] = 10,
    combine_runs: Annotated[
        bool,
        typer.Option(
            "--combine-runs",
            help="analyse all sources (capture files, proxies) as one run; by default each is its "
            "own, and a client id seen in two runs is two clients",
        ),
    ] = False,
    tables: Annotated[
        bool,
        typer.Option("--tables", help="also print every supporting table in full, as report.html shows them"),
    ] = False,
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            help="analyse only this source (a capture file name, proxy:<address>) of a dataset of "
            "several (repeatable)",
        ),
    ] = None,
) -> None:
    """Run the Spark jobs over a dataset: every result as Parquet, the findings
    (REPORT_DIR/findings/) and report.html. Prints what the page shows first: a summary, the
    findings with their evidence and advice, and one line per client."""
    from spark_jobs import report
    from spark_jobs.jobs import parse_job_list

    _check_dataset(dataset)
    try:
        names = parse_job_list(only)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    versions = _versions(kafka_versions)
    releases = _resolve(versions, broker_version or [])
    if output is not None and str(output) == "-":
        raise _fail(
            "-o -: a report is a folder of Parquet results and report.html; the findings are printed anyway"
        )
    if source:
        known = _sources(dataset)
        unknown = [s for s in source if s not in known]
        if unknown:
            raise _fail(
                f"no source {', '.join(unknown)} in {dataset} (sources: {', '.join(sorted(known)) or 'none'})"
            )
    # one source's report goes beside the whole dataset's, not over it (kwire sql reads report/)
    out = output or dataset / ("report" if not source else "report-" + _safe_name("+".join(source)))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(f"cannot create {out}: {exc.strerror or exc}") from None

    from spark_jobs.submit import analyse

    console = _console()
    start = time.perf_counter()
    spark, where = _session(dataset, master, local, "kwire-analyze")
    try:
        with console.status("running Spark jobs" + (f" on {where}..." if where else "...")), _spark_errors():
            analyse(
                spark,
                dataset,
                out,
                jobs=names,
                versions=versions,
                target_releases=releases,
                combined=combine_runs,
                sources=source or None,
            )
    finally:
        if where:  # the server's session (its kept intermediates) goes; the server stays
            spark.stop()
    results = report.load_results(out)
    results.pop("findings", None)  # written by analyse() from these results: rebuilt below
    found = report.findings(results)
    label = f"{dataset}" + (f" (source {', '.join(source)})" if source else "")
    page = report.build_page(results, found, dataset=label)
    html_path = report.write_page(out / "report.html", page)
    from kwire.report_print import print_clients, print_findings, print_summary, print_tables

    print_summary(console, page.summary)
    print_findings(console, found)
    print_clients(console, page.summary, limit=None if tables else top, everyone=tables)
    if tables:
        print_tables(console, page.tables)
    elif page.tables:
        console.print(f"{len(page.tables)} supporting tables: --tables prints them; report.html shows them")
    console.print(
        f"results: {out}/<result>/ (Parquet); report: {html_path}; {time.perf_counter() - start:.1f}s"
        + (f" on {where}" if where else "")
    )


def _safe_name(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._+-]+", "_", text)[:80]


def _sources(dataset: Path) -> set[str]:
    """The ``source`` values of a dataset (read from its Parquet with pyarrow)."""
    import pyarrow.dataset as pads

    found: set[str] = set()
    for table in ("exchanges", "connections"):
        folder = dataset / table
        if folder.is_dir() and any(folder.rglob("*.parquet")):
            col = pads.dataset(folder, format="parquet", partitioning="hive").to_table(columns=["source"])
            found.update(v for v in col.column("source").unique().to_pylist() if v is not None)
    return found


def audit(
    dataset: Annotated[Path, typer.Argument(help="dataset directory")],
    broker_version: Annotated[
        str, typer.Option("--broker-version", help="Kafka release to check against, e.g. 4.0, 3.9-kraft, 0.9")
    ],
    json_output: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    strict: Annotated[
        bool, typer.Option(help="also fail on ApiVersions fallbacks (harmless version negotiation)")
    ] = False,
    kafka_versions: Annotated[
        Path | None, typer.Option(help="broker_api_versions.json [default: shared copy, else bundled table]")
    ] = None,
    master: Annotated[
        str | None, typer.Option(help="Spark master URL [default: the dataset's warm server, else local[*]]")
    ] = None,
    local: Annotated[bool, typer.Option("--local", help=_LOCAL_HELP)] = False,
) -> None:
    """List every (client, api, version) the given Kafka release would not accept.

    Exit 0 when there is none, 1 when there are some (a CI gate), 2 on bad input.
    """
    _check_dataset(dataset)
    versions = _versions(kafka_versions)
    (release,) = _resolve(versions, [broker_version])

    from spark_jobs.common import load_tables
    from spark_jobs.unsupported_versions import audit_release, release_table

    spark, where = _session(dataset, master, local, "kwire-audit", sized=False)
    try:
        with _spark_errors():
            tables = load_tables(spark, dataset)
            rows = [
                r.asDict()
                for r in audit_release(tables.exchanges, release_table(spark, versions, [release])).collect()
            ]
    finally:
        if where:
            spark.stop()
    for r in rows:
        r.pop("client_key", None)
    blocking = [r for r in rows if strict or r["severity"] == "error"]
    if json_output:
        from spark_jobs.findings import build_findings, unsupported

        found = build_findings({"unsupported_versions": rows}, rules=(unsupported,))
        doc = {
            "broker_version": release,
            "violations": [r for r in rows if r in blocking],
            "notes": [r for r in rows if r not in blocking],
            # the same rows `kwire analyze` writes to REPORT_DIR/findings/
            "findings": [{**f.row(), "evidence": f.evidence} for f in found],
        }
        print(json.dumps(doc, default=_fmt, indent=2))
    else:
        console = _console()
        cols = [
            "client_id",
            "client_ip",
            "client_software_name",
            "client_software_version",
            "api_name",
            "api_version",
            "release_min_version",
            "release_max_version",
            "count",
            "reason",
            "severity",
        ]
        if rows:
            console.print(_rich_table(f"requests Kafka {release} would not accept", rows, cols, len(rows)))
        console.print(
            f"Kafka {release}: {len(blocking)} (client, api, version) combinations rejected"
            + (
                f", {len(rows) - len(blocking)} harmless ApiVersions fallbacks"
                if len(rows) > len(blocking)
                else ""
            ),
            highlight=False,
        )
    raise typer.Exit(1 if blocking else 0)
