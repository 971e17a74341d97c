"""Exchange rows as Arrow tables for printing and filtering: the Parquet columns plus a few made for the shell.

``kwire decode -T``/``-Y`` print and filter the very rows the dataset writer stores: each batch of
row dicts is converted with the dataset's schema (``kwire.schema.EXCHANGES_SCHEMA``, so a printed
value is the Parquet value, microseconds and all), and three columns are added that the Parquet
files do not hold because they are derived:

* ``errors``: the names of every error code in the exchange, without repeats: the top-level
  ``error_code`` and those of ``partition_errors``, ``coordinators`` and ``metadata_partitions``
  (a Produce answered with KAFKA_STORAGE_ERROR has it only per partition);
* ``client`` and ``broker``: ``ip:port`` (``[ip]:port`` for IPv6).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from decoder.protocol import error_name
from kwire.schema import EXCHANGES_SCHEMA

__all__ = ["ALL_COLUMNS", "DERIVED_COLUMNS", "PARQUET_COLUMNS", "errors_of", "rows_to_table"]

#: Columns made here, not stored in the dataset, with their type.
DERIVED_COLUMNS: dict[str, pa.DataType] = {
    "errors": pa.list_(pa.string()),
    "client": pa.string(),
    "broker": pa.string(),
}
#: The dataset's exchange columns, in schema order (``date`` last).
PARQUET_COLUMNS: tuple[str, ...] = tuple(EXCHANGES_SCHEMA.names)
ALL_COLUMNS: tuple[str, ...] = PARQUET_COLUMNS + tuple(DERIVED_COLUMNS)
_ROW_TYPE = pa.struct(list(EXCHANGES_SCHEMA))
_NESTED_WITH_ERRORS = ("partition_errors", "coordinators", "metadata_partitions")


def errors_of(row: dict[str, Any]) -> list[str]:
    """The error names anywhere in an exchange row (top level first, then nested, no repeats)."""
    names: list[str] = []
    code = row.get("error_code")
    if code:
        names.append(row.get("error_name") or error_name(code))
    for column in _NESTED_WITH_ERRORS:
        for entry in row.get(column) or ():
            code = entry.get("error_code")
            if code:
                name = error_name(code)
                if name not in names:
                    names.append(name)
    return names


def _address(ip: str | None, port: int | None) -> str | None:
    if ip is None:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return host if port is None else f"{host}:{port}"


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Exchange row dicts (as the decoder makes them) as an Arrow table of ``ALL_COLUMNS``."""
    structs = pa.array(list(rows), type=_ROW_TYPE)
    batch = pa.RecordBatch.from_struct_array(structs)
    table = pa.Table.from_batches([batch])
    derived = {
        "errors": [errors_of(r) for r in rows],
        "client": [_address(r.get("client_ip"), r.get("client_port")) for r in rows],
        "broker": [_address(r.get("broker_ip"), r.get("broker_port")) for r in rows],
    }
    for name, dtype in DERIVED_COLUMNS.items():
        table = table.append_column(pa.field(name, dtype), pa.array(derived[name], type=dtype))
    return table


def empty_table() -> pa.Table:
    """A table of ``ALL_COLUMNS`` with no rows (to check a filter before decoding anything)."""
    return rows_to_table([])
