"""Batch identity: each record batch's header facts in the ``batches`` column, no payload byte.

Hand-made frames cover the formats and the edge cases (record batches with CRC-32C computed
here, legacy v0/v1 messages plain and gzip-compressed with CRC-32 computed here, transactional
and control batches, a Fetch response cut mid-batch, hostile counts and lengths, the per-row
caps, a large frame decoded from its skeleton). Real traffic (``captures/``: Tansu with
kafka-python, confluent-kafka, aiokafka and kcat) is checked against itself (every acked
Produce batch comes back in a Fetch, at the offset the Produce response gave) and against an
independent decoder, tshark's Kafka dissector, where it dissects the batches.
"""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import subprocess
import tracemalloc
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pytest

from decoder.connection import KafkaConnection
from decoder.records import MAX_BATCHES_KEPT, MAX_MESSAGE_CRCS_KEPT, summarize_records
from kwire.decode_command import decode_captures
from kwire.rows import ConnectionInfo, ExchangeRows
from kwire.schema import BATCH_TYPE, EXCHANGES_SCHEMA

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
MANIFEST = json.loads((CAPTURES / "manifest.json").read_text())
UP, DOWN = 0, 1
TS = 1_795_319_261_955  # ms


# ---------------------------------------------------------------------------------------------------------
# hand-made bytes


def string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    return struct.pack(">h", len(text.encode())) + text.encode()


def blob(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def batch_v2(
    *,
    base_offset: int = 0,
    leader_epoch: int = -1,
    attributes: int = 0,
    count: int = 1,
    last_offset_delta: int | None = None,
    first_ts: int = TS,
    max_ts: int = TS,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    payload: bytes = b"\x00" * 20,
    length: int | None = None,
) -> bytes:
    """A magic-2 record batch; its CRC-32C (attributes to the end) computed here."""
    delta = count - 1 if last_offset_delta is None else last_offset_delta
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            delta,
            first_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + payload
    )
    body = struct.pack(">ibI", leader_epoch, 2, crc32c.crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base_offset, len(body) if length is None else length) + body


def crc_of_v2(batch: bytes) -> int:
    return struct.unpack_from(">I", batch, 17)[0]


def message(
    magic: int, offset: int, value: bytes | None, *, key: bytes | None = None, codec: int = 0, ts: int = TS
) -> bytes:
    """A legacy message (magic 0 or 1) with its CRC-32 (magic to the end) computed here."""
    body = (
        struct.pack(">bb", magic, codec)
        + (struct.pack(">q", ts) if magic == 1 else b"")
        + blob(key)
        + blob(value)
    )
    wrapped = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(wrapped)) + wrapped


def message_crc(msg: bytes) -> int:
    return struct.unpack_from(">I", msg, 12)[0]


def request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    payload = struct.pack(">hhi", api_key, version, corr) + string("batch-test") + body
    return struct.pack(">i", len(payload)) + payload


def response(corr: int, body: bytes) -> bytes:
    return struct.pack(">i", len(body) + 4) + struct.pack(">i", corr) + body


def produce(version: int, corr: int, partitions: dict[int, bytes], topic: str = "t", acks: int = -1) -> bytes:
    """Produce v0-8 (classic encoding); v3+ starts with the transactional id."""
    parts = b"".join(struct.pack(">i", p) + blob(records) for p, records in partitions.items())
    body = (
        (string(None) if version >= 3 else b"")
        + struct.pack(">hi", acks, 30_000)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", len(partitions))
        + parts
    )
    return request(0, version, corr, body)


def produce_response(
    version: int, corr: int, results: dict[int, tuple[int, int, int, int]], topic: str = "t"
) -> bytes:
    """Produce response v0-7: per partition (error, base offset, log append time, log start offset)."""
    parts = b""
    for p, (error, base, append_time, start) in results.items():
        parts += struct.pack(">ihq", p, error, base)
        parts += struct.pack(">q", append_time) if version >= 2 else b""
        parts += struct.pack(">q", start) if version >= 5 else b""
    body = struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(results)) + parts
    return response(corr, body + (struct.pack(">i", 0) if version >= 1 else b""))


def fetch(version: int, corr: int, partitions: tuple[int, ...], topic: str = "t") -> bytes:
    """Fetch request v0-4."""
    body = struct.pack(">iii", -1, 500, 1)
    body += struct.pack(">i", 1 << 20) if version >= 3 else b""
    body += struct.pack(">b", 0) if version >= 4 else b""
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(partitions))
    body += b"".join(struct.pack(">iqi", p, 0, 1 << 20) for p in partitions)
    return request(1, version, corr, body)


def fetch_response(version: int, corr: int, partitions: dict[int, bytes], topic: str = "t") -> bytes:
    """Fetch response v0-4 (v4 adds last stable offset and aborted transactions)."""
    parts = b""
    for p, records in partitions.items():
        parts += struct.pack(">ihq", p, 0, 1000)
        if version >= 4:
            parts += struct.pack(">q", 1000) + struct.pack(">i", 0)
        parts += blob(records)
    body = struct.pack(">i", 0) if version >= 1 else b""
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(partitions)) + parts
    return response(corr, body)


def rows_of(*frames: tuple[int, bytes], chunk: int | None = None) -> list[dict[str, Any]]:
    """Exchange rows of one connection fed ``frames`` (each cut in ``chunk``-byte pieces if given)."""
    conn = KafkaConnection()
    rows = ExchangeRows(ConnectionInfo("test", "c1", "127.0.0.1", 50000, "127.0.0.2", 9092))
    ts = 0
    for direction, data in frames:
        step = chunk or len(data)
        for at in range(0, len(data), step):
            ts += 1
            conn.receive_data(direction, data[at : at + step], ts)
    conn.receive_close(ts + 1)
    out = [rows.row(event) for event in conn.events()]
    return [row for row in out if row is not None]


def identity(**values: Any) -> dict[str, Any]:
    """An expected ``batches`` entry: every BATCH_TYPE key, None unless given."""
    return {name: values.get(name) for name in BATCH_TYPE.names} | values


# ---------------------------------------------------------------------------------------------------------
# record batches (magic 2)


def test_produce_v2_batches_carry_their_identity_not_their_offset() -> None:
    idempotent = batch_v2(
        count=5,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        first_ts=TS,
        max_ts=TS + 9,
        payload=b"k" * 50,
    )
    plain = batch_v2(attributes=1, count=2, base_offset=77, payload=b"v" * 30)  # gzip codec bit
    (row,) = rows_of(
        (UP, produce(3, 1, {0: idempotent, 1: plain})),
        (DOWN, produce_response(3, 1, {0: (0, 120, -1, -1), 1: (0, 8, -1, -1)})),
    )
    assert row["record_batches"] == 2 and row["records"] == 7 and row["compression"] == "none,gzip"
    assert row["batches"] == [
        identity(
            topic="t",
            partition=0,
            last_offset_delta=4,
            partition_leader_epoch=-1,
            magic=2,
            crc=crc_of_v2(idempotent),
            compression="none",
            transactional=False,
            control=False,
            producer_id=4242,
            producer_epoch=3,
            base_sequence=17,
            record_count=5,
            first_timestamp_ms=TS,
            max_timestamp_ms=TS + 9,
        ),
        identity(
            topic="t",
            partition=1,
            last_offset_delta=1,
            partition_leader_epoch=-1,
            magic=2,
            crc=crc_of_v2(plain),
            compression="gzip",
            transactional=False,
            control=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            record_count=2,
            first_timestamp_ms=TS,
            max_timestamp_ms=TS,
        ),
    ]  # base_offset None: a request's (77 here) is the client's placeholder
    acks = {(r["partition"], r["base_offset"]) for r in row["partition_errors"]}
    assert acks == {(0, 120), (1, 8)}


@pytest.mark.parametrize("version", [0, 2, 5])
def test_produce_response_keeps_base_offset_and_log_start(version: int) -> None:
    (row,) = rows_of(
        (UP, produce(version, 9, {3: batch_v2() if version >= 3 else message(0, 0, b"x")})),
        (DOWN, produce_response(version, 9, {3: (0, 5000, TS, 40)})),
    )
    (result,) = row["partition_errors"]
    assert (result["partition"], result["error_code"], result["base_offset"]) == (3, 0, 5000)
    assert result["log_start_offset"] == (40 if version >= 5 else None)


def test_fetch_transactional_and_control_batches_with_their_offsets() -> None:
    data = batch_v2(
        base_offset=100,
        leader_epoch=7,
        attributes=16,
        count=3,
        producer_id=9,
        producer_epoch=1,
        base_sequence=0,
    )
    marker = batch_v2(
        base_offset=103,
        leader_epoch=7,
        attributes=48,
        count=1,
        producer_id=9,
        producer_epoch=1,
        payload=b"\x00" * 12,
    )
    (row,) = rows_of((UP, fetch(4, 5, (2,))), (DOWN, fetch_response(4, 5, {2: data + marker})))
    got = [
        (
            b["base_offset"],
            b["last_offset_delta"],
            b["partition_leader_epoch"],
            b["transactional"],
            b["control"],
            b["record_count"],
        )
        for b in row["batches"]
    ]
    assert got == [(100, 2, 7, True, False, 3), (103, 0, 7, True, True, 1)]
    assert [b["crc"] for b in row["batches"]] == [crc_of_v2(data), crc_of_v2(marker)]
    assert {(b["topic"], b["partition"], b["producer_id"]) for b in row["batches"]} == {("t", 2, 9)}
    assert row["records"] == 4 and row["fetch_partitions"][0]["record_batches"] == 2


def test_fetch_response_cut_mid_batch_keeps_only_whole_batches() -> None:
    whole = batch_v2(base_offset=10, count=4)
    cut_header = batch_v2(base_offset=14, count=6)[:40]  # max bytes cut the next batch's header
    cut_body = batch_v2(base_offset=14, count=6, payload=b"\x00" * 200)[:120]  # ... or its records
    for tail in (cut_header, cut_body):
        (row,) = rows_of((UP, fetch(4, 1, (0,))), (DOWN, fetch_response(4, 1, {0: whole + tail})))
        assert row["status"] == "ok"
        assert [(b["base_offset"], b["record_count"]) for b in row["batches"]] == [(10, 4)]
        assert row["records"] == 4 and row["fetch_partitions"][0]["record_batches"] == 1


# ---------------------------------------------------------------------------------------------------------
# legacy message sets (magic 0/1)


def test_produce_v0_plain_and_gzip_messages() -> None:
    plain = [message(0, i, f"value-{i}".encode(), key=b"k") for i in range(2)]
    inner = [message(0, i, f"inner-{i}".encode()) for i in range(3)]
    wrapper = message(0, 2, gzip.compress(b"".join(inner)), codec=1)
    (row,) = rows_of(
        (UP, produce(0, 3, {0: b"".join(plain), 1: wrapper})),
        (DOWN, produce_response(0, 3, {0: (0, 0, 0, 0), 1: (0, 2, 0, 0)})),
    )
    assert row["record_batches"] == 3 and row["records"] == 5
    common = {"topic": "t", "magic": 0, "transactional": False, "control": False}
    assert row["batches"] == [
        identity(
            **common,
            partition=0,
            last_offset_delta=0,
            crc=message_crc(plain[0]),
            compression="none",
            record_count=1,
        ),
        identity(
            **common,
            partition=0,
            last_offset_delta=0,
            crc=message_crc(plain[1]),
            compression="none",
            record_count=1,
        ),
        identity(
            **common,
            partition=1,
            last_offset_delta=2,
            crc=message_crc(wrapper),
            compression="gzip",
            record_count=3,
            message_crcs=[message_crc(m) for m in inner],
        ),
    ]


def test_fetch_legacy_offsets_and_timestamps_magic_0_and_1() -> None:
    # magic 1: a plain message, then a wrapper whose inner offsets are relative (0..2) and whose
    # own offset is its last inner message's absolute offset (KIP-31)
    plain = message(1, 50, b"p", ts=TS)
    inner1 = [message(1, i, b"i%d" % i, ts=TS + 10 + i) for i in range(3)]
    wrapper1 = message(1, 53, gzip.compress(b"".join(inner1)), codec=1, ts=TS + 12)
    # magic 0: a wrapper whose inner offsets are absolute
    inner0 = [message(0, 60 + i, b"j%d" % i) for i in range(2)]
    wrapper0 = message(0, 61, gzip.compress(b"".join(inner0)), codec=1)
    (row,) = rows_of(
        (UP, fetch(2, 8, (0, 1))), (DOWN, fetch_response(2, 8, {0: plain + wrapper1, 1: wrapper0}))
    )
    got = [
        (
            b["partition"],
            b["magic"],
            b["base_offset"],
            b["last_offset_delta"],
            b["record_count"],
            b["first_timestamp_ms"],
            b["max_timestamp_ms"],
        )
        for b in row["batches"]
    ]
    assert got == [
        (0, 1, 50, 0, 1, TS, TS),
        (0, 1, 51, 2, 3, TS + 10, TS + 12),
        (1, 0, 60, 1, 2, None, None),
    ]
    assert row["batches"][1]["message_crcs"] == [message_crc(m) for m in inner1]
    assert row["batches"][2]["crc"] == message_crc(wrapper0)
    assert row["records"] == 6


def test_undecompressible_wrapper_counts_one_and_says_its_range_is_unknown() -> None:
    wrapper = message(1, 9, b"not gzip at all", codec=1)
    (row,) = rows_of((UP, fetch(2, 1, (0,))), (DOWN, fetch_response(2, 1, {0: wrapper})))
    (batch,) = row["batches"]
    assert (
        batch["record_count"],
        batch["base_offset"],
        batch["last_offset_delta"],
        batch["message_crcs"],
    ) == (1, 9, None, None)
    assert batch["crc"] == message_crc(wrapper)


# ---------------------------------------------------------------------------------------------------------
# hostile input and caps


def test_hostile_counts_and_lengths_allocate_nothing() -> None:
    huge_count = batch_v2(count=2**31 - 1, last_offset_delta=2**31 - 2)
    negative_count = batch_v2(count=-5)
    huge_length = batch_v2(length=2**31 - 1)  # claims 2 GB: the field ends before it
    records = huge_count + negative_count + huge_length
    tracemalloc.start()
    try:
        summary = summarize_records(records, 0, len(records))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary == (2, 2**31 - 1, 1) and len(summary.entries) == 2
    assert peak < 64 << 10, peak
    (row,) = rows_of((UP, produce(3, 1, {0: records})), (DOWN, produce_response(3, 1, {0: (0, 0, -1, -1)})))
    assert [b["record_count"] for b in row["batches"]] == [2**31 - 1, -5]  # as the header says
    assert row["records"] == 2**31 - 1  # negative counts count as none


def test_batches_kept_per_row_are_capped_and_counted() -> None:
    small = batch_v2(payload=b"")  # 61 bytes
    many = MAX_BATCHES_KEPT // 2 + 25
    (row,) = rows_of((UP, produce(3, 1, {0: small * many, 1: small * many}, acks=0)))
    assert row["status"] == "no_response_expected"
    assert row["record_batches"] == 2 * many and row["records"] == 2 * many
    assert len(row["batches"]) == MAX_BATCHES_KEPT
    assert Counter(b["partition"] for b in row["batches"]) == {0: many, 1: MAX_BATCHES_KEPT - many}
    records = small * (MAX_BATCHES_KEPT + 50)  # one field alone: capped where it is read
    summary = summarize_records(records, 0, len(records))
    assert (
        summary == (MAX_BATCHES_KEPT + 50, MAX_BATCHES_KEPT + 50, 1)
        and len(summary.entries) == MAX_BATCHES_KEPT
    )


def test_legacy_inner_crcs_are_capped_and_counted() -> None:
    inner = b"".join(message(0, i, b"") for i in range(MAX_MESSAGE_CRCS_KEPT + 50))
    wrapper = message(0, 0, gzip.compress(inner), codec=1)
    (row,) = rows_of((UP, produce(0, 1, {0: wrapper, 1: wrapper}, acks=0)))
    first, second = row["batches"]
    assert first["record_count"] == second["record_count"] == MAX_MESSAGE_CRCS_KEPT + 50
    assert len(first["message_crcs"]) == MAX_MESSAGE_CRCS_KEPT and second["message_crcs"] == []
    assert row["records"] == 2 * (MAX_MESSAGE_CRCS_KEPT + 50)


def test_a_large_frame_in_pieces_gives_the_same_identities() -> None:
    """Frames over 64 KiB held in pieces are decoded from a skeleton (batch headers only)."""
    batches = {
        p: batch_v2(count=100, producer_id=p, base_sequence=p * 100, payload=bytes(40_000)) for p in range(4)
    }
    frames = (
        (UP, produce(3, 1, batches)),
        (DOWN, produce_response(3, 1, {p: (0, p, -1, -1) for p in range(4)})),
    )
    whole = rows_of(*frames)
    pieces = rows_of(*frames, chunk=1500)
    assert pieces == whole and len(whole[0]["batches"]) == 4
    assert [b["crc"] for b in pieces[0]["batches"]] == [crc_of_v2(b) for b in batches.values()]


def test_rows_convert_to_the_schema_unchanged() -> None:
    """The dicts rows carry are what Parquet gives back (every key, in the schema's order)."""
    inner = [message(1, i, b"x", ts=TS) for i in range(2)]
    (row,) = rows_of(
        (UP, fetch(4, 2, (0,))),
        (
            DOWN,
            fetch_response(
                4,
                2,
                {
                    0: batch_v2(base_offset=3, producer_id=1)
                    + message(1, 5, gzip.compress(b"".join(inner)), codec=1)
                },
            ),
        ),
    )
    (produce_row,) = rows_of(
        (UP, produce(5, 2, {0: batch_v2()})), (DOWN, produce_response(5, 2, {0: (0, 1, -1, 0)}))
    )
    rows = [row, produce_row]
    back = pa.array(rows, type=pa.struct(list(EXCHANGES_SCHEMA))).to_pylist()
    for before, after in zip(rows, back, strict=True):
        assert after["batches"] == before["batches"] and list(after["batches"][0]) == BATCH_TYPE.names
        assert after["partition_errors"] == before.get("partition_errors")


# ---------------------------------------------------------------------------------------------------------
# real traffic


def decode(name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    result = decode_captures([CAPTURES / name], rows.append, lambda _row: None)
    assert result.error is None
    return rows


def topic_names(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Topic id -> name, from Metadata responses (Fetch v13+ names topics by id)."""
    return {
        p["topic_id"]: p["topic"]
        for r in rows
        for p in r.get("metadata_partitions") or ()
        if p["topic_id"] and p["topic"]
    }


PYTHON_CAPTURES = ["tansu-kafka-python.pcap", "tansu-confluent.pcap", "tansu-aiokafka.pcap"]


@pytest.mark.parametrize("name", [*PYTHON_CAPTURES, "tansu-mixed.pcap"])
def test_every_acked_produce_batch_is_fetched_at_its_acked_offset(name: str) -> None:
    """Every record batch a client produced comes back in a consumer's Fetch with the same
    (topic, partition, producer id, base sequence, CRC); an acked one at the base offset of
    its Produce response. The acked batches hold exactly the records the clients themselves
    counted as acknowledged (``manifest.json``)."""
    rows = decode(name)
    names = topic_names(rows)
    fetched: dict[tuple[str, int, int, int, int], list[int]] = {}
    for r in rows:
        if r["api_name"] == "Fetch":
            for b in r.get("batches") or ():
                topic = b["topic"] or names[b["topic_id"]]
                key = (topic, b["partition"], b["producer_id"], b["base_sequence"], b["crc"])
                fetched.setdefault(key, []).append(b["base_offset"])
    acked_records = 0
    for r in rows:
        if r["api_name"] != "Produce" or r["status"] not in ("ok", "no_response_expected"):
            continue
        acked = {(p["topic"], p["partition"]): p for p in r.get("partition_errors") or ()}
        for b in r["batches"]:
            assert b["base_offset"] is None  # a request's is the client's placeholder
            if b["magic"] != 2:
                continue  # kcat's legacy Produce: never stored by Tansu (see the kcat test)
            key = (b["topic"], b["partition"], b["producer_id"], b["base_sequence"], b["crc"])
            assert key in fetched, f"{name}: produced batch {key} never fetched"
            ack = acked.get((b["topic"], b["partition"]))
            if ack is not None and ack["error_code"] == 0:  # one batch per partition per request here
                assert ack["base_offset"] in fetched[key], (key, ack, fetched[key])
                acked_records += b["record_count"]
    scenarios = MANIFEST["captures"][name.removesuffix(".pcap")]["scenarios"]
    assert acked_records == sum(s["acked"] for s in scenarios) > 0


@pytest.mark.parametrize("name", [*PYTHON_CAPTURES, "tansu-kcat.pcap", "tansu-mixed.pcap"])
def test_record_totals_are_the_sum_of_the_batches(name: str) -> None:
    rows = decode(name)
    seen = 0
    for r in rows:
        if r["api_name"] == "Produce" and r["status"] != "orphan_response":
            assert len(r["batches"]) == r["record_batches"]
            assert sum(b["record_count"] for b in r["batches"]) == r["records"]
            seen += len(r["batches"])
        elif r["api_name"] == "Fetch" and r["status"] == "ok":
            assert len(r["batches"]) == sum(p["record_batches"] for p in r["fetch_partitions"])
            assert sum(b["record_count"] for b in r["batches"]) == r["records"]
            seen += len(r["batches"])
    assert seen > 0


def test_kcat_legacy_messages_and_their_compressed_copies_share_crcs() -> None:
    """kcat sends the same messages plain (Produce v1, magic 0) and gzip/snappy-wrapped: the
    wrappers' inner CRCs are the plain messages' CRCs (a CRC-32 over the message itself)."""
    rows = decode("tansu-kcat.pcap")
    legacy = [b for r in rows if r["api_name"] == "Produce" for b in r.get("batches") or ()]
    plain = {b["crc"] for b in legacy if b["compression"] == "none"}
    wrapped = [b for b in legacy if b["compression"] != "none"]
    assert {b["compression"] for b in wrapped} == {"gzip", "snappy"} and len(plain) == 5
    for b in wrapped:
        assert b["magic"] == 0 and len(b["message_crcs"]) == b["record_count"] >= 2
        assert set(b["message_crcs"]) <= plain and b["crc"] not in plain


# tshark 4.0 dissects record batches of the versions it knows (aiokafka's Produce v7 / Fetch v11,
# kcat's legacy Produce v1, ...): every batch it shows must be a kwire batch with the same identity.
# Beside the bundled captures, the public ones made by other projects (shared/public-captures)
# bring legacy Produce v1 (magic 0, go-sniffer) and v2 (magic 1, deepflow).

PUBLIC = Path(__file__).resolve().parents[2] / "shared" / "public-captures"
if not PUBLIC.is_dir():
    PUBLIC = Path("/work/shared/public-captures")

TSHARK_CASES = [  # capture, batches and legacy messages tshark shows, broker ports beside 9092
    (CAPTURES / "tansu-aiokafka.pcap", 70, 0, ()),
    (CAPTURES / "tansu-kcat.pcap", 4, 6, ()),
    (CAPTURES / "tansu-mixed.pcap", 74, 5, ()),
    (PUBLIC / "gosniffer_kafka.pcap", 0, 1, ()),
    (PUBLIC / "deepflow_00-produce-v2.pcap", 0, 1, ()),
    (PUBLIC / "deepflow_00-produce-v7-sw8.pcap", 1, 0, (36333,)),
    (PUBLIC / "ndpi_kafka.pcapng", 2, 0, ()),
]


def tshark_batches(
    path: Path, ports: tuple[int, ...] = ()
) -> tuple[Counter[tuple[int, int, int]], Counter[int]]:
    """(crc, producer id, base sequence) of each v2 batch, and each legacy message CRC, per tshark."""
    command = [str(shutil.which("tshark")), "-r", str(path)]
    for port in ports:
        command += ["-d", f"tcp.port=={port},kafka"]
    command += ["-Y", "kafka.batch_crc or kafka.message_crc", "-T", "fields", "-E", "separator=|"]
    for name in ("kafka.batch_crc", "kafka.producer_id", "kafka.batch_base_sequence", "kafka.message_crc"):
        command += ["-e", name]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    batches: Counter[tuple[int, int, int]] = Counter()
    messages: Counter[int] = Counter()
    for line in out.splitlines():
        crcs, pids, seqs, legacy = (field.split(",") if field else [] for field in line.split("|"))
        assert len(crcs) == len(pids) == len(seqs)
        batches.update((int(c, 16), int(p), int(s)) for c, p, s in zip(crcs, pids, seqs, strict=True))
        messages.update(int(c, 16) for c in legacy)
    return batches, messages


@pytest.mark.skipif(
    shutil.which("tshark") is None, reason="tshark not installed (scripts/install-system-deps)"
)
@pytest.mark.parametrize(
    ("path", "batches", "messages", "ports"), TSHARK_CASES, ids=lambda v: getattr(v, "name", None)
)
def test_tshark_sees_the_same_batch_identities(
    path: Path, batches: int, messages: int, ports: tuple[int, ...]
) -> None:
    if not path.is_file():
        pytest.skip(f"{path} not here")
    theirs, their_messages = tshark_batches(path, ports)
    ours: Counter[tuple[int, int, int]] = Counter()
    our_messages: Counter[int] = Counter()
    rows: list[dict[str, Any]] = []
    assert decode_captures([path], rows.append, lambda _row: None).error is None
    for r in rows:
        for b in r.get("batches") or ():
            if b["magic"] == 2:
                ours[(b["crc"], b["producer_id"], b["base_sequence"])] += 1
            else:
                our_messages[b["crc"]] += 1
                our_messages.update(b["message_crcs"] or ())
    assert (theirs.total(), their_messages.total()) == (batches, messages)
    assert not theirs - ours, f"tshark shows batches kwire does not: {theirs - ours}"
    assert not their_messages - our_messages, (
        f"tshark shows messages kwire does not: {their_messages - our_messages}"
    )


LEGACY_LAB = CAPTURES / "lab" / "000-old-broker" / "capture.pcap.gz"


@pytest.mark.skipif(not LEGACY_LAB.is_file(), reason="the incident lab's Kafka 0.9 capture is not here")
def test_real_kafka_0_9_serves_acked_legacy_messages_at_their_acked_offsets(tmp_path: Path) -> None:
    """Real Apache Kafka 0.9 (the incident lab): Produce v0/v1 legacy message sets from sarama,
    kafka-python and librdkafka, read back by Fetch v1. A message a consumer fetched with a
    produced message's CRC is at the offset its Produce response acked (base offset + its place
    among the partition's messages in the request)."""
    capture = tmp_path / "capture.pcap"
    capture.write_bytes(gzip.decompress(LEGACY_LAB.read_bytes()))
    rows: list[dict[str, Any]] = []
    assert decode_captures([capture], rows.append, lambda _row: None).error is None
    fetched: dict[tuple[str, int, int], set[int]] = {}
    for r in rows:
        if r["api_name"] == "Fetch":
            for b in r.get("batches") or ():
                assert b["magic"] in (0, 1) and b["producer_id"] is None
                fetched.setdefault((b["topic"], b["partition"], b["crc"]), set()).add(b["base_offset"])
    matched = 0
    for r in rows:
        if r["api_name"] != "Produce":
            continue
        acked = {(p["topic"], p["partition"]): p for p in r.get("partition_errors") or ()}
        place: Counter[tuple[str, int]] = Counter()
        for b in r.get("batches") or ():
            ack = acked.get((b["topic"], b["partition"]))
            if ack is None or ack["error_code"] != 0:
                continue
            expected = ack["base_offset"] + place[(b["topic"], b["partition"])]
            place[(b["topic"], b["partition"])] += b["record_count"]
            offsets = fetched.get((b["topic"], b["partition"], b["crc"]))
            if offsets:
                assert expected in offsets, (b, ack, sorted(offsets)[:5])
                matched += 1
    assert matched >= 100
