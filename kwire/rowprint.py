"""Rows to a text stream: ``-T table|json|jsonl|csv|fields`` of ``kwire decode`` and ``kwire sql``.

Rows are written as they come (a batch at a time), so a live capture prints each exchange when
its response has been decoded, and ``| head`` stops the work early. Values print the same way in
every format: times in ISO 8601 UTC with microseconds (``2024-10-01T12:00:00.123456Z``), no
value as nothing (``null`` in JSON). Nested lists are JSON in ``json``/``jsonl``/``csv``; in
``table`` and ``fields`` they are one readable line: a partition result is ``topic[partition]=ERROR``
(``NONE`` for no error), another entry is its non-null fields ``{name=value ...}``.

* ``table``: a header line, then one exchange per line in aligned columns (widths taken from the
  first rows; a longer value later widens its line, it is never cut);
* ``json``: one JSON array (closed even when interrupted); ``jsonl``: one object per line;
* ``csv``: RFC 4180 with a header line; ``fields``: tab-separated values, no header (tshark's ``-T fields``).
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import json
from collections.abc import Sequence
from typing import Any, TextIO

from decoder.protocol import error_name

__all__ = ["FORMATS", "TABLE_COLUMNS", "RowPrinter", "text_value"]

FORMATS = ("table", "json", "jsonl", "csv", "fields")
#: What ``table`` and ``fields`` show of an exchange when no ``-e`` is given.
TABLE_COLUMNS = (
    "request_time",
    "client",
    "broker",
    "api_name",
    "api_version",
    "correlation_id",
    "status",
    "latency_us",
    "errors",
    "client_id",
)
_WIDEST = 40  # a column wider than this in the first rows is not padded (it would push the rest off)


def _time(value: dt.datetime | dt.date | dt.time) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
            return value.isoformat(timespec="microseconds") + "Z"
        return value.isoformat(timespec="microseconds")
    return value.isoformat()


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return _time(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def _entry(value: Any) -> str:
    """One element of a nested list, on one line."""
    if isinstance(value, dict):
        if "error_code" in value and ("partition" in value or "resource" in value):
            code = value.get("error_code")
            name = "NONE" if not code else error_name(code)
            where = value.get("topic") or value.get("topic_id") or ""
            if value.get("partition") is not None:
                where = f"{where}[{value['partition']}]"
            elif value.get("resource") is not None:
                where = f"{where}{value['resource']}"
            return f"{where}={name}"
        inner = " ".join(f"{k}={text_value(v)}" for k, v in value.items() if v is not None)
        return "{" + inner + "}"
    return text_value(value)


def text_value(value: Any) -> str:
    """A value as text for ``table`` and ``fields`` (nested lists on one line)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return _time(value)
    if isinstance(value, list | tuple):
        return ", ".join(_entry(v) for v in value)
    if isinstance(value, dict):
        return _entry(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return _time(value)
    if isinstance(value, list | tuple | dict):
        return json.dumps(_json_value(value), ensure_ascii=False, separators=(",", ":"))
    return value


class RowPrinter:
    """Writes rows (dicts) of the given columns to ``out`` in one of ``FORMATS``."""

    def __init__(self, fmt: str, columns: Sequence[str], out: TextIO) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
        self.fmt = fmt
        self.columns = list(columns)
        self.out = out
        self.rows = 0
        self._widths: list[int] | None = None
        self._csv = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
        if self._csv is not None:
            self._csv.writerow(self.columns)
        self._write = {
            "table": self._table,
            "json": self._json,
            "jsonl": self._jsonl,
            "csv": self._csv_rows,
            "fields": self._fields,
        }

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        """Print these rows, and flush (the reader sees each batch as it is printed)."""
        if not rows:
            return
        self._write[self.fmt](rows)
        self.rows += len(rows)
        self.out.flush()

    def close(self) -> None:
        """Finish the output (the closing bracket of ``json``; a header for a table with no rows)."""
        if self.fmt == "json":
            self.out.write("[]\n" if not self.rows else "\n]\n")
        elif self.fmt == "table" and self._widths is None:
            self.out.write("  ".join(self.columns) + "\n")
        self.out.flush()

    def _json(self, rows: Sequence[dict[str, Any]]) -> None:
        for i, row in enumerate(rows):
            start = "[\n" if not self.rows and not i else ",\n"
            self.out.write(start + "  " + self._json_text(row))

    def _jsonl(self, rows: Sequence[dict[str, Any]]) -> None:
        self.out.write("".join(self._json_text(row) + "\n" for row in rows))

    def _json_text(self, row: dict[str, Any]) -> str:
        return json.dumps({c: _json_value(row.get(c)) for c in self.columns}, ensure_ascii=False)

    def _csv_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        assert self._csv is not None
        self._csv.writerows([_csv_value(row.get(c)) for c in self.columns] for row in rows)

    def _fields(self, rows: Sequence[dict[str, Any]]) -> None:
        clean = str.maketrans({"\t": " ", "\n": " ", "\r": " "})
        self.out.write(
            "".join(
                "\t".join(text_value(row.get(c)).translate(clean) for c in self.columns) + "\n"
                for row in rows
            )
        )

    def _table(self, rows: Sequence[dict[str, Any]]) -> None:
        cells = [[text_value(row.get(c)).replace("\n", " ") for c in self.columns] for row in rows]
        if self._widths is None:
            self._widths = [
                min(max([len(c)] + [len(line[i]) for line in cells]), _WIDEST)
                for i, c in enumerate(self.columns)
            ]
            self.out.write(self._line(self.columns) + "\n")
        self.out.write("".join(self._line(line) + "\n" for line in cells))

    def _line(self, cells: Sequence[str]) -> str:
        assert self._widths is not None
        last = len(cells) - 1
        return "  ".join(
            cell if i == last else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, self._widths, strict=True))
        )
