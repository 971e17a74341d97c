"""``kwire decode`` on captures other projects made, against those projects' own expected outputs.

The captures (``shared/public-captures``, see its README) come from the test suites of deepflow,
nDPI, go-sniffer and arkime: real traffic nobody here produced, several on non-standard broker
ports (36333), which kwire must find with no ``--port``. Where a project states facts (deepflow's
``.result`` files: api, version, correlation id, client id, topic, group, sizes, status code and
round-trip time of every request and response; nDPI's ``.out``: the Kafka flows and their
endpoints; the README: which client used which versions), the rows must say the same.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

from decoder.protocol import ERRORS
from kwire.cli import app
from kwire.decode_command import decode_captures

PUBLIC = Path(__file__).resolve().parents[2] / "shared" / "public-captures"
if not PUBLIC.is_dir():
    PUBLIC = Path("/work/shared/public-captures")
pytestmark = pytest.mark.skipif(not PUBLIC.is_dir(), reason=f"public captures not found at {PUBLIC}")

CAPTURES = sorted(p for p in PUBLIC.glob("*") if p.suffix in (".pcap", ".pcapng")) if PUBLIC.is_dir() else []


def decode(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    result = decode_captures([path], exchanges.append, connections.append)  # no forced ports
    assert result.error is None, result.error
    return exchanges, connections, result


# ---------------------------------------------------------------------------------------------------------
# every file


def test_every_public_capture_decodes_through_the_cli(tmp_path: Path) -> None:
    """Each file through ``kwire decode`` (no --port): exit 0, Kafka found, rows in the Parquet."""
    runner = CliRunner()
    for path in CAPTURES:
        out = tmp_path / f"{path.stem}.kwire"
        result = runner.invoke(app, ["decode", str(path), "-o", str(out)])
        assert result.exit_code == 0, (path.name, result.output)
        exchanges = ds.dataset(out / "exchanges", format="parquet", partitioning="hive").to_table()
        connections = ds.dataset(out / "connections", format="parquet", partitioning="hive").to_table()
        assert exchanges.num_rows >= 1, path.name
        protocols = connections.column("protocol").to_pylist()
        assert "kafka" in protocols, (path.name, protocols)
        assert "Traceback" not in result.output


#: deepflow captures whose broker listens on 36333 (the others use 9092)
ON_36333 = {
    "00-produce-v7-sw8",
    "00-produce-v9",
    "01-fetch-v12-ok",
    "11-join-group-v7",
    "13-leave-group-v4",
    "14-sync-group-v5",
}


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_broker_found_on_its_port_without_configuration(path: Path) -> None:
    exchanges, connections, _ = decode(path)
    kafka = [c for c in connections if c["protocol"] == "kafka"]
    assert kafka and len(kafka) == len(connections)  # these captures hold nothing else
    expected_port = 36333 if path.stem.removeprefix("deepflow_") in ON_36333 else 9092
    assert {c["broker_port"] for c in kafka} == {expected_port}
    for row in exchanges:  # and every row has the broker on the broker side
        assert row["broker_port"] == expected_port


# ---------------------------------------------------------------------------------------------------------
# deepflow: its parser's expected output, line by line

_FIELD = re.compile(r'(\w+): (Some\("?(.*?)"?\)|None|"(.*?)"|[\w-]+)(?=, \w+: |\s*})')


def deepflow_lines(path: Path) -> list[dict[str, Any]]:
    """The KafkaInfo records of a deepflow .result file, as dicts of plain values."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("KafkaInfo {"):
            continue
        info: dict[str, Any] = {}
        for match in _FIELD.finditer(line):
            name, raw, some, quoted = match.groups()
            value: Any = some if some is not None else quoted if quoted is not None else raw
            if raw == "None":
                value = None
            info[name] = value
        out.append(info)
    return out


DEEPFLOW = sorted(PUBLIC.glob("deepflow_*.result")) if PUBLIC.is_dir() else []


def test_deepflow_result_parser_reads_every_line() -> None:
    assert len(DEEPFLOW) == 10
    lines = [line for path in DEEPFLOW for line in deepflow_lines(path)]
    assert len(lines) == 24
    keys = {
        "msg_type",
        "correlation_id",
        "api_key",
        "api_version",
        "client_id",
        "topic_name",
        "group_id",
        "status_code",
        "req_msg_size",
        "resp_msg_size",
        "captured_request_byte",
        "rrt",
    }
    assert all(keys <= set(line) for line in lines)
    assert lines[0]["client_id"] == "console-producer" and lines[0]["topic_name"] == "topic2"
    assert lines[1]["status_code"] == "0" and lines[1]["resp_msg_size"] == "46" and lines[1]["rrt"] == "16107"


@pytest.mark.parametrize("result_file", DEEPFLOW, ids=lambda p: p.stem)
def test_deepflow_expected_output(result_file: Path) -> None:
    """Every request and response deepflow's parser reports: the same facts in kwire's rows."""
    exchanges, _connections, _ = decode(result_file.with_suffix(".pcap"))
    by_corr = {row["correlation_id"]: row for row in exchanges}
    assert len(by_corr) == len(exchanges)
    checked = 0
    for info in deepflow_lines(result_file):
        corr = int(info["correlation_id"])
        row = by_corr[corr]
        assert row["status"] == "ok", row
        assert row["api_name"] == info["api_key"]
        assert row["api_version"] == int(info["api_version"])
        if info["msg_type"] == "Request":
            assert row["client_id"] == info["client_id"]
            assert row["request_size"] == int(info["req_msg_size"]) + 4 == int(info["captured_request_byte"])
            if info["topic_name"]:
                assert info["topic_name"] in row["topics"]
            if info["group_id"]:
                assert row["group_id"] == info["group_id"]
        else:
            assert (
                row["response_size"] == int(info["resp_msg_size"]) + 4 == int(info["captured_response_byte"])
            )
            status = int(info["status_code"])
            if status != -2:  # -2 is deepflow's "not parsed" mark (no Kafka error code is -2)
                assert row.get("error_code", _first_partition_error(row)) == status
            else:
                assert -2 not in ERRORS and info["api_key"] in ("OffsetCommit", "Heartbeat")
            if int(info["rrt"]):
                assert row["latency_us"] == int(info["rrt"])
            else:  # deepflow pairs a response only within its own window; these are 13 s apart
                assert row["latency_us"] == 13_000_000
        checked += 1
    assert checked >= 2


def _first_partition_error(row: dict[str, Any]) -> int | None:
    results = row.get("partition_errors") or []
    return results[0]["error_code"] if results else None


def test_deepflow_unknown_error_code_is_kept_and_named() -> None:
    """fetch-v12-unknown answers with error code 5120, which Kafka does not define."""
    exchanges, _, _ = decode(PUBLIC / "deepflow_01-fetch-v12-unknown.pcap")
    (row,) = exchanges
    assert row["error_code"] == 5120 and row["error_name"] == "UNKNOWN_CODE_5120"


def test_deepflow_versions_deepflow_does_not_parse() -> None:
    """The mix deepflow calls unsupported: kwire decodes all three, topics and groups included."""
    exchanges, _, _ = decode(PUBLIC / "deepflow_mixed-with-unsupported.pcap")
    seen = {(r["api_name"], r["api_version"], r["status"]) for r in exchanges}
    assert seen == {("Fetch", 13, "ok"), ("OffsetCommit", 8, "ok"), ("Heartbeat", 4, "ok")}
    commit = next(r for r in exchanges if r["api_name"] == "OffsetCommit")
    assert commit["topics"] == ["orders"] and commit["group_id"] == "frauddetectionservice"
    assert [p["error_code"] for p in commit["partition_errors"]] == [0]


# ---------------------------------------------------------------------------------------------------------
# nDPI: its flows, and the README's account of the capture

_NDPI_FLOW = re.compile(r"^\s+\d+\s+TCP ([\d.]+):(\d+) <?-> ([\d.]+):(\d+) \[proto: \d+/Kafka\]")


def test_ndpi_flows_and_endpoints() -> None:
    exchanges, connections, result = decode(PUBLIC / "ndpi_kafka.pcapng")
    flows = []
    for line in (PUBLIC / "ndpi_kafka.pcapng.out").read_text().splitlines():
        if match := _NDPI_FLOW.match(line):
            a, pa, b, pb = match.groups()
            flows.append(frozenset([(a, int(pa)), (b, int(pb))]))
    assert len(flows) == 9
    assert "Kafka\t41\t7067\t9" in (PUBLIC / "ndpi_kafka.pcapng.out").read_text()
    assert result.capture.packets == result.capture.tcp_segments == 41
    kafka = {
        frozenset([(c["client_ip"], c["client_port"]), (c["broker_ip"], c["broker_port"])]): c
        for c in connections
        if c["protocol"] == "kafka"
    }
    assert set(kafka) == set(flows)
    # nDPI lists flow 3 server-first ("Match by port"); kwire puts the broker on 9092 everywhere,
    # although that connection's capture starts with two broker responses and no handshake
    assert all(c["broker_port"] == 9092 for c in kafka.values())
    reversed_flow = kafka[frozenset([("172.30.0.237", 9092), ("172.16.17.101", 58052)])]
    assert reversed_flow["syn_seen"] is False and reversed_flow["client_port"] == 58052
    # nDPI: flows 7-9 have no server-to-client traffic; their requests stay unanswered
    for port in (53768, 58300, 53052):
        (c,) = (c for c in kafka.values() if c["client_port"] == port)
        assert c["bytes_to_client"] == 0 and c["frames_to_broker"] == 1
        (row,) = (r for r in exchanges if r["client_port"] == port)
        assert row["status"] == "unanswered"


def test_ndpi_clients_versions_orphans_and_retransmissions() -> None:
    exchanges, _connections, _ = decode(PUBLIC / "ndpi_kafka.pcapng")
    versions = {(r["api_name"], r["api_version"]) for r in exchanges if r.get("api_name")}
    # README: librdkafka (ApiVersions v0, Metadata v2, Produce v3), apache-kafka-java 3.6.1
    # (ApiVersions v3, InitProducerId v4, Metadata v12, Produce v9)
    assert versions == {
        ("ApiVersions", 0),
        ("Metadata", 2),
        ("Produce", 3),
        ("ApiVersions", 3),
        ("InitProducerId", 4),
        ("Metadata", 12),
        ("Produce", 9),
    }
    java = [r for r in exchanges if r["client_port"] == 46136]
    assert {(r["client_software_name"], r["client_software_version"]) for r in java} == {
        ("apache-kafka-java", "3.6.1")
    }
    assert [r["correlation_id"] for r in java] == [3, 4, 5, 6]
    # sections with different timestamp precision: the Java section is in nanoseconds
    first = min(java, key=lambda r: r["request_time"])
    assert first["request_time"] == 1703132756329238  # tshark: 1703132756.329238485
    older = [r for r in exchanges if r["client_port"] != 46136 and r.get("request_time")]
    assert min(r["request_time"] for r in older) == 1681844706292198  # microsecond section
    # responses whose request is not in the capture: orphans, with their correlation ids
    orphans = sorted(r["correlation_id"] for r in exchanges if r["status"] == "orphan_response")
    assert orphans == [131, 140, 141]
    # retransmitted segments (frames 10 and 18) do not make extra rows
    produce_v3 = [r for r in exchanges if r.get("api_name") == "Produce" and r["api_version"] == 3]
    assert sorted(r["correlation_id"] for r in produce_v3) == [2, 3]
    assert all(r["status"] == "ok" for r in produce_v3)
    metadata_142 = [r for r in exchanges if r["correlation_id"] == 142]
    assert len(metadata_142) == 1 and metadata_142[0]["status"] == "ok"


def test_ndpi_librdkafka_apiversions_trailing_bytes_noted() -> None:
    """librdkafka's ApiVersions v0 carries 4 bytes after its (empty) body: kept and noted."""
    exchanges, _, _ = decode(PUBLIC / "ndpi_kafka.pcapng")
    v0 = [r for r in exchanges if r.get("api_name") == "ApiVersions" and r["api_version"] == 0]
    assert len(v0) == 4
    assert all(r["decode_error"] == "4 trailing bytes after the body" for r in v0)
    answered = [r for r in v0 if r["status"] == "ok"]
    assert len(answered) == 2 and all(r["api_versions"] for r in answered)


# ---------------------------------------------------------------------------------------------------------
# go-sniffer and arkime


def test_gosniffer_kafka_python_metadata_and_produce() -> None:
    exchanges, _, _ = decode(PUBLIC / "gosniffer_kafka.pcap")
    got = sorted((r["api_name"], r["api_version"], r["correlation_id"], r["status"]) for r in exchanges)
    assert got == [("Metadata", 0, 1, "ok"), ("Produce", 1, 1, "ok")]
    assert {r["client_id"] for r in exchanges} == {"kafka-python-producer-1"}
    assert all(r["topics"] == ["test"] for r in exchanges)
    produce = next(r for r in exchanges if r["api_name"] == "Produce")
    assert produce["records"] >= 1 and produce["partition_errors"][0]["error_code"] == 0


def test_arkime_client_side_only() -> None:
    """One ListOffsets v0 request; the broker's answer is missing from the capture although the
    client's FIN acknowledges it: the row says the response was lost, not that it never came."""
    exchanges, connections, _ = decode(PUBLIC / "arkime_kafka.pcap")
    (row,) = exchanges
    assert (row["api_name"], row["api_version"], row["correlation_id"]) == ("ListOffsets", 0, 0)
    assert row["topics"] == ["integration.test.topic1475007069352"]
    assert row["status"] == "truncated" and "gap" in row["decode_error"]
    (conn,) = connections
    assert conn["gap_bytes_to_client"] == 71 and conn["bytes_to_client"] == 0
