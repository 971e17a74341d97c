"""The proxy's counters, and a tiny HTTP endpoint that serves them as Prometheus text.

Connections forwarded on threads (``proxy.threaded``) and the event loop update the same
counters, so every update goes through ``add``, ``bump`` or ``observe_response``, which hold
``Metrics.lock`` for the few instructions they take (uncontended, about 0.1 us); ``render``
holds it while it reads, so a scrape never sees a dict change under it. Rendering happens
when Prometheus scrapes. Served by asyncio directly, any path answers.

Label values that come from the wire are only ever values the protocol table knows: an api
key, version or error code it has no definition for is counted under ``other``, and so is the
client id of such a request (its header cannot be trusted to be one) or a client id that is not
printable text. Random bytes can therefore not mint label values, and SASL tokens, never read by
the proxy (``proxy.session``), cannot either. (How many client ids are shown is another matter.)
"""

from __future__ import annotations

import asyncio
import threading
from bisect import bisect_left
from collections import Counter
from typing import Any

from decoder import protocol

__all__ = ["LATENCY_BUCKETS", "OTHER", "Metrics", "serve_metrics"]

#: Histogram buckets for request latency, seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


#: The label value standing for every value the protocol table does not know.
OTHER = "other"


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


class Metrics:
    """Every number ``/metrics`` shows."""

    def __init__(self) -> None:
        # labels: known values or OTHER (see the module's docstring)
        self.requests: Counter[tuple[int | str, int | str, str]] = Counter()  # (api key, version, client id)
        self.errors: Counter[tuple[int | str, int | str]] = Counter()  # (api key, error code) from rows
        self.latency: dict[int | str, list[int]] = {}  # api key -> bucket counts (+Inf last)
        self.latency_sum: Counter[int | str] = Counter()
        self.bytes_to_broker = 0
        self.bytes_to_client = 0
        self.connections_open = 0
        self.connections_total = 0
        self.upstream_failures = 0
        self.rewrites: Counter[int] = Counter()
        self.rewrite_errors: Counter[int] = Counter()
        self.injected: Counter[tuple[str, str]] = Counter()  # (rule, action)
        self.dropped_rows = 0
        self.dropped_bytes = 0  # recorder queue overflow: bytes never decoded
        self.recorder_queue_bytes = 0
        self.rows_written = 0
        self.files_rolled = 0
        self.node_listeners = 0
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
        """A request forwarded: counted by api, version and client id, each as the table knows it."""
        if protocol.is_known(api_key, api_version):
            client = client_id or ""
            key: tuple[int | str, int | str, str] = (
                api_key,
                api_version,
                client if client.isprintable() else OTHER,
            )
        elif protocol.api_name(api_key) is not None:
            key = (api_key, OTHER, OTHER)
        else:
            key = (OTHER, OTHER, OTHER)
        with self.lock:
            self.requests[key] += 1

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

    def render(self) -> str:
        """Every metric as Prometheus text."""
        with self.lock:
            return self._render()

    def _render(self) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")

        family(
            "kwire_proxy_requests_total",
            "counter",
            "Requests forwarded or answered, by api, version and client id.",
        )
        for (key, version, client), n in sorted(
            self.requests.items(), key=lambda kv: (_order(kv[0][0]), _order(kv[0][1]))
        ):
            lines.append(
                f"kwire_proxy_requests_total{_labels(api=_api_label(key), api_key=key, version=version, client_id=client)} {n}"
            )
        family(
            "kwire_proxy_response_errors_total",
            "counter",
            "Error codes in recorded responses (top level and per partition), by api and code.",
        )
        for (key, code), n in sorted(
            self.errors.items(), key=lambda kv: (_order(kv[0][0]), _order(kv[0][1]))
        ):
            error = protocol.error_name(code) if type(code) is int else OTHER
            lines.append(
                f"kwire_proxy_response_errors_total{_labels(api=_api_label(key), code=code, error=error)} {n}"
            )
        family(
            "kwire_proxy_request_latency_seconds",
            "histogram",
            "Request to response latency seen by the proxy, by api.",
        )
        for key, buckets in sorted(self.latency.items(), key=lambda kv: _order(kv[0])):
            api = _api_label(key)
            total = 0
            for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), buckets, strict=True):
                total += n
                lines.append(
                    f"kwire_proxy_request_latency_seconds_bucket{_labels(api=api, le=bound)} {total}"
                )
            lines.append(
                f"kwire_proxy_request_latency_seconds_sum{_labels(api=api)} {self.latency_sum[key]:.6f}"
            )
            lines.append(f"kwire_proxy_request_latency_seconds_count{_labels(api=api)} {total}")
        family("kwire_proxy_bytes_total", "counter", "Bytes forwarded, by direction.")
        lines.append(f'kwire_proxy_bytes_total{{direction="to_broker"}} {self.bytes_to_broker}')
        lines.append(f'kwire_proxy_bytes_total{{direction="to_client"}} {self.bytes_to_client}')
        family("kwire_proxy_open_connections", "gauge", "Client connections open now.")
        lines.append(f"kwire_proxy_open_connections {self.connections_open}")
        family("kwire_proxy_connections_total", "counter", "Client connections accepted.")
        lines.append(f"kwire_proxy_connections_total {self.connections_total}")
        family(
            "kwire_proxy_upstream_failures_total",
            "counter",
            "Client connections closed because no broker could be reached.",
        )
        lines.append(f"kwire_proxy_upstream_failures_total {self.upstream_failures}")
        family("kwire_proxy_broker_listeners", "gauge", "Per-broker listeners open.")
        lines.append(f"kwire_proxy_broker_listeners {self.node_listeners}")
        family(
            "kwire_proxy_rewrites_total",
            "counter",
            "Responses whose broker addresses were rewritten, by api.",
        )
        for key, n in sorted(self.rewrites.items()):
            lines.append(f"kwire_proxy_rewrites_total{_labels(api=_api_label(key))} {n}")
        family(
            "kwire_proxy_rewrite_errors_total",
            "counter",
            "Responses that could not be rewritten (forwarded unchanged), by api.",
        )
        for key, n in sorted(self.rewrite_errors.items()):
            lines.append(f"kwire_proxy_rewrite_errors_total{_labels(api=_api_label(key))} {n}")
        family("kwire_proxy_injected_faults_total", "counter", "Faults injected, by rule and action.")
        for (rule, action), n in sorted(self.injected.items()):
            lines.append(f"kwire_proxy_injected_faults_total{_labels(rule=rule, action=action)} {n}")
        family(
            "kwire_proxy_dropped_rows_total",
            "counter",
            "Exchange rows dropped because the writer fell behind.",
        )
        lines.append(f"kwire_proxy_dropped_rows_total {self.dropped_rows}")
        family(
            "kwire_proxy_dropped_bytes_total",
            "counter",
            "Bytes not decoded because the recorder queue was full.",
        )
        lines.append(f"kwire_proxy_dropped_bytes_total {self.dropped_bytes}")
        family("kwire_proxy_recorder_queue_bytes", "gauge", "Bytes waiting for the recorder.")
        lines.append(f"kwire_proxy_recorder_queue_bytes {self.recorder_queue_bytes}")
        family("kwire_proxy_rows_written_total", "counter", "Exchange rows written to Parquet.")
        lines.append(f"kwire_proxy_rows_written_total {self.rows_written}")
        family(
            "kwire_proxy_files_rolled_total",
            "counter",
            "Times the Parquet files were closed and made visible.",
        )
        lines.append(f"kwire_proxy_files_rolled_total {self.files_rolled}")
        return "\n".join(lines) + "\n"


async def serve_metrics(metrics: Metrics, host: str, port: int) -> asyncio.Server:
    """Serve ``metrics.render()`` over HTTP/1.0 on host:port (every path, GET or HEAD)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method = request.split(b" ", 1)[0]
            body = metrics.render().encode()
            head = (
                b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
            )
            writer.write(head if method == b"HEAD" else head + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
