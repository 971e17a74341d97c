"""The proxy's counters, and a small HTTP endpoint that serves them as Prometheus text.

**Updates.** The event loop, which forwards every connection, and the recorder's writer
thread (file rolls) update the same counters, so every update goes through
``add``, ``bump``, ``count_request`` or ``observe_response``, which hold ``Metrics.lock`` for
the few instructions they take.

**Scrapes never hold the forwarding path.** A scrape copies the numbers under the lock
(``snapshot``: plain dict copies, about 15 us for a page of 50 client ids and 0.4-0.6 ms
for the largest page the bounds below allow) and builds the text from the copy with the lock released (``render``), in a worker
thread. The page built from it is reused for ``PAGE_REUSE_SECONDS``, so scraping in a loop
renders at most a few pages a second. (Before, the whole page was built under the lock:
with 200k client ids, a 21 MB page and 0.8-0.9 s per scrape during which no chunk could be
forwarded; ``bench/metrics_scrape.py`` measures both.)

**Labels that cannot be abused.** Label values that come from the wire are only values the
protocol table knows: an api key, version or error code it has no definition for is counted
under ``other``, and so is the client id of such a request (its header cannot be trusted to
be one) or a client id that is not printable text. Random bytes therefore cannot mint label
values, and SASL tokens, never read by the proxy (``proxy.session``), cannot either. Client
ids are bounded too (``ClientIds``): at most ``max_client_ids`` of them (default 50) are shown,
each cut to ``CLIENT_ID_CHARS`` characters and with at most ``SERIES_PER_CLIENT`` (api,
version) series; every other request is counted under ``client_id="other"``. Which ids are
shown is decided by the heavy hitters: the first ids seen fill the slots; after that, the
requests of ids not shown are counted in a Misra-Gries summary of ``CANDIDATES_PER_SLOT``
candidates per slot (an id not yet a candidate, when the summary is full, cancels out one
count of every candidate instead), which keeps every id that made more than 1/(candidates+1)
of those requests (0.5% with the default 50 slots), in bounded memory and O(1) amortized
time. At a scrape, at most every ``RERANK_SECONDS``, a candidate that made more than twice
as many requests since the last re-rank as the least busy shown id takes its place; that
id's counts move to ``other``, so no total ever goes down (the evicted id's series ends, as a
series of a restarted process would). Why not "the first N seen" alone: whoever connects first
(a burst of one-shot ids after a restart) would hold every slot for the proxy's life and
the busy clients would never be shown. Why not a full space-saving sketch over every
request: the forwarding path pays only for ids that are not shown (one dict update), and
the ranking is done at scrape time. A flood of one-shot ids can only take the slots of
shown ids that were idle since the last re-rank, at most once per re-rank.

**Why not ``prometheus_client``.** Its exposition format is what ``render`` writes (text
format 0.0.4), but on the forwarding path it costs more and bounds nothing. Measured here
(CPU time per call, Python 3.11, median of 11 runs of 100k calls, one thread):
``count_request`` 0.66 us (0.57 before the client-id bound; 0.93 for an id not shown, which
also counts it as a candidate), ``add`` (bytes, per chunk, twice per read) 0.26 us; with
prometheus_client 0.26, ``Counter.labels(api, key, version, client).inc()`` 1.38 us before
any of the checks above, ``labels("to_broker").inc(n)`` 1.18 us, and a child bound in
advance ``inc(n)`` 0.34 us. So every request would cost at least twice as much and every
chunk about a third more, and the top-N ids, the per-id series cap and the ``other`` rule
would all stay here anyway (a child per series is a lock and three objects more). The
counters stay plain dicts and ints under one lock; the project takes no dependency for it.

**Endpoint.** ``proxy.admin`` serves the page (``/metrics``) with ``/healthz``, ``/ready`` and
``/rules`` on the metrics (admin) address; ``serve_metrics`` is that endpoint with the metrics
alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from decoder import protocol

__all__ = [
    "CLIENT_ID_CHARS",
    "DEFAULT_CLIENT_IDS",
    "LATENCY_BUCKETS",
    "OTHER",
    "SERIES_PER_CLIENT",
    "ClientIds",
    "Metrics",
    "Snapshot",
    "render",
    "serve_metrics",
]

#: Histogram buckets for request latency, seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: The label value standing for every value the protocol table does not know, and for every
#: client id not shown.
OTHER = "other"
#: Client ids shown by default (``--metrics-client-ids``).
DEFAULT_CLIENT_IDS = 50
#: Characters of a client id shown (longer ids are cut).
CLIENT_ID_CHARS = 128
#: (api, version) series one shown client id may have; its other requests count under ``other``.
SERIES_PER_CLIENT = 32
#: Candidates kept per shown slot (ids not shown, counted since the last re-rank).
CANDIDATES_PER_SLOT = 4
#: Shown client ids are re-ranked at a scrape at most this often.
RERANK_SECONDS = 60.0
#: A rendered page is served again to scrapes that come within this many seconds.
PAGE_REUSE_SECONDS = 0.2
#: Requests the metrics endpoint serves at once; more are closed unanswered (each open
#: connection is a file descriptor the forwarding path may need).
MAX_METRICS_CONNECTIONS = 64
#: How long the endpoint waits for a request's head, and for its answer to be taken.
_READ_SECONDS = 5.0

_SCALARS = (
    "bytes_to_broker",
    "bytes_to_client",
    "connections_open",
    "connections_total",
    "upstream_failures",
    "header_timeouts",
    "dropped_rows",
    "dropped_bytes",
    "gap_rows",
    "recorder_queue_bytes",
    "held_bytes",
    "over_budget_frames",
    "over_budget_bytes",
    "skimmed_frames",
    "skimmed_bytes",
    "recorder_deferred_seconds",
    "rows_recorded",
    "rows_written",
    "files_rolled",
    "node_listeners",
    "rules_active",
)


#: The counters the recorder adds to (``take_recorded``/``merge`` carry them between processes).
RECORDER_COUNTERS = (
    "dropped_rows",
    "dropped_bytes",
    "gap_rows",
    "over_budget_frames",
    "over_budget_bytes",
    "rows_written",
    "files_rolled",
    "recorder_deferred_seconds",
)


def _api(api_key: int | str) -> int | str:
    """``api_key`` if the table names it, else ``OTHER``."""
    return api_key if type(api_key) is int and protocol.api_name(api_key) is not None else OTHER


def _order(value: int | str) -> tuple[int, int | str]:
    """Sort key for labels that are numbers or ``OTHER`` (numbers first)."""
    return (0, value) if type(value) is int else (1, value)


def _esc(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _api_label(api_key: int | str) -> str:
    """The ``api`` label: the table's name for the key, or ``OTHER``."""
    return (protocol.api_name(api_key) if type(api_key) is int else None) or OTHER


def _labels(**labels: Any) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}"


# ---- which client ids are shown ----------------------------------------------------------------

#: (api key, version) of a request, as labels: known numbers or OTHER.
Series = tuple[int | str, int | str]


class _Shown:
    __slots__ = ("counts", "mark")

    def __init__(self) -> None:
        self.counts: Counter[Series] = Counter()
        self.mark = 0  # requests counted at the last re-rank


class ClientIds:
    """Request counts by client id, at most ``limit`` ids shown (the rest under ``OTHER``).

    Not thread-safe: ``Metrics`` calls it under its lock.
    """

    def __init__(self, limit: int = DEFAULT_CLIENT_IDS) -> None:
        self.limit = max(0, limit)
        self.other = _Shown()
        self.shown: dict[str, _Shown] = {OTHER: self.other}  # a client that calls itself "other" is other
        self.candidates: dict[str, int] = {}
        self.candidate_limit = max(8, CANDIDATES_PER_SLOT * self.limit)
        self.evictions = 0

    def count(self, client: str, series: Series) -> None:
        """One request of ``client`` (a printable id, or OTHER)."""
        entry = self.shown.get(client)
        if entry is None:
            entry = self.admit(client)
        counts = entry.counts
        if series in counts or len(counts) < SERIES_PER_CLIENT or entry is self.other:
            counts[series] += 1
        else:
            self.other.counts[series] += 1

    def admit(self, client: str) -> _Shown:
        """Where a request of ``client``, not shown yet, is counted: a free slot, else ``other``
        (and ``client`` counted as a candidate)."""
        if len(self.shown) <= self.limit:  # a free slot (``shown`` holds OTHER too)
            entry = self.shown[client] = _Shown()
            return entry
        candidates = self.candidates
        n = candidates.get(client)
        if n is not None:
            candidates[client] = n + 1
        elif len(candidates) < self.candidate_limit:
            candidates[client] = 1
        else:  # Misra-Gries: this request and one of every candidate's cancel out
            self.candidates = {name: n - 1 for name, n in candidates.items() if n > 1}
        return self.other

    def rerank(self) -> int:
        """Give the busiest candidates the slots of the least busy shown ids; how many moved."""
        windows = sorted(
            (sum(entry.counts.values()) - entry.mark, name)
            for name, entry in self.shown.items()
            if entry is not self.other
        )
        best = sorted(self.candidates.items(), key=itemgetter(1), reverse=True)
        moved = 0
        for (name, requests), (window, victim) in zip(best, windows, strict=False):
            if requests <= 2 * window:
                break
            self.other.counts.update(self.shown.pop(victim).counts)
            self.shown[name] = _Shown()
            moved += 1
        self.evictions += moved
        for entry in self.shown.values():
            entry.mark = sum(entry.counts.values())
        self.candidates = {}
        return moved

    def copy(self) -> dict[str, dict[Series, int]]:
        """Every shown id's counts (and OTHER's), as plain dicts."""
        return {name: dict(entry.counts) for name, entry in self.shown.items() if entry.counts}


# ---- the counters ------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """The numbers at one moment, for ``render`` (taken under the lock, read without it)."""

    requests: dict[str, dict[Series, int]]  # client id -> (api key, version) -> count
    errors: dict[tuple[int | str, int | str], int]
    latency: dict[int | str, list[int]]
    latency_sum: dict[int | str, float]
    rewrites: dict[int, int]
    rewrite_errors: dict[int, int]
    injected: dict[tuple[str, str], int]
    scalars: dict[str, int] = field(default_factory=dict)
    rule_reloads: dict[tuple[str, str], int] = field(default_factory=dict)
    client_ids_limit: int = DEFAULT_CLIENT_IDS
    client_id_evictions: int = 0


class Metrics:
    """Every number ``/metrics`` shows."""

    def __init__(
        self, max_client_ids: int = DEFAULT_CLIENT_IDS, rerank_seconds: float = RERANK_SECONDS
    ) -> None:
        # labels: known values or OTHER (see the module's docstring)
        self.clients = ClientIds(max_client_ids)
        self.errors: Counter[tuple[int | str, int | str]] = Counter()  # (api key, error code) from rows
        self.latency: dict[int | str, list[int]] = {}  # api key -> bucket counts (+Inf last)
        self.latency_sum: Counter[int | str] = Counter()
        # Written for every chunk by the forwarding loop's thread alone, so without the lock: with
        # one writer no update is lost, and a snapshot reads each as a whole int.
        self.bytes_to_broker = 0
        self.bytes_to_client = 0
        self.connections_open = 0
        self.connections_total = 0
        self.upstream_failures = 0
        self.header_timeouts = 0  # connections closed with a request header begun and not finished
        self.rewrites: Counter[int] = Counter()
        self.rewrite_errors: Counter[int] = Counter()
        self.injected: Counter[tuple[str, str]] = Counter()  # (rule, action)
        self.dropped_rows = 0
        self.dropped_bytes = 0  # recorder queue overflow: bytes never decoded
        self.gap_rows = 0  # rows whose exchange the recorder did not see in full (status gap)
        self.recorder_queue_bytes = 0
        self.held_bytes = 0  # frames held whole (rewrites, rules) across all connections
        self.over_budget_frames = 0  # frames forwarded unheld/undecoded at the memory budget
        self.over_budget_bytes = 0
        self.skimmed_frames = 0  # large record frames sent to the recorder as skeletons (proxy.skim)
        self.skimmed_bytes = 0  # their bytes left out (payloads that never crossed to the recorder)
        self.recorder_deferred_seconds = 0.0  # the recorder process stepping aside (proxy.contention)
        self.rows_recorded = 0  # exchange rows made for the writer (written at the next roll)
        self.rows_written = 0
        self.files_rolled = 0
        self.node_listeners = 0
        self.rules_active = 0  # fault rules in force
        self.rule_reloads: Counter[tuple[str, str]] = Counter()  # (source, result): SIGHUP, PUT /rules
        self.rerank_seconds = rerank_seconds
        self._rerank_due = time.monotonic() + rerank_seconds
        self.lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the plain counter or gauge ``name`` (``bytes_to_broker``, ...)."""
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def bump(self, counter: Counter[Any], key: Any, n: int = 1) -> None:
        """Add ``n`` to ``counter[key]`` (one of this object's labelled counters)."""
        with self.lock:
            counter[key] += n

    def count_request(self, api_key: int, api_version: int, client_id: str | None) -> None:
        """A request forwarded: counted by api, version and client id, each as the table knows it
        (client ids shown or not as ``ClientIds`` decides)."""
        if protocol.is_known(api_key, api_version):
            client = client_id[:CLIENT_ID_CHARS] if client_id else ""
            series: Series = (api_key, api_version)
            if not client.isprintable():
                client = OTHER
        elif protocol.api_name(api_key) is not None:
            series, client = (api_key, OTHER), OTHER
        else:
            series, client = (OTHER, OTHER), OTHER
        with self.lock:  # ClientIds.count, inlined: this runs for every request
            clients = self.clients
            entry = clients.shown.get(client)
            if entry is None:
                entry = clients.admit(client)
            counts = entry.counts
            n = counts.get(series)
            if n is not None:
                counts[series] = n + 1
            elif len(counts) < SERIES_PER_CLIENT or entry is clients.other:
                counts[series] = 1
            else:
                clients.other.counts[series] += 1

    def observe_response(self, api_key: int, seconds: float | None, error_codes: list[int]) -> None:
        """A recorded response: its latency (None if unknown) and its non-zero error codes."""
        api_key = _api(api_key)  # type: ignore[assignment]
        error_codes = [code if code in protocol.ERRORS else OTHER for code in error_codes]  # type: ignore[misc]
        with self.lock:
            if seconds is not None:
                buckets = self.latency.get(api_key)
                if buckets is None:
                    buckets = self.latency[api_key] = [0] * (len(LATENCY_BUCKETS) + 1)
                buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # first bound >= seconds, else +Inf
                self.latency_sum[api_key] += seconds
            for code in error_codes:
                self.errors[(api_key, code)] += 1

    def take_recorded(self) -> dict[str, Any]:
        """What the recorder added since the last call (and reset here): the latency histograms,
        error codes and counters its rows made. A recorder in a process of its own
        (``proxy.recorder_worker``) ships these to the proxy's ``Metrics`` (``merge``); their
        labels are already bounded (known values or ``other``)."""
        with self.lock:
            delta = {
                "latency": self.latency,
                "latency_sum": self.latency_sum,
                "errors": self.errors,
                "counters": {name: getattr(self, name) for name in RECORDER_COUNTERS},
            }
            self.latency, self.latency_sum, self.errors = {}, Counter(), Counter()
            for name in RECORDER_COUNTERS:
                setattr(self, name, 0)
        return delta

    def merge(self, delta: dict[str, Any]) -> None:
        """Add what another ``Metrics`` took with ``take_recorded``."""
        with self.lock:
            for api_key, buckets in delta["latency"].items():
                mine = self.latency.get(api_key)
                if mine is None:
                    self.latency[api_key] = list(buckets)
                else:
                    for i, n in enumerate(buckets):
                        mine[i] += n
            self.latency_sum.update(delta["latency_sum"])
            self.errors.update(delta["errors"])
            for name, n in delta["counters"].items():
                setattr(self, name, getattr(self, name) + n)

    def rerank(self) -> int:
        """Re-rank the shown client ids now (a scrape does it every ``rerank_seconds``)."""
        with self.lock:
            self._rerank_due = time.monotonic() + self.rerank_seconds
            return self.clients.rerank()

    def snapshot(self) -> Snapshot:
        """The numbers now: copied under the lock (re-ranking client ids first when due)."""
        now = time.monotonic()
        with self.lock:
            if now >= self._rerank_due:
                self._rerank_due = now + self.rerank_seconds
                self.clients.rerank()
            return Snapshot(
                requests=self.clients.copy(),
                errors=dict(self.errors),
                latency={key: list(buckets) for key, buckets in self.latency.items()},
                latency_sum=dict(self.latency_sum),
                rewrites=dict(self.rewrites),
                rewrite_errors=dict(self.rewrite_errors),
                injected=dict(self.injected),
                rule_reloads=dict(self.rule_reloads),
                scalars={name: getattr(self, name) for name in _SCALARS},
                client_ids_limit=self.clients.limit,
                client_id_evictions=self.clients.evictions,
            )

    def render(self) -> str:
        """Every metric as Prometheus text (from a snapshot: the lock is held only to copy)."""
        return render(self.snapshot())


# ---- the page ----------------------------------------------------------------------------------


def render(snap: Snapshot) -> str:
    """``snap`` as Prometheus text (format 0.0.4). Takes no lock."""
    lines: list[str] = []
    scalars = snap.scalars

    def family(name: str, kind: str, help_: str) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")

    def scalar(name: str, kind: str, help_: str, value: float) -> None:
        family(name, kind, help_)
        lines.append(f"{name} {value}")

    family(
        "kwire_proxy_requests_total",
        "counter",
        f"Requests forwarded or answered, by api, version and client id (at most "
        f"{snap.client_ids_limit} client ids shown, the rest as other).",
    )
    series = [
        (key, version, client, n)
        for client, counts in snap.requests.items()
        for (key, version), n in counts.items()
    ]
    series.sort(key=lambda s: (_order(s[0]), _order(s[1]), s[2]))
    for key, version, client, n in series:
        lines.append(
            f"kwire_proxy_requests_total{_labels(api=_api_label(key), api_key=key, version=version, client_id=client)} {n}"
        )
    scalar(
        "kwire_proxy_client_id_evictions_total",
        "counter",
        "Client ids no longer shown because busier ones took their place (their counts moved to other).",
        snap.client_id_evictions,
    )
    family(
        "kwire_proxy_response_errors_total",
        "counter",
        "Error codes in recorded responses (top level and per partition), by api and code.",
    )
    for (key, code), n in sorted(snap.errors.items(), key=lambda kv: (_order(kv[0][0]), _order(kv[0][1]))):
        error = protocol.error_name(code) if type(code) is int else OTHER
        lines.append(
            f"kwire_proxy_response_errors_total{_labels(api=_api_label(key), code=code, error=error)} {n}"
        )
    family(
        "kwire_proxy_request_latency_seconds",
        "histogram",
        "Request to response latency seen by the proxy, by api.",
    )
    for key, buckets in sorted(snap.latency.items(), key=lambda kv: _order(kv[0])):
        api = _api_label(key)
        total = 0
        for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), buckets, strict=True):
            total += n
            lines.append(f"kwire_proxy_request_latency_seconds_bucket{_labels(api=api, le=bound)} {total}")
        lines.append(f"kwire_proxy_request_latency_seconds_sum{_labels(api=api)} {snap.latency_sum[key]:.6f}")
        lines.append(f"kwire_proxy_request_latency_seconds_count{_labels(api=api)} {total}")
    family("kwire_proxy_bytes_total", "counter", "Bytes forwarded, by direction.")
    lines.append(f'kwire_proxy_bytes_total{{direction="to_broker"}} {scalars["bytes_to_broker"]}')
    lines.append(f'kwire_proxy_bytes_total{{direction="to_client"}} {scalars["bytes_to_client"]}')
    scalar(
        "kwire_proxy_open_connections", "gauge", "Client connections open now.", scalars["connections_open"]
    )
    scalar(
        "kwire_proxy_connections_total",
        "counter",
        "Client connections accepted.",
        scalars["connections_total"],
    )
    scalar(
        "kwire_proxy_upstream_failures_total",
        "counter",
        "Client connections closed because no broker could be reached.",
        scalars["upstream_failures"],
    )
    scalar(
        "kwire_proxy_header_timeouts_total",
        "counter",
        "Client connections closed because a request header was begun and not finished in time.",
        scalars["header_timeouts"],
    )
    scalar("kwire_proxy_broker_listeners", "gauge", "Per-broker listeners open.", scalars["node_listeners"])
    family(
        "kwire_proxy_rewrites_total",
        "counter",
        "Responses whose broker addresses were rewritten, by api.",
    )
    for key, n in sorted(snap.rewrites.items()):
        lines.append(f"kwire_proxy_rewrites_total{_labels(api=_api_label(key))} {n}")
    family(
        "kwire_proxy_rewrite_errors_total",
        "counter",
        "Responses that could not be rewritten (forwarded unchanged), by api.",
    )
    for key, n in sorted(snap.rewrite_errors.items()):
        lines.append(f"kwire_proxy_rewrite_errors_total{_labels(api=_api_label(key))} {n}")
    family("kwire_proxy_injected_faults_total", "counter", "Faults injected, by rule and action.")
    for (rule, action), n in sorted(snap.injected.items()):
        lines.append(f"kwire_proxy_injected_faults_total{_labels(rule=rule, action=action)} {n}")
    scalar("kwire_proxy_fault_rules", "gauge", "Fault rules in force.", scalars["rules_active"])
    family(
        "kwire_proxy_rule_reloads_total",
        "counter",
        "Attempts to replace the fault rules, by source (signal: SIGHUP, admin: PUT /rules) and "
        "result (error: the rules were kept).",
    )
    for source in ("signal", "admin"):
        for result in ("ok", "error"):
            n = snap.rule_reloads.get((source, result), 0)
            lines.append(f"kwire_proxy_rule_reloads_total{_labels(source=source, result=result)} {n}")
    scalar(
        "kwire_proxy_dropped_rows_total",
        "counter",
        "Exchange rows dropped because the writer fell behind.",
        scalars["dropped_rows"],
    )
    scalar(
        "kwire_proxy_dropped_bytes_total",
        "counter",
        "Bytes not decoded because the recorder queue was full.",
        scalars["dropped_bytes"],
    )
    scalar(
        "kwire_proxy_gap_rows_total",
        "counter",
        "Exchange rows written with status gap: the recorder skipped bytes of their connection.",
        scalars["gap_rows"],
    )
    scalar(
        "kwire_proxy_held_bytes",
        "gauge",
        "Bytes of frames held whole (address rewrites, fault rules), all connections.",
        scalars["held_bytes"],
    )
    scalar(
        "kwire_proxy_over_budget_frames_total",
        "counter",
        "Frames forwarded without being held or recorded because --max-memory-mb was reached.",
        scalars["over_budget_frames"],
    )
    scalar(
        "kwire_proxy_over_budget_bytes_total",
        "counter",
        "Bytes of those frames.",
        scalars["over_budget_bytes"],
    )
    scalar(
        "kwire_proxy_skimmed_frames_total",
        "counter",
        "Large Produce requests and Fetch responses handed to the recorder as their skeletons.",
        scalars["skimmed_frames"],
    )
    scalar(
        "kwire_proxy_skimmed_bytes_total",
        "counter",
        "Record payload bytes of those frames, never copied to the recorder.",
        scalars["skimmed_bytes"],
    )
    scalar(
        "kwire_proxy_recorder_deferred_seconds_total",
        "counter",
        "Time the recorder process gave up (its sleeps and the waits to run again after them) "
        "because other tasks waited for a CPU.",
        scalars["recorder_deferred_seconds"],
    )
    scalar(
        "kwire_proxy_recorder_queue_bytes",
        "gauge",
        "Bytes waiting for the recorder.",
        scalars["recorder_queue_bytes"],
    )
    scalar(
        "kwire_proxy_rows_recorded_total",
        "counter",
        "Exchange rows made for the writer (on disk at the next roll).",
        scalars["rows_recorded"],
    )
    scalar(
        "kwire_proxy_rows_written_total",
        "counter",
        "Exchange rows written to Parquet.",
        scalars["rows_written"],
    )
    scalar(
        "kwire_proxy_files_rolled_total",
        "counter",
        "Times the Parquet files were closed and made visible.",
        scalars["files_rolled"],
    )
    return "\n".join(lines) + "\n"


# ---- the endpoint ------------------------------------------------------------------------------


async def serve_metrics(metrics: Metrics, host: str, port: int, token: str | None = None) -> asyncio.Server:
    """Serve ``/metrics`` and ``/healthz`` on host:port (``proxy.admin`` with no other routes);
    with ``token``, ``/metrics`` needs ``Authorization: Bearer <token>``."""
    from proxy.admin import AdminAuth, AdminRoutes, serve_admin

    return await serve_admin(AdminRoutes(metrics), host, port, AdminAuth(token=token))
