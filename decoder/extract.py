"""From decoded fields (keyed by role) to the values an exchange row carries.

The compiled layouts hand back nested dicts whose leaf keys are roles ("error_code",
"topic", "partition", ...) assigned by the generator from Kafka's own field names and entity
types. Everything here works on roles, never on a particular API's layout, so a new API or
version is covered as soon as the table has it. Which roles feed which column is the only
knowledge written here.
"""

from __future__ import annotations

from typing import Any

from decoder.records import codec_names

__all__ = ["exchange_values", "request_values", "response_values"]

_METADATA = 3
_FIND_COORDINATOR = 10
_API_VERSIONS = 18
_DESCRIBE_CLUSTER = 60
_FETCH = 1
_RESOURCE_ROLES = ("resource", "group_id", "transactional_id", "coordinator_key", "member_id")


def _walk(node: dict[str, Any], topic: str | None, topic_id: str | None, visit, depth: int = 0) -> None:
    """Depth-first walk handing each struct its enclosing topic name and topic id."""
    own_topic = node.get("topic")
    if type(own_topic) is str:
        topic = own_topic
    own_id = node.get("topic_id")
    if type(own_id) is str:
        topic_id = own_id
    visit(node, topic, topic_id, depth)
    depth += 1
    # child structs: values that are dicts or lists of dicts (exact types: the layouts build
    # plain dicts and lists, and this runs for every struct of every frame)
    for value in node.values():
        kind = type(value)
        if kind is dict:
            _walk(value, topic, topic_id, visit, depth)
        elif kind is list and value and type(value[0]) is dict:
            for child in value:
                _walk(child, topic, topic_id, visit, depth)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _root_str(fields: dict[str, Any], role: str) -> str | None:
    value = fields.get(role)
    if isinstance(value, list):
        return ",".join(v for v in value if isinstance(v, str)) or None
    return value if isinstance(value, str) else None


def _root_int(fields: dict[str, Any], role: str) -> int | None:
    value = fields.get(role)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def request_values(api_key: int, fields: dict[str, Any] | None) -> dict[str, Any]:
    """Row values read from a request body."""
    if not fields:
        return {}
    topics: list[str] = []
    topic_ids: list[str] = []
    groups: list[str] = []
    batches = records = codecs = 0
    has_records = False

    def visit(node: dict[str, Any], _topic: str | None, _topic_id: str | None, _depth: int) -> None:
        nonlocal batches, records, codecs, has_records
        for name in _strings(node.get("topic")):
            if name not in topics:
                topics.append(name)
        for tid in _strings(node.get("topic_id")):
            if tid not in topic_ids:
                topic_ids.append(tid)
        for group in _strings(node.get("group_id")):
            if group not in groups:
                groups.append(group)
        summary = node.get("records")
        if isinstance(summary, tuple):
            has_records = True
            batches += summary[0]
            records += summary[1]
            codecs |= summary[2]
        elif "records" in node:
            has_records = True

    _walk(fields, None, None, visit)
    values: dict[str, Any] = {
        "topics": topics or topic_ids or None,
        "acks": _root_int(fields, "acks"),
        "timeout_ms": _root_int(fields, "timeout_ms"),
        "transactional_id": _root_str(fields, "transactional_id"),
        "group_id": ",".join(groups) or None,  # batched group APIs (OffsetFetch v8+) name several
        "member_id": _root_str(fields, "member_id"),
        "generation_id": _root_int(fields, "generation_id"),
        "client_software_name": _root_str(fields, "client_software_name"),
        "client_software_version": _root_str(fields, "client_software_version"),
        "sasl_mechanism": _root_str(fields, "sasl_mechanism"),
    }
    if has_records:
        values.update(record_batches=batches, records=records, compression=codec_names(codecs))
    if api_key == _FIND_COORDINATOR:
        values["coordinator_key"] = _root_str(fields, "coordinator_key")
        values["coordinator_key_type"] = _root_int(fields, "coordinator_key_type")
    return {k: v for k, v in values.items() if v is not None}


def response_values(api_key: int, fields: dict[str, Any] | None) -> dict[str, Any]:
    """Row values read from a response body."""
    if not fields:
        return {}
    results: list[dict[str, Any]] = []
    brokers: list[dict[str, Any]] = []
    meta_partitions: list[dict[str, Any]] = []
    fetch_partitions: list[dict[str, Any]] = []
    coordinators: list[dict[str, Any]] = []
    api_versions: list[dict[str, Any]] = []
    fetched_records = 0

    def visit(node: dict[str, Any], topic: str | None, topic_id: str | None, depth: int) -> None:
        nonlocal fetched_records
        if depth == 0:
            return
        code = node.get("error_code")
        if isinstance(code, int):
            resource = next((node[r] for r in _RESOURCE_ROLES if isinstance(node.get(r), str)), None)
            results.append(
                {
                    "topic": topic,
                    "topic_id": topic_id,
                    "partition": node.get("partition"),
                    "resource": resource,
                    "error_code": code,
                }
            )
        if "host" in node and "port" in node:
            entry = {
                "node_id": node.get("node_id"),
                "host": node.get("host"),
                "port": node.get("port"),
                "rack": node.get("rack"),
            }
            if api_key == _FIND_COORDINATOR:
                coordinators.append(
                    {
                        "key": node.get("coordinator_key"),
                        "node_id": entry["node_id"],
                        "host": entry["host"],
                        "port": entry["port"],
                        "error_code": node.get("error_code"),
                    }
                )
            else:
                brokers.append(entry)
        if api_key == _METADATA and "leader" in node:
            meta_partitions.append(
                {
                    "topic": topic,
                    "topic_id": topic_id,
                    "partition": node.get("partition"),
                    "error_code": node.get("error_code"),
                    "leader": node.get("leader"),
                    "leader_epoch": node.get("leader_epoch"),
                    "replicas": node.get("replicas"),
                    "isr": node.get("isr"),
                }
            )
        if api_key == _FETCH and "high_watermark" in node:
            summary = node.get("records")
            batches, count = (summary[0], summary[1]) if isinstance(summary, tuple) else (0, 0)
            fetched_records += count
            fetch_partitions.append(
                {
                    "topic": topic,
                    "topic_id": topic_id,
                    "partition": node.get("partition"),
                    "high_watermark": node.get("high_watermark"),
                    "record_batches": batches,
                    "records": count,
                }
            )
        if api_key == _API_VERSIONS and "api_key" in node:
            api_versions.append(
                {
                    "api_key": node.get("api_key"),
                    "min_version": node.get("min_version"),
                    "max_version": node.get("max_version"),
                }
            )

    _walk(fields, None, None, visit)
    values: dict[str, Any] = {
        "error_code": _root_int(fields, "error_code"),
        "throttle_time_ms": _root_int(fields, "throttle_time_ms"),
        "partition_errors": results or None,
        "member_id": _root_str(fields, "member_id"),
        "generation_id": _root_int(fields, "generation_id"),
    }
    if api_key in (_METADATA, _DESCRIBE_CLUSTER):
        values["metadata_brokers"] = brokers
        values["metadata_controller_id"] = _root_int(fields, "controller_id")
    if api_key == _METADATA:
        values["metadata_partitions"] = meta_partitions
    if api_key == _FETCH:
        values["fetch_partitions"] = fetch_partitions
        values["records"] = fetched_records
    if api_key == _API_VERSIONS:
        values["api_versions"] = api_versions
    if api_key == _FIND_COORDINATOR:
        if "host" in fields:  # v0-3: one coordinator at the top level
            coordinators.insert(
                0,
                {
                    "key": None,
                    "node_id": fields.get("node_id"),
                    "host": fields.get("host"),
                    "port": fields.get("port"),
                    "error_code": fields.get("error_code"),
                },
            )
        values["coordinators"] = coordinators
        values["coordinator_node"] = coordinators[0]["node_id"] if coordinators else None
    return {k: v for k, v in values.items() if v is not None}


def exchange_values(
    api_key: int, request_fields: dict[str, Any] | None, response_fields: dict[str, Any] | None
) -> dict[str, Any]:
    """Request values, overlaid by response values where the response knows better."""
    values = request_values(api_key, request_fields)
    for key, value in response_values(api_key, response_fields).items():
        if key in ("member_id", "generation_id") and key in values:
            continue  # the request's own ids win; the response's fill in (JoinGroup assigns them)
        if key == "records" and "records" in values:
            continue
        values[key] = value
    return values
