"""The sans-io stream decoder on hand-made frames: framing, matching, gaps, resync.

Every test runs twice: with the compiled frame path (decoder/_framecore.c) and with the Python
reference alone, so that each hand-made case (reused correlation ids, acks=0, orphans, answers out
of order, SASL, frames cut anywhere) is checked where the compiled loop hands frames back to Python.
"""

from __future__ import annotations

import struct

import kafka_frames as kf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import decoder.connection as connection
from decoder.connection import KafkaConnection, looks_like_request
from decoder.events import (
    NEED_DATA,
    MalformedFrame,
    NoResponseExpected,
    OrphanResponse,
    RequestReceived,
    ResponseReceived,
    Resync,
    Unanswered,
)

UP, DOWN = 0, 1


@pytest.fixture(autouse=True, scope="module", params=["compiled", "python"])
def frame_path(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Which frame path decodes: the compiled one (as shipped) or the Python reference alone."""
    if request.param == "compiled":
        if connection._framecore is None:
            pytest.skip("KWIRE_PURE_PYTHON=1: no compiled frame path")
        yield request.param
        return
    with pytest.MonkeyPatch.context() as mp:
        for name in ("_compiled_request", "_compiled_response", "_compiled_frames"):
            mp.setattr(connection, name, None)
        yield request.param


def run(feed: list[tuple[int, bytes]], *, synced: bool = True, close: bool = True) -> list:
    conn = KafkaConnection(synced=synced)
    for ts, (direction, data) in enumerate(feed, 1):
        conn.receive_data(direction, data, ts)
    if close:
        conn.receive_close(len(feed) + 1)
    return conn.events()


def terminal(events: list) -> list:
    return [e for e in events if not isinstance(e, (RequestReceived, Resync))]


def test_request_and_response_are_matched_by_correlation_id() -> None:
    events = run(
        [
            (UP, kf.heartbeat_v0(7, group="orders", generation=3, member="m-1")),
            (DOWN, kf.heartbeat_v0_response(7, error=27)),
        ]
    )
    (done,) = terminal(events)
    assert isinstance(done, ResponseReceived)
    assert done.request.client_id == "test-client"
    assert done.request.fields == {"group_id": "orders", "generation_id": 3, "member_id": "m-1"}
    assert done.response.fields == {"error_code": 27}
    assert (done.request.start_ns, done.response.end_ns) == (1, 2)


def test_one_byte_at_a_time_gives_the_same_events_as_whole_frames() -> None:
    stream_up = kf.produce_v3(1, acks=1) + kf.heartbeat_v0(2)
    stream_down = kf.produce_v3_response(1, {0: 0}) + kf.heartbeat_v0_response(2)
    whole = terminal(run([(UP, stream_up), (DOWN, stream_down)]))
    conn = KafkaConnection()
    for byte in stream_up:
        conn.receive_data(UP, bytes([byte]), 1)
    for byte in stream_down:
        conn.receive_data(DOWN, bytes([byte]), 2)
    conn.receive_close(3)
    split = terminal(conn.events())
    assert [(type(e), e.request.correlation_id, e.response.fields) for e in split] == [
        (type(e), e.request.correlation_id, e.response.fields) for e in whole
    ]
    assert len(whole) == 2


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, 400), max_size=30))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    stream = b"".join(kf.produce_v3(i, acks=-1, partitions=(0, 1)) for i in range(5))
    chunks, at = [], 0
    for cut in cuts:
        chunks.append(stream[at : at + cut])
        at += cut
    chunks.append(stream[at:])
    conn = KafkaConnection()
    for chunk in chunks:
        conn.receive_data(UP, chunk, 1)
    got = [e.request for e in conn.events() if isinstance(e, RequestReceived)]
    assert [r.correlation_id for r in got] == list(range(5))
    assert all(r.fields["acks"] == -1 and r.status == "ok" for r in got)


def test_produce_acks_0_expects_no_response_and_records_are_counted() -> None:
    batches = (kf.record_batch(4, codec=1), kf.record_batch(6, codec=4))
    events = run([(UP, kf.produce_v3(3, acks=0, batches=batches))])
    (done,) = terminal(events)
    assert isinstance(done, NoResponseExpected)
    records = done.request.fields["Topics" if "Topics" in done.request.fields else "TopicData"][0]
    assert records["PartitionData"][0]["records"] == (2, 10, (1 << 1) | (1 << 4))


def test_a_response_to_an_acks_0_request_is_an_orphan_that_says_so() -> None:
    events = run([(UP, kf.produce_v3(3, acks=0)), (DOWN, kf.produce_v3_response(3, {0: 0}))])
    orphan = [e for e in events if isinstance(e, OrphanResponse)]
    assert len(orphan) == 1 and orphan[0].unexpected_for.correlation_id == 3
    assert orphan[0].response.status == "ok"


def test_orphan_response_when_the_request_was_never_seen() -> None:
    (orphan,) = terminal(run([(DOWN, kf.heartbeat_v0_response(99))]))
    assert isinstance(orphan, OrphanResponse)
    assert orphan.response.correlation_id == 99 and orphan.unexpected_for is None


def test_unknown_api_key_and_version_skip_by_length_and_still_pair() -> None:
    unknown_key = kf.request(999, 0, 1, b"\x01\x02\x03")
    unknown_version = kf.request(12, 99, 2, b"\x00" * 20)
    events = run(
        [
            (UP, unknown_key + unknown_version + kf.heartbeat_v0(3)),
            (DOWN, kf.response(1, b"\x00\x00") + kf.response(2, b"") + kf.heartbeat_v0_response(3)),
        ]
    )
    done = terminal(events)
    assert [(e.request.status, e.response.status) for e in done] == [
        ("unknown_api", "unknown_api"),
        ("unknown_api", "unknown_api"),
        ("ok", "ok"),
    ]
    assert done[0].request.decode_error == "unknown api key 999"
    assert done[2].response.fields == {"error_code": 0}


def test_malformed_body_is_recorded_and_the_stream_continues() -> None:
    bad = kf.request(12, 0, 1, struct.pack(">h", 500) + b"short")  # group id claims 500 bytes
    events = run(
        [(UP, bad + kf.heartbeat_v0(2)), (DOWN, kf.heartbeat_v0_response(1) + kf.heartbeat_v0_response(2))]
    )
    done = terminal(events)
    assert done[0].request.status == "malformed" and "runs past the frame" in done[0].request.decode_error
    assert done[1].request.status == "ok"


def test_a_later_response_means_earlier_requests_were_never_answered() -> None:
    events = run(
        [(UP, kf.heartbeat_v0(1) + kf.heartbeat_v0(2)), (DOWN, kf.heartbeat_v0_response(2))], close=False
    )
    done = terminal(events)
    assert isinstance(done[0], Unanswered) and done[0].reason == "later_response"
    assert done[0].request.correlation_id == 1
    assert isinstance(done[1], ResponseReceived)


def test_close_reports_pending_requests_and_partial_frames() -> None:
    partial = kf.heartbeat_v0(5)[:-3]
    events = run([(UP, kf.heartbeat_v0(4) + partial)])
    done = terminal(events)
    assert [(type(e).__name__, e.request.correlation_id, e.request.status) for e in done] == [
        ("Unanswered", 4, "ok"),
        ("Unanswered", 5, "truncated"),
    ]


def test_gap_inside_a_frame_truncates_it_and_keeps_alignment() -> None:
    first, second = kf.heartbeat_v0(1), kf.heartbeat_v0(2)
    conn = KafkaConnection()
    conn.receive_data(UP, first[:14], 1)
    conn.receive_gap(UP, 5, 2)
    conn.receive_data(UP, first[19:] + second, 3)
    conn.receive_data(DOWN, kf.heartbeat_v0_response(1) + kf.heartbeat_v0_response(2), 4)
    events = conn.events()
    assert not [e for e in events if isinstance(e, Resync)]
    done = terminal(events)
    assert [(e.request.correlation_id, e.request.status) for e in done] == [(1, "truncated"), (2, "ok")]


def test_gap_across_frames_resyncs_on_the_next_plausible_request() -> None:
    frames = [kf.heartbeat_v0(i) for i in range(1, 5)]
    conn = KafkaConnection()
    conn.receive_data(UP, frames[0] + frames[1][:10], 1)
    conn.receive_gap(UP, len(frames[1]) - 10 + 7, 2)  # rest of frame 2 and 7 bytes of frame 3
    conn.receive_data(UP, frames[2][7:] + frames[3], 3)
    events = conn.events()
    resyncs = [e for e in events if isinstance(e, Resync)]
    assert len(resyncs) == 1 and resyncs[0].skipped_bytes == len(frames[2]) - 7
    seen = [e.request.correlation_id for e in events if isinstance(e, RequestReceived)]
    assert seen == [1, 4]  # frame 3 lost its header to the gap: it cannot be attributed
    (cut,) = [e for e in events if isinstance(e, MalformedFrame)]  # frame 2: header cut before its client id
    assert cut.reason == f"truncated after 10 of {len(frames[1])} bytes"


def test_stream_entered_mid_way_finds_the_first_request_boundary() -> None:
    stream = kf.heartbeat_v0(1) + kf.heartbeat_v0(2)
    events = run([(UP, stream[9:])], synced=False, close=False)
    requests = [e.request for e in events if isinstance(e, RequestReceived)]
    assert [r.correlation_id for r in requests] == [2]
    (resync,) = [e for e in events if isinstance(e, Resync)]
    assert resync.reason == "stream entered mid-way" and resync.skipped_bytes == len(kf.heartbeat_v0(1)) - 9


def test_responses_resync_on_a_pending_correlation_id() -> None:
    conn = KafkaConnection(synced=False)
    conn.receive_data(UP, kf.heartbeat_v0(41) + kf.heartbeat_v0(42), 1)
    conn.receive_data(DOWN, b"\x07garbage!" + kf.heartbeat_v0_response(41) + kf.heartbeat_v0_response(42), 2)
    done = terminal(conn.events())
    assert [(type(e).__name__, e.request.correlation_id) for e in done] == [
        ("ResponseReceived", 41),
        ("ResponseReceived", 42),
    ]


def test_implausible_length_is_reported_and_never_allocated() -> None:
    conn = KafkaConnection()
    conn.receive_data(UP, struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 100 + kf.heartbeat_v0(3), 1)
    events = conn.events()
    malformed = [e for e in events if isinstance(e, MalformedFrame)]
    assert len(malformed) == 1 and "implausible frame length 2147483647" in malformed[0].reason
    assert [e.request.correlation_id for e in events if isinstance(e, RequestReceived)] == [3]


def test_api_versions_unsupported_version_answered_in_v0_format() -> None:
    newer = kf.frame(struct.pack(">hhi", 18, 3, 1) + kf.string("c") + b"\x00" + b"\x02x\x021\x00")
    answer = kf.api_versions_v0_response(1, error=35, apis=((18, 0, 2),))
    (done,) = terminal(run([(UP, newer), (DOWN, answer)]))
    assert done.response.status == "ok" and done.response.api_version == 0
    assert done.response.fields["error_code"] == 35
    assert done.request.fields == {"client_software_name": "x", "client_software_version": "1"}


def test_correlation_id_reuse_closes_the_older_request() -> None:
    done = terminal(run([(UP, kf.heartbeat_v0(1) + kf.heartbeat_v0(1)), (DOWN, kf.heartbeat_v0_response(1))]))
    assert [type(e).__name__ for e in done] == ["Unanswered", "ResponseReceived"]
    assert done[0].reason == "correlation_id_reused"


def test_pending_requests_are_bounded() -> None:
    conn = KafkaConnection(max_pending=10)
    conn.receive_data(UP, b"".join(kf.heartbeat_v0(i) for i in range(25)), 1)
    evicted = [e for e in conn.events() if isinstance(e, Unanswered)]
    assert len(evicted) == 15 and conn.pending_requests == 10


def test_next_event_is_need_data_when_drained() -> None:
    conn = KafkaConnection()
    assert conn.next_event() is NEED_DATA
    conn.receive_data(UP, kf.heartbeat_v0(1), 1)
    assert isinstance(conn.next_event(), RequestReceived)
    assert conn.next_event() is NEED_DATA


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (kf.heartbeat_v0(1), True),
        (kf.request(12, 0, 1, b"", client_id="\x01\x02bad"), False),
        (kf.request(500, 0, 1, b""), False),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00\x00\x00", False),  # a TLS ClientHello
    ],
)
def test_looks_like_request(data: bytes, expected: bool) -> None:
    assert looks_like_request(data, 0, len(data)) is expected


def _produce_with_header_lost() -> tuple[bytes, bytes]:
    """A Produce request missing its first 6 bytes (its body holds header-like bytes), and the request
    after it."""
    produce = kf.produce_v3(1, acks=1, batches=(kf.record_batch(5, payload=b"v" * 40),))
    return produce[6:], kf.heartbeat_v0(2)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_hunt_accepts_only_a_whole_frame_that_decodes(chunk: int) -> None:
    rest, after = _produce_with_header_lost()
    stream = rest + after
    conn = KafkaConnection(synced=False)
    for at in range(0, len(stream), chunk):
        conn.receive_data(UP, stream[at : at + chunk], 1)
    conn.receive_close(2)
    events = conn.events()
    assert [
        (e.request.correlation_id, e.request.status) for e in events if isinstance(e, RequestReceived)
    ] == [(2, "ok")]
    (resync,) = [e for e in events if isinstance(e, Resync)]
    assert resync.skipped_bytes == len(rest)


def test_hunt_for_a_response_decodes_it_as_the_pending_requests_answer() -> None:
    conn = KafkaConnection()
    conn.receive_data(UP, kf.heartbeat_v0(1) + kf.heartbeat_v0(65536), 1)
    conn.receive_gap(DOWN, 2, 2)  # response 1 loses 00 00: the rest reads as a 393,216-byte response to 65536
    conn.receive_data(DOWN, kf.heartbeat_v0_response(1)[2:], 3)
    conn.receive_data(DOWN, kf.heartbeat_v0_response(65536), 4)
    done = terminal(conn.events())
    assert [(type(e).__name__, e.request.correlation_id) for e in done] == [
        ("Unanswered", 1),
        ("ResponseReceived", 65536),
    ]
    assert done[0].reason == "gap" and done[1].response.fields == {"error_code": 0}


def test_response_right_after_a_gap_with_its_request_lost_is_an_orphan() -> None:
    conn = KafkaConnection()
    conn.receive_data(UP, kf.heartbeat_v0(1), 1)
    conn.receive_gap(DOWN, len(kf.heartbeat_v0_response(1)), 2)
    conn.receive_data(DOWN, kf.heartbeat_v0_response(2), 3)  # request 2 was lost too
    conn.receive_data(UP, kf.heartbeat_v0(3), 4)
    conn.receive_data(DOWN, kf.heartbeat_v0_response(3), 5)
    done = terminal(conn.events())
    assert [
        (
            type(e).__name__,
            e.response.correlation_id if isinstance(e, OrphanResponse) else e.request.correlation_id,
        )
        for e in done
    ] == [
        ("OrphanResponse", 2),
        ("Unanswered", 1),
        ("ResponseReceived", 3),
    ]


def test_hunt_takes_no_chance_match_inside_a_response_still_arriving() -> None:
    """A connection picked up mid-way (a replica fetcher): the first response is checked but not
    all in yet, and its body holds what reads as a whole response to the same pending request,
    ending where the bytes so far end. The first frame is taken once its bytes come (in 006-healthy
    a Fetch v18 response was cut in two that way)."""
    inner = kf.response(1, b"\x00" * 8)  # reads as Heartbeat response 1 with trailing bytes
    outer = kf.response(1, b"\x00\x00" + inner + b"\x00" * 4)
    cut = outer.index(inner) + len(inner)
    conn = KafkaConnection(synced=False)
    conn.receive_data(UP, kf.heartbeat_v0(1), 1)
    conn.receive_data(DOWN, outer[:cut], 2)
    conn.receive_data(DOWN, outer[cut:], 3)
    conn.receive_close(4)
    answers = [e for e in conn.events() if isinstance(e, ResponseReceived)]
    assert [(e.request.correlation_id, e.response.size, e.response.end_ns) for e in answers] == [
        (1, len(outer), 3)
    ]
    assert not [e for e in conn.events() if isinstance(e, (OrphanResponse, MalformedFrame))]


def test_close_decodes_a_checked_frame_that_waited_for_the_bytes_after_it() -> None:
    stream = kf.heartbeat_v0(1) + kf.heartbeat_v0(2)
    conn = KafkaConnection(synced=False)
    conn.receive_data(UP, stream[9:] + kf.heartbeat_v0(3)[:2], 1)
    assert not [e for e in conn.events() if isinstance(e, RequestReceived)]  # 2 bytes: cannot tell yet
    conn.receive_close(2)
    assert [e.request.correlation_id for e in conn.events() if isinstance(e, RequestReceived)] == [2]


def test_hunting_holds_a_bounded_number_of_bytes() -> None:
    """A plausible header claiming 50 MiB, then bytes that hold no frame: the hunt waits for that frame
    only up to HUNT_WAIT bytes, then trusts its header (framing then holds it as any frame in progress)."""
    import tracemalloc

    from decoder.connection import HUNT_WAIT

    fake = kf.request(12, 0, 1, b"")
    fake = struct.pack(">i", 50 << 20) + fake[4:]
    conn = KafkaConnection(synced=False)
    tracemalloc.start()
    conn.receive_data(UP, fake, 1)
    for _ in range(HUNT_WAIT // 4096 // 2):
        conn.receive_data(UP, b"\xff" * 4096, 2)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < HUNT_WAIT + (1 << 20)
    assert not conn.events()  # still waiting: nothing decoded, nothing resynced
    for _ in range(HUNT_WAIT // 4096):
        conn.receive_data(UP, b"\xff" * 4096, 3)
    assert [type(e).__name__ for e in conn.events()] == ["Resync"]


def _feed_in_chunks(stream_up: bytes, stream_down: bytes, size: int) -> list:
    """Events of both streams fed ``size`` bytes at a time (requests first), then closed."""
    conn = KafkaConnection()
    for at in range(0, len(stream_up), size):
        conn.receive_data(UP, stream_up[at : at + size], 1)
    for at in range(0, len(stream_down), size):
        conn.receive_data(DOWN, stream_down[at : at + size], 2)
    conn.receive_close(3)
    return conn.events()


def _large_produce(corr: int) -> bytes:
    """A Produce request of about 300 KB: batches of two codecs, a legacy message, a partial batch."""
    big = kf.record_batch(40, codec=0, payload=b"p" * 100_000)
    legacy = struct.pack(">qiibbii", 0, 14, 0, 1, 0, -1, -1)  # magic 1, no codec: one message
    partial = kf.record_batch(3, codec=4, payload=b"q" * 500)[:-200]
    return kf.produce_v3(
        corr, acks=1, partitions=(0, 1, 2), batches=(big, kf.record_batch(7, codec=4), big, legacy, partial)
    )


@pytest.mark.parametrize("size", [1000, 9000, 70_000, 262_144])
def test_a_large_frame_held_in_pieces_decodes_as_when_whole(size: int) -> None:
    """Frames spanning reads are decoded from their skeleton (records left out) or joined: either way
    the events are those of the frames fed whole."""
    up = _large_produce(1) + kf.heartbeat_v0(2) + _large_produce(3)
    down = kf.produce_v3_response(1, {0: 0}) + kf.heartbeat_v0_response(2) + kf.produce_v3_response(3, {1: 6})
    whole = _feed_in_chunks(up, down, len(up) + len(down))
    pieces = _feed_in_chunks(up, down, size)
    assert pieces == whole
    request = next(e.request for e in whole if isinstance(e, RequestReceived))
    assert request.size == len(_large_produce(1)) and request.status == "ok"


def test_skeleton_keeps_every_field_but_record_payloads() -> None:
    from decoder import protocol
    from decoder.skeleton import skeleton

    frame = _large_produce(9)
    pieces = [frame[at : at + 50_000] for at in range(0, len(frame), 50_000)]
    small = skeleton(pieces, "request", 0, 3, 12 + 2 + len("test-client"))
    assert small is not None and len(small) < len(frame) // 10
    decode = protocol.request_decoder(0, 3)
    body = 12 + 2 + len("test-client")
    (fields, stop), (whole_fields, whole_stop) = (
        decode(small, body, len(small)),
        decode(frame, body, len(frame)),
    )
    assert (fields, stop, whole_stop) == (whole_fields, len(small), len(frame))
    records = [p["records"] for t in fields["TopicData"] for p in t["PartitionData"]]
    assert records == [(4, 88, 0b10001)] * 3  # 3 batches and a legacy message; the partial batch not counted


def test_a_malformed_frame_in_pieces_reads_as_when_whole() -> None:
    """A body that runs past its frame says so in the same words however the frame arrived."""
    stream = kf.request(0, 3, 5, b"") + kf.heartbeat_v0(6)
    whole = _feed_in_chunks(stream, b"", len(stream))
    for cut in (3, 10, 20):
        conn = KafkaConnection()
        conn.receive_data(UP, stream[:cut], 1)
        conn.receive_data(UP, stream[cut:], 1)
        conn.receive_close(3)
        assert conn.events() == whole
    assert whole[0].request.decode_error == "TransactionalId: string runs past the frame"


def test_a_gap_inside_a_held_frame_truncates_it() -> None:
    frame = _large_produce(1)
    conn = KafkaConnection()
    conn.receive_data(UP, frame[:100_000], 1)
    conn.receive_data(UP, frame[100_000:150_000], 2)
    conn.receive_gap(UP, 10, 3)
    conn.receive_data(UP, frame[150_010:] + kf.heartbeat_v0(2), 4)
    conn.receive_close(5)
    requests = [e.request for e in conn.events() if isinstance(e, RequestReceived)]
    assert [(r.correlation_id, r.status, r.size, r.start_ns) for r in requests] == [
        (1, "truncated", len(frame), 1),
        (2, "ok", len(kf.heartbeat_v0(2)), 4),
    ]
