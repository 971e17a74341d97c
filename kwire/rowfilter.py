"""``-Y/--filter``: a SQL WHERE expression over the exchange columns, run by DuckDB.

Why SQL through DuckDB rather than a display-filter language of our own (tshark's ``-Y``):

* the same expression works everywhere else a kwire dataset is read: a ``-Y`` tried on a capture
  pastes into ``kwire sql`` (Spark SQL) or a DuckDB query of the Parquet files unchanged, for the
  usual comparisons, ``AND``/``OR``/``NOT``, ``IN``, ``LIKE``, ``IS NULL`` and ``BETWEEN``;
* the columns are the Parquet columns, with their types (times are timestamps: ``request_time >
  '2024-10-01 12:00'`` works; nested lists can be searched with DuckDB's list functions);
* a grammar, a type checker and error messages that point at the mistake come for free, and the
  rows are already Arrow tables, which DuckDB reads without a copy.

Made for the shell: ``has_error('KAFKA_STORAGE_ERROR')`` is true when that error is anywhere in the
exchange (top level or any partition, coordinator or metadata partition: the ``errors`` column),
``has_error()`` when any error is; names are matched without regard to case. The expression is
checked once against an empty table before any decoding, so a typo costs nothing, and must be
one expression (no ``;``, no subqueries over other tables: only the rows' own columns exist).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa

from kwire.rowtable import empty_table

__all__ = ["FilterError", "RowFilter"]

# has_error( ... ) outside string literals and quoted identifiers
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\bhas_error\s*\(\s*(\))?", re.IGNORECASE)


class FilterError(ValueError):
    """A filter expression DuckDB cannot run; the message is one line."""


def _rewrite(expression: str) -> str:
    """``has_error(x)`` -> ``list_contains(errors, upper(x))``; ``has_error()`` -> any error."""

    def replace(match: re.Match[str]) -> str:
        text = match.group(0)
        if text[0] in "'\"":
            return text
        if match.group(1):  # has_error()
            return "(len(errors) > 0)"
        return "kwire_has_error(errors, "

    return _TOKENS.sub(replace, expression)


def _one_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


class RowFilter:
    """Select rows (and columns) of exchange tables with a WHERE expression."""

    def __init__(self, expression: str | None, columns: Sequence[str]) -> None:
        """Raises FilterError when the expression does not parse or names an unknown column."""
        import duckdb

        self.expression = expression
        self.columns = list(columns)
        self._con = duckdb.connect()
        self._con.execute(
            "CREATE MACRO kwire_has_error(errs, name) AS list_contains(errs, upper(CAST(name AS VARCHAR)))"
        )
        select = ", ".join('"' + c.replace('"', '""') + '"' for c in self.columns)
        where = f" WHERE ({_rewrite(expression)})" if expression and expression.strip() else ""
        self._query = f"SELECT {select} FROM kwire_rows{where}"
        try:
            if len(duckdb.extract_statements(self._query)) != 1:
                raise FilterError("the filter must be one expression (no ';')")
        except duckdb.Error as exc:
            raise FilterError(_one_line(exc)) from None
        self.apply(empty_table())  # checks names and types

    def apply(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` the expression keeps, with the chosen columns."""
        import duckdb

        self._con.register("kwire_rows", table)
        try:
            return self._con.sql(self._query).to_arrow_table()
        except duckdb.Error as exc:
            raise FilterError(_one_line(exc)) from None
        finally:
            self._con.unregister("kwire_rows")
