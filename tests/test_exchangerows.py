"""The compiled exchange row (kwire/_exchangerows.c) against its Python reference
(``kwire.rows.ExchangeRows._row``): every row of every real capture is the same dict, key order
included, either way; and hand-made requests and answers with odd values (timestamps past 64 bits,
before 1970, across days; unknown api keys and error codes; no fields; no answer) give the same
row, or the same exception, either way.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from test_rowvalues import _ordered

import kwire.rows
from decoder.events import Request, Response
from kwire.decode_command import decode_captures
from kwire.rows import ConnectionInfo, ExchangeRows

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted(
    [
        *REPO.glob("captures/*.pcap"),
        *REPO.glob("captures/lab/**/capture.pcap*"),
        *REPO.glob(".cache/bench/chatty.pcap"),
    ]
)
C = kwire.rows._exchange_row

pytestmark = pytest.mark.skipif(C is None, reason="KWIRE_PURE_PYTHON=1: no compiled exchange rows")


def _rows(path: Path) -> tuple[list[Any], Any]:
    """The rows of a capture, key order included, and the decode's summary."""
    rows: list[dict[str, Any]] = []
    result = decode_captures([path], rows.append, lambda row: None)
    return [_ordered(row) for row in rows], result.summary


def test_answered_requests_take_the_compiled_row_and_drain() -> None:
    assert C is kwire.rows._exchangerows.exchange_row
    assert kwire.rows._drain is kwire.rows._exchangerows.drain


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_rows_and_summary_identical_with_and_without_it(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, summary = _rows(path)
    monkeypatch.setattr(kwire.rows, "_exchange_row", None)  # the Python row and drain
    reference, reference_summary = _rows(path)
    assert len(compiled) == len(reference) > 0
    assert compiled == reference
    assert summary == reference_summary
    assert summary.exchanges == len(compiled) and summary.statuses and summary.apis


_DAY_NS = 86_400 * 10**9
_TIMES = (0, 1_700_000_000 * 10**9, 1_700_000_000 * 10**9 + _DAY_NS, -1, -_DAY_NS - 1, 2**70, -(2**70), 999)
_FIELDS = (
    None,
    {},
    {"acks": -1, "timeout_ms": 30000, "topics": [{"topic": "t", "entries": [{"partition": 0}]}]},
    {"error_code": 6, "member_id": "m", "generation_id": 3, "records": 7},
    {"error_code": 31999},
    {"error_code": None},
)


def _request(api_key: int, start_ns: int, fields: Any) -> Request:
    return Request(
        api_key, 3, 2, 7, None if api_key % 2 else "client-1", 120, start_ns, start_ns, "ok", fields
    )


def _response(end_ns: int, fields: Any) -> Response:
    return Response(7, 1, 64, end_ns, end_ns, "ok", fields)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", _ordered(fn(*args)))
    except Exception as exc:  # the reference's exception is the answer
        return ("raised", type(exc), str(exc))


def test_odd_values_give_the_same_row_or_the_same_error() -> None:
    rows = ExchangeRows(ConnectionInfo("src", "c-1", "127.0.0.1", 50000, None, None))
    rows.client_software_name = "librdkafka"
    compared = 0
    for api_key, start, end, request_fields, response_fields, answered in itertools.product(
        (0, 3, 18, 10, 999, -1), _TIMES, _TIMES[:4], _FIELDS, _FIELDS, (True, False)
    ):
        request = _request(api_key, start, request_fields)
        response = _response(end, response_fields) if answered else None
        for status, error in (("ok", None), ("truncated", "cut")):
            args = (request, response, status, error)
            assert _outcome(C, rows, *args) == _outcome(rows._row, *args), args
            compared += 1
    assert compared > 10_000


def test_days_change_from_row_to_row() -> None:
    rows = ExchangeRows(ConnectionInfo("src", "c-1", None, None, None, None))
    for start in (0, _DAY_NS, _DAY_NS - 1, 0, 2**70, _DAY_NS * 400, -1):
        row = C(rows, _request(3, start, None), None, "ok", None)
        assert row["date"] == kwire.rows.utc_date(start)


def test_wrong_objects_are_refused_not_read() -> None:
    rows = ExchangeRows(ConnectionInfo("src", "c-1", None, None, None, None))
    request = _request(3, 0, None)
    for args in (
        (object(), request, None, "ok", None),
        (rows, object(), None, "ok", None),
        (rows, request, object(), "ok", None),
        (rows, request, request, "ok", None),
    ):
        with pytest.raises(TypeError):
            C(*args)


def _drained(events: list[Any], compiled: bool) -> tuple[Any, ...]:
    """(rows, summary, the connection's noted client) after draining events one way."""
    from kwire.pipeline import DecodeSummary, StreamDecoder, _Conn

    out: list[Any] = []
    decoder = StreamDecoder("src", out.append, lambda row: None)
    conn = _Conn.__new__(_Conn)
    conn.rows = ExchangeRows(ConnectionInfo("src", "c-1", None, None, None, None))
    if not compiled:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kwire.rows, "_exchange_row", None)
            decoder._drain(conn, events)
    else:
        decoder._drain(conn, events)
    assert isinstance(decoder.summary, DecodeSummary)
    rows = conn.rows
    return (
        [_ordered(row) for row in out],
        decoder.summary,
        (rows.client_id, rows.client_software_name, rows.client_software_version),
    )


def test_odd_events_drain_the_same() -> None:
    from decoder.events import RequestReceived, ResponseReceived, Unanswered

    events: list[Any] = []
    for api_key, request_fields, response_fields in itertools.product(
        (0, 3, 18), _FIELDS, (*_FIELDS, {"error_code": 0, "topics": [{"topic": "t", "partitions": []}]})
    ):
        request = _request(api_key, 1_700_000_000 * 10**9, request_fields)
        events.append(RequestReceived(request))
        events.append(ResponseReceived(request, _response(1_700_000_001 * 10**9, response_fields)))
    software = {"client_software_name": "librdkafka", "client_software_version": "2.3.0"}
    request = _request(18, 5, software)
    events += [RequestReceived(request), ResponseReceived(request, _response(9, None))]
    events += [
        RequestReceived(_request(18, 5, {"client_software_name": ""})),
        Unanswered(request, "closed", 10),
    ]
    for cut in (0, 1, 7, len(events)):
        assert _drained(events[:cut], True) == _drained(events[:cut], False)
    assert _drained(events, True)[2] == ("client-1", "librdkafka", "2.3.0")
