"""The report's supporting tables: each result aggregated to what a reader compares, labelled,
with cells as text plus a sort key. The page makes them sortable and filterable; the terminal
prints the same tables (``kwire analyze --tables``).

Each table names the Parquet result it comes from (``REPORT_DIR/<result>/``), where every row and
column stays available (``kwire sql``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from statistics import median
from typing import Any

from spark_jobs.findings import client_label
from spark_jobs.report_model import Lane, client_name, seconds_text

__all__ = ["Cell", "Column", "TableView", "build_tables", "cell_text"]

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Column:
    header: str
    key: str
    kind: str = "text"  # text, int, float, pct, ms, s, time, bool, list, client, broker
    help: str = ""


@dataclass(frozen=True)
class Cell:
    text: str
    sort: Any  # a number, or the text
    title: str = ""


@dataclass(frozen=True)
class TableView:
    """One supporting table, ready to print or render."""

    name: str  # the result (Parquet folder) it comes from
    title: str
    note: str  # what one row is
    columns: list[Column]
    rows: list[list[Cell]]
    result_rows: int  # rows in the Parquet result

    @property
    def count_text(self) -> str:
        n = len(self.rows)
        text = f"{n:,} row{'' if n == 1 else 's'}"
        if self.result_rows != n:
            text += f", from {self.result_rows:,} in the result"
        return text


def cell_text(v: Any, kind: str = "text") -> str:
    """One value as the page and the terminal show it."""
    if v is None or v == "":
        return ""
    if kind == "s":
        return seconds_text(float(v))
    if kind == "ms":
        v = float(v)
        return f"{v:,.0f} ms" if v >= 100 else f"{v:.3g} ms"
    if kind == "pct":
        return f"{float(v):.0f}%"
    if kind == "bool":
        return "yes" if v else "no"
    if isinstance(v, datetime):
        return v.strftime("%H:%M:%S.%f")[:-3]
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, list | tuple | set):
        items = [str(x) for x in v]
        return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")
    if isinstance(v, dict):
        return ", ".join(f"{k} {cell_text(x)}" for k, x in v.items())
    return str(v)


def _sort_key(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int | float):
        return v
    if isinstance(v, datetime):
        return v.timestamp()
    if isinstance(v, list | tuple | set):
        return len(v)
    return "" if v is None else str(v)


class _Names:
    """Client names as the timeline's lanes call them; full labels as cell titles."""

    def __init__(self, lanes: list[Lane], results: dict[str, Rows]) -> None:
        self.by_key = {ln.key: ln.name for ln in lanes if ln.kind == "client"}
        self.by_id_ip: dict[tuple, str] = {}
        for ln in lanes:
            if ln.kind == "client":
                self.by_id_ip.setdefault(ln.key[1:], ln.name)

    def cell(self, r: dict[str, Any]) -> Cell:
        key = (r.get("source"), r.get("client_id"), r.get("client_ip"))
        name = self.by_key.get(key) or self.by_id_ip.get(key[1:]) or client_name(r)
        return Cell(name, name.lower(), client_label(r))


def _broker(r: dict[str, Any], ip: str = "broker_ip", port: str = "broker_port") -> str | None:
    if r.get(ip) is None:
        return None
    return f"{r[ip]}:{r[port]}" if r.get(port) is not None else r[ip]


def _group(rows: Rows, keys: Iterable[str], aggs: dict[str, tuple[str, str]]) -> Rows:
    """Rows grouped by ``keys``; ``aggs`` is out column -> (sum|max|min|count|distinct|median|
    first|union, input column)."""
    keys = list(keys)
    groups: dict[tuple, Rows] = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k) for k in keys)].append(r)
    out = []
    for key, members in groups.items():
        row = dict(zip(keys, key, strict=True))
        row.update({k: members[0].get(k) for k in ("client_software_name", "client_software_version")})
        for name, (fn, col) in aggs.items():
            values = [m.get(col) for m in members if m.get(col) is not None]
            if fn == "count":
                row[name] = len(members)
            elif fn == "sum":
                row[name] = sum(values) if values else None
            elif fn == "max":
                row[name] = max(values) if values else None
            elif fn == "min":
                row[name] = min(values) if values else None
            elif fn == "median":
                row[name] = median(values) if values else None
            elif fn == "distinct":
                row[name] = len(set(values))
            elif fn == "union":
                row[name] = sorted({str(v) for v in values})
            else:
                row[name] = values[0] if values else None
        out.append(row)
    return out


_CLIENT = Column("client", "client", "client")


@dataclass(frozen=True)
class _Spec:
    title: str
    note: str
    columns: list[Column]
    prepare: Callable[[Rows], Rows] = lambda rows: rows
    sort: tuple[str, bool] | None = None  # (key, descending)


def _delivery(rows: Rows) -> Rows:
    sums = [
        "records_sent",
        "records_acked",
        "records_failed",
        "records_dropped",
        "records_lost",
        "records_duplicated",
        "records_unconfirmed",
        "records_failed_but_written",
        "retries",
    ]
    aggs = {c: ("sum", c) for c in sums}
    aggs |= {
        "topics": ("union", "topic"),
        "partitions": ("count", "partition"),
        "first_sent": ("min", "first_sent"),
        "last_sent": ("max", "last_sent"),
    }
    return _group(rows, ["source", "client_id", "client_ip"], aggs)


def _stale(rows: Rows) -> Rows:
    for r in rows:
        src = r.get("change_source") or ""
        if src == "metadata":
            r["cause"] = "Metadata showed a new leader"
            r["move"] = f"node {r.get('old_leader')} → node {r.get('new_leader')}"
        else:
            code = src.split(":", 1)[-1]
            r["cause"] = f"error {code} ({_ERROR_NAMES.get(code, 'error')})"
            r["move"] = "new leader not named by an error"
    return _group(
        rows,
        ["source", "client_id", "client_ip", "topic", "cause", "refreshed"],
        {
            "partitions": ("distinct", "partition"),
            "windows": ("count", "partition"),
            "moves": ("union", "move"),
            "first_change": ("min", "change_time"),
            "stale_p50": ("median", "stale_s"),
            "stale_max": ("max", "stale_s"),
        },
    )


_ERROR_NAMES = {"6": "NOT_LEADER_OR_FOLLOWER", "56": "KAFKA_STORAGE_ERROR"}


def _broken(rows: Rows) -> Rows:
    for r in rows:
        r["broker"] = _broker(r)
    return _group(
        rows,
        ["source", "client_id", "client_ip", "broker", "ended_by", "last_unanswered_api"],
        {
            "connections": ("count", "connection_id"),
            "unanswered": ("sum", "unanswered"),
            "waited_max": ("max", "waited_s"),
            "first_end": ("min", "end_time"),
            "last_end": ("max", "end_time"),
        },
    )


def _with_broker(rows: Rows) -> Rows:
    for r in rows:
        r["broker"] = _broker(r)
    return rows


def _latency(rows: Rows) -> Rows:
    kept = [r for r in rows if r.get("scope") in ("api", "api_broker")]
    for r in kept:
        r["broker"] = _broker(r) or "(all brokers)"
    return kept


def _skew(rows: Rows) -> Rows:
    for r in rows:
        r["leader_nodes"] = ", ".join(f"node {n}" for n in (r.get("leaders") or []))
    return rows


def _skew_brokers(rows: Rows) -> Rows:
    for r in rows:
        r["broker"] = f"node {r.get('node_id')}" + (
            f" ({r['host']}:{r.get('port')})" if r.get("host") else ""
        )
    return rows


def _outages(rows: Rows) -> Rows:
    for r in rows:
        r["broker"] = _broker(r)
        r["clients"] = list(r.get("client_ids") or [])
    return rows


def _drops(rows: Rows) -> Rows:
    for r in rows:
        r["broker"] = _broker(r)
        r["clients"] = list(r.get("client_ids") or [])
    return rows


def _software(rows: Rows) -> Rows:
    for r in rows:
        r["software"] = (
            f"{r.get('client_software_name') or ''} {r.get('client_software_version') or ''}".strip()
        )
        if "brokers" in r and isinstance(r["brokers"], list):
            r["broker_list"] = r["brokers"]
    return rows


def _unsupported(rows: Rows) -> Rows:
    for r in rows:
        r["broker"] = _broker(r)
        r["request"] = f"{r.get('api_name') or r.get('api_key')} v{r.get('api_version')}"
    return rows


_SPECS: dict[str, _Spec] = {
    "outages": _Spec(
        "Broker outages",
        "one row per stretch a broker stopped answering",
        [
            Column("broker", "broker"),
            Column("kind", "kind"),
            Column("start", "start", "time"),
            Column("end", "end", "time"),
            Column("duration", "duration_s", "s"),
            Column("frozen", "frozen_s", "s", "answering nothing while connections stayed open"),
            Column("requests unanswered", "requests_unanswered", "int"),
            Column("answered late", "requests_answered_late", "int"),
            Column("connections closed", "connections_closed", "int"),
            Column("refused", "connections_refused", "int"),
            Column("clients", "clients", "list"),
        ],
        _outages,
    ),
    "old_broker_drops": _Spec(
        "Requests a broker dropped while it answered others",
        "one row per drop event (requests read in one poll)",
        [
            Column("broker", "broker"),
            Column("cause", "cause"),
            Column("first request", "first_request", "time"),
            Column("last request", "last_request", "time"),
            Column("dropped", "requests_dropped", "int"),
            Column("ApiVersions dropped", "apiversions_dropped", "int"),
            Column("other dropped", "other_requests_dropped", "int"),
            Column("connections silent after", "connections_silent", "int"),
            Column("clients", "clients", "list"),
        ],
        _drops,
    ),
    "delivery": _Spec(
        "Delivery per producer",
        "one row per client: every partition it wrote to, summed",
        [
            _CLIENT,
            Column("topics", "topics", "list"),
            Column("partitions", "partitions", "int"),
            Column("records sent", "records_sent", "int"),
            Column("acked", "records_acked", "int"),
            Column("failed", "records_failed", "int"),
            Column("dropped", "records_dropped", "int", "failed and never sent again"),
            Column("lost", "records_lost", "int", "acked, and not there when fetched"),
            Column("duplicated", "records_duplicated", "int"),
            Column("unconfirmed", "records_unconfirmed", "int", "acked, never fetched in the data"),
            Column("retries", "retries", "int"),
            Column("first sent", "first_sent", "time"),
            Column("last sent", "last_sent", "time"),
        ],
        _delivery,
        ("records_sent", True),
    ),
    "error_reaction_headline": _Spec(
        "Reaction to KAFKA_STORAGE_ERROR (56) and NOT_LEADER_OR_FOLLOWER (6)",
        "one row per client that got either error",
        [
            _CLIENT,
            Column("errors 56", "errors_56", "int"),
            Column("reaction to 56", "reaction_56"),
            Column("errors 6", "errors_6", "int"),
            Column("reaction to 6", "reaction_6"),
            Column("reactions differ", "reactions_differ", "bool"),
        ],
    ),
    "error_reaction": _Spec(
        "What each client did after an error",
        "one row per client, api, error and verdict",
        [
            _CLIENT,
            Column("api", "api_name"),
            Column("error", "error_name"),
            Column("verdict", "verdict"),
            Column("errors", "errors", "int"),
            Column("retries", "retries", "int"),
            Column("Metadata refreshes", "refreshes", "int"),
            Column("refresh after (p50)", "refresh_p50_ms", "ms"),
            Column("records dropped", "records_dropped", "int"),
            Column("first error", "first_error_time", "time"),
            Column("last error", "last_error_time", "time"),
        ],
        sort=("errors", True),
    ),
    "metadata_refresh": _Spec(
        "Metadata refresh per client",
        "one row per client: how often it asked for Metadata",
        [
            _CLIENT,
            Column("Metadata requests", "metadata_requests", "int"),
            Column("interval p50", "interval_p50_s", "s"),
            Column("interval max", "interval_max_s", "s"),
            Column(
                "longest without",
                "longest_gap_s",
                "s",
                "the longest stretch of activity without a Metadata request",
            ),
            Column("active", "active_s", "s"),
            Column("refreshes periodically", "refreshes_periodically", "bool"),
        ],
        sort=("longest_gap_s", True),
    ),
    "metadata_stale_windows": _Spec(
        "Stale metadata after leadership changes",
        "one row per client, topic and cause: the partitions it kept writing to an old leader",
        [
            _CLIENT,
            Column("topic", "topic"),
            Column("cause", "cause"),
            Column("leader moves", "moves", "list"),
            Column("partitions", "partitions", "int"),
            Column("windows", "windows", "int"),
            Column("first change", "first_change", "time"),
            Column("stale p50", "stale_p50", "s"),
            Column("stale max", "stale_max", "s"),
            Column("refreshed", "refreshed", "bool", "asked for Metadata before the data ended"),
        ],
        _stale,
        ("stale_max", True),
    ),
    "producer_acks": _Spec(
        "Producer acks",
        "one row per client and acks setting",
        [
            _CLIENT,
            Column("acks", "acks_label"),
            Column("requests", "requests", "int"),
            Column("records", "records", "int"),
            Column("topics", "topics", "list"),
            Column("data loss risk", "data_loss_risk", "bool"),
        ],
    ),
    "coordinator_errors": _Spec(
        "Coordinator error storms",
        "one row per group and storm",
        [
            Column("group", "group_id"),
            Column("broker", "broker"),
            Column("start", "storm_start", "time"),
            Column("end", "storm_end", "time"),
            Column("duration", "duration_s", "s"),
            Column("errors", "errors", "int"),
            Column("NOT_COORDINATOR", "not_coordinator", "int"),
            Column("LOAD_IN_PROGRESS", "load_in_progress", "int"),
            Column("NOT_AVAILABLE", "not_available", "int"),
            Column("clients", "clients", "int"),
        ],
        _with_broker,
    ),
    "connection_health": _Spec(
        "Connections per client",
        "one row per client",
        [
            _CLIENT,
            Column("connections", "connections", "int"),
            Column("brokers", "brokers", "int"),
            Column("reconnects", "reconnects", "int"),
            Column("per minute", "connections_per_min", "float"),
            Column("ended by broker", "ended_by_broker", "int"),
            Column("ended by client", "ended_by_client", "int"),
            Column("ended mid-request", "ended_mid_request", "int"),
            Column("requests", "requests", "int"),
            Column("unanswered", "unanswered", "int"),
            Column("unanswered %", "unanswered_pct", "float"),
        ],
        sort=("unanswered", True),
    ),
    "connection_broken": _Spec(
        "Connections that ended with requests unanswered",
        "one row per client, broker, who ended it and the last api left waiting",
        [
            _CLIENT,
            Column("broker", "broker"),
            Column("ended by", "ended_by"),
            Column("last unanswered api", "last_unanswered_api"),
            Column("connections", "connections", "int"),
            Column("unanswered", "unanswered", "int"),
            Column("waited (max)", "waited_max", "s"),
            Column("first end", "first_end", "time"),
            Column("last end", "last_end", "time"),
        ],
        _broken,
        ("unanswered", True),
    ),
    "connection_latency": _Spec(
        "Latency per api and broker",
        "one row per api (all brokers) and per api and broker; per client in the Parquet",
        [
            Column("api", "api_name"),
            Column("broker", "broker"),
            Column("requests", "requests", "int"),
            Column("p50", "p50_ms", "ms"),
            Column("p99", "p99_ms", "ms"),
            Column("max", "max_ms", "ms"),
        ],
        _latency,
        ("requests", True),
    ),
    "leader_skew": _Spec(
        "Partition placement per topic",
        "one row per topic (kafka-manager's metrics)",
        [
            Column("topic", "topic"),
            Column("partitions", "partitions", "int"),
            Column("replication factor", "replication_factor", "int"),
            Column("brokers used", "brokers_used", "int"),
            Column("brokers in cluster", "brokers_in_cluster", "int"),
            Column("spread", "brokers_spread_pct", "pct"),
            Column("skew", "brokers_skew_pct", "pct"),
            Column("leader skew", "brokers_leader_skew_pct", "pct"),
            Column(
                "nodes leading", "leader_nodes", "text", "the broker ids that lead at least one partition"
            ),
        ],
        _skew,
    ),
    "leader_skew_brokers": _Spec(
        "Replicas and leaders per broker",
        "one row per broker",
        [
            Column("broker", "broker"),
            Column("in cluster", "in_cluster", "bool"),
            Column("replicas", "replicas", "int"),
            Column("leaders", "leaders", "int"),
            Column("leader share", "leader_share_pct", "pct"),
            Column("fair share", "fair_share_pct", "pct"),
            Column("topics led", "topics_led", "int"),
        ],
        _skew_brokers,
    ),
    "unsupported_versions": _Spec(
        "Requests a broker does not support",
        "one row per client, broker, api and version",
        [
            _CLIENT,
            Column("broker", "broker"),
            Column("request", "request"),
            Column("count", "count", "int"),
            Column("reason", "reason"),
            Column("severity", "severity"),
            Column("reference", "reference"),
        ],
        _unsupported,
    ),
    "client_inventory": _Spec(
        "Client inventory",
        "one row per client",
        [
            _CLIENT,
            Column("software", "software"),
            Column("first seen", "first_seen", "time"),
            Column("last seen", "last_seen", "time"),
            Column("requests", "requests", "int"),
            Column("brokers", "broker_list", "list"),
            Column("fingerprint", "fingerprint_id"),
            Column("clients with it", "same_fingerprint_clients", "int"),
        ],
        _software,
        ("requests", True),
    ),
}

#: Results drawn elsewhere (the findings, the timeline) or too detailed for a table on the page:
#: they are listed with their row counts and links only.
DETAIL_RESULTS = (
    "findings",
    "incident_timeline",
    "incident_lanes",
    "incident_sources",
    "delivery_batches",
    "error_reaction_events",
    "latency_timeline",
    "error_timeline",
    "coordinator_errors_timeline",
)


def build_tables(results: dict[str, Rows], lanes: list[Lane]) -> list[TableView]:
    """The supporting tables, in reading order, for every result that has rows."""
    names = _Names(lanes, results)
    sources = {r.get("source") for rows in results.values() for r in rows if r.get("source")}
    tables = []
    for name, spec in _SPECS.items():
        rows = results.get(name) or []
        if not rows:
            continue
        shown = spec.prepare([dict(r) for r in rows])
        if spec.sort:
            key, desc = spec.sort
            present = sorted(
                (r for r in shown if r.get(key) is not None),
                key=lambda r, k=key: _sort_key(r[k]),
                reverse=desc,
            )
            shown = present + [r for r in shown if r.get(key) is None]
        columns = list(spec.columns)
        if len(sources) > 1 and any("source" in r for r in shown):
            columns.insert(0, Column("source", "source"))
        body = []
        for r in shown:
            cells = []
            for c in columns:
                if c.kind == "client":
                    cells.append(names.cell(r))
                else:
                    v = r.get(c.key)
                    title = v.strftime("%Y-%m-%d %H:%M:%S.%f UTC") if isinstance(v, datetime) else ""
                    cells.append(Cell(cell_text(v, c.kind), _sort_key(v), title))
            body.append(cells)
        tables.append(TableView(name, spec.title, spec.note, columns, body, len(rows)))
    return tables
