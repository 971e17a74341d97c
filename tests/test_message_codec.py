"""decoder.message_codec: decode + encode reproduces real and kio-made frames byte for byte.

Three sources of frames: the sample captures (real clients against Tansu), random messages
that the independent ``kio`` package serialises for every (api, version, direction) both
define, and trees the codec builds itself (``default_tree``) for every layout in the table.
"""

from __future__ import annotations

import importlib
import io
import struct
from pathlib import Path
from typing import Any

import pytest

from decoder import message_codec as mc
from decoder import protocol
from decoder.connection import KafkaConnection
from decoder.events import ResponseReceived
from proxy.streams import capture_streams, split_frames

CAPTURES = sorted((Path(__file__).resolve().parent.parent / "captures").glob("*.pcap"))


def _capture_frames() -> list[tuple[str, int, int, bytes]]:
    """(direction, api key, version, frame) of every frame in the sample captures."""
    out = []
    for path in CAPTURES:
        for stream in capture_streams([path]):
            pending: dict[int, tuple[int, int]] = {}
            for frame in split_frames(stream.data[0]):
                key, version, corr = struct.unpack_from(">hhi", frame, 4)
                pending[corr] = (key, version)
                out.append(("request", key, version, frame))
            for frame in split_frames(stream.data[1]):
                corr = struct.unpack_from(">i", frame, 4)[0]
                if corr in pending:
                    out.append(("response", *pending.pop(corr), frame))
    return out


def test_capture_frames_round_trip_byte_exact() -> None:
    frames = _capture_frames()
    assert len(frames) > 500
    exact = 0
    refused: list[tuple[int, int]] = []
    for direction, key, version, frame in frames:
        try:
            header, body = mc.decode_frame(direction, frame, key, version)
        except mc.CodecError:
            refused.append((key, version))
            continue
        assert mc.encode_frame(direction, key, version, header, body) == frame, (direction, key, version)
        exact += 1
    assert exact >= len(frames) - 10
    # Tansu's ListOffsets v0 response is short by the OldStyleOffsets array (the "Read
    # underflow" kcat reports): the only frames that do not fit the layout.
    assert set(refused) <= {(2, 0)}


def test_decoded_tree_has_every_field() -> None:
    metadata = next(f for d, k, v, f in _capture_frames() if d == "response" and k == 3)
    corr = struct.unpack_from(">i", metadata, 4)[0]
    key_version = next((k, v) for d, k, v, f in _capture_frames() if d == "response" and f == metadata)
    header, body = mc.decode_frame("response", metadata, *key_version)
    assert header["CorrelationId"] == corr
    broker = body["Brokers"][0]
    assert broker["Host"] == "127.0.0.1" and broker["Port"] == 9092 and broker["NodeId"] == 111
    assert all("Partitions" in topic for topic in body["Topics"])


def test_rewrite_changes_only_host_and_port() -> None:
    request = next(f for d, k, v, f in _capture_frames() if d == "response" and k == 3 and v >= 9)
    key_version = next((k, v) for d, k, v, f in _capture_frames() if f == request)
    header, body = mc.decode_frame("response", request, *key_version)
    body["Brokers"][0]["Host"] = "proxy.example"
    body["Brokers"][0]["Port"] = 19092
    out = mc.encode_frame("response", *key_version, header, body)
    assert struct.unpack_from(">i", out)[0] == len(out) - 4
    assert len(out) == len(request) + len("proxy.example") - len("127.0.0.1")
    # The stream decoder (an independent reader) sees the new address and nothing else changed.
    conn = KafkaConnection()
    conn.receive_data(0, _request_for(key_version, header["CorrelationId"]), 1)
    conn.receive_data(1, out, 2)
    [event] = [e for e in conn.events() if isinstance(e, ResponseReceived)]
    assert event.response.status == "ok", event.response.decode_error
    assert event.response.fields["Brokers"][0]["host"] == "proxy.example"
    assert event.response.fields["Brokers"][0]["port"] == 19092
    _, again = mc.decode_frame("response", out, *key_version)
    assert again == body


def _request_for(key_version: tuple[int, int], corr: int) -> bytes:
    key, version = key_version
    header_version = protocol.request_header_version(key, version)
    header = {"RequestApiKey": key, "RequestApiVersion": version, "CorrelationId": corr, "ClientId": "t"}
    body = mc.default_tree("request", key, version)
    if header_version == 0:
        del header["ClientId"]
    return mc.encode_frame("request", key, version, header, body)


def test_unknown_tags_and_trailing_bytes_survive() -> None:
    key, version = 3, 12
    tree = mc.default_tree("response", key, version)
    tree["_unknown_tags"] = [(7, b"\x01\x02\x03"), (9, b"")]
    raw = mc.encode_message("response", key, version, tree) + b"tail"
    back = mc.decode_message("response", key, version, raw)
    assert back["_unknown_tags"] == [(7, b"\x01\x02\x03"), (9, b"")]
    assert back["_trailing"] == b"tail"
    assert mc.encode_message("response", key, version, back) == raw


def test_tags_out_of_order_keep_their_order() -> None:
    # Fetch v12 response partition: tags 0 (DivergingEpoch) and 1 (CurrentLeader), written 1 then 0.
    tree = mc.default_tree("response", 1, 12)
    partition = {
        "PartitionIndex": 0,
        "ErrorCode": 0,
        "HighWatermark": 5,
        "LastStableOffset": -1,
        "LogStartOffset": 0,
        "AbortedTransactions": None,
        "PreferredReadReplica": -1,
        "Records": None,
        "DivergingEpoch": {"Epoch": 1, "EndOffset": 2},
        "CurrentLeader": {"LeaderId": 3, "LeaderEpoch": 4},
        "_tag_order": [1, 0],
    }
    tree["Responses"] = [{"Topic": "t", "Partitions": [partition]}]
    raw = mc.encode_message("response", 1, 12, tree)
    back = mc.decode_message("response", 1, 12, raw)
    got = back["Responses"][0]["Partitions"][0]
    assert got["_tag_order"] == [1, 0]
    assert got["CurrentLeader"] == {"LeaderId": 3, "LeaderEpoch": 4}
    assert mc.encode_message("response", 1, 12, back) == raw
    del got["_tag_order"]  # without it the tags are written in ascending order
    assert mc.encode_message("response", 1, 12, back) != raw


def test_zero_copy_records_are_views() -> None:
    frames = [(k, v, f) for d, k, v, f in _capture_frames() if d == "request" and k == 0 and v >= 3]
    _key, _version, frame = frames[-1]
    _header, body = mc.decode_frame("request", frame, zero_copy=True)
    records = body["TopicData"][0]["PartitionData"][0]["Records"]
    assert isinstance(records, memoryview)
    assert bytes(records)[16] == 2  # magic byte of a v2 record batch


@pytest.mark.parametrize("direction", ["request", "response"])
def test_default_tree_encodes_for_every_layout(direction: str) -> None:
    """Every (api, version) in the table: the empty tree encodes, decodes back equal, and the
    stream decoder accepts it with no trailing bytes."""
    checked = 0
    for key, version in protocol.all_versions(direction):
        tree = mc.default_tree(direction, key, version)
        raw = mc.encode_message(direction, key, version, tree)
        assert mc.decode_message(direction, key, version, raw) == tree, (key, version)
        decoder = (protocol.request_decoder if direction == "request" else protocol.response_decoder)(
            key, version
        )
        _fields, stop = decoder(raw, 0, len(raw))
        assert stop == len(raw), (key, version)
        checked += 1
    assert checked > 300


def test_bad_input_raises_codec_error() -> None:
    with pytest.raises(mc.CodecError):
        mc.decode_message("response", 3, 12, b"\x00\x00")
    with pytest.raises(mc.CodecError):
        mc.encode_message("response", 3, 12, {"ThrottleTimeMs": 0})
    with pytest.raises(mc.CodecError):
        mc.decode_message("request", 9999, 0, b"")
    tree = mc.default_tree("response", 3, 12)
    tree["Brokers"] = [{"NodeId": 1, "Host": None, "Port": 1, "Rack": None}]
    with pytest.raises(mc.CodecError):
        mc.encode_message("response", 3, 12, tree)  # Host is not nullable


def test_uvarint() -> None:
    for value in (0, 1, 127, 128, 300, 16383, 16384, 2**31 - 1, 2**32 - 1):
        raw = mc.write_uvarint(value)
        assert mc.read_uvarint(raw, 0) == (value, len(raw))


# ---- against kio ---------------------------------------------------------------------------

kio_index = pytest.importorskip("kio.schema.index", reason="the kio package is not installed")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kio.serial import entity_writer  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402
from kio.static.primitive import Records  # noqa: E402


def _record_batch(codec: int, count: int, payload: bytes) -> bytes:
    """A magic-2 record batch header followed by opaque bytes (as tests/test_against_kio.py
    registers it: the same strategy, so whichever registration wins, both modules work)."""
    after_length = struct.pack(">ibIhiqqqhii", 0, 2, 0, codec, max(count - 1, 0), 0, 0, -1, -1, -1, count)
    after_length += payload
    return struct.pack(">qi", 0, len(after_length)) + after_length


_BATCHES = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5000), st.binary(max_size=40)), max_size=4)
st.register_type_strategy(Records, _BATCHES.map(lambda bs: Records(b"".join(_record_batch(*b) for b in bs))))


def _load(path: str) -> type:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _kio_messages() -> list[tuple[str, int, str, str]]:
    out = []
    for name, versions in kio_index.schema_name_map.items():
        for version, entities in versions.items():
            for entity_type, path in entities.items():
                if entity_type in (EntityType.request, EntityType.response):
                    direction = "request" if entity_type == EntityType.request else "response"
                    out.append((name, version, direction, path))
    return out


KIO_MESSAGES = _kio_messages()


def _kio_frame(entity: Any, correlation_id: int) -> bytes:
    header_cls = type(entity).__header_schema__
    header_version = int(header_cls.__module__.split(".")[-2].lstrip("v"))
    if type(entity).__type__ == EntityType.request:
        header = header_cls(
            **{
                "request_api_key": type(entity).__api_key__,
                "request_api_version": type(entity).__version__,
                "correlation_id": correlation_id,
                **({"client_id": "kio-client"} if header_version >= 1 else {}),
            }
        )
    else:
        header = header_cls(correlation_id=correlation_id)
    out = io.BytesIO()
    entity_writer(header_cls)(out, header)
    entity_writer(type(entity))(out, entity)
    payload = out.getvalue()
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize(
    ("name", "version", "direction", "path"),
    KIO_MESSAGES,
    ids=[f"{m[0]}-v{m[1]}-{m[2]}" for m in KIO_MESSAGES],
)
def test_round_trips_what_kio_encodes(name: str, version: int, direction: str, path: str) -> None:
    cls = _load(path)
    api_key = int(cls.__api_key__)
    if protocol.layout(direction, api_key, version) is None:
        pytest.skip(f"kwire has no definition for {name} v{version} {direction}")

    @settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(entity=st.from_type(cls), correlation_id=st.integers(0, 2**31 - 1))
    def check(entity: Any, correlation_id: int) -> None:
        frame = _kio_frame(entity, correlation_id)
        try:
            header, body = mc.decode_frame(direction, frame, api_key, version)
        except mc.CodecError as exc:
            # kio's definition of an unstable API may differ from the table's. Then the stream
            # decoder (separate code, same table) must refuse the frame too, else it is our bug.
            assert not _stream_decoder_accepts(direction, api_key, version, frame), exc
            pytest.skip(f"{name} v{version} {direction}: kio's definition differs from the table's")
        assert header["CorrelationId"] == correlation_id
        assert mc.encode_frame(direction, api_key, version, header, body) == frame

    check()


def _stream_decoder_accepts(direction: str, api_key: int, version: int, frame: bytes) -> bool:
    conn = KafkaConnection()
    if direction == "request":
        conn.receive_data(0, frame, 1)
        request = conn.events()[0].request
        return request.status == "ok" and request.decode_error is None
    corr = struct.unpack_from(">i", frame, 4)[0]
    conn.receive_data(0, _request_for((api_key, version), corr), 1)
    conn.receive_data(1, frame, 2)
    [event] = [e for e in conn.events() if isinstance(e, ResponseReceived)]
    return event.response.status == "ok" and event.response.decode_error is None
