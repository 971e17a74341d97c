"""Write exchange and connection rows as a Hive-partitioned Parquet dataset.

Layout: ``DIR/exchanges/date=YYYY-MM-DD/<prefix>-<n>.parquet`` and the same under
``connections/``. Rows are buffered and written in row groups of at most ``row_group_rows``;
each file is written under a ``.tmp`` name and renamed when closed, so a reader (Spark,
DuckDB, ``kwire analyze`` on a live proxy's output) never sees a partial file.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kwire.rowarrow import compiled_plan, record_batch
from kwire.schema import CONNECTIONS_SCHEMA, EXCHANGES_SCHEMA

__all__ = ["DEFAULT_ROW_GROUP_ROWS", "DatasetWriter", "TableWriter"]

DEFAULT_ROW_GROUP_ROWS = 64_000


def _let_others_run() -> None:
    """Between two conversions: let a thread waiting for the GIL (the proxy's loop) run."""
    time.sleep(0)


class TableWriter:
    """Rows of one table, spread over one open file per date partition.

    Rows are buffered as dicts and converted to Arrow every ``batch_rows`` rows (default: a
    row group's worth); converted batches wait until they make a row group of
    ``row_group_rows`` (or the roll) and are written as one. A recorder that converts as rows
    come, in small batches, still writes whole row groups: on 20,000 rows of a 200-connection
    proxy load (``bench/recorder_replay.py``) the writer cost 8.8 us a row written 4,096 rows
    at a time and 7.9 us in whole row groups of 65,536 (zstd and each column chunk's metadata).
    """

    def __init__(
        self,
        root: Path,
        schema: pa.Schema,
        prefix: str,
        row_group_rows: int,
        convert_rows: int | None = None,
        batch_rows: int | None = None,
        pause: Callable[[], None] | None = None,
        background: bool = False,
    ) -> None:
        self.root = root
        self.pause = pause or _let_others_run
        self.convert_rows = convert_rows
        self.schema = schema
        self.file_schema = schema.remove(schema.get_field_index("date"))
        self._plan = compiled_plan(self.file_schema)
        self.prefix = prefix
        self.row_group_rows = row_group_rows
        self.batch_rows = min(batch_rows or row_group_rows, row_group_rows)
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._converted: dict[str, list[pa.RecordBatch]] = {}  # per date: batches not yet written
        self._writers: dict[str, tuple[pq.ParquetWriter, Path, Path]] = {}
        self._files = 0
        self.rows_written = 0
        #: Row groups are encoded and compressed on this thread (pyarrow releases the GIL while
        #: it writes), one at a time, while the caller goes on making rows.
        self._background = ThreadPoolExecutor(1, thread_name_prefix="kwire-parquet") if background else None
        self._in_flight: Future[None] | None = None

    def append(self, row: dict[str, Any]) -> None:
        date = row.get("date") or "1970-01-01"
        buffer = self._buffers.setdefault(date, [])
        buffer.append(row)
        if len(buffer) >= self.batch_rows:
            self._convert(date)

    def _convert(self, date: str) -> None:
        rows = self._buffers.pop(date, None)
        if not rows:
            return
        converted = self._converted.setdefault(date, [])
        converted.extend(self._batches(rows))
        total = sum(batch.num_rows for batch in converted)
        if total >= self.row_group_rows:  # whole row groups now, the rest waits for more
            table = pa.Table.from_batches(converted, schema=self.file_schema)
            whole = total - total % self.row_group_rows
            self._converted[date] = table.slice(whole).to_batches()
            self._write(date, table.slice(0, whole))

    def _write(self, date: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if date not in self._writers:
            folder = self.root / f"date={date}"
            folder.mkdir(parents=True, exist_ok=True)
            final = folder / f"{self.prefix}-{self._files:05d}.parquet"
            self._files += 1
            temporary = final.with_name("." + final.name + ".tmp")
            writer = pq.ParquetWriter(temporary, self.file_schema, compression="zstd")
            self._writers[date] = (writer, temporary, final)
        writer = self._writers[date][0]
        if self._background is None:
            writer.write_table(table, row_group_size=self.row_group_rows)
        else:
            self._wait()  # one row group in flight at most: memory stays bounded
            self._in_flight = self._background.submit(writer.write_table, table, self.row_group_rows)
        self.rows_written += table.num_rows

    def _wait(self) -> None:
        """Wait for the row group in flight, if any (raising what its write raised)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _batches(self, rows: list[dict[str, Any]]) -> list[pa.RecordBatch]:
        # The row dicts converted by kwire.rowarrow (keys not in the schema, such as the
        # partition's date, are ignored). One conversion holds the GIL from start to end (no
        # bytecode runs inside it, so the switch interval cannot cut in): with pyarrow's
        # struct conversion, about 15 us per exchange row, 3,000 rows took 45 ms and 64,000
        # about a second, that long a stall for a proxy's forwarding thread. With
        # ``convert_rows`` set, rows are converted that many at a time and other threads can
        # take the GIL in between. Measured at 128 on 64,000 rows: about 10% more conversion
        # CPU, and a thread waiting for the GIL waited at most 4-8 ms; the Parquet write of
        # the pieces releases the GIL (waits of 1-2 ms).
        size = self.convert_rows or len(rows)
        batches = []
        for start in range(0, len(rows), size):
            batches.append(record_batch(rows[start : start + size], self.file_schema, self._plan))
            if self.convert_rows:
                self.pause()
        return batches

    def roll(self) -> None:
        """Write what is buffered and close every open file (they become visible)."""
        for date in list(self._buffers):
            self._convert(date)
        for date, batches in self._converted.items():
            self._write(date, pa.Table.from_batches(batches, schema=self.file_schema))
        self._converted.clear()
        self._wait()
        for writer, temporary, final in self._writers.values():
            writer.close()
            os.replace(temporary, final)
        self._writers.clear()

    def close(self) -> None:
        """Roll, and stop the background thread if there is one."""
        try:
            self.roll()
        finally:
            if self._background is not None:
                self._background.shutdown(wait=True)


class DatasetWriter:
    """The two tables of a kwire dataset under ``root``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        prefix: str | None = None,
        convert_rows: int | None = None,
        batch_rows: int | None = None,
        pause: Callable[[], None] | None = None,
        background: bool = False,
    ) -> None:
        """``batch_rows``: rows buffered as dicts before they are converted to Arrow (default: a
        row group); ``convert_rows``: of those, converted that many at a time (see
        ``TableWriter``), for writers in a thread beside latency-sensitive work, calling
        ``pause`` in between (default: let a thread waiting for the GIL run). ``background``:
        the exchanges' row groups are written on a thread of their own, one at a time, while
        the caller makes more rows (for ``kwire decode``, whose second CPU is otherwise idle on a
        capture of one busy connection)."""
        self.root = Path(root)
        prefix = prefix or f"part-{uuid.uuid4().hex[:12]}"
        self.exchanges = TableWriter(
            self.root / "exchanges",
            EXCHANGES_SCHEMA,
            prefix,
            row_group_rows,
            convert_rows,
            batch_rows,
            pause,
            background,
        )
        self.connections = TableWriter(
            self.root / "connections",
            CONNECTIONS_SCHEMA,
            prefix,
            row_group_rows,
            convert_rows,
            batch_rows,
            pause,
        )

    def roll(self) -> None:
        """Close the current files of both tables (the next rows start new files)."""
        self.exchanges.roll()
        self.connections.roll()

    def close(self) -> None:
        self.exchanges.close()
        self.connections.close()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
