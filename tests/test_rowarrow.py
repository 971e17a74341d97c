"""The compiled conversion of rows to Arrow (kwire/_rowarrow.c) against pyarrow's (its reference).

Every row of every bundled and lab capture (exchanges and connections) converts to the same
record batch either way, without the compiled path giving up; the datasets written either way
are the same files byte for byte; hand-made rows reach every kind and edge (nulls, missing keys,
empty lists, nested nulls, integer bounds, non-ASCII text); values pyarrow would judge (floats,
bytes, tuples, out-of-range integers, bools for integers...) make the compiled path give up, so
the outcome is pyarrow's, batch or exception; and seeded random rows, valid and not, agree.
"""

from __future__ import annotations

import datetime
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kwire import rowarrow
from kwire.dataset import DatasetWriter
from kwire.decode_command import decode_captures
from kwire.schema import CONNECTIONS_SCHEMA, EXCHANGES_SCHEMA

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted([*REPO.glob("captures/*.pcap"), *REPO.glob("captures/lab/**/capture.pcap*")])
C = rowarrow._rowarrow

pytestmark = pytest.mark.skipif(C is None, reason="KWIRE_PURE_PYTHON=1: no compiled Arrow conversion")


def _file_schema(schema: pa.Schema) -> pa.Schema:
    return schema.remove(schema.get_field_index("date"))


def _outcome(rows: list[Any], schema: pa.Schema, plan: tuple | None) -> Any:
    try:
        return ("ok", rowarrow.record_batch(rows, schema, plan))
    except Exception as exc:  # pyarrow's exception is the answer
        return ("raised", type(exc))


def _same(rows: list[Any], schema: pa.Schema) -> None:
    compiled = _outcome(rows, schema, rowarrow.compiled_plan(schema))
    reference = _outcome(rows, schema, None)
    assert compiled[0] == reference[0], (compiled, reference)
    if compiled[0] == "ok":
        assert compiled[1].schema.equals(reference[1].schema, check_metadata=True)
        assert compiled[1].equals(reference[1])
        compiled[1].validate(full=True)
    else:
        assert compiled[1] is reference[1]


@pytest.fixture(scope="module")
def captured() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    decode_captures(CAPTURES, exchanges.append, connections.append)
    return exchanges, connections


def test_every_captured_row_converts_the_same_without_giving_up(captured: Any) -> None:
    exchanges, connections = captured
    assert len(exchanges) > 1000 and len(connections) > 50
    kinds = {row.get("api_key") for row in exchanges}
    assert {0, 1, 3, 10, 18} <= kinds  # Produce, Fetch, Metadata, FindCoordinator, ApiVersions
    for rows, schema in ((exchanges, EXCHANGES_SCHEMA), (connections, CONNECTIONS_SCHEMA)):
        schema = _file_schema(schema)
        plan = rowarrow.compiled_plan(schema)
        assert plan is not None
        assert C.convert(rows, plan) is not None  # the compiled path took every row
        _same(rows, schema)
        for start in range(0, len(rows), 997):  # and in pieces, as a recorder converts them
            _same(rows[start : start + 997], schema)


def test_datasets_written_either_way_are_the_same_files(captured: Any, tmp_path: Path) -> None:
    exchanges, connections = captured

    def write(root: Path, compiled: bool) -> None:
        with DatasetWriter(root, row_group_rows=5_000, prefix="part") as writer:
            for table in (writer.exchanges, writer.connections):
                if not compiled:
                    table._plan = None
                assert (table._plan is not None) == compiled
            for row in exchanges:
                writer.exchanges.append(row)
            for row in connections:
                writer.connections.append(row)

    write(tmp_path / "c", True)
    write(tmp_path / "py", False)
    files = sorted(p.relative_to(tmp_path / "c") for p in (tmp_path / "c").rglob("*.parquet"))
    assert len(files) >= 2
    assert files == sorted(p.relative_to(tmp_path / "py") for p in (tmp_path / "py").rglob("*.parquet"))
    for name in files:
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "py" / name).read_bytes(), name
    total = sum(pq.read_metadata(tmp_path / "c" / name).num_rows for name in files)
    assert total == len(exchanges) + len(connections)


EDGE_SCHEMA = pa.schema(
    [
        pa.field("flag", pa.bool_()),
        pa.field("i8", pa.int8()),
        pa.field("i16", pa.int16()),
        pa.field("i32", pa.int32()),
        pa.field("i64", pa.int64()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("text", pa.string()),
        pa.field("words", pa.list_(pa.string())),
        pa.field("numbers", pa.list_(pa.int32())),
        pa.field(
            "items",
            pa.list_(
                pa.struct(
                    [
                        pa.field("name", pa.string()),
                        pa.field("on", pa.bool_()),
                        pa.field("crcs", pa.list_(pa.int64())),
                    ]
                )
            ),
        ),
        pa.field("inner", pa.struct([pa.field("a", pa.int16()), pa.field("b", pa.string())])),
    ]
)

_BOUNDS = {"i8": 7, "i16": 15, "i32": 31, "i64": 63}


def test_hand_made_rows_reach_every_kind_and_edge() -> None:
    rows: list[dict[str, Any]] = [
        {},  # every column missing: all null
        dict.fromkeys(EDGE_SCHEMA.names),  # every column None
        {
            "flag": True,
            "text": "",
            "words": [],
            "numbers": [],
            "items": [],
            "inner": {},
            "extra": object(),  # a key not in the schema is ignored
        },
        {
            "flag": False,
            "text": "naïve ☃ 𝄞",
            "words": ["a", None, "ü"],
            "numbers": [None, 0, -1],
            "items": [None, {}, {"name": "x", "on": False, "crcs": [None, 2**63 - 1]}, {"crcs": []}],
            "inner": {"a": -(2**15), "b": None, "other": 1},
            "at": 1_790_000_000_000_000,
        },
    ]
    for name, bits in _BOUNDS.items():
        rows.append({name: -(2**bits)})
        rows.append({name: 2**bits - 1})
    rows.extend({"flag": i % 3 == 0 if i % 5 else None, "i32": i} for i in range(40))  # bitmaps past a byte
    plan = rowarrow.compiled_plan(EDGE_SCHEMA)
    assert C.convert(rows, plan) is not None
    _same(rows, EDGE_SCHEMA)
    _same([], EDGE_SCHEMA)
    _same([{"flag": None}] * 9, EDGE_SCHEMA)  # a bool column of nulls only


@pytest.mark.parametrize(
    "row",
    [
        {"i8": 128},
        {"i16": -(2**15) - 1},
        {"i32": 2**31},
        {"i64": 2**63},
        {"i32": 1.0},
        {"i32": True},
        {"flag": 1},
        {"text": b"bytes"},
        {"text": "\ud800"},  # a lone surrogate: not UTF-8
        {"words": ("a", "b")},
        {"words": "ab"},
        {"items": [("x", True, [])]},
        {"inner": ["not", "a", "dict"]},
        {"at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)},
        {"numbers": [1, 2**40]},
    ],
)
def test_values_pyarrow_judges_are_left_to_it(row: dict[str, Any]) -> None:
    plan = rowarrow.compiled_plan(EDGE_SCHEMA)
    assert C.convert([{"i32": 1}, row], plan) is None  # the compiled path gives up...
    _same([{"i32": 1}, row], EDGE_SCHEMA)  # ...and the outcome is pyarrow's


class _Key(str):
    """A str subclass: may hash and compare as it likes, so pyarrow's look-up decides."""


def _copy(text: str) -> str:
    return "".join(list(text))  # equal, but not the same (interned) object


def test_keys_in_any_order_and_equal_copies_are_the_same_fields() -> None:
    rows: list[dict[Any, Any]] = [
        {"i32": 1, "text": "a", "flag": True, "inner": {"a": 1, "b": "x"}},
        {"flag": False, "inner": {"b": "y", "a": 2}, "text": "b", "i32": 2},  # the other way round
        {_copy("text"): "c", _copy("i32"): 3, 7: "a non-str key is never read", ("t",): 1},
        {"items": [{"on": True, "name": "n"}, {_copy("name"): "m", "crcs": [1]}, {"crcs": [], "on": None}]},
        {"i32": 4},  # shorter than the order before it
        {"text": "d", "i32": 5, "flag": None, "inner": {_copy("a"): 3}},
    ]
    plan = rowarrow.compiled_plan(EDGE_SCHEMA)
    assert C.convert(rows, plan) is not None
    _same(rows, EDGE_SCHEMA)
    assert rowarrow.record_batch(rows, EDGE_SCHEMA, plan).column("i32").to_pylist() == [1, 2, 3, None, 4, 5]


def test_a_str_subclass_key_is_left_to_pyarrow() -> None:
    plan = rowarrow.compiled_plan(EDGE_SCHEMA)
    rows = [{"i32": 1}, {_Key("i32"): 2}]
    assert C.convert(rows, plan) is None
    _same(rows, EDGE_SCHEMA)


def test_rows_that_are_not_dicts_are_left_to_pyarrow() -> None:
    plan = rowarrow.compiled_plan(EDGE_SCHEMA)
    assert C.convert([{"i32": 1}, None], plan) is None
    _same([{"i32": 1}, None], EDGE_SCHEMA)


def test_types_it_lacks_use_pyarrow_alone() -> None:
    schema = pa.schema([pa.field("x", pa.float64()), pa.field("n", pa.int32())])
    assert rowarrow.compiled_plan(schema) is None
    batch = rowarrow.record_batch([{"x": 1.5, "n": 2}], schema, None)
    assert batch.to_pylist() == [{"x": 1.5, "n": 2}]


_CHOICES: dict[str, list[Any]] = {
    "bool": [True, False, None, 0, 1],
    "int": [0, -1, 1, 127, -128, 128, 2**15, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, 2**63, None, 1.5, False],
    "string": ["", "k", "é", "\ud800", b"x", None, 3],
}


def _random_value(rnd: random.Random, arrow_type: pa.DataType, depth: int = 0) -> Any:
    if rnd.random() < 0.1:
        return rnd.choice([None, 7, "s", [], {}, (1,)])  # sometimes anything
    if pa.types.is_boolean(arrow_type):
        return rnd.choice(_CHOICES["bool"])
    if pa.types.is_integer(arrow_type) or pa.types.is_timestamp(arrow_type):
        return rnd.choice(_CHOICES["int"])
    if pa.types.is_string(arrow_type):
        return rnd.choice(_CHOICES["string"])
    if pa.types.is_list(arrow_type):
        return [_random_value(rnd, arrow_type.value_type, depth + 1) for _ in range(rnd.randrange(4))]
    fields = list(arrow_type)
    return {f.name: _random_value(rnd, f.type, depth + 1) for f in fields if rnd.random() < 0.8}


def test_random_rows_agree() -> None:
    rnd = random.Random(22)
    schemas = [EDGE_SCHEMA, _file_schema(EXCHANGES_SCHEMA), _file_schema(CONNECTIONS_SCHEMA)]
    converted = 0
    for i in range(600):
        schema = schemas[i % len(schemas)]
        row_type = pa.struct(list(schema))
        rows = [_random_value(rnd, row_type) for _ in range(rnd.randrange(1, 6))]
        if rnd.random() < 0.5:  # half the time, valid rows only, so that many convert
            rows = [row for row in rows if _outcome([row], schema, None)[0] == "ok"] or [{}]
        converted += C.convert(rows, rowarrow.compiled_plan(schema)) is not None
        _same(rows, schema)
    assert converted > 200  # the compiled path did the converting often
