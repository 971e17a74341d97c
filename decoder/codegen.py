"""Turn protocol-table layouts into Python decode functions.

Walking a layout tree for every frame costs more than the frame itself, so each
(layout, flexible) pair is compiled once, on first use, into a straight-line Python
function. A compiled function reads only the fields that carry a role (see
``generate_protocol``) and skips every other field by its length: fixed-size runs become a
single offset addition, record batches are summarised from their headers, never copied.

A decode function has the signature ``f(buf, pos, end) -> (fields, pos)`` where ``fields``
is a dict keyed by role (leaf fields) or by field name (structs and arrays of structs that
hold a role somewhere below). Skip functions have ``s(buf, pos, end) -> pos``. Any read past
``end`` or an implausible length raises ``Malformed``; ``struct.error``/``IndexError`` from
reading past the buffer are turned into ``Malformed`` by the caller.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable
from typing import Any

from decoder.compiled import load
from decoder.primitives import (
    Malformed,
    read_uuid,
    read_uvarint,
    unpack_int16_array,
    unpack_int32_array,
    unpack_int64_array,
)
from decoder.records import MAX_BATCHES_KEPT, RecordsSummary, summarize_records

__all__ = ["Layout", "compile_message", "compile_python", "program"]

Layout = list[list[Any]]  # [name, type, flags, tag, role, children] per field

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "float64": 8, "uuid": 16}
_UNPACK = {
    "bool": "_bool",
    "int8": "_i8",
    "int16": "_i16",
    "uint16": "_u16",
    "int32": "_i32",
    "int64": "_i64",
    "float64": "_f64",
}
_ARRAY_UNPACK = {"int16": "_a16", "int32": "_a32", "int64": "_a64"}

NULLABLE = 1
CLASSIC_ENCODING = 2


def _count_error(name: str, n: int, p: int, e: int) -> str:
    """Why an array's count does not fit: its count, or its count field itself, runs past the frame."""
    if p > e:
        return f"{name}: array count runs past the frame"
    return f"{name}: array count {n} exceeds the frame"


_NAMESPACE: dict[str, Any] = {
    "Malformed": Malformed,
    "_count_error": _count_error,
    "_uv": read_uvarint,
    "_uuid": read_uuid,
    "_records": summarize_records,
    "_a16": unpack_int16_array,
    "_a32": unpack_int32_array,
    "_a64": unpack_int64_array,
    "_i8": struct.Struct(">b").unpack_from,
    "_i16": struct.Struct(">h").unpack_from,
    "_u16": struct.Struct(">H").unpack_from,
    "_i32": struct.Struct(">i").unpack_from,
    "_i64": struct.Struct(">q").unpack_from,
    "_f64": struct.Struct(">d").unpack_from,
    "_bool": lambda b, p: (b[p] != 0,),
}

_cache: dict[tuple[str, bool, bool], str] = {}  # (layout json, flexible, keep) -> function name


def _is_kept(field: list[Any]) -> bool:
    _name, _ftype, _flags, _tag, role, children = field
    return role is not None or (children is not None and any(_is_kept(c) for c in children))


class _Writer:
    """Accumulates the source of one function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.pending_skip = 0  # fixed bytes to skip, folded into one addition

    def emit(self, indent: int, line: str) -> None:
        self.flush(indent)
        self.lines.append("    " * indent + line)

    def flush(self, indent: int) -> None:
        if self.pending_skip:
            self.lines.append("    " * indent + f"p += {self.pending_skip}")
            self.pending_skip = 0


def _length(w: _Writer, ind: int, compact: bool, wide: bool) -> None:
    """Emit code leaving a length (or count) in ``n``; -1 means null."""
    if compact:
        w.emit(ind, "n = b[p]")
        w.emit(ind, "if n < 128:")
        w.emit(ind + 1, "p += 1")
        w.emit(ind, "else:")
        w.emit(ind + 1, "n, p = _uv(b, p)")
        w.emit(ind, "n -= 1")
    elif wide:
        w.emit(ind, "n = _i32(b, p)[0]")
        w.emit(ind, "p += 4")
    else:
        w.emit(ind, "n = _i16(b, p)[0]")
        w.emit(ind, "p += 2")


def _field_code(w: _Writer, ind: int, field: list[Any], flexible: bool, keep: bool, target: str) -> None:
    """Emit code that reads (``keep``) or skips one field. A kept value lands in ``target``."""
    name, ftype, flags, _tag, role, children = field
    compact = flexible and not flags & CLASSIC_ENCODING
    kept = keep and _is_kept(field)
    if ftype in _FIXED:
        if kept:
            if ftype == "uuid":
                w.emit(ind, f"{target} = _uuid(b, p)")
            else:
                w.emit(ind, f"{target} = {_UNPACK[ftype]}(b, p)[0]")
            w.pending_skip += _FIXED[ftype]
        else:
            w.pending_skip += _FIXED[ftype]
        return
    if ftype in ("string", "bytes", "records"):
        _length(w, ind, compact, wide=ftype != "string")
        if kept:
            # strings: decoded text; records: summarised from batch headers in place
            value = "b[p:q].decode('utf-8', 'replace')" if ftype == "string" else "_records(b, p, q)"
            w.emit(ind, "if n >= 0:" if ftype == "string" else "if n > 0:")
            w.emit(ind + 1, "q = p + n")
            w.emit(ind + 1, "if q > e:")
            w.emit(ind + 2, f"raise Malformed('{name}: {ftype} runs past the frame')")
            w.emit(ind + 1, f"{target} = {value}")
            w.emit(ind + 1, "p = q")
            w.emit(ind, "else:")
            w.emit(ind + 1, f"{target} = None")
        else:
            w.emit(ind, "if n > 0:")
            w.emit(ind + 1, "p += n")
        return
    if ftype == "{}":  # a single struct, nullable ones carry an int8 presence marker
        if flags & NULLABLE:
            w.emit(ind, "if _i8(b, p)[0] < 0:")
            w.emit(ind + 1, "p += 1")
            if kept:
                w.emit(ind + 1, f"{target} = None")
            w.emit(ind, "else:")
            w.emit(ind + 1, "p += 1")
            ind += 1
        fn = _function(children, flexible, kept)
        w.emit(ind, f"{target}, p = {fn}(b, p, e)" if kept else f"p = {fn}(b, p, e)")
        return
    if not ftype.startswith("[]"):
        raise ValueError(f"unknown field type {ftype!r}")
    element = ftype[2:]
    _length(w, ind, compact, wide=True)
    w.emit(ind, "if n > e - p:")
    w.emit(ind + 1, f"raise Malformed(_count_error('{name}', n, p, e))")
    if kept:
        w.emit(ind, "if n < 0:")
        w.emit(ind + 1, f"{target} = None")
        w.emit(ind, "else:")
        ind += 1
    else:
        w.emit(ind, "if n > 0:")
        ind += 1
    if element == "":  # array of structs
        fn = _function(children, flexible, kept)
        if kept:
            w.emit(ind, "v = []")
            w.emit(ind, "for _ in range(n):")
            w.emit(ind + 1, f"x, p = {fn}(b, p, e)")
            w.emit(ind + 1, "v.append(x)")
            w.emit(ind, f"{target} = v")
        else:
            w.emit(ind, "for _ in range(n):")
            w.emit(ind + 1, f"p = {fn}(b, p, e)")
    elif element in _FIXED:
        size = _FIXED[element]
        if kept and element in _ARRAY_UNPACK:
            w.emit(ind, f"{target} = {_ARRAY_UNPACK[element]}(b, p, n)")
        elif kept:
            w.emit(
                ind,
                f"{target} = [_uuid(b, p + {size} * i) for i in range(n)]"
                if element == "uuid"
                else f"{target} = [{_UNPACK[element]}(b, p + {size} * i)[0] for i in range(n)]",
            )
        w.emit(ind, f"p += {size} * n")
    elif element in ("string", "bytes"):
        if kept:
            w.emit(ind, "v = []")
        w.emit(ind, "for _ in range(n):")
        inner = _Writer()
        _field_code(
            inner,
            ind + 1,
            [name, element, 0 if compact else CLASSIC_ENCODING, None, role if kept else None, None],
            flexible,
            kept,
            "x",
        )
        inner.flush(ind + 1)
        w.lines.extend(inner.lines)
        if kept:
            w.emit(ind + 1, "v.append(x)")
            w.emit(ind, f"{target} = v")
    else:
        raise ValueError(f"unknown array element type {element!r}")
    w.flush(ind)


def _tagged_code(w: _Writer, fields: Layout, flexible: bool, keep: bool) -> None:
    """Emit the tagged-field section that ends every flexible struct."""
    kept_tags = [f for f in fields if f[3] is not None and keep and _is_kept(f)]
    w.emit(1, "n = b[p]")
    w.emit(1, "if n < 128:")
    w.emit(2, "p += 1")
    w.emit(1, "else:")
    w.emit(2, "n, p = _uv(b, p)")
    w.emit(1, "if n > e - p:")
    w.emit(2, "raise Malformed('tagged field count exceeds the frame')")
    w.emit(1, "for _ in range(n):")
    w.emit(2, "tag, p = _uv(b, p)")
    w.emit(2, "size, p = _uv(b, p)")
    w.emit(2, "if p + size > e:")
    w.emit(3, "raise Malformed('tagged field runs past the frame')")
    for index, field in enumerate(kept_tags):
        w.emit(2, ("if" if index == 0 else "elif") + f" tag == {field[3]}:")
        w.emit(3, "q = p")
        w.emit(3, "e0, e = e, p + size")
        _field_code(w, 3, field, flexible, True, f"r[{_key(field)!r}]")
        w.flush(3)
        w.emit(3, "p, e = q, e0")
    w.emit(2, "p += size")


def _key(field: list[Any]) -> str:
    return field[4] if field[4] is not None else field[0]


_STRUCT_CODES = {
    "bool": "?",
    "int8": "b",
    "int16": "h",
    "uint16": "H",
    "int32": "i",
    "int64": "q",
    "float64": "d",
}


def _fixed_run(w: _Writer, run: list[tuple[list[Any], str]]) -> None:
    """Emit one struct call for consecutive fixed-size fields (skipped ones become pad bytes)."""
    kept = [(field, target) for field, target in run if target]
    size = sum(_FIXED[field[1]] for field, _ in run)
    if not kept:
        w.pending_skip += size
        return
    if any(f[1] == "uuid" for f, _ in kept):
        for field, target in run:  # uuids are rare: read them one by one
            if target and field[1] == "uuid":
                w.emit(1, f"{target} = _uuid(b, p)")
            elif target:
                w.emit(1, f"{target} = {_UNPACK[field[1]]}(b, p)[0]")
            w.pending_skip += _FIXED[field[1]]
        return
    fmt = ">" + "".join(_STRUCT_CODES[f[1]] if t else f"{_FIXED[f[1]]}x" for f, t in run)
    name = "_S" + "".join(c if c.isalnum() else "_" for c in fmt[1:])
    if name not in _NAMESPACE:
        _NAMESPACE[name] = struct.Struct(fmt).unpack_from
    targets = ", ".join(t for _, t in kept)
    w.emit(1, f"{targets}{',' if len(kept) == 1 else ''} = {name}(b, p)")
    w.pending_skip += size


def _function(fields: Layout, flexible: bool, keep: bool) -> str:
    """Compile (or reuse) the decode/skip function for a struct layout; return its name.

    Kept values go to locals and the result dict is built once at the end; consecutive
    fixed-size fields are read with a single struct call.
    """
    cache_key = (json.dumps(fields, separators=(",", ":")), flexible, keep)
    if cache_key in _cache:
        return _cache[cache_key]
    fn = f"_{'d' if keep else 's'}{len(_cache)}"
    _cache[cache_key] = fn
    w = _Writer()
    w.lines.append(f"def {fn}(b, p, e):")
    keys: list[tuple[str, str]] = []  # (dict key, local variable)
    run: list[tuple[list[Any], str]] = []
    for index, field in enumerate(fields):
        if field[3] is not None:
            continue  # tagged: read in the tagged section below
        target = f"v{index}" if keep and _is_kept(field) else ""
        if target:
            keys.append((_key(field), target))
        if field[1] in _FIXED:
            run.append((field, target))
            continue
        if run:
            _fixed_run(w, run)
            run = []
        _field_code(w, 1, field, flexible, keep, target or "_")
    if run:
        _fixed_run(w, run)
    if keep:
        w.emit(1, "r = {" + ", ".join(f"{k!r}: {v}" for k, v in keys) + "}")
    if flexible:
        _tagged_code(w, fields, flexible, keep)
    w.emit(1, "return (r, p)" if keep else "return p")
    exec(compile("\n".join(w.lines), f"<kwire layout {fn}>", "exec"), _NAMESPACE)
    return fn


#: Compiling names a function in ``_cache`` before it exists in ``_NAMESPACE``: one compile
#: at a time (the proxy decodes on several threads).
_compile_lock = threading.Lock()

# ---- programs for the compiled interpreter (decoder/_layoutvm.c) ---------------------------
#
# The same layouts, the same reading rules, as data for C: a struct is ``(ops, tagged, flexible,
# keep)``, each op a tuple whose first item is one of the ``_OP_*`` codes below. The C file's
# header describes each op; every rule here mirrors the Python emitted above, which stays the
# reference (the C decoder hands every frame it cannot decode cleanly to it).

_OP_RUN, _OP_STR, _OP_STRUCT, _OP_ASTRUCT, _OP_AFIXED, _OP_ASTR = range(6)
_FIXED_CODE = {"bool": 0, "int8": 1, "int16": 2, "uint16": 3, "int32": 4, "int64": 5, "float64": 6, "uuid": 7}


def _run_op(run: list[tuple[list[Any], str | None]]) -> tuple[Any, ...]:
    """Consecutive fixed-size fields: one bounds check for the run when read at once (no uuid),
    as the struct call of ``_fixed_run`` does."""
    items = []
    offset = 0
    for field, key in run:
        if key is not None:
            items.append((offset, _FIXED_CODE[field[1]], key))
        offset += _FIXED[field[1]]
    check = bool(items) and not any(f[1] == "uuid" for f, k in run if k is not None)
    return (_OP_RUN, offset, int(check), tuple(items))


def _op(field: list[Any], flexible: bool, keep: bool) -> tuple[Any, ...]:
    """One non-fixed field (or a tagged one of any type) as an op, as ``_field_code`` reads it."""
    _name, ftype, flags, _tag, _role, children = field
    compact = int(flexible and not flags & CLASSIC_ENCODING)
    kept = keep and _is_kept(field)
    key = _key(field) if kept else None
    if ftype in _FIXED:
        return _run_op([(field, key)])
    if ftype in ("string", "bytes", "records"):
        return (_OP_STR, compact, int(ftype != "string"), 0 if ftype == "string" else 1, key)
    if ftype == "{}":
        return (_OP_STRUCT, int(bool(flags & NULLABLE)), key, program(children, flexible, kept))
    element = ftype[2:]
    if element == "":
        return (_OP_ASTRUCT, compact, key, program(children, flexible, kept))
    if element in _FIXED:
        return (_OP_AFIXED, compact, _FIXED_CODE[element], _FIXED[element], key)
    if element in ("string", "bytes"):
        return (_OP_ASTR, compact, int(element != "string"), 0 if element == "string" else 1, key)
    raise ValueError(f"unknown field type {ftype!r}")


def program(fields: Layout, flexible: bool, keep: bool = True) -> tuple[Any, ...]:
    """The interpreter's program for a struct layout (see ``_function`` for the Python one)."""
    ops: list[tuple[Any, ...]] = []
    run: list[tuple[list[Any], str | None]] = []
    for field in fields:
        if field[3] is not None:
            continue  # tagged: in the tagged section
        if field[1] in _FIXED:
            run.append((field, _key(field) if keep and _is_kept(field) else None))
            continue
        if run:
            ops.append(_run_op(run))
            run = []
        ops.append(_op(field, flexible, keep))
    if run:
        ops.append(_run_op(run))
    tagged = tuple(
        (f[3], _op(f, flexible, True)) for f in fields if f[3] is not None and keep and _is_kept(f)
    )
    return (tuple(ops), tagged if flexible else (), flexible, keep)


def compile_python(layout: Layout, flexible: bool) -> Callable[[Any, int, int], tuple[dict[str, Any], int]]:
    """The generated Python decode function for a whole message body: the reference."""
    with _compile_lock:
        return _NAMESPACE[_function(layout, flexible, True)]


def compile_message(layout: Layout, flexible: bool) -> Callable[[Any, int, int], tuple[dict[str, Any], int]]:
    """The decode function for a whole message body: the compiled interpreter running the
    layout's program, holding the Python function as its reference (``KWIRE_PURE_PYTHON=1``:
    the Python function alone)."""
    reference = compile_python(layout, flexible)
    if _layoutvm is None:
        return reference
    return _layoutvm.Decoder(
        program(layout, flexible), reference, summarize_records, RecordsSummary, MAX_BATCHES_KEPT
    )


_layoutvm: Any = load("_layoutvm", "compiled decoder")


def generated_source_lines() -> int:
    """How many lines of Python the compiled layouts took so far (for diagnostics)."""
    return len(_cache)
