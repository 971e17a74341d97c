"""``kwire decode`` printing rows: exchanges in batches through the filter (``-Y``) to the printer (``-T``).

``RowSink`` takes the decoder's exchange rows one by one and prints them a batch at a time:
converting a batch to Arrow and filtering it costs about a millisecond however small it is, so
rows are gathered while more input is waiting and printed as soon as none is (``ready``), which
keeps a live capture's output immediate and a file's fast.
"""

from __future__ import annotations

import os
import select
from collections.abc import Sequence
from typing import Any

from kwire.rowfilter import RowFilter
from kwire.rowprint import RowPrinter
from kwire.rowtable import rows_to_table

__all__ = ["Enough", "RowSink", "input_waiting"]

BATCH_ROWS = 2048


class Enough(Exception):
    """``-c N`` rows have been printed: stop decoding."""


class RowSink:
    """Exchange rows in; the rows the filter keeps, with the chosen columns, out to the printer."""

    def __init__(
        self,
        printer: RowPrinter,
        row_filter: RowFilter | None,
        count: int | None = None,
        batch_rows: int = BATCH_ROWS,
    ) -> None:
        self.printer = printer
        self.columns = printer.columns
        self.row_filter = row_filter
        self.count = count
        self.batch_rows = batch_rows
        self.printed = 0
        self.seen = 0
        self._pending: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        """One exchange row (printing a batch once ``batch_rows`` are waiting)."""
        self._pending.append(row)
        self.seen += 1
        if len(self._pending) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Print what is waiting; raises Enough once ``count`` rows are printed."""
        rows, self._pending = self._pending, []
        if not rows:
            return
        table = rows_to_table(rows)
        table = self.row_filter.apply(table) if self.row_filter is not None else table.select(self.columns)
        out: Sequence[dict[str, Any]] = table.to_pylist()
        if self.count is not None:
            out = out[: self.count - self.printed]
        self.printer.write(out)
        self.printed += len(out)
        if self.count is not None and self.printed >= self.count:
            raise Enough

    def ready(self, fd: int | None) -> None:
        """Between two segments of a stream: print now unless more input is already waiting on ``fd``."""
        if self._pending and (fd is None or not input_waiting(fd)):
            self.flush()


def input_waiting(fd: int) -> bool:
    """Whether reading ``fd`` would return at once (data, or the end of the stream)."""
    try:
        readable, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(readable)


def stdout_gone() -> None:
    """The reader of stdout left (``| head``): send what is still buffered nowhere, quietly."""
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
