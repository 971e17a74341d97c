"""Compile Kafka's JSON message definitions into kwire's protocol table.

Usage::

    python -m decoder.generate_protocol          # the two default sources below
    python -m decoder.generate_protocol \\
        --messages ../shared/kafka-protocol/messages \\
        --messages .cache/m2/org/apache/kafka/kafka-clients/4.4.0/kafka-clients-4.4.0.jar \\
        --errors ../shared/kafka-protocol/error_codes.tsv \\
        -o decoder/kafka_protocol.json

Each ``--messages`` source is a folder of ``*Request.json`` / ``*Response.json`` files in
Kafka's own format (``//`` comments allowed) or a kafka-clients jar, whose
``common/message/*.json`` are read from the zip. Sources are merged per (api key, direction,
version): a version defined in only one source is taken from there; where several define it,
the source given last wins (give the newest definitions last). Without ``--messages`` the
sources are Kafka's October-2024 definitions in ``shared/`` (they still hold the versions and
inter-broker APIs Kafka 4.0 removed: Produce v0-2, LeaderAndIsr, ...) and then the
kafka-clients jar pinned in ``decoder.fetch_definitions`` (every API Kafka 4.x speaks, client,
broker, controller and KRaft alike), fetched into ``.cache/m2`` with Maven if absent. Nothing
but this script's output is committed; the definition files stay where they are.

The table resolves every version on its own: for (api key, direction, version) it lists
exactly the fields on the wire, each with its type, nullability, tag (if tagged in that
version) and *role*. A role names what kwire extracts from a field ("error_code", "topic",
"partition", ...); fields without a role, and structs that hold none, are skipped by length
when decoding. Roles are assigned here, from field names and entity types, so the decoder
knows nothing about individual APIs.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from decoder.fetch_definitions import FetchError, fetch_kafka_clients, kafka_clients_jar

TABLE_FORMAT = 1

PRIMITIVES: dict[str, str] = {
    "bool": "1 byte, 0 or 1",
    "int8": "signed 8-bit",
    "int16": "signed 16-bit big-endian",
    "int32": "signed 32-bit big-endian",
    "int64": "signed 64-bit big-endian",
    "uint16": "unsigned 16-bit big-endian",
    "float64": "IEEE 754 double, big-endian",
    "uuid": "16 bytes",
    "string": "int16 length + UTF-8 (flexible: unsigned varint length+1); nullable: -1 / 0",
    "bytes": "int32 length + bytes (flexible: unsigned varint length+1); nullable: -1 / 0",
    "records": "like nullable bytes; holds record batches or legacy message sets",
    "array": "int32 count + items (flexible: unsigned varint count+1); nullable: -1 / 0",
    "varint": "zig-zag signed varint (inside records)",
    "varlong": "zig-zag signed varlong (inside records)",
    "unsigned_varint": "LEB128 unsigned varint (lengths, tags in flexible versions)",
    "tagged_fields": "unsigned varint count, then (tag, size, bytes) per field",
}

# Roles by (field name, field type). A role is what kwire keeps from a field.
ROLE_BY_NAME_AND_TYPE: dict[tuple[str, str], str] = {
    ("ErrorCode", "int16"): "error_code",
    ("PartitionErrorCode", "int16"): "error_code",
    ("ThrottleTimeMs", "int32"): "throttle_time_ms",
    ("TopicId", "uuid"): "topic_id",
    ("PartitionIndex", "int32"): "partition",
    ("Partition", "int32"): "partition",
    ("PartitionId", "int32"): "partition",
    ("Index", "int32"): "partition",
    ("Acks", "int16"): "acks",
    ("TimeoutMs", "int32"): "timeout_ms",
    ("MemberId", "string"): "member_id",
    ("GenerationId", "int32"): "generation_id",
    ("GenerationIdOrMemberEpoch", "int32"): "generation_id",
    ("MemberEpoch", "int32"): "generation_id",
    ("Key", "string"): "coordinator_key",
    ("KeyType", "int8"): "coordinator_key_type",
    ("CoordinatorKeys", "[]string"): "coordinator_key",
    ("NodeId", "int32"): "node_id",
    ("BrokerId", "int32"): "node_id",
    ("Host", "string"): "host",
    ("Port", "int32"): "port",
    ("Rack", "string"): "rack",
    ("ControllerId", "int32"): "controller_id",
    ("LeaderId", "int32"): "leader",
    ("LeaderEpoch", "int32"): "leader_epoch",
    ("ReplicaNodes", "[]int32"): "replicas",
    ("IsrNodes", "[]int32"): "isr",
    ("ApiKey", "int16"): "api_key",
    ("MinVersion", "int16"): "min_version",
    ("MaxVersion", "int16"): "max_version",
    ("ClientSoftwareName", "string"): "client_software_name",
    ("ClientSoftwareVersion", "string"): "client_software_version",
    ("Mechanism", "string"): "sasl_mechanism",
    ("HighWatermark", "int64"): "high_watermark",
    ("BaseOffset", "int64"): "base_offset",
    ("LogStartOffset", "int64"): "log_start_offset",
    ("ResourceName", "string"): "resource",
}

_ROLES_CASELESS = {(name.lower(), ftype): role for (name, ftype), role in ROLE_BY_NAME_AND_TYPE.items()}

# Roles by entity type, for string fields (and arrays of strings).
ROLE_BY_ENTITY_TYPE: dict[str, str] = {
    "topicName": "topic",
    "groupId": "group_id",
    "transactionalId": "transactional_id",
}

# Field names whose value must never be kept, whatever the rules above say.
NEVER_KEPT = {"AuthBytes", "Metadata", "Assignment", "Data", "Value", "Headers"}

_NEVER_KEPT_CASELESS = {name.lower() for name in NEVER_KEPT}

# Header rules the JSON cannot express (see KIP-482 and the ApiVersions exception).
HEADER_RULES = {
    "request_header_version": "2 if the api version is flexible else 1",
    "response_header_version": "1 if the api version is flexible else 0",
    "request_header_v0": [[7, 0]],  # ControlledShutdown v0 uses request header v0
    "response_header_v0_always": [18],  # ApiVersions responses always use response header v0
}


def _strip_comments(text: str) -> str:
    """Remove ``//`` comments outside strings (Kafka's JSON files carry license headers)."""
    out_lines = []
    for line in text.splitlines():
        in_string = False
        escaped = False
        cut = len(line)
        for i, ch in enumerate(line):
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                cut = i
                break
        out_lines.append(line[:cut])
    return "\n".join(out_lines)


def load_definition(path: Path) -> dict[str, Any]:
    """Parse one Kafka message definition file."""
    return json.loads(_strip_comments(path.read_text(encoding="utf-8")))


JAR_MESSAGES = "common/message/"


def load_definitions(source: Path) -> Iterator[dict[str, Any]]:
    """Every definition in a folder (``*.json``) or a jar (``common/message/*.json``), by file name."""
    if source.is_dir():
        for path in sorted(source.glob("*.json")):
            yield load_definition(path)
        return
    with zipfile.ZipFile(source) as jar:
        names = sorted(
            n
            for n in jar.namelist()
            if n.startswith(JAR_MESSAGES) and n.endswith(".json") and n.count("/") == 2
        )
        if not names:
            raise ValueError(f"{source}: no {JAR_MESSAGES}*.json inside")
        for name in names:
            yield json.loads(_strip_comments(jar.read(name).decode("utf-8")))


class VersionRange:
    """A Kafka version spec: ``"0+"``, ``"3-5"``, ``"7"`` or ``"none"``."""

    __slots__ = ("high", "low")

    def __init__(self, spec: str | None) -> None:
        spec = (spec or "none").strip()
        if spec == "none":
            self.low, self.high = 1, 0
        elif spec.endswith("+"):
            self.low, self.high = int(spec[:-1]), 1 << 15
        elif "-" in spec:
            low, high = spec.split("-")
            self.low, self.high = int(low), int(high)
        else:
            self.low = self.high = int(spec)

    def __contains__(self, version: int) -> bool:
        return self.low <= version <= self.high


def _role(field: dict[str, Any]) -> str | None:
    name, ftype = field["name"], field["type"]
    if ftype == "records":
        return "records"  # summarised from batch headers, never kept
    if name.lower() in _NEVER_KEPT_CASELESS:
        return None
    role = _ROLES_CASELESS.get((name.lower(), ftype))  # Kafka's JSON is not consistent in case
    if role is None and ftype in ("string", "[]string"):
        role = ROLE_BY_ENTITY_TYPE.get(field.get("entityType", ""))
    return role


class _Compiler:
    """Resolves one definition file into a field layout per version."""

    def __init__(self, definition: dict[str, Any]) -> None:
        self.definition = definition
        self.common = {s["name"]: s for s in definition.get("commonStructs", [])}
        self.inline: dict[str, dict[str, Any]] = {}
        self._collect_inline(definition.get("fields", []))
        for struct in self.common.values():
            self._collect_inline(struct["fields"])

    def _collect_inline(self, fields: list[dict[str, Any]]) -> None:
        for field in fields:
            if "fields" in field:
                self.inline.setdefault(field["type"].removeprefix("[]"), field)
                self._collect_inline(field["fields"])

    def _struct_fields(self, field: dict[str, Any]) -> list[dict[str, Any]]:
        if "fields" in field:
            return field["fields"]
        struct_name = field["type"].removeprefix("[]")
        if struct_name in self.common:
            return self.common[struct_name]["fields"]
        if struct_name in self.inline:
            return self.inline[struct_name]["fields"]
        raise ValueError(f"{self.definition['name']}: unknown struct type {field['type']}")

    def layout(self, version: int, fields: list[dict[str, Any]] | None = None) -> list[list[Any]]:
        """The wire layout of ``fields`` at ``version``: [name, type, flags, tag, role, children]."""
        if fields is None:
            fields = self.definition.get("fields", [])
        out: list[list[Any]] = []
        for field in fields:
            if version not in VersionRange(field.get("versions")):
                continue
            ftype: str = field["type"]
            flags = 0
            if version in VersionRange(field.get("nullableVersions")):
                flags |= 1
            if "flexibleVersions" in field and version not in VersionRange(field["flexibleVersions"]):
                flags |= 2  # classic (non-compact) encoding even in a flexible version
            tag = None
            if version in VersionRange(field.get("taggedVersions")):
                tag = int(field["tag"])  # some definitions spell it as a string ("0")
            children: list[list[Any]] | None = None
            element = ftype.removeprefix("[]")
            if element not in PRIMITIVES:
                children = self.layout(version, self._struct_fields(field))
                ftype = "[]" if ftype.startswith("[]") else "{}"
            out.append([field["name"], ftype, flags, tag, _role(field), children])
        return out


def compile_source(source: Path) -> tuple[dict[tuple[int, str], dict[int, dict[str, Any]]], dict[str, Any]]:
    """Compile every message definition in ``source`` (a folder or a jar).

    Returns ``{(api_key, "request"|"response"): {version: {"name", "flexible", "layout"}}}``
    and the header layouts found (``{"request"|"response": {version: layout}}``).
    """
    apis: dict[tuple[int, str], dict[int, dict[str, Any]]] = {}
    headers: dict[str, dict[int, list[list[Any]]]] = {}
    for definition in load_definitions(source):
        kind = definition.get("type")
        if kind == "header":
            direction = "request" if definition["name"] == "RequestHeader" else "response"
            valid = VersionRange(definition["validVersions"])
            compiler = _Compiler(definition)
            headers[direction] = {v: compiler.layout(v) for v in range(valid.low, valid.high + 1)}
            continue
        if kind not in ("request", "response") or "apiKey" not in definition:
            continue
        valid = VersionRange(definition["validVersions"])
        flexible = VersionRange(definition.get("flexibleVersions"))
        compiler = _Compiler(definition)
        per_version = apis.setdefault((definition["apiKey"], kind), {})
        for version in range(valid.low, valid.high + 1):
            per_version[version] = {
                "name": re.sub(r"(Request|Response)$", "", definition["name"]),
                "flexible": version in flexible,
                "layout": compiler.layout(version),
            }
    return apis, headers


def load_error_codes(path: Path) -> dict[str, list[Any]]:
    """``{code: [name, retriable, invalid_metadata]}`` from error_codes.tsv."""
    out: dict[str, list[Any]] = {}
    with path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            out[row["code"]] = [
                row["name"],
                row["retriable"].strip().lower() == "true",
                row["invalid_metadata"].strip().lower() == "true",
            ]
    return out


def build_table(message_sources: list[Path], error_codes: Path) -> dict[str, Any]:
    """Merge the sources (folders or jars, later wins per version) and return the protocol table."""
    merged: dict[tuple[int, str], dict[int, dict[str, Any]]] = {}
    headers: dict[str, dict[int, list[list[Any]]]] = {}
    for source in message_sources:
        apis, folder_headers = compile_source(source)
        for direction, versions in folder_headers.items():
            headers.setdefault(direction, {}).update(versions)
        for key, versions in apis.items():
            merged.setdefault(key, {}).update(versions)
    if set(headers) != {"request", "response"}:
        raise SystemExit("RequestHeader.json and ResponseHeader.json must be in one of the folders")

    layouts: list[list[list[Any]]] = []
    layout_ids: dict[str, int] = {}

    def intern(layout: list[list[Any]]) -> int:
        canonical = json.dumps(layout, separators=(",", ":"))
        if canonical not in layout_ids:
            layout_ids[canonical] = len(layouts)
            layouts.append(layout)
        return layout_ids[canonical]

    apis_out: dict[str, dict[str, Any]] = {}
    for (api_key, direction), versions in sorted(merged.items()):
        if not versions:
            continue  # "validVersions": "none" (an API Kafka removed) and no older source for it
        # the newest version's name: Kafka renames APIs (ListClientMetricsResources -> ListConfigResources)
        entry = apis_out.setdefault(str(api_key), {"name": versions[max(versions)]["name"]})
        entry[direction] = {
            str(v): [int(info["flexible"]), intern(info["layout"])] for v, info in sorted(versions.items())
        }

    header_out = {
        direction: {str(v): layout for v, layout in sorted(versions.items())}
        for direction, versions in sorted(headers.items())
    }
    return {
        "format": TABLE_FORMAT,
        "primitives": PRIMITIVES,
        "header_rules": HEADER_RULES,
        "headers": header_out,
        "apis": apis_out,
        "layouts": layouts,
        "errors": load_error_codes(error_codes),
    }


def render(table: dict[str, Any]) -> str:
    """Serialise the table: one layout or api per line, so diffs stay readable."""
    lines = ["{"]
    items = list(table.items())
    for index, (key, value) in enumerate(items):
        comma = "," if index < len(items) - 1 else ""
        if key in ("apis", "layouts", "errors", "headers") and value:
            is_list = isinstance(value, list)
            lines.append(f'"{key}": ' + ("[" if is_list else "{"))
            entries = list(value) if is_list else list(value.items())
            for i, entry in enumerate(entries):
                sep = "," if i < len(entries) - 1 else ""
                if is_list:
                    lines.append(json.dumps(entry, separators=(",", ":")) + sep)
                else:
                    lines.append(f"{json.dumps(entry[0])}:{json.dumps(entry[1], separators=(',', ':'))}{sep}")
            lines.append(("]" if is_list else "}") + comma)
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, separators=(',', ':'))}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


SHARED_PROTOCOL = Path(__file__).resolve().parent.parent.parent / "shared" / "kafka-protocol"


def default_message_sources() -> list[Path]:
    """The sources the committed table is generated from, oldest first (present or not).

    Kafka's October-2024 definitions (for what Kafka 4.0 removed), then the pinned
    kafka-clients jar in the project's Maven cache (``decoder.fetch_definitions``).
    """
    return [SHARED_PROTOCOL / "messages", kafka_clients_jar()]


def _usable(source: Path) -> bool:
    return source.is_dir() or (source.is_file() and zipfile.is_zipfile(source))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages",
        action="append",
        type=Path,
        help="folder of Kafka JSON message definitions, or a kafka-clients jar (repeatable; later wins)",
    )
    parser.add_argument("--errors", type=Path, help="error_codes.tsv")
    parser.add_argument("-o", "--output", type=Path, default=Path(__file__).with_name("kafka_protocol.json"))
    args = parser.parse_args(argv)
    sources = args.messages
    if not sources:
        try:
            fetch_kafka_clients()
        except FetchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        sources = default_message_sources()
    errors = args.errors or SHARED_PROTOCOL / "error_codes.tsv"
    for source in sources:
        if not _usable(source):
            print(f"error: not a definitions folder or jar: {source}", file=sys.stderr)
            return 2
    if not errors.is_file():
        print(f"error: no such error code table: {errors}", file=sys.stderr)
        return 2
    try:
        table = build_table(sources, errors)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.output.write_text(render(table), encoding="utf-8")
    n_versions = sum(len(d) for api in table["apis"].values() for k, d in api.items() if k != "name")
    print(
        f"wrote {args.output}: {len(table['apis'])} api keys, {n_versions} (key, direction, version) "
        f"entries, {len(table['layouts'])} distinct layouts, {len(table['errors'])} error codes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
