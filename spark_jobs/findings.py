"""One findings table: what an operator should look at first, drawn from the jobs' results.

Every finding has a kind (``KINDS``), a severity (critical, warning, info), the client and
broker it is about, its time span, the count behind it, one plain sentence (``summary``),
the numbers and example ids behind it (``evidence``, JSON) and what to do (``advice``).
Where the wire cannot tell something (whether an application saw an error its library
returned, whether a record was read back by a consumer outside the capture), the summary
says what the wire shows and the evidence's ``wire_cannot_show`` says what it cannot.

The rules read the jobs' results as rows (they are small aggregates), so they are plain
Python over ``{result name: rows}``: the same input the HTML report reads from
``REPORT_DIR``. ``write_findings`` writes ``REPORT_DIR/findings/`` (Parquet).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "EXPLAINED_BY",
    "FINDINGS_SCHEMA",
    "KINDS",
    "SEVERITIES",
    "Finding",
    "build_findings",
    "client_label",
    "load_findings",
    "write_findings",
]

Rows = list[dict[str, Any]]

SEVERITIES = ("critical", "warning", "info")
#: Every kind a rule can emit, with the incident or question it answers.
KINDS: dict[str, str] = {
    "records_lost": "records a client sent that were dropped after an error, or acked and never fetched",
    "no_refresh_after_error": "a client kept writing to a broker after an error that means 'ask for new metadata'",
    "retry_storm": "a client resent the same batches to the same broker many times without new metadata",
    "broker_unreachable": "a broker stopped answering: refused connections, connections reset, requests unanswered",
    "old_broker_dropped_requests": "a broker dropped requests read with an api key it does not know (Kafka 0.9)",
    "coordinator_unavailable": "group members got NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for a while",
    "acks_data_loss_risk": "producers writing with acks 0 or 1: a leader change can lose acked records",
    "leader_skew": "one broker leads far more partitions than its share",
    "unsupported_version": "requests the broker does not support",
    "broker_protocol_violation": "a broker answered in a way Kafka's protocol does not allow",
    "client_cannot_parse_broker": "a client closes the connection right after a broker's answer, again and again",
    "reconnect_churn": "a client opens connections at least once a minute",
    "metadata_stale": "a client kept stale metadata long after a leadership change",
    "client_inventory": "the clients seen and their software",
}

#: The results that explain each kind: what `kwire analyze` prints after the findings.
EXPLAINED_BY: dict[str, tuple[str, ...]] = {
    "records_lost": ("delivery",),
    "no_refresh_after_error": ("error_reaction_headline",),
    "retry_storm": ("error_reaction_headline",),
    "broker_unreachable": ("outages",),
    "old_broker_dropped_requests": ("unsupported_versions",),
    "coordinator_unavailable": ("coordinator_errors",),
    "acks_data_loss_risk": ("producer_acks",),
    "leader_skew": ("leader_skew_brokers",),
    "unsupported_version": ("unsupported_versions",),
    "reconnect_churn": ("connection_health",),
    "metadata_stale": ("metadata_stale_windows",),
}

FINDINGS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("severity", pa.string()),
        ("kind", pa.string()),
        ("client_id", pa.string()),
        ("client_ip", pa.string()),
        ("client_software", pa.string()),
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("first_time", pa.timestamp("us", tz="UTC")),
        ("last_time", pa.timestamp("us", tz="UTC")),
        ("count", pa.int64()),
        ("summary", pa.string()),
        ("evidence", pa.string()),
        ("advice", pa.string()),
    ]
)


@dataclass(frozen=True)
class Finding:
    """One row of the findings table (``FINDINGS_SCHEMA``); ``evidence`` is kept as a dict."""

    severity: str
    kind: str
    summary: str
    advice: str = ""
    source: str | None = None
    client_id: str | None = None
    client_ip: str | None = None
    client_software: str | None = None
    broker: str | None = None
    topic: str | None = None
    first_time: datetime | None = None
    last_time: datetime | None = None
    count: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES or self.kind not in KINDS:
            raise ValueError(f"bad finding: severity {self.severity!r}, kind {self.kind!r}")

    @property
    def title(self) -> str:
        """The one-line heading the terminal and the page show."""
        return self.summary

    @property
    def detail(self) -> str:
        """The evidence in words, then the advice."""
        facts = "; ".join(
            f"{k.replace('_', ' ')}: {_text(v)}" for k, v in self.evidence.items() if v not in (None, [], "")
        )
        return " ".join(part for part in (facts + ("." if facts else ""), self.advice) if part)

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["evidence"] = json.dumps(self.evidence, default=str, sort_keys=True)
        return out


def _text(value: Any) -> str:
    if isinstance(value, list):
        shown = ", ".join(str(v) for v in value[:5])
        return shown + (f" and {len(value) - 5} more" if len(value) > 5 else "")
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _names(items: list[str], shown: int = 4) -> str:
    """``a, b, c and 5 more``: a list that never hides how long it is."""
    head = ", ".join(items[:shown])
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


def client_label(r: dict[str, Any]) -> str:
    """A row's client as one phrase: ``'id' at ip (software version)``; never a raw None."""
    name = r.get("client_id")
    who = f"{name!r}" if name else "a client with no client id"
    if r.get("client_ip"):
        who += f" at {r['client_ip']}"
    software = _software(r)
    if software:
        who += f" ({software})"
    return who


#: Client ids Kafka's own brokers and controllers use for their outgoing connections (replica
#: fetchers, the broker-to-controller channel, raft): a broker, never an application client.
_INTERNAL_CLIENT = re.compile(r"^(?:broker-\d+-fetcher-\d+|broker-\d+-.*|raft-client-\d+|\d+)$")


def internal_client(r: dict[str, Any]) -> bool:
    """Whether a row's client is a broker or controller talking to another one."""
    return bool(r.get("client_id") and _INTERNAL_CLIENT.match(r["client_id"]))


def _software(r: dict[str, Any]) -> str | None:
    name = r.get("client_software_name")
    if not name:
        return r.get("client_software")
    return f"{name} {r.get('client_software_version') or ''}".strip()


def _about(r: dict[str, Any]) -> dict[str, Any]:
    """The client/broker columns of a finding, from a result row."""
    broker = r.get("broker") or (
        f"{r['broker_ip']}:{r['broker_port']}"
        if r.get("broker_ip") and r.get("broker_port")
        else r.get("broker_ip")
    )
    return {
        "source": r.get("source"),
        "client_id": r.get("client_id"),
        "client_ip": r.get("client_ip"),
        "client_software": _software(r),
        "broker": broker,
    }


# ----------------------------------------------------------------------------------- rules
#: Leaders above a broker's fair share before a skew is a finding.
SKEW_MIN_EXCESS = 5

Rule = Callable[[dict[str, Rows]], Iterable[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


@rule
def old_broker_dropped(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("unsupported_versions", []):
        if r.get("reason") not in ("unanswered_then_closed", "unanswered_then_silent"):
            continue
        api = r.get("api_name") or f"api {r.get('api_key')}"
        yield Finding(
            "critical",
            "old_broker_dropped_requests",
            f"{api} v{r.get('api_version')} from {client_label(r)} was never answered by "
            f"{r.get('broker_ip')}:{r.get('broker_port')}, and the connection then went "
            f"{'silent' if r['reason'].endswith('silent') else 'closed'}",
            "The broker does not know this api key or version. Kafka 0.9 brokers stop dispatching every "
            "request read in the same poll, from any client: upgrade the broker, or pin the client to the "
            "broker's protocol (librdkafka api.version.request=false, broker.version.fallback=0.9.0.1).",
            count=r.get("count"),
            evidence={"times_sent": r.get("count"), "reference": r.get("reference")},
            **_about(r),
        )


@rule
def broker_unreachable(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("outages", []):
        refused, closed = r.get("connections_refused") or 0, r.get("connections_closed") or 0
        unanswered = r.get("requests_unanswered") or 0
        how = {
            "frozen": "stopped answering while its connections stayed open",
            "dead": "closed its connections and refused new ones",
            "frozen_then_dead": "stopped answering with its connections open, then closed them and refused new ones",
            "unreachable": "never answered new connections",
        }.get(r.get("kind") or "", "stopped answering")
        span = f"for {r['duration_s']:.1f} s" if r.get("duration_s") is not None else "until the data ended"
        broker = _about(r)["broker"]
        yield Finding(
            "critical",
            "broker_unreachable",
            f"broker {broker} {how} {span}: {_plural(unanswered, 'request')} left unanswered, "
            f"{_plural(closed, 'connection')} closed by it, {_plural(refused, 'connection')} refused",
            "Check the broker's process and host for that window (GC pauses, a stopped or killed process, "
            "the network); clients fail over only after their request timeout.",
            source=r.get("source"),
            broker=broker,
            first_time=r.get("start"),
            last_time=r.get("end"),
            count=unanswered,
            evidence={
                "kind": r.get("kind"),
                "frozen_s": r.get("frozen_s"),
                "clients": r.get("client_ids"),
                "wire_cannot_show": "whether the process was paused, swapping or cut off by the network",
            },
        )


@rule
def old_broker_drops(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("old_broker_drops", []):
        if r.get("cause") != "unsupported_apiversions":
            continue
        dropped = r.get("requests_dropped") or 0
        broker = _about(r)["broker"]
        yield Finding(
            "critical",
            "old_broker_dropped_requests",
            f"broker {broker} dropped {_plural(dropped, 'request')} read with an "
            f"ApiVersions it does not know, from {_names(list(r.get('client_ids') or []))}",
            "A Kafka 0.9 broker stops dispatching every request read in the same poll as an unknown api key, "
            "from any client: upgrade the broker, or pin clients to 0.9 (librdkafka api.version.request=false, "
            "broker.version.fallback=0.9.0.1).",
            source=r.get("source"),
            broker=broker,
            first_time=r.get("first_request"),
            last_time=r.get("last_request"),
            count=dropped,
            evidence={
                "apiversions_from": r.get("apiversions_client_ids"),
                "connections_silent": r.get("connections_silent"),
                "answered_again": r.get("answered_again"),
            },
        )


@rule
def unsupported(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("unsupported_versions", []):
        if r.get("severity") != "error" or r.get("reason") in (
            "unanswered_then_closed",
            "unanswered_then_silent",
        ):
            continue
        api = r.get("api_name") or f"api {r.get('api_key')}"
        yield Finding(
            "critical",
            "unsupported_version",
            f"{client_label(r)} sent {api} v{r.get('api_version')} {_plural(r.get('count') or 0, 'time')}, "
            f"which {r.get('broker_ip') or 'the broker'} does not support ({r.get('reason')})",
            "Upgrade the client library, or configure it for the broker's protocol version.",
            count=r.get("count"),
            evidence={"reason": r.get("reason"), "reference": r.get("reference")},
            **_about(r),
        )


@rule
def reaction_differs(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("error_reaction_headline", []):
        if not (r.get("reactions_differ") and r.get("reaction_6") == "refreshes_metadata"):
            continue
        yield Finding(
            "critical",
            "no_refresh_after_error",
            f"{client_label(r)} does not refresh metadata after KAFKA_STORAGE_ERROR, though it does after "
            "NOT_LEADER_OR_FOLLOWER",
            "A client that keeps writing to the failed disk's broker fails every write to those partitions. "
            "sarama before 1.43.3 behaves like this: upgrade it.",
            count=r.get("errors_56"),
            evidence={
                "reaction_to_56": r.get("reaction_56"),
                "errors_56": r.get("errors_56"),
                "reaction_to_6": r.get("reaction_6"),
                "errors_6": r.get("errors_6"),
            },
            **_about(r),
        )


@rule
def churn(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("connection_health", []):
        if (
            (r.get("connections_per_min") or 0) >= 1.0
            and (r.get("reconnects") or 0) >= 5
            and r.get("client_id")
        ):
            yield Finding(
                "warning",
                "reconnect_churn",
                f"{client_label(r)} opened {r.get('connections')} connections, "
                f"{r['connections_per_min']:.1f} a minute",
                "Find out why the connections end (see the connections table's end_reason).",
                count=r.get("connections"),
                evidence={
                    "reconnects": r.get("reconnects"),
                    "connections_per_min": r.get("connections_per_min"),
                },
                **_about(r),
            )


@rule
def coordinator(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("coordinator_errors", []):
        yield Finding(
            "warning",
            "coordinator_unavailable",
            f"group {r.get('group_id')!r} could not reach its coordinator on {r.get('broker_ip')} for "
            f"{r.get('duration_s') or 0:.0f} s: {r.get('errors')} errors to {_plural(r.get('clients') or 0, 'client')}",
            "A coordinator loading a large __consumer_offsets partition answers COORDINATOR_LOAD_IN_PROGRESS "
            "until it is done; keep offsets partitions small (offsets.retention, compaction) and check the "
            "broker's 'Finished loading offsets' log lines.",
            source=r.get("source"),
            broker=r.get("broker_ip"),
            first_time=r.get("storm_start"),
            last_time=r.get("storm_end"),
            count=r.get("errors"),
            evidence={
                "not_coordinator": r.get("not_coordinator"),
                "load_in_progress": r.get("load_in_progress"),
                "not_available": r.get("not_available"),
            },
        )


@rule
def acks_risk(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("producer_acks", []):
        if not r.get("data_loss_risk"):
            continue
        yield Finding(
            "warning",
            "acks_data_loss_risk",
            f"{client_label(r)} writes with acks={r.get('acks_label')} ({r.get('records') or 0} records)",
            "Records acked by a leader alone are lost if it dies before its followers copy them: use "
            "acks=all with min.insync.replicas >= 2 for data that matters.",
            count=r.get("records"),
            evidence={
                "acks": r.get("acks_label"),
                "wire_cannot_show": "whether these records were later lost",
            },
            **_about(r),
        )


@rule
def stale_metadata(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("metadata_stale_windows", []):
        if (r.get("stale_s") or 0) <= 30 or internal_client(r):
            continue
        yield Finding(
            "warning",
            "metadata_stale",
            f"{client_label(r)} used stale metadata for {r['topic']}/{r['partition']} for {r['stale_s']:.0f} s after "
            f"{r.get('change_source')}",
            "Lower the client's metadata.max.age.ms, or upgrade it to refresh on leadership errors.",
            topic=r.get("topic"),
            count=1,
            evidence={"stale_s": r.get("stale_s"), "refreshed": r.get("refreshed")},
            **_about(r),
        )


@rule
def skew(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("leader_skew_brokers", []):
        share, fair, leaders = r.get("leader_share_pct"), r.get("fair_share_pct"), r.get("leaders") or 0
        # a share well above fair, and by enough partitions to matter: 3 of 6 on a 3-broker
        # cluster is noise, 27 of 35 is incident 3
        excess = leaders - leaders * fair / share if share else 0
        if share is not None and fair and share >= 1.5 * fair and share >= 50 and excess >= SKEW_MIN_EXCESS:
            yield Finding(
                "warning",
                "leader_skew",
                f"broker {r.get('node_id')} leads {share:.0f}% of partitions (fair share {fair:.0f}%)",
                "Reassign partitions (kafka-reassign-partitions) and run a preferred leader election; "
                "a broker leading most partitions carries most client connections and open files.",
                source=r.get("source"),
                broker=str(r.get("node_id")),
                count=r.get("leaders"),
                evidence={
                    "leaders": r.get("leaders"),
                    "topics_led": r.get("topics_led"),
                    "replicas": r.get("replicas"),
                },
            )


@rule
def inventory(results: dict[str, Rows]) -> Iterator[Finding]:
    inv = results.get("client_inventory", [])
    if not inv:
        return
    named = sorted({_software(r) for r in inv if _software(r)})
    yield Finding(
        "info",
        "client_inventory",
        f"{_plural(len(inv), 'client')}: {_names(named) or 'none names its software'}",
        count=len(inv),
        evidence={"without_software_name": sum(1 for r in inv if not r.get("client_software_name"))},
    )


def build_findings(results: dict[str, Rows], rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every rule over the results, most severe first (stable within a severity)."""
    found = [f for r in rules for f in r(results)]
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


def write_findings(found: list[Finding], report_dir: str | Path) -> Path:
    """``REPORT_DIR/findings/part-0.parquet`` (replacing what was there)."""
    folder = Path(report_dir) / "findings"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    table = pa.Table.from_pylist([f.row() for f in found], schema=FINDINGS_SCHEMA)
    pq.write_table(table, folder / "part-0.parquet")
    return folder


def load_findings(report_dir: str | Path) -> Rows:
    """The findings table as rows (evidence parsed back into a dict)."""
    rows = pq.read_table(Path(report_dir) / "findings").to_pylist()
    for r in rows:
        r["evidence"] = json.loads(r["evidence"] or "{}")
    return rows
