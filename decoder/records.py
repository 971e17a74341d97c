"""Summarise a Kafka ``records`` field from batch headers, without touching payloads.

Two formats share the field (KIP-98): record batches (magic 2), whose 61-byte header
holds the codec, the record count and the batch's identity (producer id, epoch, base
sequence, CRC), and legacy message sets (magic 0/1), where each message carries its own
CRC and a compressed wrapper message hides its inner messages in a compressed value.
Batches are never decompressed; only legacy wrappers are, to count what they hold and read
their inner messages' offsets, timestamps and CRCs, with output capped so a hostile frame
cannot inflate memory. Keys, values and headers are never returned.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

__all__ = [
    "CODECS",
    "CODEC_OF",
    "LEGACY_DECOMPRESS_LIMIT",
    "MAX_BATCHES_KEPT",
    "MAX_MESSAGE_CRCS_KEPT",
    "RecordsSummary",
    "batch_identity",
    "codec_names",
    "summarize_records",
]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
LEGACY_DECOMPRESS_LIMIT = 16 << 20  # bytes of inner message set decompressed per wrapper
MAX_BATCHES_KEPT = 10_000  # batch identities kept per records field (and per row, see extract)
MAX_MESSAGE_CRCS_KEPT = 10_000  # inner message CRCs kept per legacy wrapper (and per row)

_BATCH_LEN = struct.Struct(">qi")  # base offset, batch length
_BATCH_MAGIC_AT = 16
_BATCH_HEADER = 61
# base offset, batch length, partition leader epoch, magic, crc, attributes, last offset delta,
# base timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_LEGACY_CRC = struct.Struct(">I")  # at offset 12
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
CODEC_OF = (*CODECS, None, None, None)  # attributes & 7; 5-7 are not codecs


class RecordsSummary(tuple):  # type: ignore[type-arg]
    """(batches, records, codec bitmask) of a records field, compared and indexed as that
    plain 3-tuple; it also carries ``entries``, one per batch (per message for legacy message
    sets), the first ``MAX_BATCHES_KEPT`` of them, which ``batch_identity`` turns into
    identity dicts once the batches' topic and partition are known. A record batch's entry is
    its header as unpacked (``_V2_HEADER``: the 13 fields in wire order, batch length
    included); a legacy message's is already its identity dict, topic and partition unset.

    The entries ride along rather than beside the summary so that decoded fields keep one
    key per role; walks over decoded fields (``decoder.extract``) descend into dicts and
    lists of dicts only, so they never visit them.
    """

    entries: tuple[Any, ...]


def summarize_records(buf: Any, start: int, end: int) -> RecordsSummary:
    """Summarise the records in ``buf[start:end]`` from batch headers (see ``RecordsSummary``).

    A trailing partial batch (Fetch responses end with one when max bytes cut it) is not
    counted. The codec bitmask has bit ``1 << codec`` set for every codec seen. The counts
    cover every batch, kept as an entry or not.
    """
    batches = records = codecs = 0
    kept: list[Any] = []
    pos = start
    while pos + 17 <= end:
        magic = buf[pos + _BATCH_MAGIC_AT]
        if magic == 2:
            if pos + _BATCH_HEADER > end:
                break
            header = _V2_HEADER.unpack_from(buf, pos)
            length = header[1]
            if length < _BATCH_HEADER - 12 or pos + 12 + length > end:
                break
            codec = header[5] & 7
            count = header[12]
            records += count if count > 0 else 0
            if batches < MAX_BATCHES_KEPT:
                kept.append(header)  # the identity dict is built from it later, once
        elif magic == 0 or magic == 1:
            offset, length = _BATCH_LEN.unpack_from(buf, pos)
            if length < 6 or pos + 12 + length > end:  # crc, magic and attributes at least
                break
            codec = buf[pos + 17] & 7
            identity = _legacy_identity(buf, pos, 12 + length, magic, codec, offset)
            records += identity["record_count"]
            if batches < MAX_BATCHES_KEPT:
                kept.append(identity)
        else:
            break
        codecs |= 1 << codec if codec < len(CODECS) else 0
        batches += 1
        pos += 12 + length
    summary = RecordsSummary((batches, records, codecs))
    summary.entries = tuple(kept)
    return summary


def batch_identity(
    entry: Any, topic: str | None, topic_id: str | None, partition: int | None, in_request: bool
) -> dict[str, Any]:
    """The identity dict of one ``RecordsSummary`` entry: every key of
    ``kwire.schema.BATCH_TYPE``, in its order (rows read the same as Parquet gives them back).

    In a request the base offset is the client's placeholder (the broker assigns offsets):
    it is left out.
    """
    if type(entry) is tuple:  # a record batch header, as unpacked
        base, _length, epoch, _magic, crc, attrs, delta, first_ts, max_ts, pid, pepoch, seq, count = entry
        return {
            "topic": topic,
            "topic_id": topic_id,
            "partition": partition,
            "base_offset": None if in_request else base,
            "last_offset_delta": delta,
            "partition_leader_epoch": epoch,
            "magic": 2,
            "crc": crc,
            "compression": CODEC_OF[attrs & 7],
            "transactional": attrs & 16 != 0,
            "control": attrs & 32 != 0,
            "producer_id": pid,
            "producer_epoch": pepoch,
            "base_sequence": seq,
            "record_count": count,
            "first_timestamp_ms": first_ts,
            "max_timestamp_ms": max_ts,
            "message_crcs": None,
        }
    identity = dict(entry)  # legacy: already a dict (copied: a frame's fields may be read twice)
    identity["topic"] = topic
    identity["topic_id"] = topic_id
    identity["partition"] = partition
    if in_request:
        identity["base_offset"] = None
    return identity


def _legacy_identity(buf: Any, pos: int, total: int, magic: int, codec: int, offset: int) -> dict[str, Any]:
    """The identity of one legacy message; a compressed wrapper's is read from its inner messages.

    ``base_offset`` and ``last_offset_delta`` describe the offsets the message covers: a plain
    message its own offset; a wrapper (whose own offset is its last inner message's) the
    range of its inner messages, relative ones (magic 1) resolved against the wrapper's.
    """
    timestamp = _I64.unpack_from(buf, pos + 18)[0] if magic == 1 and total >= 26 else None
    identity: dict[str, Any] = {
        "topic": None,
        "topic_id": None,
        "partition": None,
        "base_offset": offset,
        "last_offset_delta": 0,
        "partition_leader_epoch": None,
        "magic": magic,
        "crc": _LEGACY_CRC.unpack_from(buf, pos + 12)[0],
        "compression": CODEC_OF[codec],
        "transactional": False,
        "control": False,
        "producer_id": None,
        "producer_epoch": None,
        "base_sequence": None,
        "record_count": 1,
        "first_timestamp_ms": timestamp,
        "max_timestamp_ms": timestamp,
        "message_crcs": None,
    }
    if codec == 0:
        return identity
    inner = _wrapper_inner(buf, pos, total, magic, codec)
    if inner is None:  # not decompressed: one message whose range is unknown
        identity["last_offset_delta"] = None
        return identity
    count, first, last, first_ts, crcs = inner
    identity["record_count"] = count
    identity["message_crcs"] = crcs
    if first_ts is not None:
        identity["first_timestamp_ms"] = first_ts
    if magic == 1:  # inner offsets relative; the wrapper holds the last one's absolute offset
        identity["base_offset"] = offset - (last - first)
    else:
        identity["base_offset"] = first
    identity["last_offset_delta"] = last - first
    return identity


def _wrapper_inner(
    buf: Any, pos: int, total: int, magic: int, codec: int
) -> tuple[int, int, int, int | None, list[int]] | None:
    """(count, first offset, last offset, first timestamp, CRCs) of a wrapper's inner messages.

    None when the value cannot be read or decompressed, or holds no whole message.
    """
    value_at = pos + 12 + 4 + 2 + (8 if magic == 1 else 0)
    if value_at + 4 > pos + total:
        return None
    key_len = _I32.unpack_from(buf, value_at)[0]
    value_at += 4 + max(key_len, 0)
    if value_at + 4 > pos + total:
        return None
    value_len = _I32.unpack_from(buf, value_at)[0]
    if value_len <= 0 or value_at + 4 + value_len > pos + total:
        return None
    inner = _decompress(codec, bytes(buf[value_at + 4 : value_at + 4 + value_len]))
    if inner is None:
        return None
    count = 0
    first = last = 0
    first_ts: int | None = None
    crcs: list[int] = []
    at = 0
    size_of = len(inner)
    while at + 12 <= size_of:
        offset, size = _BATCH_LEN.unpack_from(inner, at)
        if size < 6 or at + 12 + size > size_of:
            break
        if count == 0:
            first = offset
            if inner[at + 16] == 1 and size >= 14:
                first_ts = _I64.unpack_from(inner, at + 18)[0]
        last = offset
        if count < MAX_MESSAGE_CRCS_KEPT:
            crcs.append(_LEGACY_CRC.unpack_from(inner, at + 12)[0])
        count += 1
        at += 12 + size
    if count == 0:
        return None
    return count, first, last, first_ts, crcs


def _decompress(codec: int, data: bytes) -> bytes | None:
    """Decompress a legacy wrapper value, capped at LEGACY_DECOMPRESS_LIMIT; None if unknown."""
    try:
        if codec == 1:
            inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
            return inflater.decompress(data, LEGACY_DECOMPRESS_LIMIT)
        import cramjam

        if codec == 2:
            if data.startswith(b"\x82SNAPPY\x00"):  # xerial framing used by the Java client
                return _xerial_snappy(data, cramjam)
            return _raw_snappy(data, cramjam)
        if codec == 3 and len(data) * 255 <= LEGACY_DECOMPRESS_LIMIT:  # lz4 expands at most ~255x
            return bytes(cramjam.lz4.decompress(data))
    except Exception:
        return None
    return None


def _xerial_snappy(data: bytes, cramjam: Any) -> bytes:
    out = bytearray()
    at = 16
    while at + 4 <= len(data) and len(out) < LEGACY_DECOMPRESS_LIMIT:
        size = struct.unpack_from(">i", data, at)[0]
        out += _raw_snappy(data[at + 4 : at + 4 + size], cramjam)
        at += 4 + size
    return bytes(out[:LEGACY_DECOMPRESS_LIMIT])


def _raw_snappy(data: bytes, cramjam: Any) -> bytes:
    """Raw snappy, refusing blocks whose declared size exceeds the cap (checked before inflating)."""
    declared = shift = 0
    for byte in data[:5]:
        declared |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
    if declared > LEGACY_DECOMPRESS_LIMIT:
        return b""
    return bytes(cramjam.snappy.decompress_raw(data))


def codec_names(mask: int) -> str | None:
    """Comma-joined codec names of a bitmask from ``summarize_records``."""
    if not mask:
        return None
    return ",".join(name for bit, name in enumerate(CODECS) if mask >> bit & 1)
