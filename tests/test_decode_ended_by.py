"""``connections.ended_by`` / ``end_time``: who ended a connection first, from TCP segments through
the reassembler and the stream decoder, and on the incident lab's 001 capture against its truth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kafka_frames import heartbeat_v0, heartbeat_v0_response

from decoder.pcap import ACK, FIN, PSH, RST, SYN, TcpSegment
from decoder.tcp import TcpReassembler
from kwire.decode_command import decode_captures
from kwire.pipeline import StreamDecoder

C, S = ("10.0.0.1", 40000), ("10.0.0.9", 9092)
REQ, RESP = heartbeat_v0(7), heartbeat_v0_response(7)
LAB = Path(__file__).resolve().parents[1] / "captures" / "lab"


def seg(ts: int, frm: tuple[str, int], seq: int, flags: int, data: bytes = b"", ack: int = 0) -> TcpSegment:
    to = S if frm == C else C
    return TcpSegment(ts * 1000, frm[0], frm[1], to[0], to[1], seq, ack, flags, data)


def kafka_exchange() -> list[TcpSegment]:
    """Handshake, one Heartbeat and its answer; the client's next byte is 1001 + len(REQ)."""
    return [
        seg(1, C, 1000, SYN),
        seg(2, S, 5000, SYN | ACK, ack=1001),
        seg(3, C, 1001, ACK, ack=5001),
        seg(4, C, 1001, PSH | ACK, REQ, ack=5001),
        seg(5, S, 5001, PSH | ACK, RESP, ack=1001 + len(REQ)),
    ]


def connection_rows(segments: list[TcpSegment], end_us: int = 1_000) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    reassembler = TcpReassembler()
    streams = StreamDecoder("t.pcap", lambda row: None, rows.append)
    for s in segments:
        for event in reassembler.feed(s):
            streams.feed(event)
    for event in reassembler.finish(end_us * 1000):
        streams.feed(event)
    return rows


c_next, s_next = 1001 + len(REQ), 5001 + len(RESP)


@pytest.mark.parametrize(
    ("tail", "ended_by", "end_us"),
    [
        (
            [seg(9, C, c_next, FIN | ACK, ack=s_next), seg(10, S, s_next, FIN | ACK, ack=c_next + 1)],
            "client_fin",
            9,
        ),
        (
            [seg(9, S, s_next, FIN | ACK, ack=c_next), seg(10, C, c_next, FIN | ACK, ack=s_next + 1)],
            "broker_fin",
            9,
        ),
        ([seg(9, S, s_next, RST | ACK, ack=c_next)], "broker_rst", 9),
        ([seg(9, C, c_next, RST | ACK, ack=s_next)], "client_rst", 9),
        # the client gives up on a frozen broker, which resets everything when it is killed
        ([seg(9, C, c_next, FIN | ACK, ack=s_next), seg(60, S, s_next, RST)], "client_fin", 9),
        ([], None, None),  # open when the capture ended
    ],
)
def test_who_ended_a_kafka_connection(tail, ended_by, end_us) -> None:
    [row] = connection_rows([*kafka_exchange(), *tail])
    assert (row["protocol"], row["ended_by"], row["end_time"]) == ("kafka", ended_by, end_us)


def test_refused_and_unanswered_syns() -> None:
    refused = connection_rows([seg(1, C, 1000, SYN), seg(2, S, 0, RST | ACK, ack=1001)])
    assert [(r["protocol"], r["ended_by"], r["end_time"], r.get("client_id")) for r in refused] == [
        ("other", "refused", 2, None)
    ]
    unanswered = connection_rows(
        [seg(1, C, 1000, SYN), seg(1001, C, 1000, SYN), seg(3001, C, 1000, SYN)], 9000
    )
    assert [(r["ended_by"], r["end_time"], r["end_reason"]) for r in unanswered] == [
        ("syn_unanswered", None, "open_at_end")
    ]
    # a connection the server accepted and then reset is not a refusal
    [accepted] = connection_rows([*kafka_exchange()[:3], seg(9, S, 5001, RST | ACK, ack=1001)])
    assert accepted["ended_by"] == "broker_rst"


def test_roles_found_by_decoding_name_the_right_side() -> None:
    """No handshake in the capture and the broker's segment first: the reassembler takes the broker
    for the client until the decoder finds the request; the broker's FIN is still the broker's."""
    segments = [
        seg(5, S, 5001, PSH | ACK, RESP, ack=1001 + len(REQ)),  # an answer to a request not captured
        seg(6, C, 1001 + len(REQ), PSH | ACK, REQ, ack=5001 + len(RESP)),
        seg(7, S, 5001 + len(RESP), PSH | ACK, RESP, ack=1001 + 2 * len(REQ)),
        seg(9, S, 5001 + 2 * len(RESP), FIN | ACK, ack=1001 + 2 * len(REQ)),
    ]
    [row] = connection_rows(segments)
    assert (row["broker_ip"], row["ended_by"], row["end_time"]) == (S[0], "broker_fin", 9)


def test_001_capture_who_closed_what_against_truth() -> None:
    """The frozen broker's connections: reset (or closed) by it when it was killed, or given up by
    their clients while it was frozen; SYNs refused from the kill until it was back."""
    capture = LAB / "001-broker-drops-out" / "capture.pcap.gz"
    if not capture.is_file():
        pytest.skip("lab capture missing")
    truth = json.loads((LAB / "001-broker-drops-out" / "truth.json").read_text())
    at = {e["kind"]: e["ts"] for e in truth["timeline"]}
    victim = truth["brokers"][str(truth["victim"])]["ip"]
    rows: list[dict[str, Any]] = []
    decode_captures([capture], lambda row: None, rows.append)
    mine = [r for r in rows if r["broker_ip"] == victim]
    ended = {r["ended_by"] for r in mine}
    assert (
        {"refused", "broker_rst", "client_fin"}
        <= ended
        <= {
            "refused",
            "broker_rst",
            "broker_fin",
            "client_fin",
            "client_rst",
        }
    )
    for r in mine:
        when = r["end_time"] / 1e6
        if r["ended_by"] == "refused":
            assert at["broker_killed"] <= when <= at["broker_started"] and r["protocol"] == "other"
        elif r["ended_by"].startswith("broker_"):
            assert at["broker_killed"] <= when < at["broker_killed"] + 1.0
        elif r["first_packet_time"] / 1e6 < at["broker_paused"] < when < at["broker_started"]:
            assert when < at["broker_killed"] + 1.0  # a client that gave up on the frozen broker
    # nothing to or from the other brokers was refused
    assert not [
        r for r in rows if r["broker_ip"] != victim and r["ended_by"] in ("refused", "syn_unanswered")
    ]
