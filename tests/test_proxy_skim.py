"""``proxy.skim``: large record frames handed to the recorder as skeletons decode as the frames.

Hand-made streams (``kafka_frames``, ``decoder.message_codec``): Produce requests and Fetch
responses of several versions, large and small, between other requests, cut into reads at
every kind of place. Fed through a ``FrameSkim`` and then to a ``KafkaConnection`` (chunks
with ``receive_data``, skeletons with ``receive_skeleton``), they must give exactly the
events the unskimmed chunks give: sizes, times, statuses, batches. Real traffic through the
proxy is compared with a tcpdump of it in ``test_proxy_real.py``'s skim test.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import coverage_report
import kafka_frames as kf
import pyarrow.dataset as ds
import pytest

from decoder import message_codec as mc
from decoder.connection import BROKER_TO_CLIENT as DOWN
from decoder.connection import CLIENT_TO_BROKER as UP
from decoder.connection import KafkaConnection
from decoder.events import RequestReceived, ResponseReceived
from proxy.skim import SKIM_MIN, FrameSkim


def _big_batches(n: int = 3, size: int = 40_000) -> bytes:
    return b"".join(kf.record_batch(20 + i, codec=0, payload=bytes([65 + i]) * size) for i in range(n))


def _produce(corr: int) -> bytes:
    return kf.produce_v3(corr, acks=1, partitions=(0, 1), batches=(kf.record_batch(5), _big_batches()))


def _frame(direction: str, api_key: int, version: int, corr: int, body: dict[str, Any]) -> bytes:
    header = {"CorrelationId": corr}
    if direction == "request":
        header |= {"RequestApiKey": api_key, "RequestApiVersion": version, "ClientId": "skim-test"}
    return mc.encode_frame(direction, api_key, version, header, body)


def _produce_v9(corr: int) -> bytes:
    body = mc.default_tree("request", 0, 9)
    body |= {"Acks": -1, "TimeoutMs": 3000}
    body["TopicData"] = [{"Name": "t9", "PartitionData": [{"Index": 3, "Records": _big_batches(2)}]}]
    return _frame("request", 0, 9, corr, body)


def _fetch(corr: int, version: int) -> bytes:
    return _frame("request", 1, version, corr, mc.default_tree("request", 1, version))


def _fetch_response(corr: int, version: int, records: bytes) -> bytes:
    body = mc.default_tree("response", 1, version)
    body["Responses"] = [
        {
            "Topic": "t",
            "Partitions": [
                {
                    "PartitionIndex": 0,
                    "ErrorCode": 0,
                    "HighWatermark": 99,
                    "LastStableOffset": 99,
                    "LogStartOffset": 0,
                    "AbortedTransactions": [],
                    "PreferredReadReplica": -1,
                    "Records": records,
                }
            ],
        }
    ]
    return _frame("response", 1, version, corr, body)


def _streams() -> tuple[list[bytes], list[bytes]]:
    """Requests and their answers in order: small and large, record-carrying and not."""
    up = [
        kf.api_versions_v0(1),
        _produce(2),
        kf.heartbeat_v0(3),
        _fetch(4, 4),
        _produce_v9(5),
        _fetch(6, 12),
        _fetch(7, 12),
        kf.produce_v3(8, acks=1, partitions=(0,), batches=(kf.record_batch(3),)),
    ]
    down = [
        kf.api_versions_v0_response(1),
        kf.produce_v3_response(2, {0: 0, 1: 0}),
        kf.heartbeat_v0_response(3),
        _fetch_response(4, 4, _big_batches()),
        _frame("response", 0, 9, 5, mc.default_tree("response", 0, 9)),
        _fetch_response(6, 12, _big_batches(4)),
        _fetch_response(7, 12, kf.record_batch(2)),  # small: passes
        kf.produce_v3_response(8, {0: 0}),
    ]
    return up, down


def _reads(stream: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


def _feed(reads: list[tuple[int, bytes, int]], skim: FrameSkim | None) -> tuple[list[Any], int]:
    """Events of ``reads`` ((direction, chunk, time)) through ``skim`` (None: as they are), and
    how many skeletons it made."""
    conn = KafkaConnection()
    skeletons = 0
    for direction, chunk, ts in reads:
        items = None if skim is None else skim.feed(direction, chunk, ts)
        if items is None:
            conn.receive_data(direction, chunk, ts)
            continue
        for item in items:
            if item[0] == "data":
                conn.receive_data(direction, bytes(item[1]), item[2])
            else:
                skeletons += 1
                _, frame, size, start_ns, end_ns = item
                assert len(frame) < size // 10
                assert conn.receive_skeleton(direction, frame, size, start_ns, end_ns)
    if skim is not None:
        for direction, items in enumerate(skim.close()):
            for item in items:
                conn.receive_data(direction, bytes(item[1]), item[2])
    conn.receive_close(10**9)
    return conn.events(), skeletons


def _interleaved(cuts_up: list[int], cuts_down: list[int]) -> list[tuple[int, bytes, int]]:
    """Each request's reads, then its answer's: a read's time is its place in the order."""
    up, down = _streams()
    reads: list[tuple[int, bytes, int]] = []
    for request, answer in zip(up, down, strict=True):
        reads += [(UP, c, 0) for c in _reads(request, cuts_up)]
        reads += [(DOWN, c, 0) for c in _reads(answer, cuts_down)]
    return [(d, c, i) for i, (d, c, _) in enumerate(reads)]


@pytest.mark.parametrize(
    "cuts",
    [[], [20], [3, 5, 11, 60_000], [SKIM_MIN - 1, SKIM_MIN + 1], list(range(1000, 200_000, 7919))],
    ids=["whole", "after-head", "inside-head", "around-min", "many"],
)
def test_skimmed_streams_give_the_events_the_streams_give(cuts: list[int]) -> None:
    reads = _interleaved(cuts, cuts)
    plain, _ = _feed(reads, None)
    skimmed, skeletons = _feed(reads, FrameSkim())
    assert skimmed == plain
    ok = [e for e in plain if isinstance(e, ResponseReceived) and e.response.status == "ok"]
    assert len(ok) == 8
    # the 2 large Produce requests and 2 large Fetch answers, unless a cut splits their heads
    expected = 0 if any(c < 12 for c in cuts) else 4
    assert skeletons == expected


def test_random_reads_in_both_directions_give_the_same_events() -> None:
    up, down = _streams()
    rng = random.Random(18)
    for _ in range(20):
        reads: list[tuple[int, bytes, int]] = []
        for request, answer in zip(up, down, strict=True):
            for direction, frame in ((UP, request), (DOWN, answer)):
                cuts = [rng.randrange(len(frame)) for _ in range(rng.choice((0, 1, 3, 30)))]
                reads += [(direction, c, len(reads)) for c in _reads(frame, cuts)]
        # a read may end one frame and start the next: join some neighbours of one direction
        joined: list[tuple[int, bytes, int]] = []
        for read in reads:
            if joined and joined[-1][0] == read[0] and rng.random() < 0.3:
                joined[-1] = (read[0], joined[-1][1] + read[1], joined[-1][2])
            else:
                joined.append(read)
        assert _feed(joined, FrameSkim())[0] == _feed(joined, None)[0]


def test_sizes_and_times_are_the_frames_own() -> None:
    reads = _interleaved([30_000, 90_000], [50_000])
    events, skeletons = _feed(reads, FrameSkim())
    assert skeletons == 4
    produce = next(
        e.request for e in events if isinstance(e, RequestReceived) and e.request.correlation_id == 2
    )
    assert produce.size == len(_produce(2))
    first = next(i for i, (d, c, _) in enumerate(reads) if d == UP and c == _produce(2)[:30_000])
    assert (produce.start_ns, produce.end_ns) == (first, first + 2)
    fetch = next(
        e.response for e in events if isinstance(e, ResponseReceived) and e.response.correlation_id == 6
    )
    assert fetch.size == len(_fetch_response(6, 12, _big_batches(4)))


def test_any_bytes_in_any_reads_are_all_accounted_for_and_never_raise() -> None:
    """Random and damaged streams: every byte fed comes out as data, inside a skeleton's frame
    size, or back from ``close``; nothing raises, and held frames never outlive the budget."""
    up, down = _streams()
    rng = random.Random(4)
    streams = [b"".join(up), b"".join(down)]
    for case in range(300):
        if case % 3 == 0:
            stream = rng.randbytes(rng.randrange(1, 300_000))
        else:
            stream = bytearray(streams[case % 2])
            for _ in range(rng.randrange(1, 6)):
                at = rng.randrange(len(stream))
                stream[at : at + 4] = rng.randbytes(4)
            stream = bytes(stream[: rng.randrange(len(stream) // 2, len(stream) + 1)])  # often cut mid-frame
        direction = case % 2
        budget = _Budget()
        skim = FrameSkim(budget.take, budget.give)
        if direction:  # its requests first, so that answers are awaited
            for frame in up:
                skim.feed(UP, frame, 0)
        seen = 0
        at = 0
        while at < len(stream):
            n = rng.choice((1, 7, 100, 5000, 70_000, 300_000))
            chunk = stream[at : at + n]
            at += len(chunk)
            items = skim.feed(direction, chunk, at)
            if items is None:
                seen += len(chunk)
                continue
            for item in items:
                seen += len(item[1]) if item[0] == "data" else item[2]
        seen += sum(len(item[1]) for item in skim.close()[direction])
        assert seen == len(stream), case
        assert budget.used == 0


def test_a_sasl_handshake_stops_skimming_both_ways() -> None:
    skim = FrameSkim()
    handshake = kf.request(17, 0, 1, kf.string("PLAIN"))
    assert skim.feed(UP, handshake, 1) is None
    assert skim.off
    token = b"\x00\x00\x01\x00" + b"\x00user\x00" + b"p" * 250  # unframed: never read as a frame
    assert skim.feed(UP, token, 2) is None
    assert skim.feed(UP, _produce(3), 3) is None
    assert skim.feed(DOWN, _fetch_response(4, 4, _big_batches()), 4) is None


def test_a_raw_first_frame_stops_skimming() -> None:
    skim = FrameSkim()
    gssapi = b"\x00\x01\x00\x00\x60\x82" + bytes(65_530)  # a token, not a request
    assert skim.feed(UP, gssapi, 1) is None
    assert skim.off


class _Budget:
    """What ``FrameSkim`` takes and gives back, counted."""

    def __init__(self) -> None:
        self.used = 0
        self.taken: list[int] = []

    def take(self, n: int) -> bool:
        self.used += n
        self.taken.append(n)
        return True

    def give(self, n: int) -> None:
        self.used -= n


def test_a_frame_the_budget_cannot_take_passes_as_it_comes() -> None:
    skim = FrameSkim(take=lambda n: False)
    reads = _interleaved([], [])
    assert _feed(reads, skim) == (_feed(reads, None)[0], 0)
    budget = _Budget()
    _, skeletons = _feed(reads, FrameSkim(budget.take, budget.give))
    assert skeletons == 4 and len(budget.taken) == 4 and budget.used == 0


def test_a_frame_whose_skeleton_cannot_be_made_passes_as_its_pieces() -> None:
    frame = bytearray(_produce(2))
    frame[-5000:] = b"\xff" * 5000  # the last batch's bytes no longer end where the frame does
    frame[36:40] = b"\x7f\xff\xff\xff"  # ... and the partition count is absurd
    reads = [(UP, bytes(frame[:70_000]), 1), (UP, bytes(frame[70_000:]), 2)]
    skim = FrameSkim()
    assert skim.feed(UP, reads[0][1], 1) == []  # held
    items = skim.feed(UP, reads[1][1], 2)
    assert [(kind, bytes(piece), ts) for kind, piece, ts in items] == [
        ("data", reads[0][1], 1),
        ("data", reads[1][1], 2),
    ]
    assert _feed(reads, FrameSkim()) == (_feed(reads, None)[0], 0)


def test_a_frame_in_progress_at_close_is_handed_back() -> None:
    skim = FrameSkim()
    before = kf.heartbeat_v0(1)
    part = _produce(2)[:80_000]
    items = skim.feed(UP, before + part, 5)
    assert [(kind, bytes(piece), ts) for kind, piece, ts in items] == [("data", before, 5)]
    assert [[(k, bytes(p), t) for k, p, t in d] for d in skim.close()] == [[("data", part, 5)], []]
    assert skim.feed(UP, b"more", 6) is None


def test_a_skeleton_where_the_stream_is_not_at_a_boundary_is_a_gap() -> None:
    conn = KafkaConnection()
    conn.receive_data(UP, kf.heartbeat_v0(1)[:7], 1)  # a frame begun
    skim = FrameSkim()
    ((_, frame, size, start, end),) = skim.feed(UP, _produce(2), 2)
    assert conn.receive_skeleton(UP, frame, size, start, end) is False
    conn.receive_close(3)
    assert conn.stats(UP)["gap_bytes"] == size
    assert not [e for e in conn.events() if isinstance(e, RequestReceived) and e.request.status == "ok"]


@pytest.mark.parametrize("queue", [10 << 20, 200_000])
def test_the_proxy_holds_frames_for_skeletons_within_its_recorder_queue(queue: int) -> None:
    """``RecorderProcess`` skims within ``max_queue_bytes`` (and the budget): a frame beyond
    that goes to the recorder as it came."""
    from proxy.metrics import Metrics
    from proxy.recorder_worker import _DATA, _GAP, _SKELETON, RecorderProcess

    metrics = Metrics()
    recorder = RecorderProcess(None, metrics, max_queue_bytes=queue)
    recorder.open(1, None, 0)
    frame = _produce(2)
    recorder.data(1, UP, frame[:100_000], 1)
    recorder.data(1, UP, frame[100_000:], 2)
    kinds = [item[0] for item in recorder._batch[1:]]
    if queue > len(frame):
        assert kinds == [_SKELETON] and recorder._batch[1][4:] == (len(frame), 1, 2)
        assert metrics.skimmed_frames == 1 and metrics.skimmed_bytes == len(frame) - len(
            recorder._batch[1][3]
        )
    else:  # as it came, and then the queue's bound cut it (counted) as before
        assert kinds == [_DATA, _GAP] and metrics.skimmed_frames == 0
        assert metrics.dropped_bytes == len(frame) - 100_000
    assert recorder._skim_held == 0 and recorder.budget.used == recorder._batch_bytes
    assert recorder._take(queue) and not recorder._take(1)
    recorder._give(queue)
    assert recorder._skim_held == 0 and recorder.budget.used == recorder._batch_bytes


# ---- real traffic --------------------------------------------------------------------------


@pytest.mark.real
def test_bulk_traffic_through_the_proxy_is_recorded_as_kwire_decode_reads_the_capture(
    tansu: Any, capture: Any, tmp_path: Any
) -> None:
    """confluent-kafka producing 1 MB requests and consuming them in 4 MB answers through
    ``kwire proxy``, with a tcpdump of the client side: the rows the proxy recorded from
    skeletons equal ``kwire decode``'s rows of the capture, column for column (but for what
    differs by nature: ``proxy_sides.ROW_FIELDS_THAT_DIFFER``), and the payloads never crossed
    to the recorder (``kwire_proxy_skimmed_*``)."""
    import re
    import urllib.request

    from confluent_kafka import Consumer, Producer
    from proxy_sides import compare_rows
    from realkafka import free_port

    from kwire.decode_command import decode_captures
    from proxy.embedded import ProxyProcess

    out = tmp_path / "recorded"
    listen, node_port = free_port(), free_port()
    args = ["--bootstrap", tansu.bootstrap, "--listen", f"127.0.0.1:{listen}", "-o", str(out)]
    args += ["--broker-port-base", str(node_port - tansu.node_id), "--flush-seconds", "1"]
    args += ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
    records, value = 12_000, b"v" * 1000
    bootstrap = f"127.0.0.1:{listen}"
    with capture(listen, node_port, name="skim") as dump:
        proxy = ProxyProcess(args).start()
        try:
            producer = Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "client.id": "skim-producer",
                    "acks": "all",
                    "linger.ms": 50,
                    "batch.size": 1_000_000,
                    "message.timeout.ms": 20_000,
                }
            )
            acked: list[int] = []
            for _ in range(records):
                while True:
                    try:
                        producer.produce("skim", value, on_delivery=lambda e, _m: acked.append(e is None))
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            assert producer.flush(30) == 0
            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "client.id": "skim-consumer",
                    "group.id": "skim",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "fetch.max.bytes": 4 << 20,
                    "max.partition.fetch.bytes": 4 << 20,
                }
            )
            consumer.subscribe(["skim"])
            got, deadline = 0, time.monotonic() + 60
            while got < records and time.monotonic() < deadline:
                got += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
            consumer.close()
            time.sleep(1.5)  # the recorder's last batches
            url = f"http://127.0.0.1:{proxy.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as answer:
                page = answer.read().decode()
        finally:
            code = proxy.terminate()
    assert code == 0, proxy.log[-2000:]
    assert acked.count(True) == records and got == records
    metric = dict(re.findall(r"^kwire_proxy_(skimmed_\w+) ([0-9.e+]+)$", page, re.MULTILINE))
    skimmed, left_out = float(metric["skimmed_frames_total"]), float(metric["skimmed_bytes_total"])
    assert skimmed >= 6 and left_out >= 0.9 * 2 * records * len(value)  # produced and fetched

    recorded = ds.dataset(out / "exchanges", partitioning="hive").to_table().to_pylist()
    decoded: list[dict[str, Any]] = []
    decode_captures([dump.path], decoded.append, lambda _row: None)
    decoded = [r for r in decoded if r["broker_port"] in (listen, node_port)]
    report = compare_rows(recorded, decoded, lambda _port: {("127.0.0.1", tansu.port)})
    assert not report.problems, report.problems[:20]
    assert report.compared == len(recorded) == len(decoded)
    big = [
        r for r in recorded if (r["request_size"] or 0) >= SKIM_MIN or (r["response_size"] or 0) >= SKIM_MIN
    ]
    assert len(big) >= skimmed and {r["api_name"] for r in big} >= {"Produce", "Fetch"}

    def produced(rows: list[dict[str, Any]]) -> int:
        return sum(b["record_count"] for r in rows if r["api_name"] == "Produce" for b in r["batches"] or ())

    assert produced(recorded) == records and produced(big) >= records // 2
    coverage_report.add("skim: large frames recorded from skeletons", int(skimmed))
    coverage_report.add("skim: payload MB never copied to the recorder", int(left_out) >> 20)
    coverage_report.add("skim: rows equal to kwire decode of the capture", report.compared)
