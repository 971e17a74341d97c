"""The analysis report: one self-contained HTML page that reads top-down like an incident review.

Summary (runs, capture span, brokers, clients and their software, exchanges, errors, findings by
severity) -> findings with their evidence and advice -> the incident timeline (a lane per
broker and per client) -> supporting tables, sortable and filterable, each linked to its
Parquet result.

Built from the Parquet results the jobs wrote (read with pyarrow, no Spark needed), so it can be
regenerated from ``REPORT_DIR`` alone (``python -m spark_jobs.report REPORT_DIR``).

Charts are Vega-Lite specs built with Altair; the page inlines the Vega, Vega-Lite and
Vega-Embed JavaScript (the bundle ``vl-convert-python`` ships), so it opens offline and asks
the network for nothing. The page is a Jinja2 template (``templates/report.html.j2``).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spark_jobs.findings import Finding, client_label, internal_client
from spark_jobs.findings import build_findings as findings
from spark_jobs.report_model import Summary, build_summary, duration_text, lanes, seconds_text
from spark_jobs.report_tables import TableView, build_tables

__all__ = [
    "Finding",
    "ReportPage",
    "build_page",
    "client_label",
    "display_cells",
    "findings",
    "load_results",
    "render_html",
    "render_page",
    "write_html",
    "write_page",
]

Rows = list[dict[str, Any]]


_CLIENT_PARTS = ("client_id", "client_ip", "client_software_name", "client_software_version")


def display_cells(
    columns: list[str], fmt: Callable[[Any], str], *, merge_client: bool = True
) -> list[tuple[str, Callable[[dict], str]]]:
    """(header, row -> text) per column shown, each value through ``fmt``. With
    ``merge_client``, the client id, address and software columns become one ``client``
    column, named as the findings name clients (:func:`client_label`)."""
    cells: list[tuple[str, Callable[[dict], str]]] = [(c, lambda r, c=c: fmt(r.get(c))) for c in columns]
    if merge_client and {"client_id", "client_ip"} <= set(columns):
        at = columns.index("client_id")
        cells = [cell for cell in cells if cell[0] not in _CLIENT_PARTS]
        cells.insert(at, ("client", client_label))
    return cells


def load_results(report_dir: str | Path, *, sources: list[str] | None = None) -> dict[str, Rows]:
    """Every result under ``report_dir`` (one subdirectory of Parquet files each) as rows;
    with ``sources``, only the rows of those runs (rows without a source are kept)."""
    out: dict[str, Rows] = {}
    for sub in sorted(Path(report_dir).iterdir()) if Path(report_dir).is_dir() else []:
        if sub.is_dir() and any(sub.glob("*.parquet")):
            rows = pq.read_table(sub).to_pylist()
            if sources:
                rows = [r for r in rows if r.get("source") is None or r.get("source") in sources]
            out[sub.name] = rows
    return out


@cache
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed as one script that sets ``window.vegaEmbed`` (from
    vl-convert-python's bundled copies, matched to Altair's Vega-Lite version).

    Bundling took 1.3-2.2 s of CPU in every ``kwire analyze`` (the same 0.9 MB each time for one
    vl-convert version): it is kept in :func:`kwire.runtime.cache_dir` ``vega``,
    named after the vl-convert and Vega-Lite versions, and read from there."""
    import altair as alt
    import vl_convert as vlc

    from kwire.runtime import cache_dir

    wanted = ".".join(alt.VEGALITE_VERSION.split(".")[:2])
    version = wanted if wanted in vlc.get_vegalite_versions() else None
    kept = cache_dir("vega") / f"bundle-{getattr(vlc, '__version__', 'unknown')}-{version or 'default'}.js"
    try:
        return kept.read_text(encoding="utf-8")
    except OSError:
        pass
    bundle = vlc.javascript_bundle(vl_version=version)
    try:  # a cache that cannot be written only costs the next run the bundling
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
        partial.write_text(bundle, encoding="utf-8")
        os.replace(partial, kept)
    except OSError:
        pass
    return bundle


def _script_json(value: Any) -> str:
    """JSON that can sit inside a <script> element: no ``<`` at all (only strings can hold one,
    and ``\\u003c`` is the same string), so neither ``</script>`` nor ``<!--<script>`` in a client
    id can end the element or make the parser swallow the rest of the page."""
    return json.dumps(value, default=str, separators=(",", ":")).replace("<", "\\u003c")


class ReportPage:
    """Everything the template shows, computed once from the results and findings."""

    #: Rows of a supporting table the page shows (sorted as the table's spec says); the
    #: terminal's --tables and the Parquet have them all.
    max_rows = 1000

    def __init__(self, results: dict[str, Rows], found: list[Finding], *, dataset: str = "") -> None:
        from spark_jobs import report_charts

        self.dataset = dataset
        self.generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        self.findings = found
        self.summary: Summary = build_summary(results, found)
        self.lanes = lanes(results)
        self.tables: list[TableView] = build_tables(results, self.lanes)
        shown = {t.name for t in self.tables}
        self.other_results = [(name, len(rows)) for name, rows in results.items() if name not in shown]
        self.charts: dict[str, dict] = {}
        self.timelines = []
        timeline = results.get("incident_timeline", [])
        outages = results.get("outages", [])
        if timeline:
            totals: Counter = Counter()
            for r in timeline:
                if r.get("event") == "error":
                    totals[r.get("detail") or f"error {r.get('code')}"] += r.get("count") or 0
            colors = report_charts.error_color_map(name for name, _ in totals.most_common())
            for i, s in enumerate(self.summary.sources):
                spec, left_out = report_charts.timeline_chart(
                    s.source,
                    self.lanes,
                    timeline,
                    outages,
                    found,
                    first=s.first,
                    last=s.last,
                    error_colors=colors,
                )
                chart_id = f"timeline-{i}"
                self.charts[chart_id] = spec
                self.timelines.append({"source": s, "chart_id": chart_id, "left_out": left_out})
        if len(self.summary.sources) > 1:
            self.charts["sources-chart"] = report_charts.sources_chart(
                [
                    {"source": s.source, "first": s.first, "last": s.last, "exchanges": s.exchanges}
                    for s in self.summary.sources
                ]
            )
        # applications only: brokers' own connections (replica fetchers, raft) never ask
        md = [r for r in results.get("metadata_refresh", []) if not internal_client(r)]
        if md:
            # one chart for every run: a name two runs use gets its run
            used = Counter(ln.name for ln in self.lanes if ln.kind == "client")
            names = {
                ln.key: ln.name + (f" [{ln.source}]" if used[ln.name] > 1 else "")
                for ln in self.lanes
                if ln.kind == "client"
            }
            self.charts["metadata-chart"] = report_charts.metadata_chart(md, names)

    def evidence(self, f: Finding) -> list[tuple[str, str]]:
        """A finding's evidence as (label, text) pairs, lists shortened."""
        out = []
        for k, v in f.evidence.items():
            if v in (None, [], ""):
                continue
            if isinstance(v, list):
                text = ", ".join(str(x) for x in v[:8]) + (f" and {len(v) - 8} more" if len(v) > 8 else "")
            elif isinstance(v, float):
                text = f"{v:g}"
            else:
                text = str(v)
            out.append((k.replace("_", " "), text))
        return out

    def who(self, f: Finding) -> list[tuple[str, str]]:
        """The client, broker, topic, run and time a finding is about."""
        out = []
        if f.client_id is not None or f.client_ip is not None:
            out.append(("client", client_label(f.row())))
        if f.broker:
            out.append(("broker", f.broker))
        if f.topic:
            out.append(("topic", f.topic))
        if f.first_time:
            when = f.first_time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            if f.last_time and f.last_time != f.first_time:
                when += f" to {f.last_time.strftime('%H:%M:%S.%f')[:-3]} UTC"
                when += f" ({duration_text((f.last_time - f.first_time).total_seconds())})"
            else:
                when += " UTC"
            out.append(("when", when))
        if f.count is not None:
            out.append(("count", f"{f.count:,}"))
        if f.source and len(self.summary.sources) > 1:
            out.append(("run", f.source))
        return out


def build_page(results: dict[str, Rows], found: list[Finding], *, dataset: str = "") -> ReportPage:
    """The page's content, without rendering it."""
    return ReportPage(results, found, dataset=dataset)


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["seconds"] = seconds_text
    env.filters["duration"] = duration_text
    env.filters["num"] = lambda v: "" if v is None else f"{v:,}"
    env.filters["utc"] = lambda t, fmt="%Y-%m-%d %H:%M:%S": t.strftime(fmt) if t else ""
    env.filters["plural"] = lambda n, word: f"{n:,} {word}{'' if n == 1 else 's'}"
    return env


def render_page(page: ReportPage) -> str:
    """A built page as one HTML string (scripts and data inline)."""
    import altair as alt
    from markupsafe import Markup

    template = _environment().get_template("report.html.j2")
    bundle = vega_bundle().replace("</script", "<\\/script") if page.charts else ""
    return template.render(
        page=page,
        summary=page.summary,
        vega_bundle=Markup(bundle),
        chart_specs=Markup(_script_json(page.charts)),
        versions=f"Altair {alt.__version__}, Vega-Lite {alt.VEGALITE_VERSION}",
    )


def render_html(results: dict[str, Rows], found: list[Finding], *, dataset: str = "") -> str:
    """The report page of ``results`` and ``found`` as one HTML string."""
    return render_page(build_page(results, found, dataset=dataset))


def write_page(path: str | Path, page: ReportPage) -> Path:
    """Render a built page to ``path``."""
    path = Path(path)
    path.write_text(render_page(page), encoding="utf-8")
    return path


def write_html(
    path: str | Path, results: dict[str, Rows], found: list[Finding], *, dataset: str = ""
) -> Path:
    """Render the report and write it to ``path``."""
    return write_page(path, build_page(results, found, dataset=dataset))


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_jobs.report REPORT_DIR [--source S ...]``: re-render report.html."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m spark_jobs.report", description=main.__doc__)
    parser.add_argument("report_dir")
    parser.add_argument("--source", action="append", default=[], help="only this run (repeatable)")
    parser.add_argument(
        "-o", "--output", default=None, help="page to write [default: REPORT_DIR/report.html]"
    )
    args = parser.parse_args(argv)
    results = load_results(args.report_dir, sources=args.source or None)
    results.pop("findings", None)
    path = write_html(
        args.output or Path(args.report_dir) / "report.html",
        results,
        findings(results),
        dataset=args.report_dir,
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
