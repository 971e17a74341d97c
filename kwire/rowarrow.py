"""Row dicts to an Arrow record batch: compiled where it can, pyarrow's conversion otherwise.

pyarrow's conversion of the rows as one struct array (``pa.array(rows, type=struct)``) is the
reference, and the fallback. ``kwire/_rowarrow.c`` appends each row's values to its columns'
buffers instead, which Python wraps with ``pa.Array.from_buffers`` (why, and measured: the C
file's header). The compiled path takes only what pyarrow would take as the same value (the C
file's header lists it); on anything else it gives up and these rows go through pyarrow, so a
row pyarrow rejects is rejected the same way. ``KWIRE_PURE_PYTHON=1`` uses pyarrow alone.
"""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa

from decoder.compiled import load

__all__ = ["compiled_plan", "record_batch"]

_rowarrow = load("_rowarrow", "compiled Arrow conversion of rows", package="kwire")

_INTS = {8: "INT8", 16: "INT16", 32: "INT32", 64: "INT64"}


def _plan(arrow_type: pa.DataType, key: str | None) -> tuple | None:
    """(kind, key, child plans) for ``arrow_type``, or None if the compiled path lacks its kind."""
    kinds = _rowarrow
    # interned like the rows' keys (literals in kwire.rows and decoder.extract): a dict look-up
    # then matches by identity, not by comparing the text
    key = sys.intern(key) if key is not None else None
    if pa.types.is_boolean(arrow_type):
        return (kinds.BOOL, key, ())
    if pa.types.is_signed_integer(arrow_type):
        return (getattr(kinds, _INTS[arrow_type.bit_width]), key, ())
    if pa.types.is_timestamp(arrow_type) or pa.types.is_duration(arrow_type):
        return (kinds.INT64, key, ())  # an int is the value in the type's unit, as for pyarrow
    if pa.types.is_string(arrow_type):
        return (kinds.STRING, key, ())
    if pa.types.is_list(arrow_type):
        item = _plan(arrow_type.value_type, None)
        return None if item is None else (kinds.LIST, key, (item,))
    if pa.types.is_struct(arrow_type):
        fields = tuple(_plan(field.type, field.name) for field in arrow_type)
        return None if None in fields else (kinds.STRUCT, key, fields)
    return None


def compiled_plan(schema: pa.Schema) -> tuple | None:
    """The compiled conversion's plan for rows of ``schema``, or None (pure-Python mode, or a
    column type it does not take): then :func:`record_batch` uses pyarrow alone."""
    if _rowarrow is None:
        return None
    plans = tuple(_plan(field.type, field.name) for field in schema)
    return None if None in plans else plans


def _array(arrow_type: pa.DataType, node: tuple) -> pa.Array:
    length, nulls, validity, offsets, data, children = node
    buffers = [pa.py_buffer(validity) if nulls else None]
    if offsets is not None:
        buffers.append(pa.py_buffer(offsets))
    if data is not None:
        buffers.append(pa.py_buffer(data))
    nested = None
    if pa.types.is_list(arrow_type):
        nested = [_array(arrow_type.value_type, children[0])]
    elif pa.types.is_struct(arrow_type):
        nested = [_array(field.type, child) for field, child in zip(arrow_type, children, strict=True)]
    return pa.Array.from_buffers(arrow_type, length, buffers, null_count=nulls, children=nested)


def record_batch(rows: list[dict[str, Any]], schema: pa.Schema, plan: tuple | None) -> pa.RecordBatch:
    """``rows`` as a record batch of ``schema`` (keys not in it ignored, missing ones null).
    ``plan``: :func:`compiled_plan` of ``schema``, None for pyarrow's conversion alone."""
    if plan is not None:
        columns = _rowarrow.convert(rows, plan)
        if columns is not None:
            arrays = [_array(field.type, column) for field, column in zip(schema, columns, strict=True)]
            return pa.RecordBatch.from_arrays(arrays, schema=schema)
    structs = pa.array(rows, type=pa.struct(list(schema)))
    return pa.RecordBatch.from_struct_array(structs)
