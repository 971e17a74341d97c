"""The analysis report: findings first, then charts and tables, as one self-contained HTML page.

Built from the Parquet results the jobs wrote (read with pyarrow, no Spark needed), so it can be
regenerated from ``REPORT_DIR`` alone. Charts are inline SVG drawn here; the page has no
script, no external style sheet, no font or CDN: it reads offline.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from spark_jobs.findings import Finding, client_label
from spark_jobs.findings import build_findings as findings

__all__ = [
    "HEADLINE_COLUMNS",
    "Finding",
    "client_label",
    "display_cells",
    "findings",
    "load_results",
    "render_html",
    "write_html",
]

Rows = list[dict[str, Any]]

#: Columns shown per result in the terminal headline tables and the HTML tables (in order).
HEADLINE_COLUMNS: dict[str, list[str]] = {
    "unsupported_versions": [
        "client_id",
        "client_ip",
        "client_software_name",
        "client_software_version",
        "broker_ip",
        "api_name",
        "api_version",
        "count",
        "reason",
        "reference",
        "severity",
    ],
    "error_reaction_headline": [
        "client_id",
        "client_ip",
        "client_software_name",
        "client_software_version",
        "errors_56",
        "reaction_56",
        "errors_6",
        "reaction_6",
        "reactions_differ",
    ],
    "error_reaction": [
        "client_id",
        "client_ip",
        "topic",
        "partition",
        "error_code",
        "error_time",
        "metadata_delay_ms",
        "requests_before_refresh",
        "first_success_ms",
        "verdict",
    ],
    "metadata_refresh": [
        "client_id",
        "client_ip",
        "client_software_name",
        "metadata_requests",
        "interval_p50_s",
        "interval_max_s",
        "longest_gap_s",
        "refreshes_periodically",
    ],
    "metadata_stale_windows": [
        "client_id",
        "client_ip",
        "topic",
        "partition",
        "change_time",
        "change_source",
        "new_leader",
        "stale_s",
        "refreshed",
    ],
    "producer_acks": [
        "client_id",
        "client_ip",
        "client_software_name",
        "acks_label",
        "requests",
        "records",
        "data_loss_risk",
    ],
    "coordinator_errors": [
        "group_id",
        "broker_ip",
        "storm_start",
        "storm_end",
        "duration_s",
        "errors",
        "not_coordinator",
        "load_in_progress",
        "not_available",
        "clients",
    ],
    "coordinator_errors_timeline": ["bucket", "group_id", "broker_ip", "error_name", "errors"],
    "connection_health": [
        "client_id",
        "client_ip",
        "connections",
        "reconnects",
        "connections_per_min",
        "ended_rst",
        "ended_mid_request",
        "requests",
        "unanswered",
        "unanswered_pct",
    ],
    "connection_broken": [
        "client_id",
        "client_ip",
        "broker_ip",
        "end_reason",
        "unanswered",
        "last_unanswered_api",
        "waited_s",
        "closed",
    ],
    "connection_latency": [
        "scope",
        "api_name",
        "broker_ip",
        "client_id",
        "requests",
        "p50_ms",
        "p99_ms",
        "max_ms",
    ],
    "leader_skew": [
        "topic",
        "partitions",
        "replication_factor",
        "brokers_used",
        "brokers_in_cluster",
        "brokers_spread_pct",
        "brokers_skew_pct",
        "brokers_leader_skew_pct",
        "leaders",
    ],
    "leader_skew_brokers": [
        "node_id",
        "host",
        "port",
        "in_cluster",
        "replicas",
        "leaders",
        "leader_share_pct",
        "fair_share_pct",
        "topics_led",
    ],
    "client_inventory": [
        "client_id",
        "client_ip",
        "client_software_name",
        "client_software_version",
        "first_seen",
        "last_seen",
        "requests",
        "fingerprint_id",
        "same_fingerprint_clients",
        "fingerprint_software",
    ],
    "latency_timeline": ["bucket", "api_name", "requests", "p50_ms", "p99_ms", "max_ms"],
    "error_timeline": ["bucket", "client_id", "client_ip", "error_name", "errors"],
}

_TITLES = {
    "unsupported_versions": "Requests the broker does not support",
    "error_reaction_headline": "Reaction to KAFKA_STORAGE_ERROR (56) vs NOT_LEADER_OR_FOLLOWER (6)",
    "error_reaction": "Every watched partition error and what the client did next",
    "metadata_refresh": "Metadata refresh per client",
    "metadata_stale_windows": "Stale windows after leadership changes",
    "producer_acks": "Producer acks",
    "coordinator_errors": "Coordinator error storms",
    "coordinator_errors_timeline": "Coordinator errors over time",
    "connection_health": "Connection health per client",
    "connection_broken": "Connections ended mid-request",
    "connection_latency": "Latency per api, broker and client",
    "leader_skew": "Partition placement per topic (kafka-manager metrics)",
    "leader_skew_brokers": "Replicas and leaders per broker",
    "client_inventory": "Client inventory",
    "latency_timeline": "Latency over time",
    "error_timeline": "Errors over time",
}


def load_results(report_dir: str | Path) -> dict[str, Rows]:
    """Every result under ``report_dir`` (one subdirectory of Parquet files each) as rows."""
    out: dict[str, Rows] = {}
    for sub in sorted(Path(report_dir).iterdir()) if Path(report_dir).is_dir() else []:
        if sub.is_dir() and any(sub.glob("*.parquet")):
            out[sub.name] = pq.read_table(sub).to_pylist()
    return out


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


# --- SVG charts -----------------------------------------------------------------------------

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _ts(v: Any) -> float:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp()
    return float(v)


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def line_chart(
    series: dict[str, list[tuple[Any, float]]],
    title: str,
    y_label: str,
    *,
    width: int = 760,
    height: int = 260,
) -> str:
    """Inline SVG line chart; x values are datetimes (UTC) or numbers."""
    pts = [(_ts(x), float(y)) for s in series.values() for x, y in s if y is not None]
    if not pts:
        return f"<p class='empty'>{html.escape(title)}: no data</p>"
    left, right, top, bottom = 60, 230, 28, 34
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(p[1] for p in pts) or 1.0
    x1 = x1 if x1 > x0 else x0 + 60
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - y / y1 * ph

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='{html.escape(title)}'>"
    ]
    parts.append(f"<text x='{left}' y='16' class='ct'>{html.escape(title)}</text>")
    for t in _nice_ticks(0, y1):
        if t <= y1:
            parts.append(
                f"<line x1='{left}' x2='{left + pw}' y1='{sy(t):.1f}' y2='{sy(t):.1f}' class='grid'/>"
            )
            parts.append(
                f"<text x='{left - 6}' y='{sy(t) + 4:.1f}' class='ax' text-anchor='end'>{t:g}</text>"
            )
    span = x1 - x0
    for i in range(6):
        x = x0 + span * i / 5
        label = datetime.fromtimestamp(x, UTC).strftime("%H:%M" if span < 86400 * 2 else "%m-%d %H:%M")
        parts.append(
            f"<text x='{sx(x):.1f}' y='{top + ph + 16}' class='ax' text-anchor='middle'>{label}</text>"
        )
    parts.append(
        f"<text x='14' y='{top + ph / 2:.0f}' class='ax' transform='rotate(-90 14 {top + ph / 2:.0f})' text-anchor='middle'>{html.escape(y_label)}</text>"
    )
    parts.append(f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' class='frame'/>")
    for i, (name, s) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        coords = " ".join(
            f"{sx(_ts(x)):.1f},{sy(float(y)):.1f}"
            for x, y in sorted(s, key=lambda p: _ts(p[0]))
            if y is not None
        )
        if len(s) == 1:
            cx, cy = coords.split(",")
            parts.append(f"<circle cx='{cx}' cy='{cy}' r='3' fill='{color}'/>")
        else:
            parts.append(f"<polyline points='{coords}' fill='none' stroke='{color}' stroke-width='1.6'/>")
        ly = top + 12 + i * 16
        parts.append(f"<rect x='{left + pw + 12}' y='{ly - 9}' width='10' height='10' fill='{color}'/>")
        parts.append(f"<text x='{left + pw + 26}' y='{ly}' class='ax'>{html.escape(str(name)[:34])}</text>")
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(bars: list[tuple[str, float, float | None]], title: str, unit: str, *, width: int = 760) -> str:
    """Horizontal bars (label, value, optional marker value, e.g. p50 bar with a max marker)."""
    bars = [b for b in bars if b[1] is not None]
    if not bars:
        return f"<p class='empty'>{html.escape(title)}: no data</p>"
    left, right, row = 230, 190, 18
    height = 34 + row * len(bars)
    vmax = max(max(b[1], b[2] or 0) for b in bars) or 1.0
    pw = width - left - right
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='{html.escape(title)}'>"
    ]
    parts.append(f"<text x='8' y='16' class='ct'>{html.escape(title)}</text>")
    for i, (label, value, marker) in enumerate(bars):
        y = 26 + i * row
        parts.append(
            f"<text x='{left - 6}' y='{y + 12}' class='ax' text-anchor='end'>{html.escape(label[:36])}</text>"
        )
        parts.append(
            f"<rect x='{left}' y='{y + 2}' width='{max(value / vmax * pw, 1):.1f}' height='{row - 5}' fill='{_COLORS[0]}'/>"
        )
        if marker is not None:
            mx = left + marker / vmax * pw
            parts.append(
                f"<line x1='{mx:.1f}' x2='{mx:.1f}' y1='{y}' y2='{y + row - 1}' stroke='{_COLORS[1]}' stroke-width='2'/>"
            )
        text = f"{value:,.0f} {unit}" + (f" (max {marker:,.0f})" if marker is not None else "")
        parts.append(f"<text x='{left + pw + 4}' y='{y + 12}' class='ax'>{html.escape(text)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _zero_filled(series: dict[str, dict[Any, int]]) -> dict[str, list[tuple[Any, float]]]:
    """Counts per bucket with the buckets where a series had nothing set to 0 (else a line would
    join two distant buckets as if errors had happened in between)."""
    seen = sorted({_ts(b) for s in series.values() for b in s})
    steps = [b - a for a, b in itertools.pairwise(seen) if b > a]
    grid = seen
    if steps and (seen[-1] - seen[0]) / min(steps) < 5000:  # the regular bucket grid
        step = min(steps)
        grid = [seen[0] + i * step for i in range(round((seen[-1] - seen[0]) / step) + 1)]
    return {
        name: [(t, {_ts(b): v for b, v in s.items()}.get(t, 0)) for t in grid] for name, s in series.items()
    }


def _charts(results: dict[str, Rows]) -> list[str]:
    charts = []
    lat = results.get("latency_timeline", [])
    volume: dict[str, int] = {}
    for r in lat:
        volume[r["api_name"]] = volume.get(r["api_name"], 0) + r["requests"]
    top_apis = sorted(volume, key=lambda a: -volume[a])[:6]
    charts.append(
        line_chart(
            {a: [(r["bucket"], r["p99_ms"]) for r in lat if r["api_name"] == a] for a in top_apis},
            "Latency p99 over time, busiest APIs",
            "ms",
        )
    )
    err = results.get("error_timeline", [])
    per_client: dict[str, dict[Any, int]] = {}
    for r in err:
        name = f"{r['client_id']}@{r['client_ip']}"
        per_client.setdefault(name, {})
        per_client[name][r["bucket"]] = per_client[name].get(r["bucket"], 0) + r["errors"]
    top_clients = sorted(per_client, key=lambda c: -sum(per_client[c].values()))[:6]
    charts.append(
        line_chart(
            _zero_filled({c: per_client[c] for c in top_clients}),
            "Errors over time, most affected clients",
            "errors / bucket",
        )
    )
    md = [r for r in results.get("metadata_refresh", []) if r.get("interval_p50_s") is not None]
    md = sorted(md, key=lambda r: -(r.get("longest_gap_s") or 0))[:20]
    charts.append(
        bar_chart(
            [
                (f"{r['client_id']}@{r['client_ip']}", r["interval_p50_s"], r.get("interval_max_s"))
                for r in md
            ],
            "Metadata refresh interval per client: p50 bar, max marker",
            "s",
        )
    )
    coord = results.get("coordinator_errors_timeline", [])
    if coord:
        by_err: dict[str, dict[Any, int]] = {}
        for r in coord:
            by_err.setdefault(r["error_name"], {})
            by_err[r["error_name"]][r["bucket"]] = by_err[r["error_name"]].get(r["bucket"], 0) + r["errors"]
        charts.append(
            line_chart(
                _zero_filled(by_err),
                "Coordinator errors over time",
                "errors / bucket",
            )
        )
    brokers = results.get("leader_skew_brokers", [])
    if brokers:
        charts.append(
            bar_chart(
                [
                    (f"broker {r['node_id']} {r.get('host') or ''}", float(r["leaders"]), None)
                    for r in brokers
                ],
                "Partition leaders per broker",
                "leaders",
            )
        )
    return charts


# --- HTML -----------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 12px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;margin-bottom:16px}.finding{border-left:5px solid #999;padding:6px 10px;margin:8px 0;background:#fafafa}
.critical{border-color:#c62828;background:#fdecea}.warning{border-color:#ef8f00;background:#fff5e5}.info{border-color:#1e6fc2;background:#eaf2fb}
.finding b{display:block}.sev{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:#555}
table{border-collapse:collapse;font-size:12px;margin:6px 0 4px;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;white-space:nowrap}th{background:#f0f0f0}
tr:nth-child(even) td{background:#fafafa}.note{color:#666;font-size:12px}.empty{color:#888}
svg{display:block;margin:10px 0;background:#fff}.ct{font-size:13px;font-weight:600}.ax{font-size:11px;fill:#444}
.grid{stroke:#eee}.frame{fill:none;stroke:#bbb}
"""


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(v, list):
        return ", ".join(_cell(x) for x in v)
    return str(v)


def _table(name: str, rows: Rows, limit: int) -> str:
    cols = [c for c in HEADLINE_COLUMNS.get(name, []) if rows and c in rows[0]] or (
        list(rows[0]) if rows else []
    )
    cells = display_cells(cols, _cell)
    head = "".join(f"<th>{html.escape(header)}</th>" for header, _ in cells)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(text(r))}</td>" for _, text in cells) + "</tr>"
        for r in rows[:limit]
    )
    more = f" (first {limit} shown)" if len(rows) > limit else ""
    return (
        f"<h2 id='{name}'>{html.escape(_TITLES.get(name, name))}</h2>"
        f"<p class='note'>{len(rows)} rows{more}; all columns in <code>{html.escape(name)}/</code> (Parquet).</p>"
        + (
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            if rows
            else "<p class='empty'>nothing found</p>"
        )
    )


def render_html(results: dict[str, Rows], found: list[Finding], *, dataset: str = "", limit: int = 50) -> str:
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    items = (
        "".join(
            f"<div class='finding {f.severity}'><span class='sev'>{f.severity}</span><b>{html.escape(f.title)}</b>{html.escape(f.detail)}</div>"
            for f in found
        )
        or "<p>No findings.</p>"
    )
    order = [n for n in HEADLINE_COLUMNS if n in results] + [n for n in results if n not in HEADLINE_COLUMNS]
    toc = " · ".join(f"<a href='#{n}'>{html.escape(n)}</a>" for n in order)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>kwire report {html.escape(dataset)}</title><style>{_CSS}</style></head><body>"
        f"<h1>kwire analysis</h1><div class='meta'>dataset <code>{html.escape(dataset)}</code> · generated {generated}</div>"
        f"<h2>Findings</h2>{items}<h2>Charts</h2>{''.join(_charts(results))}"
        f"<p class='note'>Tables: {toc}</p>"
        + "".join(_table(n, results[n], limit) for n in order)
        + "</body></html>"
    )


def write_html(
    path: str | Path, results: dict[str, Rows], found: list[Finding], *, dataset: str = ""
) -> Path:
    path = Path(path)
    path.write_text(render_html(results, found, dataset=dataset), encoding="utf-8")
    return path
