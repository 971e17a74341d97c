"""``kwire analyze``'s terminal output, the same content as report.html in the same order: a
summary line, the findings (numbered as on the page, with evidence and advice), a short table
per client, and with ``--tables`` every supporting table in full.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

from spark_jobs.findings import Finding
from spark_jobs.report_model import Summary, duration_text
from spark_jobs.report_tables import TableView

__all__ = ["print_clients", "print_findings", "print_summary", "print_tables", "rich_view"]

_COLORS = {"critical": "red", "warning": "yellow", "info": "cyan"}


def print_summary(console: Console, summary: Summary) -> None:
    """One line per run, one for the totals, one for the findings by severity."""
    console.rule("summary")
    if not summary.sources and summary.timeline_ran:
        console.print("no traffic: the dataset holds no exchanges and no connections")
    elif not summary.sources:
        console.print("no run summary (the incident_timeline job was not run)")
    for s in summary.sources if len(summary.sources) > 1 else []:
        console.print(
            f"run {s.source}: {s.first:%Y-%m-%d %H:%M:%S} to {s.last:%H:%M:%S} UTC ({duration_text(s.span_s)}), "
            f"{s.exchanges:,} exchanges, {s.errors:,} errors",
            highlight=False,
        )
    if summary.sources:
        span = f"{summary.first:%Y-%m-%d %H:%M:%S} to {summary.last:%H:%M:%S} UTC ({duration_text(summary.span_s)})"
        apps = len(summary.application_clients)
        console.print(
            f"{len(summary.sources)} source{'s' if len(summary.sources) != 1 else ''}, {span}; "
            f"{len(summary.brokers)} brokers, {len(summary.clients)} clients ({apps} applications); "
            f"{summary.exchanges:,} exchanges, {summary.errors:,} errors",
            highlight=False,
        )
        if summary.not_seen:
            console.print(f"not seen: {summary.not_seen.text()}", highlight=False)
    counts = ", ".join(f"{n} {sev}" for sev, n in summary.findings_by_severity.items())
    console.print(f"findings: {counts}", highlight=False)


def print_findings(console: Console, found: list[Finding]) -> None:
    """The findings, most severe first, numbered as on the page."""
    from collections import Counter

    console.rule("findings")
    if not found:
        console.print("no findings")
        return
    kinds = Counter(f.kind for f in found)
    console.print(", ".join(f"{kind} x{n}" for kind, n in kinds.items()), highlight=False)
    for i, f in enumerate(found, 1):
        console.print(
            f"[{_COLORS[f.severity]}]#{i} {f.severity}[/] [bold]{_escape(f.summary)}[/bold]", highlight=False
        )
        facts = "; ".join(
            f"{k.replace('_', ' ')}: {_short(v)}" for k, v in f.evidence.items() if v not in (None, [], "")
        )
        if f.first_time:
            when = (
                f"{f.first_time:%H:%M:%S}" + (f" to {f.last_time:%H:%M:%S}" if f.last_time else "") + " UTC"
            )
            facts = f"when: {when}" + (f"; {facts}" if facts else "")
        if facts:
            console.print(f"    {_escape(facts)}", highlight=False)
        if f.advice:
            console.print(f"    [green]what to do:[/] {_escape(f.advice)}", highlight=False)


def print_clients(
    console: Console, summary: Summary, *, limit: int | None = None, everyone: bool = False
) -> None:
    """One line per application client (with ``everyone``, brokers' own clients too), the
    most affected first (worst finding, errors, unanswered requests, requests); at most
    ``limit`` of them."""
    if not summary.clients:
        return
    candidates = summary.clients if everyone else summary.application_clients
    severity = {"critical": 0, "warning": 1, "info": 2, None: 3}
    ranked = sorted(
        candidates, key=lambda c: (severity[c.worst], -c.errors, -c.unanswered, -c.requests, c.name)
    )
    shown = ranked if limit is None else ranked[:limit]
    several = len(summary.sources) > 1
    table = Table(title="clients", title_justify="left")
    if several:
        table.add_column("source")
    numbers = ("requests", "unanswered", "errors", "Metadata", "disconnects")
    for header in ("client", "software", *numbers[:3], "most frequent errors", *numbers[3:], "findings"):
        table.add_column(header, justify="right" if header in numbers else "left")
    for c in shown:
        worst = f"[{_COLORS[c.worst]}]{c.findings} ({c.worst})[/]" if c.worst else ""
        cells = [
            _escape(c.name),
            _escape(c.software),
            f"{c.requests:,}",
            f"{c.unanswered:,}",
            f"{c.errors:,}",
            ", ".join(f"{name} x{n}" for name, n in c.top_errors),
            f"{c.metadata_requests:,}",
            f"{c.disconnects:,}",
            worst,
        ]
        table.add_row(*([c.source or ""] if several else []), *cells)
    console.print(table)
    notes = []
    if len(candidates) > len(shown):
        notes.append(f"{len(candidates) - len(shown)} more clients (--top, --tables, report.html)")
    internal = len(summary.clients) - len(candidates)
    if internal:
        notes.append(f"{internal} brokers' own clients (replica fetchers, controllers) not shown (--tables)")
    for note in notes:
        console.print(note, highlight=False)


def rich_view(view: TableView) -> Table:
    """A supporting table as a rich Table, every row."""
    table = Table(title=f"{view.title} ({view.count_text}; {view.name}/)", title_justify="left")
    numeric = [
        all(isinstance(row[i].sort, int | float) for row in view.rows) for i in range(len(view.columns))
    ]
    for c, is_number in zip(view.columns, numeric, strict=True):
        table.add_column(c.header, justify="right" if is_number else "left", overflow="fold")
    for row in view.rows:
        table.add_row(*[_escape(cell.text) for cell in row])
    return table


def print_tables(console: Console, views: Iterable[TableView]) -> None:
    """Every supporting table in full."""
    for view in views:
        console.print(rich_view(view))


def _short(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(str(x) for x in v[:5]) + (f" and {len(v) - 5} more" if len(v) > 5 else "")
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
