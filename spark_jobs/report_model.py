"""What the report says, as plain data: the summary, the clients and brokers with short names, and
the per-client summary. Shared by the HTML page (:mod:`spark_jobs.report`) and the terminal
(``kwire analyze``) so that both show the same numbers.

Built from the results the jobs wrote (``{result name: rows}``); a result that was not computed
(``kwire analyze --only``) leaves its part empty rather than failing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spark_jobs.findings import SEVERITIES, Finding, internal_client

__all__ = [
    "ClientSummary",
    "Lane",
    "SourceSummary",
    "Summary",
    "build_summary",
    "client_name",
    "duration_text",
    "lanes",
    "seconds_text",
]

Rows = list[dict[str, Any]]


def seconds_text(v: float | None) -> str:
    """A duration in seconds, as precise as it needs to be: ``0.12 s``, ``3.4 s``, ``95 s``."""
    if v is None:
        return ""
    if v == 0:
        return "0 s"
    if abs(v) < 0.01:
        return f"{v * 1000:.2g} ms"
    if abs(v) < 10:
        return f"{v:.2g} s" if abs(v) < 1 else f"{v:.1f} s"
    return f"{v:,.0f} s"


def duration_text(seconds: float | None) -> str:
    """``42.1 s``, ``12 min 5 s``, ``3 h 02 min``."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _software(r: dict[str, Any]) -> str:
    name = r.get("client_software_name")
    if not name:
        return r.get("client_software") or ""
    return f"{name} {r.get('client_software_version') or ''}".strip()


def client_name(r: dict[str, Any], *, with_ip: bool = False, with_source: bool = False) -> str:
    """A client's short name: its client id (``(no client id)`` when it sent none), with its
    address and run only where they are needed to tell two clients apart."""
    name = r.get("client_id") or "(no client id)"
    if with_ip and r.get("client_ip"):
        name += f" @{r['client_ip']}"
    if with_source and r.get("source"):
        name += f" [{r['source']}]"
    return name


@dataclass(frozen=True)
class Lane:
    """One lane of the incident timeline: a client or a broker of one run."""

    kind: str  # client or broker
    source: str | None
    key: tuple  # (source, client_id, client_ip) or (source, broker_ip, broker_port)
    name: str  # what the page and the terminal call it
    software: str = ""
    internal: bool = False  # a broker's or controller's own client connection
    node_id: int | None = None
    totals: dict[str, int] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None


def lanes(results: dict[str, Rows]) -> list[Lane]:
    """The timeline's lanes, brokers first, then application clients, then brokers' own
    clients (replica fetchers, controller channels), each group in name order. A client is named
    by its client id; one id on two addresses of one run gets them. Runs are told apart by their
    own column and timeline, not in the name."""
    rows = results.get("incident_lanes", [])
    clients = [r for r in rows if r.get("lane_kind") == "client"]
    ids = Counter((r.get("source"), r.get("client_id")) for r in clients)
    out = []
    for r in rows:
        totals = {
            k: int(r.get(k) or 0)
            for k in ("requests", "unanswered", "error_results", "metadata_requests", "disconnects")
        }
        common = {
            "source": r.get("source"),
            "totals": totals,
            "first": r.get("first_bucket"),
            "last": r.get("last_bucket_end"),
        }
        if r.get("lane_kind") == "broker":
            addr = f"{r.get('broker_ip')}:{r.get('broker_port')}"
            node = r.get("node_id")
            name = f"broker {node} ({addr})" if node is not None else addr
            key = (r.get("source"), r.get("broker_ip"), r.get("broker_port"))
            out.append(Lane("broker", key=key, name=name, node_id=node, **common))
        else:
            name = client_name(r, with_ip=ids[(r.get("source"), r.get("client_id"))] > 1)
            key = (r.get("source"), r.get("client_id"), r.get("client_ip"))
            out.append(
                Lane(
                    "client", key=key, name=name, software=_software(r), internal=internal_client(r), **common
                )
            )
    # brokers the Metadata responses named first (by node id), then other listeners (controllers)
    return sorted(
        out,
        key=lambda ln: (
            ln.source or "",
            ln.kind != "broker",
            ln.internal,
            ln.node_id is None,
            ln.node_id if ln.node_id is not None else 0,
            ln.name,
        ),
    )


@dataclass(frozen=True)
class NotSeen:
    """What a run's data lacks: bytes no decoder saw (a capture's lost packets, or what a proxy's
    recorder skipped when it fell behind), on how many connections, the exchanges that left
    unknown (status ``gap``), and rows a proxy's writer dropped."""

    bytes: int
    connections: int
    gap_rows: int
    dropped_rows: int

    def __add__(self, other: NotSeen) -> NotSeen:
        return NotSeen(
            self.bytes + other.bytes,
            self.connections + other.connections,
            self.gap_rows + other.gap_rows,
            self.dropped_rows + other.dropped_rows,
        )

    def __bool__(self) -> bool:
        return bool(self.bytes or self.gap_rows or self.dropped_rows)

    def text(self) -> str:
        """What is missing, in words (the page's figure and the terminal's summary)."""
        parts = []
        if self.bytes:
            parts.append(
                f"{self.bytes:,} bytes on {self.connections:,} connection{'s' if self.connections != 1 else ''} "
                "lost by the capture or skipped by a proxy's recorder"
            )
        if self.gap_rows:
            parts.append(
                f"{self.gap_rows:,} exchange{'s' if self.gap_rows != 1 else ''} left unknown (status gap)"
            )
        if self.dropped_rows:
            parts.append(f"{self.dropped_rows:,} rows dropped by a proxy's writer")
        return "; ".join(parts)


@dataclass(frozen=True)
class SourceSummary:
    """One run (capture file, proxy) of the dataset."""

    source: str
    first: datetime | None
    last: datetime | None
    exchanges: int
    connections: int
    clients: int
    brokers: int
    errors: int
    bucket_s: float | None
    not_seen: NotSeen = field(default_factory=lambda: NotSeen(0, 0, 0, 0))

    @property
    def span_s(self) -> float | None:
        return (self.last - self.first).total_seconds() if self.first and self.last else None


@dataclass(frozen=True)
class ClientSummary:
    """One client's line in the per-client summary."""

    name: str
    source: str | None
    software: str
    requests: int
    unanswered: int
    errors: int
    top_errors: list[tuple[str, int]]
    metadata_requests: int
    disconnects: int
    findings: int
    worst: str | None  # the most severe finding's severity
    internal: bool


@dataclass(frozen=True)
class Summary:
    """The page's first section, and the terminal's header."""

    sources: list[SourceSummary]
    first: datetime | None
    last: datetime | None
    covered_s: float | None  # the sum of the runs' own spans (less than last - first when apart)
    exchanges: int | None
    connections: int | None
    errors: int | None
    not_seen: NotSeen | None  # summed over the runs
    brokers: list[Lane]
    clients: list[ClientSummary]
    findings_by_severity: dict[str, int]
    software: dict[str, int]  # software -> clients (application clients only)
    #: the incident_timeline job ran (no ``sources`` then means a dataset with no traffic at all)
    timeline_ran: bool = True

    @property
    def span_s(self) -> float | None:
        return (self.last - self.first).total_seconds() if self.first and self.last else None

    @property
    def application_clients(self) -> list[ClientSummary]:
        return [c for c in self.clients if not c.internal]


def build_summary(results: dict[str, Rows], found: list[Finding]) -> Summary:
    """The summary of a report from its results and findings."""
    src_rows = results.get("incident_sources", [])
    sources = [
        SourceSummary(
            source=r.get("source") or "",
            first=r.get("first_time"),
            last=r.get("last_time"),
            exchanges=int(r.get("exchanges") or 0),
            connections=int(r.get("connections") or 0),
            clients=int(r.get("clients") or 0),
            brokers=int(r.get("brokers") or 0),
            errors=int(r.get("error_results") or 0),
            bucket_s=r.get("bucket_s"),
            not_seen=NotSeen(
                int(r.get("bytes_not_seen") or 0),
                int(r.get("connections_with_gaps") or 0),
                int(r.get("gap_rows") or 0),
                int(r.get("dropped_rows") or 0),
            ),
        )
        for r in sorted(src_rows, key=lambda r: (r.get("first_time") is None, r.get("first_time") or 0))
    ]
    firsts = [s.first for s in sources if s.first]
    lasts = [s.last for s in sources if s.last]
    all_lanes = lanes(results)
    errors_by_client: dict[tuple, Counter] = defaultdict(Counter)
    for r in results.get("incident_timeline", []):
        if r.get("lane_kind") == "client" and r.get("event") == "error":
            key = (r.get("source"), r.get("client_id"), r.get("client_ip"))
            errors_by_client[key][r.get("detail") or str(r.get("code"))] += int(r.get("count") or 0)
    per_client_findings: dict[tuple, list[Finding]] = defaultdict(list)
    for f in found:
        if f.client_id is not None or f.client_ip is not None:
            per_client_findings[(f.client_id, f.client_ip)].append(f)
    clients = []
    for lane in all_lanes:
        if lane.kind != "client":
            continue
        # a rule over a result without a source names the client alone: it is every run's
        mine = [f for f in per_client_findings.get(lane.key[1:], []) if f.source in (None, lane.source)]
        worst = min((SEVERITIES.index(f.severity) for f in mine), default=None)
        clients.append(
            ClientSummary(
                name=lane.name,
                source=lane.source,
                software=lane.software,
                requests=lane.totals["requests"],
                unanswered=lane.totals["unanswered"],
                errors=lane.totals["error_results"],
                top_errors=errors_by_client[lane.key].most_common(3),
                metadata_requests=lane.totals["metadata_requests"],
                disconnects=lane.totals["disconnects"],
                findings=len(mine),
                worst=SEVERITIES[worst] if worst is not None else None,
                internal=lane.internal,
            )
        )
    software = Counter(c.software or "(not announced)" for c in clients if not c.internal)
    return Summary(
        sources=sources,
        first=min(firsts) if firsts else None,
        last=max(lasts) if lasts else None,
        covered_s=sum(s.span_s or 0 for s in sources) if sources else None,
        exchanges=sum(s.exchanges for s in sources) if sources else None,
        connections=sum(s.connections for s in sources) if sources else None,
        errors=sum(s.errors for s in sources) if sources else None,
        not_seen=sum((s.not_seen for s in sources), NotSeen(0, 0, 0, 0)) if sources else None,
        brokers=[ln for ln in all_lanes if ln.kind == "broker"],
        clients=clients,
        findings_by_severity={s: sum(1 for f in found if f.severity == s) for s in SEVERITIES},
        software=dict(software.most_common()),
        timeline_ran="incident_sources" in results,
    )
