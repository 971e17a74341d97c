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
    "no_refresh_after_error": ("error_reaction",),
    "retry_storm": ("error_reaction",),
    "broker_protocol_violation": ("protocol_anomalies",),
    "client_cannot_parse_broker": ("client_parse_failures",),
    "broker_unreachable": ("outages",),
    "old_broker_dropped_requests": ("old_broker_drops",),
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
    if isinstance(value, dict):
        return ", ".join(f"{k} {_text(v)}" for k, v in value.items())
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
    """One finding per broker: every request it dropped because an unknown ApiVersions was read
    in the same poll, over all the episodes (``old_broker_drops`` has one row per episode)."""
    groups: dict[tuple, Rows] = {}
    for r in results.get("old_broker_drops", []):
        if r.get("cause") == "unsupported_apiversions":
            groups.setdefault((r.get("source"), r.get("broker_ip"), r.get("broker_port")), []).append(r)
    for (source, _ip, _port), rows in groups.items():
        dropped = sum(r.get("requests_dropped") or 0 for r in rows)
        clients = sorted({c for r in rows for c in r.get("client_ids") or []})
        broker = _about(rows[0])["broker"]
        yield Finding(
            "critical",
            "old_broker_dropped_requests",
            f"broker {broker} dropped {_plural(dropped, 'request')} from {_plural(len(clients), 'client')} "
            f"({_names(clients)}): each was read in the same poll as an ApiVersions it does not know "
            f"({_plural(len(rows), 'time')})",
            "A Kafka 0.9 broker stops dispatching every request read in the same poll as an unknown api key, "
            "from any client, even clients configured for 0.9: upgrade the broker, or pin every client to 0.9 "
            "(librdkafka api.version.request=false, broker.version.fallback=0.9.0.1).",
            source=source,
            broker=broker,
            first_time=min((r["first_request"] for r in rows if r.get("first_request")), default=None),
            last_time=max((r["last_request"] for r in rows if r.get("last_request")), default=None),
            count=dropped,
            evidence={
                "episodes": len(rows),
                "episodes_answered_again": sum(1 for r in rows if r.get("answered_again")),
                "apiversions_dropped": sum(r.get("apiversions_dropped") or 0 for r in rows),
                "other_requests_dropped": sum(r.get("other_requests_dropped") or 0 for r in rows),
                "records_dropped": sum(r.get("records_dropped") or 0 for r in rows),
                "apiversions_from": sorted({c for r in rows for c in r.get("apiversions_client_ids") or []}),
                "clients": clients,
                "connections_silent": sum(r.get("connections_silent") or 0 for r in rows),
                "example_correlation_ids": [
                    f"{e.get('client_id')}:{e.get('api_name')}#{e.get('correlation_id')}"
                    for r in rows[:2]
                    for e in (r.get("examples") or [])[:3]
                ],
                "wire_cannot_show": "whether each client re-sent what was dropped as new requests",
            },
        )


@rule
def unsupported(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("unsupported_versions", []):
        if r.get("severity") != "error":
            continue
        api = r.get("api_name") or f"api {r.get('api_key')}"
        broker = r.get("broker_ip") or "the broker"
        sent = f"{client_label(r)} sent {api} v{r.get('api_version')} {_plural(r.get('count') or 0, 'time')}"
        if r.get("reason") in ("unanswered_then_closed", "unanswered_then_silent"):
            went = "silent" if r["reason"].endswith("silent") else "closed"
            what = f"{sent}; {broker} never answered it and the connection then went {went}"
            advice = (
                "The broker does not know this api key or version (Kafka 0.9 has no ApiVersions): configure "
                "the client for the broker's protocol (librdkafka api.version.request=false and "
                "broker.version.fallback=0.9.0.1), or upgrade the broker."
            )
        else:
            what = f"{sent}, which {broker} does not support ({r.get('reason')})"
            advice = "Upgrade the client library, or configure it for the broker's protocol version."
        yield Finding(
            "critical",
            "unsupported_version",
            what,
            advice,
            count=r.get("count"),
            first_time=r.get("first_seen"),
            last_time=r.get("last_seen"),
            evidence={"reason": r.get("reason"), "reference": r.get("reference")},
            **_about(r),
        )


#: Errors that mean "your metadata is wrong: ask again" (UNKNOWN_TOPIC_OR_PARTITION,
#: LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR, FENCED_LEADER_EPOCH,
#: UNKNOWN_LEADER_EPOCH).
REFRESH_ERRORS = (3, 5, 6, 56, 74, 75)
#: Re-sends to the same broker without new metadata before they are a storm.
STORM_MIN_RETRIES = 10
_VERDICTS = (
    "refresh_then_retry",
    "retry_on_new_leader",
    "retry_without_refresh",
    "drop_without_retry",
    "unknown",
)
_VERDICT_WORDS = {
    "drop_without_retry": "never sent the failed batches again",
    "retry_without_refresh": "sent the failed requests again to the same broker without asking for metadata",
}
_APP_CANNOT_SHOW = "whether the application saw the failures its library returned, or sent the records again itself as new ones"


def _reaction_evidence(r: dict[str, Any], other: str | None) -> dict[str, Any]:
    out = {
        "verdict": r.get("verdict"),
        "errors": r.get("errors"),
        "error_responses": r.get("error_responses"),
        "batches_dropped": r.get("batches_dropped"),
        "records_dropped": r.get("records_dropped"),
        "retries": r.get("retries"),
        "retries_same_broker": r.get("retries_same_broker"),
        "refreshes": r.get("refreshes"),
        "refresh_p50_ms": r.get("refresh_p50_ms"),
        "verdicts": {v: r.get(f"n_{v}") for v in _VERDICTS if r.get(f"n_{v}")},
        "brokers": r.get("brokers"),
        "example_correlation_ids": r.get("example_correlation_ids"),
        "wire_shows": r.get("wire_shows"),
        "wire_cannot_show": r.get("wire_cannot_show") or _APP_CANNOT_SHOW,
    }
    if other:
        out["reaction_to_NOT_LEADER_OR_FOLLOWER"] = other
    return out


@rule
def no_refresh(results: dict[str, Rows]) -> Iterator[Finding]:
    headline = {
        (h.get("source"), h.get("client_id"), h.get("client_ip")): h
        for h in results.get("error_reaction_headline", [])
    }
    for r in results.get("error_reaction", []):
        verdict = r.get("verdict")
        if internal_client(r) or r.get("error_code") not in REFRESH_ERRORS or verdict not in _VERDICT_WORDS:
            continue
        if r.get("api_name") != "Produce":
            # a consumer re-fetching fast after FENCED_LEADER_EPOCH, or one that stops fetching a
            # partition, may have refreshed elsewhere or moved on: retry_storm covers the bursts
            continue
        if verdict == "drop_without_retry" and 2 * (r.get("refreshes") or 0) >= (r.get("errors") or 0):
            continue  # it did ask for metadata after most errors: a loss, which records_lost reports
        h = headline.get((r.get("source"), r.get("client_id"), r.get("client_ip"))) or {}
        other = (
            f"{h.get('reaction_6')} ({_plural(h.get('errors_6') or 0, 'error')})"
            if r.get("error_code") != 6 and h.get("reaction_6")
            else None
        )
        dropped = r.get("records_dropped") or 0
        name = r.get("error_name") or f"error {r.get('error_code')}"
        contrast = (
            f", though after NOT_LEADER_OR_FOLLOWER it does ({h.get('reaction_6')})"
            if other and h.get("reaction_6") in ("refresh_then_retry", "retry_on_new_leader")
            else ""
        )
        yield Finding(
            "critical" if dropped or verdict == "drop_without_retry" else "warning",
            "no_refresh_after_error",
            f"{client_label(r)} got {name} {_plural(r.get('errors') or 0, 'time')} on {r.get('api_name')} and "
            f"{_VERDICT_WORDS[verdict]}{contrast}"
            + (f": {_plural(dropped, 'record')} dropped" if dropped else ""),
            f"{name} means this broker cannot take the write for that partition: the client should ask for "
            "metadata and write to the new leader. sarama before 1.43.3 neither retries nor refreshes after "
            "KAFKA_STORAGE_ERROR: upgrade it. Other clients: check their retry settings.",
            first_time=r.get("first_error_time"),
            last_time=r.get("last_error_time"),
            count=r.get("errors"),
            evidence=_reaction_evidence(r, other),
            **_about(r),
        )


@rule
def retry_storm(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("error_reaction", []):
        blind = r.get("n_retry_without_refresh") or 0
        if internal_client(r) or blind < STORM_MIN_RETRIES:
            continue
        name = r.get("error_name") or f"error {r.get('error_code')}"
        yield Finding(
            "warning",
            "retry_storm",
            f"{client_label(r)} sent {_plural(blind, 'failed ' + str(r.get('api_name')) + ' request')} again "
            f"to the same broker without asking for metadata, after {name} ({r.get('errors')} errors)",
            "Retries without new metadata hit the same broken leader again: give the client a retry backoff "
            "and make it refresh metadata on this error (or upgrade it).",
            first_time=r.get("first_error_time"),
            last_time=r.get("last_error_time"),
            count=blind,
            evidence=_reaction_evidence(r, None),
            **_about(r),
        )


_LOSS_COUNTS = (
    "records_sent",
    "records_acked",
    "records_dropped",
    "batches_dropped",
    "records_lost",
    "batches_lost",
)


@rule
def records_lost(results: dict[str, Rows]) -> Iterator[Finding]:
    """Per client and topic: records dropped after an error and never sent again, and records
    acked and then missing from the log that consumers and followers read afterwards."""
    groups: dict[tuple, Rows] = {}
    for r in results.get("delivery", []):
        key = (r.get("source"), r.get("client_id"), r.get("client_ip"), r.get("topic"))
        groups.setdefault(key, []).append(r)
    for (_source, _cid, _ip, topic), every in groups.items():
        total = {k: sum(r.get(k) or 0 for r in every) for k in _LOSS_COUNTS}
        rows = [r for r in every if (r.get("records_dropped") or 0) + (r.get("records_lost") or 0) > 0]
        if not rows:
            continue
        by_error: dict[str, int] = {}
        for r in rows:
            for name, n in dict(r.get("dropped_by_error") or {}).items():
                by_error[name] = by_error.get(name, 0) + n
        if total["records_dropped"] > sum(by_error.values()):
            by_error["no answer"] = total["records_dropped"] - sum(by_error.values())
        parts = []
        if total["records_dropped"]:
            why = ", ".join(
                f"{n} after {name}" for name, n in sorted(by_error.items(), key=lambda kv: -kv[1])
            )
            parts.append(f"{total['records_dropped']} failed ({why}) and were never sent again")
        if total["records_lost"]:
            parts.append(f"{total['records_lost']} were acked and then missing from the log read afterwards")
        lost = total["records_dropped"] + total["records_lost"]
        first = [r["first_sent"] for r in rows if r.get("first_sent")]
        last = [r["last_sent"] for r in rows if r.get("last_sent")]
        yield Finding(
            "critical",
            "records_lost",
            f"{client_label(rows[0])} lost {lost} of the {total['records_sent']} records it sent to {topic}: "
            + "; ".join(parts),
            "Dropped records: make the client retry this error (or upgrade it) and have the application check "
            "every delivery result. Acked and then lost: use acks=all with min.insync.replicas >= 2 and "
            "unclean leader election off.",
            topic=topic,
            first_time=min(first) if first else None,
            last_time=max(last) if last else None,
            count=lost,
            evidence={
                **total,
                "dropped_by_error": by_error,
                "partitions": sorted(r.get("partition") for r in rows),
                "dropped_example_correlation_ids": sorted(
                    c for r in rows for c in r.get("dropped_examples") or []
                )[:5],
                "lost_offsets": {
                    str(r.get("partition")): r.get("lost_offsets") for r in rows if r.get("lost_offsets")
                },
                "wire_cannot_show": _APP_CANNOT_SHOW,
            },
            **_about(rows[0]),
        )


def _versions(r: dict[str, Any]) -> str:
    return "/".join(f"v{v}" for v in r.get("api_versions") or [])


@rule
def broker_violations(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("protocol_anomalies", []):
        broker = _about(r)["broker"]
        n = r.get("responses") or 0
        if r.get("kind") == "answered_acks0":
            what = f"broker {broker} answered {_plural(n, 'Produce request')} sent with acks=0, which expect no answer"
            advice = (
                "Clients with acks=0 do not read these answers: they pile up unread, or are taken for the answer "
                "to the next request. Fix the broker (Tansu does this), or avoid acks=0 with it."
            )
        else:
            what = (
                f"broker {broker} sent {_plural(n, 'answer')} to {r.get('api_name')} {_versions(r)} "
                "that do not match that version's layout"
            )
            advice = (
                "Clients fail to parse these answers: fix the broker, or keep clients off this API version."
            )
        yield Finding(
            "warning",
            "broker_protocol_violation",
            what,
            advice,
            source=r.get("source"),
            broker=broker,
            first_time=r.get("first_time"),
            last_time=r.get("last_time"),
            count=n,
            evidence={
                "kind": r.get("kind"),
                "api": f"{r.get('api_name')} {_versions(r)}",
                "clients": r.get("client_ids"),
                "connections": r.get("connections"),
                "example_correlation_ids": r.get("example_correlation_ids"),
                "decode_error": r.get("example_error"),
            },
        )


#: Connections closed right after an unusable answer before the pattern is a finding.
PARSE_FAILURES_MIN = 2


@rule
def cannot_parse(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("client_parse_failures", []):
        n = r.get("connections") or 0
        if n < PARSE_FAILURES_MIN or internal_client(r):
            continue
        answer = f"{r.get('api_name')} v{r.get('api_version')}"
        how = (
            f"a {answer} answer that does not match its version's layout"
            if r.get("reason") == "malformed_response"
            else f"the broker's {answer} answer, without sending anything else"
        )
        never = not r.get("connections_used")
        yield Finding(
            "critical" if never else "warning",
            "client_cannot_parse_broker",
            f"{client_label(r)} closed {_plural(n, 'connection')} to {_about(r)['broker']} right after {how}"
            + ("; it never got past that point" if never else ""),
            "The client cannot use what this broker answers: it fails to parse it (librdkafka logs "
            "'Read underflow') and reconnects. Pin the client to an older protocol "
            "(librdkafka api.version.request=false, broker.version.fallback) or fix the broker.",
            first_time=r.get("first_time"),
            last_time=r.get("last_time"),
            count=n,
            evidence={
                "reason": r.get("reason"),
                "answer": answer,
                "closed_by": r.get("ended_by"),
                "max_close_after_s": r.get("max_close_after_s"),
                "connections_used": r.get("connections_used"),
                "example_connections": r.get("example_connections"),
                "wire_cannot_show": "the client's own parse error (it is in the client's log)",
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


#: How long a group must go without its coordinator before it is a finding.
COORDINATOR_MIN_S = 5.0


@rule
def coordinator(results: dict[str, Rows]) -> Iterator[Finding]:
    for r in results.get("coordinator_errors", []):
        if (r.get("duration_s") or 0) < COORDINATOR_MIN_S:
            continue  # a group's first FindCoordinator while __consumer_offsets is created
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
    by_source: dict[Any, Rows] = {}
    for r in results.get("client_inventory", []):
        by_source.setdefault(r.get("source"), []).append(r)
    for source, inv in by_source.items():
        named = sorted({_software(r) for r in inv if _software(r)})
        yield Finding(
            "info",
            "client_inventory",
            f"{_plural(len(inv), 'client')}: {_names(named) or 'none names its software'}",
            source=source,
            count=len(inv),
            evidence={"without_software_name": sum(1 for r in inv if not r.get("client_software_name"))},
        )


#: Kinds that are a symptom of another finding about the same client, and dropped beside it.
SYMPTOMS = ("reconnect_churn", "metadata_stale")


def _client(f: Finding) -> tuple:
    return (f.source, f.client_id, f.client_ip)


def build_findings(results: dict[str, Rows], rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every rule over the results, most severe first (stable within a severity). A symptom
    (``SYMPTOMS``: reconnects) of a client that has a critical finding is left out: the
    critical one explains it."""
    found = [f for r in rules for f in r(results)]
    critical = {_client(f) for f in found if f.severity == "critical" and f.client_id}
    found = [f for f in found if not (f.kind in SYMPTOMS and _client(f) in critical)]
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
