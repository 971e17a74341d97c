"""The truth of a lab run, built from the clients' and brokers' own records.

Every driver writes JSON-lines events (``send``, ``ack``, ``error``, ``consume``; see
``tests/lab/drivers/README.md``), and every broker writes its log4j log. This module turns
those into ``truth.json``: per client what was sent, acked, failed (by error), left
unresolved, lost (acked and never read back) and duplicated (read back more than once),
plus the broker facts a diagnosis is checked against (leader moves, log dirs going offline,
replica fetchers losing their leader, coordinator loads), and the scenario's own timeline
(when a broker was paused, killed, restarted).

Nothing here reads the capture: the truth must be independent of what kwire decodes.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "BrokerFacts",
    "ClientTruth",
    "broker_errors",
    "broker_facts",
    "client_log_facts",
    "client_truth",
    "read_back_ids",
    "read_events",
]


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one driver's JSON-lines file; a line cut short by a kill is skipped."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_back_ids(paths: Iterable[Path]) -> Counter[str]:
    """How often each message id was consumed at a distinct (topic, partition, offset)."""
    seen: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
    for path in paths:
        for event in read_events(path):
            if event.get("event") == "consume":
                seen[event["id"]].add((event["topic"], event["partition"], event["offset"]))
    return Counter({msg_id: len(places) for msg_id, places in seen.items()})


@dataclass
class ClientTruth:
    """What one producing client did, by its own account and by the read-back."""

    client_id: str
    library: str
    library_version: str
    acks: str
    sent: int = 0
    acked: int = 0
    failed: int = 0
    unresolved: int = 0
    failed_by_error: dict[str, int] = field(default_factory=dict)
    #: acked, and never read back by the verifying consumer
    lost: int = 0
    #: read back at more than one offset (sent twice and written twice)
    duplicated: int = 0
    #: failed by the client's account, yet found in the log (written, the ack was lost)
    failed_but_written: int = 0
    acked_by_partition: dict[str, int] = field(default_factory=dict)
    lost_examples: list[str] = field(default_factory=list)
    first_error_ts: float | None = None
    last_error_ts: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def client_truth(events_path: Path, read_back: Counter[str] | None) -> ClientTruth:
    """Sum one driver's events; with ``read_back``, also count lost and duplicated messages."""
    start: dict[str, Any] = {}
    outcome: dict[str, str] = {}
    errors: dict[str, str] = {}
    acked_partition: dict[str, int] = {}
    error_ts: list[float] = []
    sent: set[str] = set()
    for event in read_events(events_path):
        kind = event.get("event")
        if kind == "start":
            start = event
        elif kind == "send":
            sent.add(event["id"])
        elif kind == "ack":
            outcome[event["id"]] = "acked"
            acked_partition[event["id"]] = event.get("partition", -1)
        elif kind == "error":
            # the library's final word on a message wins (an ack after an error would be a driver bug)
            outcome.setdefault(event["id"], "failed")
            errors[event["id"]] = event.get("error_name") or _short(event.get("error"))
            error_ts.append(event["ts"])
    config = start.get("config") or {}
    truth = ClientTruth(
        client_id=start.get("client_id", events_path.stem),
        library=start.get("library", "?"),
        library_version=str(start.get("library_version", "?")),
        acks=str(config.get("acks", (start.get("args") or {}).get("acks", "?"))),
    )
    truth.sent = len(sent)
    truth.acked = sum(1 for v in outcome.values() if v == "acked")
    truth.failed = sum(1 for v in outcome.values() if v == "failed")
    truth.unresolved = len(sent - outcome.keys())
    truth.failed_by_error = dict(Counter(errors[i] for i, v in outcome.items() if v == "failed"))
    truth.acked_by_partition = {
        str(p): n
        for p, n in sorted(Counter(acked_partition[i] for i, v in outcome.items() if v == "acked").items())
    }
    if error_ts:
        truth.first_error_ts, truth.last_error_ts = min(error_ts), max(error_ts)
    if read_back is not None:
        lost = sorted((i for i, v in outcome.items() if v == "acked" and read_back[i] == 0), key=_seq)
        truth.lost = len(lost)
        truth.lost_examples = lost[:10]
        truth.duplicated = sum(1 for i in sent if read_back[i] > 1)
        truth.failed_but_written = sum(1 for i, v in outcome.items() if v == "failed" and read_back[i] > 0)
    return truth


def _seq(msg_id: str) -> int:
    tail = msg_id.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _short(text: Any) -> str:
    return str(text or "unknown")[:80]


# ----------------------------------------------------------------------------- client logs

#: Lines in a client library's own log that say it retried a request or refreshed metadata.
#: Keyed by the driver's ``library`` name; each pattern is matched against one log line.
CLIENT_LOG_PATTERNS: dict[str, dict[str, re.Pattern[str]]] = {
    "kafka-clients": {
        "retry": re.compile(r"Got error produce response .* retrying"),
        "metadata_refresh": re.compile(r"Received invalid metadata error|Requesting metadata update"),
        "disconnect": re.compile(
            r"Node -?\d+ disconnected|Connection to node .* could not be established"
            r"|Bootstrap broker \S+ .*disconnected"
        ),
        "request_timeout": re.compile(r"due to request timeout"),
        "coordinator_loading": re.compile(r"coordinator is loading"),
        "not_coordinator": re.compile(r"NOT_COORDINATOR|is not the correct coordinator"),
    },
    "sarama": {
        "retry": re.compile(r"state change to \[retrying-\d+\]"),
        "metadata_refresh": re.compile(r"client/metadata fetching metadata for"),
        "disconnect": re.compile(r"Closed connection to broker|Failed to connect to broker"),
        "request_timeout": re.compile(r"i/o timeout"),
        "coordinator_loading": re.compile(r"still loading offsets"),
        "not_coordinator": re.compile(r"not coordinated by this broker"),
    },
    "confluent-kafka": {
        "retry": re.compile(r"[Rr]etrying|retry \d+"),
        "metadata_refresh": re.compile(r"Requesting metadata for"),
        "disconnect": re.compile(r"Disconnected|Connect to \S+ failed|[Cc]onnection refused"),
        "request_timeout": re.compile(r"Timed out \w+Request in flight"),
        "api_versions_failed": re.compile(r"ApiVersionRequest failed"),
        "coordinator_loading": re.compile(r"Coordinator load in progress"),
        "not_coordinator": re.compile(r"Not coordinator"),
    },
    "kafka-python": {
        "retry": re.compile(r"[Rr]etrying"),
        "metadata_refresh": re.compile(r"Updated metadata"),
        "disconnect": re.compile(r"Connection closed|[Cc]onnection refused|disconnected"),
        # one line per event (kafka-python repeats the error on several following lines)
        "request_timeout": re.compile(r"Request timed out after \d+ ms\. Closing connection"),
        "correlation_mismatch": re.compile(r"Abort \(CorrelationIdError"),
        "coordinator_loading": re.compile(r"CoordinatorLoadInProgress"),
        "not_coordinator": re.compile(r"NotCoordinator"),
    },
    "franz-go": {
        "disconnect": re.compile(r"read from broker errored|unable to open connection"),
        "coordinator_loading": re.compile(r"COORDINATOR_LOAD_IN_PROGRESS"),
        "not_coordinator": re.compile(r"NOT_COORDINATOR"),
    },
    "kafkajs": {
        "disconnect": re.compile(r"Connection error|ECONNREFUSED|Connection timeout"),
        "coordinator_loading": re.compile(r"coordinator is loading"),
        "not_coordinator": re.compile(r"not the correct coordinator"),
    },
}


def client_log_facts(library: str, log_path: Path) -> dict[str, int]:
    """Counts of retry, metadata-refresh and disconnect lines in one client's log."""
    patterns = CLIENT_LOG_PATTERNS.get(library, {})
    counts = dict.fromkeys(patterns, 0)
    if not patterns or not log_path.is_file():
        return counts
    with log_path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            for name, pattern in patterns.items():
                if pattern.search(line):
                    counts[name] += 1
    return counts


# ----------------------------------------------------------------------------- broker logs

_LOG4J_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
#: Broker log lines that are facts of a run. Each yields a fact of that kind with the groups named.
BROKER_LOG_PATTERNS: dict[str, re.Pattern[str]] = {
    # ReplicaManager/Partition (KRaft and ZK): this broker became leader of a partition
    # state change logger, KRaft and ZK alike: "[Broker id=2] Leader orders-0 with topic id ... starts at leader epoch 1"
    "became_leader": re.compile(
        r"\[Broker id=(?P<node>\d+)\] Leader (?P<topic>\S+)-(?P<partition>\d+) .*?starts at leader epoch (?P<epoch>\d+)"
    ),
    "log_dir_offline": re.compile(
        r"(?:Stopping serving logs in dir|Marking log dir offline|Log directory) (?P<dir>\S+)"
    ),
    "fetcher_disconnected": re.compile(
        r"\[ReplicaFetcher replicaId=(?P<node>\d+), leaderId=(?P<leader>\d+).*?(?:disconnected before the response was read|Error sending fetch request)"
    ),
    "coordinator_loaded": re.compile(
        r"Finished loading offsets and group metadata from __consumer_offsets-(?P<partition>\d+) in (?P<ms>\d+) milliseconds"
    ),
    "storage_error": re.compile(
        r"KafkaStorageException|Error while writing to checkpoint file|Error while appending"
    ),
}


@dataclass
class BrokerFacts:
    """What one broker's log says happened, each fact with its log time (Unix seconds)."""

    node: int
    facts: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.facts if f["kind"] == kind]


def broker_facts(node: int, log_path: Path) -> BrokerFacts:
    """Scan a broker's log for the facts in ``BROKER_LOG_PATTERNS`` (times in the machine's zone)."""
    result = BrokerFacts(node)
    if not log_path.is_file():
        return result
    with log_path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            stamp = _LOG4J_TIME.match(line)
            if stamp is None:
                continue
            for kind, pattern in BROKER_LOG_PATTERNS.items():
                found = pattern.search(line)
                if found is None:
                    continue
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                fact = {
                    "kind": kind,
                    "ts": when,
                    **{k: _num(v) for k, v in found.groupdict().items() if v is not None},
                }
                result.facts.append(fact)
                break
    return result


def _num(value: str) -> Any:
    return int(value) if value.isdigit() else value


_EXCEPTION_LINE = re.compile(r"^(?:Caused by: )?(?P<cause>[\w$.]+(?:Exception|Error)\b.*)$")


def broker_errors(log_path: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """Every ERROR line of a broker's log at or after *since* (Unix seconds), each with the
    first exception line that follows it (log4j prints the throwable on its own lines).

    ``[{"ts", "message", "cause"}]``; ``cause`` is e.g. "java.lang.ArrayIndexOutOfBoundsException:
    Index 18 out of bounds for length 17", or None when the line carries no throwable.
    """
    errors: list[dict[str, Any]] = []
    if not log_path.is_file():
        return errors
    pending: dict[str, Any] | None = None
    with log_path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            line = line.rstrip("\n")
            stamp = _LOG4J_TIME.match(line)
            if stamp is not None:
                pending = None
                rest = line[stamp.end() :].strip()
                if not rest.startswith("ERROR "):
                    continue
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if when < since:
                    continue
                pending = {"ts": when, "message": rest.removeprefix("ERROR ").strip(), "cause": None}
                errors.append(pending)
            elif pending is not None and pending["cause"] is None:
                found = _EXCEPTION_LINE.match(line.strip())
                if found is not None:
                    pending["cause"] = found.group("cause")
    return errors
