"""From decoder events to exchange rows (``kwire.schema.EXCHANGES_SCHEMA``).

Shared by every feed (capture files, the proxy, the Spark decode job) so that the same
traffic gives the same rows whichever way it was read. One terminal decoder event is one
row; ``RequestReceived`` only updates what the connection knows (its client software).
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

from decoder import extract, protocol
from decoder.compiled import load
from decoder.events import (
    Event,
    MalformedFrame,
    NoResponseExpected,
    OrphanResponse,
    Request,
    RequestReceived,
    Response,
    ResponseReceived,
    Resync,
    Unanswered,
)
from decoder.extract import exchange_values
from decoder.tcp import StreamStats

__all__ = ["ConnectionInfo", "ExchangeRows", "ended_by", "utc_date"]

_API_VERSIONS = 18


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Where a connection's rows come from."""

    source: str
    connection_id: str
    client_ip: str | None
    client_port: int | None
    broker_ip: str | None
    broker_port: int | None


_DAY_NS = 86_400 * 1_000_000_000


def utc_date(ts_ns: int | None) -> str:
    """YYYY-MM-DD (UTC) of a nanosecond timestamp; the dataset's partition value."""
    return _day_name(0 if ts_ns is None else ts_ns // _DAY_NS)


@functools.lru_cache(maxsize=4096)
def _day_name(day: int) -> str:
    # one date formatting per day seen, not per row; a capture's timestamps can be anything,
    # so days outside what a date can hold are clamped rather than raising
    try:
        return (_EPOCH + dt.timedelta(days=day)).isoformat()
    except OverflowError:
        return dt.date.max.isoformat() if day > 0 else dt.date.min.isoformat()


_EPOCH = dt.date(1970, 1, 1)


def ended_by(stats: StreamStats, swapped: bool = False) -> dict[str, Any]:
    """The ``ended_by`` and ``end_time`` columns of a captured connection (see ``kwire.schema``).

    ``swapped``: the reassembler's client is really the broker (roles found by decoding). A SYN
    answered by a RST (no SYN/ACK before it) is ``refused``, a SYN that got no packet at all back
    ``syn_unanswered``; otherwise the side that sent the first FIN or RST.
    """
    first = stats.first_end
    to_server, to_client = stats.directions
    if first is None:
        unanswered = stats.syn_seen and to_server.syn_seen and to_client.packets == 0
        return {"ended_by": "syn_unanswered" if unanswered else None, "end_time": None}
    broker = first.direction ^ swapped
    if first.flag == "rst" and broker and stats.syn_seen and not to_client.syn_seen and not to_client.bytes:
        who = "refused"
    else:
        who = f"{'broker' if broker else 'client'}_{first.flag}"
    return {"ended_by": who, "end_time": first.ts_ns // 1000}


def _us(ts_ns: int | None) -> int | None:
    return None if ts_ns is None else ts_ns // 1000


class ExchangeRows:
    """Turns one connection's events into rows; carries client software to every row."""

    __slots__ = ("client_id", "client_software_name", "client_software_version", "info", "resyncs")

    def __init__(self, info: ConnectionInfo) -> None:
        self.info = info
        self.client_software_name: str | None = None
        self.client_software_version: str | None = None
        self.client_id: str | None = None
        self.resyncs = 0

    def row(self, event: Event) -> dict[str, Any] | None:
        """The row for a terminal event; None for informational ones."""
        if isinstance(event, RequestReceived):
            self._note_request(event.request)
            return None
        if isinstance(event, ResponseReceived):
            request, response = event.request, event.response
            status = request.status if request.status != "ok" else response.status
            error = response.decode_error or request.decode_error
            if _exchange_row is not None:
                return _exchange_row(self, request, response, status, error)
            return self._row(request, response, status, error)
        if isinstance(event, NoResponseExpected):
            return self._row(
                event.request,
                None,
                "no_response_expected" if event.request.status == "ok" else event.request.status,
                event.request.decode_error,
            )
        if isinstance(event, Unanswered):
            if event.reason == "gap":
                return self._row(event.request, None, "truncated", "response lost in a capture gap")
            status = "unanswered" if event.request.status == "ok" else event.request.status
            error = event.request.decode_error
            if event.reason != "closed" and event.reason != "open_at_end":
                error = error or f"no response ({event.reason.replace('_', ' ')})"
            return self._row(event.request, None, status, error)
        if isinstance(event, OrphanResponse):
            status = "orphan_response" if event.response.status == "ok" else event.response.status
            if event.unexpected_for is not None:
                # Header facts only: the request's own row (no_response_expected) holds its body values.
                return self._row(
                    event.unexpected_for,
                    event.response,
                    status,
                    "broker answered a Produce with acks=0, which expects no response",
                    request_body=False,
                )
            return self._row(None, event.response, status, event.response.decode_error)
        if isinstance(event, MalformedFrame):
            return self._base(event.start_ns, None, None, None) | {
                "status": "malformed",
                "decode_error": event.reason,
                "correlation_id": event.correlation_id,
                ("request_size" if event.direction == 0 else "response_size"): event.size,
                ("request_time" if event.direction == 0 else "response_time"): _us(event.start_ns),
            }
        if isinstance(event, Resync):
            self.resyncs += 1
        return None

    def _note_request(self, request: Request) -> None:
        if self.client_id is None and request.client_id:
            self.client_id = request.client_id
        if request.api_key == _API_VERSIONS and request.fields:
            name = request.fields.get("client_software_name")
            if name:
                self.client_software_name = name
                self.client_software_version = request.fields.get("client_software_version")

    def _base(
        self, start_ns: int | None, end_ns: int | None, request: Request | None, response: Response | None
    ) -> dict[str, Any]:
        info = self.info
        return {
            "source": info.source,
            "connection_id": info.connection_id,
            "client_ip": info.client_ip,
            "client_port": info.client_port,
            "broker_ip": info.broker_ip,
            "broker_port": info.broker_port,
            "client_software_name": self.client_software_name,
            "client_software_version": self.client_software_version,
            "date": utc_date(start_ns if start_ns is not None else end_ns),
        }

    def _row(
        self,
        request: Request | None,
        response: Response | None,
        status: str,
        decode_error: str | None,
        request_body: bool = True,
    ) -> dict[str, Any]:
        start_ns = request.start_ns if request else None
        end_ns = response.end_ns if response else None
        row = self._base(start_ns, end_ns, request, response)
        row["request_time"] = _us(start_ns)
        row["response_time"] = _us(end_ns)
        if start_ns is not None and end_ns is not None:
            row["latency_us"] = (end_ns - start_ns) // 1000
        row["status"] = status
        row["decode_error"] = decode_error
        if response is not None:
            row["response_size"] = response.size
            row["correlation_id"] = response.correlation_id
        if request is None:
            return row
        api_key = request.api_key
        row["api_key"] = api_key
        row["api_name"] = protocol.api_name(api_key)
        row["api_version"] = request.api_version
        row["request_header_version"] = request.header_version
        row["correlation_id"] = request.correlation_id
        row["client_id"] = request.client_id
        row["request_size"] = request.size
        row.update(
            exchange_values(
                api_key,
                request.fields if request_body else None,
                response.fields if response else None,
            )
        )
        if "error_code" in row:
            row["error_name"] = protocol.error_name(row["error_code"])
        return row


# ``_row`` compiled (kwire/_exchangerows.c: why, and what it is handed) for the common row, an
# answered request, and the pipeline's drain of a connection's events into rows (see
# ``kwire.pipeline``); KWIRE_PURE_PYTHON=1 leaves them out.
_exchangerows = load("_exchangerows", "compiled exchange rows", package="kwire")
if _exchangerows is not None:
    _exchangerows.configure(
        ExchangeRows,
        ConnectionInfo,
        Request,
        Response,
        RequestReceived,
        ResponseReceived,
        _day_name,
        protocol.api_name,
        protocol.error_name,
        extract._request_values,
        extract._response_values,
    )
    _exchange_row = _exchangerows.exchange_row
    #: ``kwire.pipeline.StreamDecoder._drain`` compiled (it calls this when both are built)
    _drain = _exchangerows.drain
else:
    _exchange_row = _drain = None
