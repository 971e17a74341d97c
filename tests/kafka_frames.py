"""Hand-made Kafka frames for unit tests (classic encodings, written out field by field)."""

from __future__ import annotations

import struct


def string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def request(
    api_key: int, version: int, corr: int, body: bytes, client_id: str | None = "test-client"
) -> bytes:
    """A request with header v1 (every non-flexible version except ControlledShutdown v0)."""
    return frame(struct.pack(">hhi", api_key, version, corr) + string(client_id) + body)


def response(corr: int, body: bytes) -> bytes:
    """A response with header v0."""
    return frame(struct.pack(">i", corr) + body)


def record_batch(count: int, codec: int = 0, payload: bytes = b"x" * 10) -> bytes:
    """A magic-2 record batch header claiming ``count`` records, then opaque bytes."""
    after = struct.pack(">ibIhiqqqhii", 0, 2, 0, codec, max(count - 1, 0), 0, 0, -1, -1, -1, count) + payload
    return struct.pack(">qi", 0, len(after)) + after


def produce_v3(
    corr: int,
    acks: int,
    topic: str = "t",
    partitions: tuple[int, ...] = (0,),
    batches: tuple[bytes, ...] = (),
    transactional_id: str | None = None,
) -> bytes:
    records = b"".join(batches) or record_batch(3)
    parts = b"".join(struct.pack(">i", p) + struct.pack(">i", len(records)) + records for p in partitions)
    body = (
        string(transactional_id)
        + struct.pack(">hi", acks, 30000)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", len(partitions))
        + parts
    )
    return request(0, 3, corr, body)


def produce_v3_response(corr: int, errors: dict[int, int], topic: str = "t") -> bytes:
    parts = b"".join(struct.pack(">ihqq", p, code, 0, -1) for p, code in errors.items())
    body = (
        struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(errors)) + parts + struct.pack(">i", 0)
    )
    return response(corr, body)


def heartbeat_v0(corr: int, group: str = "g", generation: int = 1, member: str = "m") -> bytes:
    return request(12, 0, corr, string(group) + struct.pack(">i", generation) + string(member))


def heartbeat_v0_response(corr: int, error: int = 0) -> bytes:
    return response(corr, struct.pack(">h", error))


def api_versions_v0(corr: int) -> bytes:
    return request(18, 0, corr, b"")


def api_versions_v0_response(
    corr: int, error: int = 0, apis: tuple[tuple[int, int, int], ...] = ((0, 0, 9),)
) -> bytes:
    body = struct.pack(">hi", error, len(apis)) + b"".join(struct.pack(">hhh", *a) for a in apis)
    return response(corr, body)
