"""The committed protocol table is what the generator writes, and covers what the issue asks.

The generator's sources are Kafka's October-2024 definitions in ``shared/`` and the pinned
kafka-clients jar (``decoder.fetch_definitions``). The jar, and the jars of the Kafka releases
the lab runs, are fetched into ``.cache/m2`` on first use (bounded); where Maven cannot be
reached the tests that need them skip, naming the reason.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from decoder import protocol
from decoder.fetch_definitions import (
    KAFKA_CLIENTS_VERSION,
    FetchError,
    fetch_kafka_clients,
    kafka_clients_jar,
)
from decoder.generate_protocol import (
    VersionRange,
    build_table,
    compile_source,
    default_message_sources,
    load_definitions,
    render,
)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "kafka-protocol"
FETCH_TIMEOUT_S = 180.0

# Releases whose every message must be in the table with the same wire layout: the lab's
# KRaft brokers and controllers (3.9, 4.1) and each later 4.x minor before the pinned jar.
RELEASES = ("3.9.1", "4.1.1", "4.2.0", "4.3.1")


_fetch_failures: list[str] = []


def _jar(version: str) -> Path:
    """The kafka-clients jar of ``version``, fetched if absent; skips if Maven cannot bring it."""
    jar = kafka_clients_jar(version)
    if not jar.is_file() and _fetch_failures:
        pytest.skip(
            f"kafka-clients {version} is not in .cache/m2; an earlier fetch failed: {_fetch_failures[0]}"
        )
    try:
        return fetch_kafka_clients(version, timeout=FETCH_TIMEOUT_S)
    except FetchError as exc:
        _fetch_failures.append(str(exc))
        pytest.skip(f"kafka-clients {version} is not in .cache/m2 and cannot be fetched: {exc}")


@pytest.fixture(scope="module")
def pinned_jar() -> Path:
    """The kafka-clients jar the committed table is generated from."""
    return _jar(KAFKA_CLIENTS_VERSION)


@pytest.fixture(scope="module")
def shared_messages() -> Path:
    folder = SHARED / "messages"
    if not folder.is_dir():
        pytest.skip(f"Kafka's October-2024 definitions are not at hand ({folder})")
    return folder


def test_committed_table_matches_the_generator(shared_messages: Path, pinned_jar: Path) -> None:
    sources = default_message_sources()
    assert sources == [shared_messages, pinned_jar]
    expected = render(build_table(sources, SHARED / "error_codes.tsv"))
    committed = (REPO / "decoder" / "kafka_protocol.json").read_text()
    assert committed == expected, "run: python -m decoder.generate_protocol"


def test_a_jar_reads_like_its_unpacked_folder(pinned_jar: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(pinned_jar) as jar:
        members = [n for n in jar.namelist() if n.startswith("common/message/") and n.endswith(".json")]
        jar.extractall(tmp_path, members)
    from_jar, from_folder = compile_source(pinned_jar), compile_source(tmp_path / "common" / "message")
    assert from_jar == from_folder
    assert len(from_jar[0]) == 2 * 95 and set(from_jar[1]) == {"request", "response"}


def _wire(layout: list[list[Any]]) -> list[Any]:
    """A layout without field names and roles: what is on the wire."""
    return [
        [ftype, flags, tag, None if kids is None else _wire(kids)]
        for _n, ftype, flags, tag, _r, kids in layout
    ]


def _unstable(jar: Path) -> set[tuple[int, int]]:
    """(api key, version) a release marks unstable: brokers refuse it unless told otherwise."""
    out = set()
    for definition in load_definitions(jar):
        if definition.get("type") == "request" and definition.get("latestVersionUnstable"):
            out.add((definition["apiKey"], VersionRange(definition["validVersions"]).high))
    return out


@pytest.mark.parametrize("release", RELEASES)
def test_every_message_of_a_release_decodes_alike(release: str) -> None:
    jar = _jar(release)
    apis, _headers = compile_source(jar)
    unstable = _unstable(jar)
    checked = 0
    for (api_key, direction), versions in apis.items():
        for version, info in versions.items():
            ours = protocol.layout(direction, api_key, version)
            assert ours is not None, f"{release}: {info['name']} v{version} {direction} is not in the table"
            assert protocol._decoder(direction, api_key, version) is not None
            if (api_key, version) in unstable:
                continue  # revised later without a version bump (3.9's early share-group APIs)
            assert ours[0] == info["flexible"], f"{release}: {info['name']} v{version} {direction}"
            assert _wire(ours[1]) == _wire(info["layout"]), (
                f"{release}: {info['name']} v{version} {direction}"
            )
            checked += 1
    assert checked > 500


def test_every_version_in_the_table_compiles() -> None:
    for direction in ("request", "response"):
        for api_key, version in protocol.all_versions(direction):
            assert protocol._decoder(direction, api_key, version) is not None, (direction, api_key, version)


def test_every_defined_key_and_the_newest_versions() -> None:
    table = json.loads((REPO / "decoder" / "kafka_protocol.json").read_text())
    assert {int(k) for k in table["apis"]} == set(range(0, 95))
    assert protocol.version_range(0) == (0, 13)  # Produce: 0-2 from 2024 (removed in 4.0), 3-13 from the jar
    assert protocol.version_range(1) == (0, 18)  # Fetch
    assert protocol.version_range(3) == (0, 13)  # Metadata
    assert protocol.version_range(4) == (0, 7)  # LeaderAndIsr: inter-broker, removed in 4.0
    assert protocol.version_range(18) == (0, 5)  # ApiVersions
    assert protocol.version_range(52) == (0, 2)  # Vote (KRaft)
    assert protocol.version_range(63) == (0, 2)  # BrokerHeartbeat (broker to controller)
    assert protocol.version_range(78) == (0, 2)  # ShareFetch: v0 early access (2024), v1-2 from the jar
    assert protocol.version_range(80) == (0, 1)  # AddRaftVoter
    assert protocol.version_range(88) == (0, 1)  # StreamsGroupHeartbeat
    assert protocol.version_range(94) == (0, 0)  # UnregisterController
    assert protocol.api_name(74) == "ListConfigResources"  # the newest name (was ListClientMetricsResources)
    assert protocol.api_name(93) == "StreamsGroupTopologyDescriptionUpdate"


@pytest.mark.parametrize(
    ("api_key", "version", "request_header", "response_header"),
    [
        (7, 0, 0, 0),  # ControlledShutdown v0: request header v0
        (7, 3, 2, 1),
        (18, 3, 2, 0),  # ApiVersions: response header v0 even when flexible
        (18, 5, 2, 0),
        (0, 8, 1, 0),
        (0, 9, 2, 1),  # Produce v9 is the first flexible version
        (3, 9, 2, 1),
        (52, 2, 2, 1),
    ],
)
def test_header_versions(api_key: int, version: int, request_header: int, response_header: int) -> None:
    assert protocol.request_header_version(api_key, version) == request_header
    assert protocol.response_header_version(api_key, version) == response_header


def test_client_id_keeps_its_int16_length_in_flexible_headers() -> None:
    client_id = protocol.header_layout("request", 2)[3]
    assert client_id[0] == "ClientId" and client_id[2] & 2  # classic (non-compact) encoding flag


def test_tags_are_integers_even_where_a_definition_spells_them_as_strings(shared_messages: Path) -> None:
    apis, _ = compile_source(shared_messages)  # the 2024 BrokerHeartbeatRequest has "tag": "0"
    offline_log_dirs = apis[(63, "request")][1]["layout"][-1]
    assert offline_log_dirs[0] == "OfflineLogDirs" and offline_log_dirs[3] == 0


def test_error_codes() -> None:
    assert protocol.ERRORS[56] == ("KAFKA_STORAGE_ERROR", True, True)
    assert protocol.ERRORS[6][0] == "NOT_LEADER_OR_FOLLOWER"
    assert protocol.error_name(0) == "NONE" and protocol.error_name(9999) == "UNKNOWN_CODE_9999"


def test_generator_is_rerunnable_from_the_command_line(
    shared_messages: Path, pinned_jar: Path, tmp_path: Path
) -> None:
    from decoder.generate_protocol import main

    out = tmp_path / "table.json"
    errors = ["--errors", str(SHARED / "error_codes.tsv"), "-o", str(out)]
    assert main(["--messages", str(shared_messages), "--messages", str(pinned_jar), *errors]) == 0
    assert out.read_text() == (REPO / "decoder" / "kafka_protocol.json").read_text()
    assert main(["--messages", str(pinned_jar), *errors]) == 0  # the jar alone: without what 4.0 removed
    jar_only = json.loads(out.read_text())["apis"]
    assert "4" not in jar_only and "7" not in jar_only and min(map(int, jar_only["0"]["request"])) == 3
    assert main(["--messages", str(tmp_path / "missing"), *errors]) == 2
    not_a_jar = tmp_path / "empty.jar"
    with zipfile.ZipFile(not_a_jar, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    assert main(["--messages", str(not_a_jar), *errors]) == 2
