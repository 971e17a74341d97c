"""Summarise a Kafka ``records`` field from batch headers, without touching payloads.

Two formats share the field (KIP-98): record batches (magic 2), whose 61-byte header
holds the codec and the record count, and legacy message sets (magic 0/1), where a
compressed wrapper message hides its inner messages in a compressed value. Batches are
never decompressed; only legacy wrappers are, to count what they hold, with output capped
so a hostile frame cannot inflate memory. Keys, values and headers are never returned.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

__all__ = ["CODECS", "LEGACY_DECOMPRESS_LIMIT", "summarize_records"]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
LEGACY_DECOMPRESS_LIMIT = 16 << 20  # bytes of inner message set decompressed per wrapper

_BATCH_LEN = struct.Struct(">qi")  # base offset, batch length
_BATCH_MAGIC_AT = 16
_BATCH_ATTRS = struct.Struct(">h")  # at offset 21
_BATCH_COUNT = struct.Struct(">i")  # at offset 57
_BATCH_HEADER = 61
_LEGACY_HEADER = struct.Struct(">qiibb")  # offset, size, crc, magic, attributes


def summarize_records(buf: Any, start: int, end: int) -> tuple[int, int, int]:
    """Return (batches, records, codec bitmask) for the records in ``buf[start:end]``.

    A trailing partial batch (Fetch responses end with one when max bytes cut it) is not
    counted. The codec bitmask has bit ``1 << codec`` set for every codec seen.
    """
    batches = records = codecs = 0
    pos = start
    while pos + 17 <= end:
        _offset, length = _BATCH_LEN.unpack_from(buf, pos)
        total = 12 + length
        if length < 0 or pos + total > end:
            break
        magic = buf[pos + _BATCH_MAGIC_AT]
        if magic == 2:
            if length + 12 < _BATCH_HEADER:
                break
            codec = _BATCH_ATTRS.unpack_from(buf, pos + 21)[0] & 7
            count = _BATCH_COUNT.unpack_from(buf, pos + 57)[0]
            records += max(count, 0)
        elif magic in (0, 1):
            codec = buf[pos + 17] & 7
            records += _legacy_message_count(buf, pos, total, magic, codec)
        else:
            break
        codecs |= 1 << codec if codec < len(CODECS) else 0
        batches += 1
        pos += total
    return batches, records, codecs


def _legacy_message_count(buf: Any, pos: int, total: int, magic: int, codec: int) -> int:
    """Messages inside one legacy message: 1, or the inner count of a compressed wrapper."""
    if codec == 0:
        return 1
    value_at = pos + 12 + 4 + 2 + (8 if magic == 1 else 0)
    key_len = struct.unpack_from(">i", buf, value_at)[0]
    value_at += 4 + max(key_len, 0)
    if value_at + 4 > pos + total:
        return 1
    value_len = struct.unpack_from(">i", buf, value_at)[0]
    if value_len <= 0 or value_at + 4 + value_len > pos + total:
        return 1
    inner = _decompress(codec, bytes(buf[value_at + 4 : value_at + 4 + value_len]))
    if inner is None:
        return 1
    count = 0
    at = 0
    while at + 12 <= len(inner):
        size = struct.unpack_from(">i", inner, at + 8)[0]
        if size < 0 or at + 12 + size > len(inner):
            break
        count += 1
        at += 12 + size
    return max(count, 1)


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
