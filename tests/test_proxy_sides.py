"""The checks of ``tests/proxy_sides.py`` find what they are meant to find (no broker needed).

``test_proxy_real_cluster`` relies on them passing on a real run; these make sure they fail
on a pair that was not forwarded faithfully, so a pass there means something.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from proxy_sides import (
    compare_connections,
    compare_pair,
    compare_rows,
    pair_streams,
    same_connections,
    unread_requests,
)

from decoder import message_codec as mc
from decoder import protocol
from proxy.streams import CapturedStream

PROXY, BROKER = ("127.0.5.100", 9101), ("127.0.5.2", 9092)


def request(key: int, version: int, corr: int) -> bytes:
    header = {"RequestApiKey": key, "RequestApiVersion": version, "CorrelationId": corr}
    if protocol.request_header_version(key, version) >= 1:
        header["ClientId"] = "sides"
    return mc.encode_frame("request", key, version, header, mc.default_tree("request", key, version))


def metadata_response(corr: int, host: str, port: int) -> bytes:
    body = mc.default_tree("response", 3, 12)
    body["Brokers"] = [{"NodeId": 1, "Host": host, "Port": port, "Rack": None}]
    return mc.encode_frame("response", 3, 12, {"CorrelationId": corr}, body)


def heartbeat_response(corr: int) -> bytes:
    return mc.encode_frame("response", 12, 4, {"CorrelationId": corr}, mc.default_tree("response", 12, 4))


def stream(server: tuple[str, int], sent: bytes, got: bytes, opened: int, how: str = "fin") -> CapturedStream:
    s = CapturedStream(("127.0.0.1", 40000 + opened), server, True, opened_ns=opened, how=how)
    s.data[0].extend(sent)
    s.data[1].extend(got)
    return s


SENT = request(3, 12, 1) + request(12, 4, 2)


def compared(near_got: bytes, far_got: bytes, how: str = "fin") -> list[str]:
    near = stream(PROXY, SENT, near_got, 1, how)
    far = stream(BROKER, SENT, far_got, 2, how)
    [pair], _, _ = pair_streams([near], [far], lambda listener: {BROKER})
    return compare_pair(pair, lambda node: PROXY, lambda node: BROKER).problems


def test_a_faithful_pair_passes() -> None:
    near = metadata_response(1, *PROXY) + heartbeat_response(2)
    far = metadata_response(1, *BROKER) + heartbeat_response(2)
    assert compared(near, far) == []


def test_a_changed_byte_an_unmapped_address_and_a_lost_response_are_found() -> None:
    far = metadata_response(1, *BROKER) + heartbeat_response(2)
    flipped = bytearray(metadata_response(1, *PROXY) + heartbeat_response(2))
    flipped[-1] ^= 1
    assert any("changed on the way" in p for p in compared(bytes(flipped), far))
    wrong_port = metadata_response(1, PROXY[0], 9999) + heartbeat_response(2)
    assert any("shown to the client" in p for p in compared(wrong_port, far))
    unrewritten = metadata_response(1, *BROKER) + heartbeat_response(2)
    assert any("shown to the client" in p for p in compared(unrewritten, far))
    assert any("never reached the client" in p for p in compared(metadata_response(1, *PROXY), far))
    # ... which a reset excuses
    assert compared(metadata_response(1, *PROXY), far, how="rst") == []


def test_pairing_needs_the_same_request_bytes_and_a_route() -> None:
    near = stream(PROXY, SENT, b"", 10)
    other = stream(BROKER, request(3, 12, 7), b"", 11)
    assert pair_streams([near], [other], lambda listener: {BROKER})[0] == []
    same = stream(BROKER, SENT, b"", 12)
    assert pair_streams([near], [same], lambda listener: set())[0] == []  # not a broker of that listener
    assert pair_streams([near], [same], lambda listener: {BROKER}, window_ns=1)[0] == []  # too late
    prefix = stream(BROKER, SENT[:10], b"", 12)
    assert len(pair_streams([near], [prefix], lambda listener: {BROKER})[0]) == 1


def row(port: int, corr: int, **fields: Any) -> dict[str, Any]:
    return {
        "client_port": port,
        "correlation_id": corr,
        "api_key": 0,
        "api_name": "Produce",
        "status": "ok",
        "error_code": None,
        "partition_errors": [{"topic": "t", "partition": 0, "error_code": 0}],
        "broker_ip": BROKER[0],
        "broker_port": BROKER[1],
        "request_time": 1_000_000,
        "response_time": 1_001_000,
        **fields,
    }


def test_rows_must_agree_but_for_what_differs_by_nature() -> None:
    routes = lambda port: {BROKER}  # noqa: E731
    decoded = [row(5, 1, broker_ip=PROXY[0], broker_port=PROXY[1], source="near.pcap")]
    assert compare_rows([row(5, 1, source="proxy:x")], decoded, routes).problems == []
    wrong = row(5, 1, partition_errors=[{"topic": "t", "partition": 0, "error_code": 6}])
    assert compare_rows([wrong], decoded, routes).problems
    late = row(5, 1, request_time=3_000_000)
    assert compare_rows([late], decoded, routes).problems  # 2 s apart
    missing = row(5, 2, status="unanswered", response_time=None)
    assert compare_rows([row(5, 1)], [*decoded, missing], routes).problems
    # ... unless the proxy never read that request
    produce = mc.encode_frame(
        "request",
        0,
        9,
        {"RequestApiKey": 0, "RequestApiVersion": 9, "CorrelationId": 2, "ClientId": "c"},
        mc.default_tree("request", 0, 9),
    )
    first = request(12, 4, 1)
    assert unread_requests(first + produce, len(first)) == {(2, 0)}
    report = compare_rows([row(5, 1)], [*decoded, missing], routes, unread={5: {(2, 0)}})
    assert report.problems == [] and len(report.unread[5]) == 1


def _connection(**values: Any) -> dict[str, Any]:
    base = {
        "client_port": 5,
        "first_packet_time": 1_000_000,
        "end_reason": "closed",
        "client_id": None,
        "protocol": "kafka",
        "bytes_to_broker": 0,
        "bytes_to_client": 0,
        "frames_to_broker": 0,
        "frames_to_client": 0,
        "gap_bytes_to_broker": 0,
        "gap_bytes_to_client": 0,
        "resyncs": 0,
    }
    return base | values


def test_a_connection_the_proxy_ended_before_reading_a_byte_is_its_late_requests() -> None:
    """The proxy ended the connection before it read anything (its row: "other", no Kafka
    counts); the client's request came after. The capture sees a Kafka connection of that
    request alone, and the comparison expects exactly that."""
    recorded = _connection(protocol="other", frames_to_broker=None, frames_to_client=None, resyncs=None)
    late = [{"request_size": 40, "client_id": "c"}]
    decoded = _connection(bytes_to_broker=40, frames_to_broker=1, client_id="c")
    assert compare_connections([recorded], [decoded], {5: late}) == (
        1,
        Counter({("closed", "closed"): 1}),
        [],
    )
    # what the capture shows must still match: a request more is a problem
    decoded = decoded | {"frames_to_broker": 2}
    assert compare_connections([recorded], [decoded], {5: late})[2]


def test_a_client_port_used_by_two_connections_is_two_connections() -> None:
    """The kernel gave port 5 to a producer and, 1.1 s later, to a consumer going to another
    listener (the CI run that found it): by port alone their rows and counts collide; by
    ``same_connections`` each recorded connection meets its own in the capture."""
    recorded = [
        _connection(
            connection_id="p-2", first_packet_time=2_100_000, client_id="consumer", bytes_to_broker=9
        ),
        _connection(
            connection_id="p-1", first_packet_time=1_000_000, client_id="producer", bytes_to_broker=7
        ),
    ]
    decoded = [
        _connection(
            connection_id="d-1", first_packet_time=1_000_400, client_id="producer", bytes_to_broker=7
        ),
        _connection(
            connection_id="d-2", first_packet_time=2_100_300, client_id="consumer", bytes_to_broker=9
        ),
    ]
    assert compare_connections(recorded, decoded)[2]  # by port: one of them meets the other's counts
    recorded_as = same_connections(recorded, decoded)
    assert recorded_as == {"p-1": "d-1", "p-2": "d-2"}
    assert compare_connections(recorded, decoded, recorded_as=recorded_as)[::2] == (2, [])
    routes = lambda port: {BROKER}  # noqa: E731
    mine = [row(5, 1, connection_id="p-1"), row(5, 1, connection_id="p-2", api_key=1, api_name="Fetch")]
    theirs = [row(5, 1, connection_id="d-1"), row(5, 1, connection_id="d-2", api_key=1, api_name="Fetch")]
    assert compare_rows(mine, theirs, routes, recorded_as=recorded_as).compared == 2
    # the same correlation id and api on both: by port they are "two rows for" one key
    twins = [row(5, 1, connection_id="p-1"), row(5, 1, connection_id="p-2")]
    assert any("two rows for" in p for p in compare_rows(twins, twins, routes).problems)
    swapped = [row(5, 1, connection_id="d-2"), row(5, 1, connection_id="d-1", api_key=1, api_name="Fetch")]
    assert compare_rows(mine, swapped, routes, recorded_as=recorded_as).problems


def test_a_connection_the_recorder_skipped_bytes_of_claims_only_what_it_saw() -> None:
    """The recorder fell behind on port 5 and says so (gap bytes): a row it lacks there is
    skipped, a ``gap`` row may leave out what it did not see, and the client software (from a
    skipped ApiVersions) may be null. A ``gap`` row that states something else, or any of
    this on port 6, whose recorder skipped nothing, is a problem."""
    routes = lambda port: {BROKER}  # noqa: E731
    software = {"client_software_name": "kafka-python", "client_software_version": "3.0.12"}
    decoded = [row(5, 1, **software), row(5, 2, **software), row(6, 1, **software), row(6, 2, **software)]
    gap = row(5, 2, status="gap", decode_error="skipped", response_time=None, partition_errors=None)
    mine = [row(5, 1), gap, row(6, 1, **software), row(6, 2, **software)]
    report = compare_rows(mine, decoded, routes, gapped={5})
    assert report.problems == [] and report.gap_rows == 1 and report.skipped == {}
    assert len(compare_rows(mine[:1] + mine[2:], decoded, routes, gapped={5}).skipped[5]) == 1
    assert compare_rows(mine, decoded, routes).problems  # port 5 not said to have skipped bytes
    lying = gap | {"partition_errors": [{"topic": "t", "partition": 0, "error_code": 6}]}
    assert compare_rows([mine[0], lying, *mine[2:]], decoded, routes, gapped={5}).problems
    assert compare_rows([*mine[:2], row(6, 1), mine[3]], decoded, routes, gapped={5}).problems
    extra = row(5, 9, status="gap", api_key=None)
    assert compare_rows([*mine, extra], decoded, routes, gapped={5}).unpaired_gap_rows == 1
    assert compare_rows([*mine, extra | {"status": "ok"}], decoded, routes, gapped={5}).problems

    counts = {"bytes_to_broker": 900, "frames_to_broker": 6, "client_id": "c"}
    seen = _connection(**counts)
    short = _connection(**counts | {"frames_to_broker": 4, "gap_bytes_to_broker": 120, "client_id": None})
    assert compare_connections([short], [seen])[2] == []
    assert compare_connections([short | {"bytes_to_broker": 780}], [seen])[2]  # every byte is counted
    assert compare_connections([short | {"gap_bytes_to_broker": 0}], [seen])[2]  # unless it says so
