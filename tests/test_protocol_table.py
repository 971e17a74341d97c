"""The committed protocol table is what the generator writes, and covers what the issue asks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoder import protocol
from decoder.generate_protocol import build_table, default_message_folders, render

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "kafka-protocol"


def test_committed_table_matches_the_generator() -> None:
    folders = default_message_folders()
    if not folders[0].is_dir():
        pytest.skip(f"Kafka's October-2024 definitions are not at hand ({folders[0]})")
    if len(folders) < 2:
        pytest.skip("kafka-python 3.x (Kafka 4.3's client definitions) is not installed")
    expected = render(build_table(folders, SHARED / "error_codes.tsv"))
    committed = (REPO / "decoder" / "kafka_protocol.json").read_text()
    assert committed == expected, "run: python -m decoder.generate_protocol"


def test_every_defined_key_and_the_newest_versions() -> None:
    table = json.loads((REPO / "decoder" / "kafka_protocol.json").read_text())
    keys = {int(k) for k in table["apis"]}
    assert set(range(0, 62)) | set(range(63, 88)) <= keys  # 62 was never assigned
    assert protocol.version_range(0) == (0, 13)  # Produce: 0-2 from 2024, 12-13 from Kafka 4.3
    assert protocol.version_range(1) == (0, 18)  # Fetch
    assert protocol.version_range(3) == (0, 13)  # Metadata
    assert protocol.version_range(4) == (0, 7)  # LeaderAndIsr: inter-broker, removed in 4.0


@pytest.mark.parametrize(
    ("api_key", "version", "request_header", "response_header"),
    [
        (7, 0, 0, 0),  # ControlledShutdown v0: request header v0
        (7, 3, 2, 1),
        (18, 3, 2, 0),  # ApiVersions: response header v0 even when flexible
        (0, 8, 1, 0),
        (0, 9, 2, 1),  # Produce v9 is the first flexible version
        (3, 9, 2, 1),
    ],
)
def test_header_versions(api_key: int, version: int, request_header: int, response_header: int) -> None:
    assert protocol.request_header_version(api_key, version) == request_header
    assert protocol.response_header_version(api_key, version) == response_header


def test_client_id_keeps_its_int16_length_in_flexible_headers() -> None:
    client_id = protocol.header_layout("request", 2)[3]
    assert client_id[0] == "ClientId" and client_id[2] & 2  # classic (non-compact) encoding flag


def test_error_codes() -> None:
    assert protocol.ERRORS[56] == ("KAFKA_STORAGE_ERROR", True, True)
    assert protocol.ERRORS[6][0] == "NOT_LEADER_OR_FOLLOWER"
    assert protocol.error_name(0) == "NONE" and protocol.error_name(9999) == "UNKNOWN_CODE_9999"


def test_generator_is_rerunnable_from_the_command_line(tmp_path: Path) -> None:
    from decoder.generate_protocol import main

    folders = default_message_folders()
    if not folders[0].is_dir():
        pytest.skip(f"Kafka's October-2024 definitions are not at hand ({folders[0]})")
    out = tmp_path / "table.json"
    args = [a for f in folders for a in ("--messages", str(f))]
    assert main([*args, "--errors", str(SHARED / "error_codes.tsv"), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == 1
    assert main(["--messages", str(tmp_path / "missing"), "-o", str(out)]) == 2
