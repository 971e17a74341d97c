"""The incident lab's captures decoded by kwire against an independent decoder: ``kio``.

``test_decode_tshark`` checks the lab captures against tshark 4.0, which lacks many versions the
lab's clusters speak (Fetch v17-18, Produce v11+, Metadata v12+, the KRaft APIs between brokers
and controllers on 9093, ...). This test covers those too: every Kafka frame kwire decodes in
every ``captures/lab/*/capture.pcap*`` (all frames, not a sample; each frame's bytes cut out of
the reassembled stream by ``lab_frames.capture_frames``, which also checks kwire's framing
against the bytes) is read again by ``kio`` (generated from Kafka's schemas, with its own native
reader), with the api key and version kwire attributes to it, and:

* kio's header must agree with kwire's (correlation id; a request's api key, version, client id);
* where kio reads the frame exactly, kwire must have decoded it cleanly, and every field that
  carries a role in kwire's table must hold kio's value (the role rules and value conversions
  are ``test_against_kio``'s); a tagged field at its default may be absent from kwire's fields;
* where kio rejects the frame or leaves bytes after the body, kwire must say so too;
* ``records`` fields, which kio keeps opaque, are walked here batch by batch (a CRC check on
  each): kwire's (batches, records, codec mask) summary and its batch entries (every header field
  but the length) must match. Uncompressed batches are read record by record with kio's record
  reader (``kio.records.readers.read_record``) until the batch is filled exactly, so their
  header's count is checked against the records; compressed batches are not decompressed (the
  count is the header's). Legacy message sets (magic 0/1): (magic, CRC, count) per message,
  inner messages counted for gzip wrappers only. A trailing partial batch is not counted.

Frames of an (api key, version) kio 0.6.5 does not define are counted by api, version and
direction, printed and shown in the run's closing figures; responses kwire could not match to a
request are counted apart. Any disagreement fails the test; the first few are printed.

Cost: all frames, no sampling. Framing and reading a capture of 15,000-20,000 frames (4 MB of
Kafka bytes) takes 2-4 s on the project's 2-core machine, 7 s when it is busy (load 10); the whole
file took 29 s on six lab captures on the busy machine.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import importlib
import struct
import uuid
import zlib
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio.serial", reason="the kio package is not installed")
import coverage_report
import lab_frames
import test_against_kio as kio_rules  # the role rules and value conversions, shared
from crc32c import crc32c
from kio.records.readers import read_record
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader
from kio.static.constants import EntityType
from lab_frames import Frame, FrameStats, capture_frames

from decoder.protocol import api_name
from decoder.records import MAX_BATCHES_KEPT, RecordsSummary, summarize_records

LAB = Path(__file__).resolve().parents[1] / "captures" / "lab"
BROKER_PORTS = (9092, 9093)  # brokers and KRaft controllers
SHOWN = 10  # disagreements printed


def _lab() -> list[Path]:
    return sorted(LAB.glob("*/capture.pcap*"))


# ---------------------------------------------------------------------------------------------------------
# kio's reading of a frame


@cache
def kio_entity(api_key: int, api_version: int, request: bool) -> type | None:
    """kio's class for a request or response body, or None when kio does not define it."""
    name = api_key_map.get(api_key)
    entities = schema_name_map.get(name, {}).get(api_version) if name else None
    if not entities:
        return None
    module, _, attr = entities[EntityType.request if request else EntityType.response].partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclasses.dataclass
class KioRead:
    header: Any
    body: Any
    trailing: int  # bytes after the body


def kio_read(cls: type, data: bytes) -> KioRead:
    """Read a frame (length prefix included) with kio; raises what kio raises."""
    frame = memoryview(data)[4:]
    header, at = entity_reader(cls.__header_schema__)(frame, 0)
    body, size = entity_reader(cls)(frame, at)
    return KioRead(header, body, len(frame) - at - size)


@dataclasses.dataclass(frozen=True, slots=True)
class _Records:
    """A records field as the walk read it: kwire's summary and the entries riding on it."""

    summary: tuple[int, int, int] | None
    entries: tuple[Any, ...] | None


class _Optional:
    """An expected value kwire may also leave out: a tagged field kio read at its default."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


@dataclasses.dataclass
class RecordFigures:
    """What the records walks saw over a capture."""

    fields: int = 0
    batches: int = 0  # magic 2
    read_by_kio: int = 0  # uncompressed: every record read by kio
    compressed: int = 0  # header and CRC checked, records not decompressed
    legacy: int = 0  # magic 0/1 messages
    legacy_uncounted: int = 0  # compressed legacy wrappers (not gzip): inner messages not counted
    partial: int = 0  # trailing partial batches (Fetch cuts the last one at max bytes)


def expected_tree(entity: Any, figures: RecordFigures) -> dict[str, Any]:
    """What kwire should extract from a kio entity read off the wire (see the module docstring)."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(entity):
        value = getattr(entity, field.name)
        optional = "tag" in field.metadata and kio_rules._is_default(field, value)
        nested = kio_rules._field_info(field)[2]
        if nested is not None:
            if not kio_rules._kept(nested):
                continue
            key = kio_rules._norm(field.name)
            if value is None:
                tree: Any = None
            elif isinstance(value, tuple):
                tree = [expected_tree(v, figures) for v in value]
            else:
                tree = expected_tree(value, figures)
            out[key] = _Optional(tree) if optional else tree
            continue
        role = kio_rules._role(field)
        if role is None:
            continue
        kafka_type = field.metadata.get("kafka_type")
        if value is None and kafka_type == "uuid":
            value = uuid.UUID(int=0)  # kio reads the zero uuid as null; kwire keeps it
        elif value is None and kafka_type == "datetime_i64":
            value = -1  # kio reads a timestamp of -1 (none) as null; kwire keeps the number
        if role == "records":
            out["records"] = _Records(*walk_records(value, figures))
        else:
            out[role] = _Optional(kio_rules._value(value)) if optional else kio_rules._value(value)
    return out


def walk_records(data: bytes | None, figures: RecordFigures) -> tuple[Any, Any]:
    """(batches, records, codec mask) and kwire's batch entries, from a records field's bytes.

    Magic 2 entries are the header fields in wire order but the length; legacy entries
    are compared by (magic, crc, record count), the count None where it is not checked here.
    A trailing partial batch is not counted, as kwire documents.
    """
    if not data:
        return None, None
    figures.fields += 1
    data = bytes(data)
    batches = records = mask = 0
    entries: list[Any] = []
    at = 0
    while at + 12 <= len(data):
        length = struct.unpack_from(">i", data, at + 8)[0]
        end = at + 12 + length
        if end > len(data) or len(data) < at + 17:
            figures.partial += 1
            break
        magic = data[at + 16]
        if magic == 2:
            entry, count, codec = _v2_batch(data, at, end, figures)
        elif magic in (0, 1):
            entry, count, codec = _legacy_message(data, at, end, magic, figures)
        else:
            raise AssertionError(f"records: magic {magic} at byte {at}")
        entries.append(entry)
        batches += 1
        records += count
        mask |= 1 << codec if codec < 5 else 0
        at = end
    return (batches, records, mask), tuple(entries[:MAX_BATCHES_KEPT])  # kwire keeps the first ones


_V2 = struct.Struct(">qiibIhiqqqhii")


def _v2_batch(data: bytes, at: int, end: int, figures: RecordFigures) -> tuple[Any, int, int]:
    figures.batches += 1
    header = _V2.unpack_from(data, at)
    assert crc32c(data[at + 21 : end]) == header[4], f"batch CRC mismatch at byte {at}"
    codec = header[5] & 7
    if codec == 0:
        # kio's record reader, record by record: the header's count must fill the batch exactly.
        # (Not kio's read_batch: it refuses a max timestamp of -1, which sarama sends.)
        pos = at + _V2.size
        for _ in range(header[12]):
            pos += read_record(data, header[7], header[0], pos)[1]
        assert pos == end, f"{header[12]} records end at byte {pos}, the batch at {end}"
        figures.read_by_kio += 1
    else:
        figures.compressed += 1
    return _without_length(header), max(header[12], 0), codec


def _legacy_message(
    data: bytes, at: int, end: int, magic: int, figures: RecordFigures
) -> tuple[Any, int, int]:
    figures.legacy += 1
    crc = struct.unpack_from(">I", data, at + 12)[0]
    assert zlib.crc32(data[at + 16 : end]) == crc, f"legacy message CRC mismatch at byte {at}"
    codec = data[at + 17] & 7
    count: int | None = 1
    if codec == 1:
        count = _legacy_inner_count(gzip.decompress(_legacy_value(data, at, end, magic)))
    elif codec:
        figures.legacy_uncounted += 1
        count = None
    return (magic, crc, count), count or 0, codec


def _legacy_value(data: bytes, at: int, end: int, magic: int) -> bytes:
    pos = at + 18 + (8 if magic == 1 else 0)
    key = struct.unpack_from(">i", data, pos)[0]
    pos += 4 + max(key, 0)
    value = struct.unpack_from(">i", data, pos)[0]
    return data[pos + 4 : pos + 4 + max(value, 0)]


def _legacy_inner_count(inner: bytes) -> int:
    count = at = 0
    while at + 12 <= len(inner):
        at += 12 + struct.unpack_from(">i", inner, at + 8)[0]
        count += at <= len(inner)
    return count


def kwire_entries(summary: Any) -> Any:
    """The batch entries on kwire's records summary (``decoder.records.RecordsSummary``) in the
    walk's terms (legacy ones as (magic, crc, record count))."""
    if summary is None:
        return None
    batches = getattr(summary, "entries", None)
    if batches is None:
        return "no entries"
    out = []
    for entry in batches:
        if isinstance(entry, dict):
            out.append((entry["magic"], entry["crc"], entry["record_count"]))
        else:
            out.append(_without_length(entry))
    return tuple(out)


def _without_length(header: Any) -> tuple[Any, ...]:
    """A batch header without its length: a frame kwire decoded from its skeleton (a frame that
    arrived in pieces, ``decoder.skeleton``) has every batch shortened to its header, and the
    length is no part of the batch's identity (``decoder.records.batch_identity``)."""
    return (header[0], *header[2:])


# ---------------------------------------------------------------------------------------------------------
# the comparison

_MISSING = object()


def diff(path: str, mine: Any, theirs: Any, out: list[str]) -> None:
    """Append 'path: kwire X, kio Y' for every difference between kwire's fields and kio's tree."""
    if isinstance(theirs, dict):
        if not isinstance(mine, dict):
            out.append(f"{path}: kwire {_short(mine)}, kio a struct")
            return
        for key in sorted(theirs.keys() | mine.keys()):
            want = theirs.get(key, _MISSING)
            if isinstance(want, _Optional):
                if key not in mine:
                    continue
                want = want.value
            if want is _MISSING:
                out.append(f"{path}.{key}: kwire {_short(mine[key])}, kio has no such field")
            elif key not in mine:
                out.append(f"{path}.{key}: kwire lacks it, kio {_short(want)}")
            elif isinstance(want, _Records):
                got = mine[key]
                if (None if got is None else tuple(got)) != want.summary:
                    out.append(f"{path}.{key}: kwire {_short(got)}, kio {_short(want.summary)}")
                elif kwire_entries(got) != want.entries:
                    out.append(
                        f"{path}.{key} entries: kwire {_short(kwire_entries(got))}, kio {_short(want.entries)}"
                    )
            else:
                diff(f"{path}.{key}", mine[key], want, out)
    elif isinstance(theirs, list) and isinstance(mine, (list, tuple)) and len(mine) == len(theirs):
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            diff(f"{path}[{index}]", a, b, out)
    elif isinstance(theirs, list) and mine is not None and not isinstance(mine, (str, dict)):
        if list(mine) != theirs:
            out.append(f"{path}: kwire {_short(list(mine))}, kio {_short(theirs)}")
    elif mine != theirs or (type(mine) is bool) != (type(theirs) is bool):
        out.append(f"{path}: kwire {_short(mine)}, kio {_short(theirs)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _label(frame: Frame) -> str:
    name = api_name(frame.api_key) or f"key {frame.api_key}"  # type: ignore[arg-type]
    return f"{name} v{frame.api_version} {'request' if frame.request else 'response'}"


def _trailing(frame: Frame) -> int:
    note = frame.decode_error or ""
    return int(note.split()[0]) if note.endswith("trailing bytes after the body") else 0


@dataclasses.dataclass
class Comparison:
    name: str
    frames: int = 0
    compared: int = 0  # kio read the frame; every role field compared
    agreed: int = 0
    fields: int = 0  # leaf values compared
    both_reject: int = 0  # kio rejects the frame and kwire reports it malformed
    trailing: int = 0  # both see the same bytes after the body
    kio_lacks: Counter[str] = dataclasses.field(default_factory=Counter)
    kio_lacks_rejected: int = 0  # of those, frames kwire did not decode cleanly (not checked here)
    unmatched: int = 0  # responses kwire could not match to a request: no api to read them with
    records: RecordFigures = dataclasses.field(default_factory=RecordFigures)
    frame_stats: FrameStats = dataclasses.field(default_factory=FrameStats)
    disagreements: list[str] = dataclasses.field(default_factory=list)

    def report(self) -> str:
        lacks = ", ".join(f"{what} x{n}" for what, n in sorted(self.kio_lacks.items())) or "none"
        r, s = self.records, self.frame_stats
        return (
            f"{self.name}: {self.frames} kwire frames on {s.kafka_connections} connections "
            f"({s.unsynced_connections} started before the capture, {s.gap_connections} with gaps, "
            f"{s.after_gap} frames after a gap not cut, {s.skipped_bytes} bytes skipped while hunting); "
            f"{self.compared} read by kio and compared "
            f"({self.fields} field values), {self.agreed} agreed, {self.trailing} with the same trailing bytes, "
            f"{self.both_reject} rejected by both, {self.unmatched} unmatched responses; records fields "
            f"{r.fields}: {r.batches} batches ({r.read_by_kio} read by kio, {r.compressed} compressed), "
            f"{r.legacy} legacy messages ({r.legacy_uncounted} wrappers uncounted), {r.partial} partial; "
            f"kio lacks: {lacks} ({self.kio_lacks_rejected} of them not decoded cleanly by kwire); "
            f"{len(self.disagreements)} disagreements"
        )


def compare_frame(frame: Frame, cmp: Comparison) -> None:
    """Read one frame with kio and compare it with kwire's decoding; note the outcome in ``cmp``."""
    cmp.frames += 1
    if frame.api_key is None:
        cmp.unmatched += 1
        return
    cls = kio_entity(frame.api_key, frame.api_version, frame.request)  # type: ignore[arg-type]
    if cls is None:
        cmp.kio_lacks[_label(frame)] += 1
        cmp.kio_lacks_rejected += frame.status != "ok"
        return
    problems: list[str] = []
    try:
        read = kio_read(cls, frame.data)
    except Exception as exc:  # kio rejects the frame: kwire must not have decoded it cleanly
        if frame.status == "ok":
            problems.append(f"kwire decodes it ({frame.decode_error or 'cleanly'}), kio rejects it: {exc!r}")
        else:
            cmp.both_reject += 1
        _note(frame, problems, cmp)
        return
    _compare_header(frame, read.header, problems)
    if frame.status != "ok":
        problems.append(f"kwire: {frame.status} ({frame.decode_error}); kio reads it")
    elif read.trailing != _trailing(frame):
        problems.append(f"bytes after the body: kwire {_trailing(frame)}, kio {read.trailing}")
    else:
        cmp.compared += 1
        cmp.trailing += read.trailing > 0
        try:
            expected = expected_tree(read.body, cmp.records)
        except Exception as exc:  # the records walk (a bad CRC, batches that do not fill the field)
            problems.append(f"records: {exc!r}")
        else:
            cmp.fields += _leaves(expected)
            diff("", kio_rules.actual_tree(frame.fields or {}), expected, problems)
    _note(frame, problems, cmp)


def _compare_header(frame: Frame, header: Any, problems: list[str]) -> None:
    if header.correlation_id != frame.correlation_id:
        problems.append(f"correlation id: kwire {frame.correlation_id}, kio {header.correlation_id}")
    if frame.request:
        theirs = (header.request_api_key, header.request_api_version, getattr(header, "client_id", None))
        if theirs != (frame.api_key, frame.api_version, frame.client_id):
            problems.append(
                f"header: kwire {(frame.api_key, frame.api_version, frame.client_id)}, kio {theirs}"
            )


def _leaves(tree: Any) -> int:
    if isinstance(tree, _Optional):
        return _leaves(tree.value)
    if isinstance(tree, dict):
        return sum(_leaves(v) for v in tree.values())
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return sum(_leaves(v) for v in tree)
    return 1


def _note(frame: Frame, problems: list[str], cmp: Comparison) -> None:
    if problems:
        cmp.disagreements.append(f"{frame.where()} {_label(frame)}: " + "; ".join(problems[:4]))
    elif frame.status == "ok":
        cmp.agreed += 1


def compare(path: Path) -> Comparison:
    """Every frame kwire decodes in ``path``, read again by kio (see the module docstring)."""
    cmp = Comparison(path.parent.name)
    for frame in capture_frames(path, BROKER_PORTS, cmp.frame_stats):
        compare_frame(frame, cmp)
    cmp.disagreements[:0] = cmp.frame_stats.problems
    return cmp


# ---------------------------------------------------------------------------------------------------------
# the test


@pytest.mark.parametrize("path", _lab(), ids=lambda p: p.parent.name)
def test_lab_capture_matches_kio(path: Path) -> None:
    cmp = compare(path)
    print(cmp.report())
    topic = "kio lab comparison"
    coverage_report.add(f"{topic}: frames", cmp.frames)
    coverage_report.add(f"{topic}: frames read by kio and compared", cmp.compared)
    coverage_report.add(f"{topic}: field values compared", cmp.fields)
    coverage_report.add(f"{topic}: record batches checked", cmp.records.batches + cmp.records.legacy)
    coverage_report.add(f"{topic}: frames kio and kwire both reject", cmp.both_reject)
    coverage_report.add(f"{topic}: unmatched responses (no api)", cmp.unmatched)
    coverage_report.add(f"{topic}: frames after a capture gap (not cut)", cmp.frame_stats.after_gap)
    coverage_report.add(f"{topic}: disagreements", len(cmp.disagreements))
    coverage_report.add(f"{topic}: frames kio 0.6.5 lacks", sum(cmp.kio_lacks.values()))
    for what, n in cmp.kio_lacks.items():
        coverage_report.add(f"{topic}: kio 0.6.5 lacks {what}", n)
    shown = "\n".join(cmp.disagreements[:SHOWN])
    assert not cmp.disagreements, f"{len(cmp.disagreements)} disagreements, the first {SHOWN}:\n{shown}"
    assert cmp.frames > 0 and cmp.compared > 0
    # every frame is accounted for: agreed, or read by neither, or not readable by kio
    assert cmp.agreed + cmp.both_reject + cmp.unmatched + sum(cmp.kio_lacks.values()) == cmp.frames


# ---------------------------------------------------------------------------------------------------------
# the comparison itself can fail


def _tampered(frame: Frame, path: tuple[Any, ...], value: Any = _MISSING) -> Frame:
    """``frame`` with one of kwire's decoded fields changed (or, with no value, removed)."""
    fields = copy.deepcopy(frame.fields)
    parent = fields
    for step in path[:-1]:
        parent = parent[step]  # type: ignore[index]
    if value is _MISSING:
        del parent[path[-1]]  # type: ignore[union-attr]
    else:
        parent[path[-1]] = value  # type: ignore[index]
    return dataclasses.replace(frame, fields=fields)


def _reframed(frame: Frame, body_change: int) -> Frame:
    """``frame`` with bytes appended to (> 0) or cut from (< 0) its end, the length prefix adjusted."""
    body = frame.data[4:] + b"\0" * body_change if body_change > 0 else frame.data[4:body_change]
    return dataclasses.replace(frame, data=struct.pack(">i", len(body)) + body)


def _samples() -> tuple[Frame, Frame]:
    """A Produce request with record batches and a Metadata response naming a partition, from the
    first lab capture that has both (skips when none has)."""
    produce = metadata = None
    for path in _lab():
        for f in capture_frames(path, BROKER_PORTS):
            if f.status != "ok" or kio_entity(f.api_key, f.api_version, f.request) is None:  # type: ignore[arg-type]
                continue
            if produce is None and f.request and f.api_key == 0:
                records = f.fields["TopicData"][0]["PartitionData"][0]["records"]  # type: ignore[index]
                produce = f if getattr(records, "entries", None) else None
            elif metadata is None and not f.request and f.api_key == 3:
                topics = f.fields.get("Topics") or [{}]  # type: ignore[union-attr]
                metadata = f if topics[0].get("Partitions") and "controller_id" in f.fields else None  # type: ignore[operator]
            if produce and metadata:
                return produce, metadata
    pytest.skip("no lab capture has a Produce request with batches and a Metadata response")


def test_comparison_catches_wrong_decodings() -> None:
    """A Produce request and a Metadata response of a lab capture, each altered in one respect,
    each give exactly one disagreement that names what was altered; unaltered, both agree."""
    produce, metadata = _samples()
    summary = produce.fields["TopicData"][0]["PartitionData"][0]["records"]  # type: ignore[index]
    batch = summary.entries[0]
    other_pid = RecordsSummary(summary)
    other_pid.entries = ((*batch[:9], batch[9] + 1, *batch[10:]), *summary.entries[1:])
    other_count = RecordsSummary((9, 9, 1))
    other_count.entries = summary.entries
    cases = [
        (_tampered(produce, ("acks",), 7), ".acks: kwire 7"),
        (_tampered(produce, ("TopicData", 0, "PartitionData", 0, "partition"), 99), ".partition: kwire 99"),
        (
            _tampered(produce, ("TopicData", 0, "PartitionData", 0, "records"), other_count),
            ".records: kwire (9, 9, 1)",
        ),
        (
            _tampered(produce, ("TopicData", 0, "PartitionData", 0, "records"), other_pid),
            ".records entries: kwire",
        ),
        (_tampered(metadata, ("Topics", 0, "Partitions", 0, "replicas"), [7]), ".replicas: kwire [7]"),
        (_tampered(metadata, ("controller_id",)), ".controller_id: kwire lacks it"),
        (_tampered(metadata, ("bogus",), 1), ".bogus: kwire 1, kio has no such field"),
        (dataclasses.replace(produce, client_id="someone-else"), "header: kwire"),
        (dataclasses.replace(metadata, correlation_id=metadata.correlation_id + 1), "correlation id: kwire"),
        (dataclasses.replace(metadata, status="malformed", fields=None), "kwire: malformed"),
        (_reframed(metadata, 2), "bytes after the body: kwire 0, kio 2"),
        (_reframed(metadata, -1), "kio rejects it"),
    ]
    for frame in (produce, metadata):
        cmp = Comparison("unaltered")
        compare_frame(frame, cmp)
        assert cmp.disagreements == [] and cmp.agreed == 1
    for frame, words in cases:
        cmp = Comparison("altered")
        compare_frame(frame, cmp)
        assert len(cmp.disagreements) == 1 and words in cmp.disagreements[0], (words, cmp.disagreements)


def test_frame_cutting_checks_kwire_framing() -> None:
    """``lab_frames`` cuts a frame where kwire read it, reports a frame kwire did not read (bytes
    it was never fed) or one that is not where kwire says (bytes before it), and stops cutting a
    direction at a gap."""
    produce = _samples()[0]

    def cut(stream: bytes) -> tuple[list[Frame], list[str]]:
        conn = lab_frames._Conn("test", swapped=False, synced=True)
        conn.decoder.receive_data(0, produce.data, 1)
        conn.events += conn.decoder.events()
        conn.chunks[0].append(stream)
        stats = FrameStats()
        return list(lab_frames._cut(conn, stats)), stats.problems

    frames, problems = cut(produce.data)
    assert problems == [] and [f.data for f in frames] == [produce.data]
    assert frames[0].fields == produce.fields and frames[0].client_id == produce.client_id
    _frames, problems = cut(produce.data + produce.data)
    assert len(problems) == 1 and "that kwire did not report" in problems[0]
    _frames, problems = cut(b"\0\0\0\2\0\0" + produce.data)
    assert len(problems) == 1 and "is not at byte 0" in problems[0]

    # bytes lost after the frame: what kwire reports past the gap is counted, not cut
    conn = lab_frames._Conn("test", swapped=False, synced=True)
    conn.chunks[0].append(produce.data)
    conn.decoder.receive_data(0, produce.data, 1)
    conn.events += conn.decoder.events()
    conn.events.append(lab_frames._Gap(0))
    conn.decoder.receive_gap(0, 100, 2)
    conn.decoder.receive_data(0, produce.data * 3, 3)
    conn.decoder.receive_close(4)
    conn.events += conn.decoder.events()
    stats = FrameStats()
    frames = list(lab_frames._cut(conn, stats))
    assert stats.problems == [] and [f.data for f in frames] == [produce.data] and stats.after_gap == 3


def test_frame_cutting_skips_sasl_tokens() -> None:
    """SASL/PLAIN after SaslHandshake v0: the token and its empty answer travel outside Kafka
    framing; kwire skips them, and so does the cutting (hand-made frames: only the cutting is
    under test here)."""

    def framed(body: bytes) -> bytes:
        return struct.pack(">i", len(body)) + body

    def request(key: int, version: int, corr: int, body: bytes) -> bytes:
        return framed(struct.pack(">hhih", key, version, corr, 1) + b"c" + body)

    token = framed(b"\0user\0secret-password")
    traffic = [
        (0, request(17, 0, 1, struct.pack(">h", 5) + b"PLAIN")),
        (1, framed(struct.pack(">ihi", 1, 0, 1) + struct.pack(">h", 5) + b"PLAIN")),
        (0, token),
        (1, framed(b"")),
        (0, request(18, 0, 2, b"")),
        (1, framed(struct.pack(">ihi", 2, 0, 0))),
    ]
    conn = lab_frames._Conn("test", swapped=False, synced=True)
    for direction, data in traffic:
        conn.chunks[direction].append(data)
        conn.decoder.receive_data(direction, data, 1)
        conn.events += conn.decoder.events()
    conn.decoder.receive_close(2)
    conn.events += conn.decoder.events()
    stats = FrameStats()
    frames = list(lab_frames._cut(conn, stats))
    assert stats.problems == [] and stats.events["SaslExchange"] == 1
    assert [(f.request, f.api_key) for f in frames] == [(True, 17), (False, 17), (True, 18), (False, 18)]
    assert [f.data for f in frames] == [data for _, data in traffic if data not in (token, framed(b""))]
    assert stats.skipped_bytes == len(token) + 4


def test_records_walk_reads_legacy_message_sets() -> None:
    """The walk's legacy branch (no lab capture has legacy sets that kio can frame yet): a plain
    magic-0 message and a gzip magic-1 wrapper of two, read as kwire reads them."""

    def message(offset: int, magic: int, codec: int, value: bytes) -> bytes:
        body = bytes([magic, codec]) + (struct.pack(">q", 1_700_000_000_000) if magic else b"")
        body += struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
        body = struct.pack(">I", zlib.crc32(body)) + body
        return struct.pack(">qi", offset, len(body)) + body

    inner = message(0, 1, 0, b"a") + message(1, 1, 0, b"b")
    data = message(7, 0, 0, b"plain") + message(1, 1, 1, gzip.compress(inner))
    figures = RecordFigures()
    summary, entries = walk_records(data, figures)
    assert summary == (2, 3, 0b11) and figures.legacy == 2 and figures.legacy_uncounted == 0
    kwire = summarize_records(data, 0, len(data))
    assert tuple(kwire) == summary and kwire_entries(kwire) == entries
    cut = data[:-3]  # a partial last message is not counted
    assert walk_records(cut, RecordFigures())[0] == tuple(summarize_records(cut, 0, len(cut))) == (1, 1, 1)
