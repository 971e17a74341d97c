"""From decoded fields (keyed by role) to the values an exchange row carries.

The compiled layouts hand back nested dicts whose leaf keys are roles ("error_code",
"topic", "partition", ...) assigned by the generator from Kafka's own field names and entity
types. Everything here works on roles, never on a particular API's layout, so a new API or
version is covered as soon as the table has it. Which roles feed which column is the only
knowledge written here.

This runs for every frame a decode sees, so the walks are written for speed: one recursive
function per direction, exact type checks (the layouts build plain dicts, lists and tuples),
and no per-node callbacks.

Record batches (Produce requests, Fetch responses) become ``batches`` entries: the identity
dicts ``decoder.records`` read from their headers, with the enclosing topic and partition,
at most ``MAX_BATCHES_KEPT`` per row (the counts columns count every batch).
"""

from __future__ import annotations

from typing import Any

from decoder.compiled import load
from decoder.records import (
    CODEC_OF,
    CODECS,
    MAX_BATCHES_KEPT,
    MAX_MESSAGE_CRCS_KEPT,
    RecordsSummary,
    batch_identity,
    codec_names,
)

__all__ = ["exchange_values", "request_values", "response_values"]

_METADATA = 3
_FIND_COORDINATOR = 10
_API_VERSIONS = 18
_DESCRIBE_CLUSTER = 60
_FETCH = 1
_RESOURCE_ROLES = ("resource", "group_id", "transactional_id", "coordinator_key", "member_id")
_CODEC_NAMES = tuple(codec_names(mask) for mask in range(1 << len(CODECS)))
_REQUEST_INTS = ("acks", "timeout_ms", "generation_id")
_REQUEST_STRS = (
    "transactional_id",
    "member_id",
    "client_software_name",
    "client_software_version",
    "sasl_mechanism",
)


def _add_strings(found: list[str], value: Any) -> None:
    """Append the string(s) in ``value`` not already in ``found``."""
    if type(value) is str:
        if value not in found:
            found.append(value)
    elif type(value) is list:
        for item in value:
            if type(item) is str and item not in found:
                found.append(item)


def _root_str(fields: dict[str, Any], role: str) -> str | None:
    value = fields.get(role)
    if type(value) is list:
        return ",".join(v for v in value if type(v) is str) or None
    return value if type(value) is str else None


def _root_int(fields: dict[str, Any], role: str) -> int | None:
    value = fields.get(role)
    return value if type(value) is int else None  # not bool: type() is exact


class _Batches:
    """The batch identities a row keeps, within the per-row caps."""

    __slots__ = ("crcs", "kept")

    def __init__(self) -> None:
        self.kept: list[dict[str, Any]] = []
        self.crcs = 0  # legacy inner message CRCs kept so far

    def add(
        self,
        entries: tuple[Any, ...],
        topic: str | None,
        topic_id: str | None,
        partition: Any,
        in_request: bool,
    ) -> None:
        """Keep a records field's batches (``RecordsSummary.entries``) with their topic and partition."""
        kept = self.kept
        room = MAX_BATCHES_KEPT - len(kept)
        if room <= 0:
            return
        if len(entries) > room:
            entries = entries[:room]
        if type(partition) is not int:
            partition = None
        for entry in entries:
            batch = batch_identity(entry, topic, topic_id, partition, in_request)
            crcs = batch["message_crcs"]
            if crcs:
                room = MAX_MESSAGE_CRCS_KEPT - self.crcs
                if len(crcs) > room:
                    batch["message_crcs"] = crcs = crcs[: max(room, 0)]
                self.crcs += len(crcs)
            kept.append(batch)


_API_VERSIONS_KEYS = frozenset(("api_key", "min_version", "max_version"))


def _api_versions_entry(node: dict[str, Any]) -> bool:
    """Whether a struct is exactly an ApiVersions ``ApiKeys`` entry (its layout's keys and no other):
    then ``_ResponseScan.scan`` would find nothing in it but the entry itself."""
    return len(node) == 3 and node.keys() == _API_VERSIONS_KEYS


def _child_structs(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The structs directly below a node (values that are dicts or lists of dicts), in order."""
    children: list[dict[str, Any]] = []
    for value in node.values():
        kind = type(value)
        if kind is dict:
            children.append(value)
        elif kind is list and value and type(value[0]) is dict:
            children.extend(value)
    return children


class _RequestScan:
    """What a request's structs name: topics, topic ids, groups, and its records' summary."""

    __slots__ = (
        "batch_identities",
        "batches",
        "codecs",
        "groups",
        "has_records",
        "records",
        "topic_ids",
        "topics",
    )

    def __init__(self) -> None:
        self.topics: list[str] = []
        self.topic_ids: list[str] = []
        self.groups: list[str] = []
        self.batches = self.records = self.codecs = 0
        self.has_records = False
        self.batch_identities: _Batches | None = None  # made on the first batch

    def scan(self, node: dict[str, Any], topic: str | None = None, topic_id: str | None = None) -> None:
        """Depth first: the node's own roles, then its children, which inherit its topic."""
        value = node.get("topic")
        if value is not None:
            _add_strings(self.topics, value)
            if type(value) is str:
                topic = value
        value = node.get("topic_id")
        if value is not None:
            _add_strings(self.topic_ids, value)
            if type(value) is str:
                topic_id = value
        value = node.get("group_id")
        if value is not None:
            _add_strings(self.groups, value)
        if "records" in node:
            self.has_records = True
            summary = node["records"]
            if type(summary) is RecordsSummary:
                self.batches += summary[0]
                self.records += summary[1]
                self.codecs |= summary[2]
                if summary.entries:
                    if self.batch_identities is None:
                        self.batch_identities = _Batches()
                    self.batch_identities.add(summary.entries, topic, topic_id, node.get("partition"), True)
        for value in node.values():
            kind = type(value)
            if kind is dict:
                self.scan(value, topic, topic_id)
            elif kind is list and value and type(value[0]) is dict:
                for child in value:
                    self.scan(child, topic, topic_id)


def request_values(api_key: int, fields: dict[str, Any] | None) -> dict[str, Any]:
    """Row values read from a request body (the reference of ``decoder._rowvalues``)."""
    if not fields:
        return {}
    found = _RequestScan()
    found.scan(fields)
    values: dict[str, Any] = {}
    topics = found.topics or found.topic_ids
    if topics:
        values["topics"] = topics
    for role in _REQUEST_INTS:
        value = fields.get(role)
        if type(value) is int:
            values[role] = value
    for role in _REQUEST_STRS:
        if fields.get(role) is not None:
            value = _root_str(fields, role)
            if value is not None:
                values[role] = value
    if found.groups:
        values["group_id"] = ",".join(found.groups)  # batched group APIs (OffsetFetch v8+) name several
    if found.has_records:
        values["record_batches"] = found.batches
        values["records"] = found.records
        values["batches"] = found.batch_identities.kept if found.batch_identities else []
        if found.codecs:
            values["compression"] = _CODEC_NAMES[found.codecs]
    if api_key == _FIND_COORDINATOR:
        key = _root_str(fields, "coordinator_key")
        if key is not None:
            values["coordinator_key"] = key
        key_type = _root_int(fields, "coordinator_key_type")
        if key_type is not None:
            values["coordinator_key_type"] = key_type
    return values


class _ResponseScan:
    """What a response's structs below the top level carry, each with its enclosing topic."""

    __slots__ = (
        "api_key",
        "api_versions",
        "batch_identities",
        "brokers",
        "coordinators",
        "fetch_partitions",
        "fetched_records",
        "has_records",
        "meta_partitions",
        "results",
    )

    def __init__(self, api_key: int) -> None:
        self.api_key = api_key
        self.results: list[dict[str, Any]] = []
        self.brokers: list[dict[str, Any]] = []
        self.meta_partitions: list[dict[str, Any]] = []
        self.fetch_partitions: list[dict[str, Any]] = []
        self.coordinators: list[dict[str, Any]] = []
        self.api_versions: list[dict[str, Any]] = []
        self.fetched_records = 0
        self.has_records = False
        self.batch_identities: _Batches | None = None  # made on the first batch

    def scan_below(self, root: dict[str, Any]) -> None:
        """Scan the structs below the top level (its own fields are read by name)."""
        topic = root.get("topic")
        topic_id = root.get("topic_id")
        topic = topic if type(topic) is str else None
        topic_id = topic_id if type(topic_id) is str else None
        for child in _child_structs(root):
            if self.api_key == _API_VERSIONS and _api_versions_entry(child):
                # ApiVersions answers carry ~60 of these: kept as decoded, not walked (the
                # walk was the recorder's largest single cost at 200 connections, issue 18)
                self.api_versions.append(child)
            else:
                self.scan(child, topic, topic_id)

    def scan(self, node: dict[str, Any], topic: str | None, topic_id: str | None) -> None:
        """Depth first: the node's own roles, then its children, which inherit its topic."""
        own = node.get("topic")
        if type(own) is str:
            topic = own
        own = node.get("topic_id")
        if type(own) is str:
            topic_id = own
        code = node.get("error_code")
        if type(code) is int:
            resource = None
            for role in _RESOURCE_ROLES:
                value = node.get(role)
                if type(value) is str:
                    resource = value
                    break
            self.results.append(
                {
                    "topic": topic,
                    "topic_id": topic_id,
                    "partition": node.get("partition"),
                    "resource": resource,
                    "error_code": code,
                    # Produce: where the batches landed, to follow them to their ack
                    "base_offset": node.get("base_offset"),
                    "log_start_offset": node.get("log_start_offset"),  # Produce v5+, Fetch v5+
                }
            )
        if "host" in node and "port" in node:
            self._endpoint(node)
        if "records" in node:
            self.has_records = True
            summary = node["records"]
            if type(summary) is RecordsSummary and summary.entries:
                if self.batch_identities is None:
                    self.batch_identities = _Batches()
                self.batch_identities.add(summary.entries, topic, topic_id, node.get("partition"), False)
        api_key = self.api_key
        if api_key == _METADATA:
            if "leader" in node:
                self.meta_partitions.append(
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
        elif api_key == _FETCH:
            if "high_watermark" in node:
                summary = node.get("records")
                batches, count = (summary[0], summary[1]) if type(summary) is RecordsSummary else (0, 0)
                self.fetched_records += count
                self.fetch_partitions.append(
                    {
                        "topic": topic,
                        "topic_id": topic_id,
                        "partition": node.get("partition"),
                        "high_watermark": node.get("high_watermark"),
                        "record_batches": batches,
                        "records": count,
                    }
                )
        elif api_key == _API_VERSIONS and "api_key" in node:
            self.api_versions.append(
                {
                    "api_key": node.get("api_key"),
                    "min_version": node.get("min_version"),
                    "max_version": node.get("max_version"),
                }
            )
        for value in node.values():
            kind = type(value)
            if kind is dict:
                self.scan(value, topic, topic_id)
            elif kind is list and value and type(value[0]) is dict:
                for child in value:
                    self.scan(child, topic, topic_id)

    def _endpoint(self, node: dict[str, Any]) -> None:
        """A broker endpoint (Metadata, DescribeCluster, node endpoints) or a coordinator."""
        if self.api_key == _FIND_COORDINATOR:
            self.coordinators.append(
                {
                    "key": node.get("coordinator_key"),
                    "node_id": node.get("node_id"),
                    "host": node.get("host"),
                    "port": node.get("port"),
                    "error_code": node.get("error_code"),
                }
            )
        else:
            self.brokers.append(
                {
                    "node_id": node.get("node_id"),
                    "host": node.get("host"),
                    "port": node.get("port"),
                    "rack": node.get("rack"),
                }
            )


def response_values(api_key: int, fields: dict[str, Any] | None) -> dict[str, Any]:
    """Row values read from a response body (the reference of ``decoder._rowvalues``)."""
    if not fields:
        return {}
    found = _ResponseScan(api_key)
    found.scan_below(fields)
    values: dict[str, Any] = {}
    for role in ("error_code", "throttle_time_ms"):
        value = fields.get(role)
        if type(value) is int:
            values[role] = value
    if found.results:
        values["partition_errors"] = found.results
    if found.has_records:
        values["batches"] = found.batch_identities.kept if found.batch_identities else []
    if fields.get("member_id") is not None:
        member_id = _root_str(fields, "member_id")
        if member_id is not None:
            values["member_id"] = member_id
    generation_id = fields.get("generation_id")
    if type(generation_id) is int:
        values["generation_id"] = generation_id
    if api_key in (_METADATA, _DESCRIBE_CLUSTER):
        values["metadata_brokers"] = found.brokers
        controller_id = _root_int(fields, "controller_id")
        if controller_id is not None:
            values["metadata_controller_id"] = controller_id
        if api_key == _METADATA:
            values["metadata_partitions"] = found.meta_partitions
    elif api_key == _FETCH:
        values["fetch_partitions"] = found.fetch_partitions
        values["records"] = found.fetched_records
    elif api_key == _API_VERSIONS:
        values["api_versions"] = found.api_versions
    elif api_key == _FIND_COORDINATOR:
        coordinators = found.coordinators
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
        if coordinators and coordinators[0]["node_id"] is not None:
            values["coordinator_node"] = coordinators[0]["node_id"]
    return values


# The same walks compiled (decoder/_rowvalues.c: why, and how it falls back to the functions
# above); KWIRE_PURE_PYTHON=1 leaves them out.
_rowvalues = load("_rowvalues", "compiled row values")
if _rowvalues is not None:
    _rowvalues.configure(
        RecordsSummary,
        batch_identity,
        CODEC_OF,
        _CODEC_NAMES,
        MAX_BATCHES_KEPT,
        MAX_MESSAGE_CRCS_KEPT,
        request_values,
        response_values,
    )
    _request_values = _rowvalues.request_values
    _response_values = _rowvalues.response_values
else:
    _request_values = request_values
    _response_values = response_values


def exchange_values(
    api_key: int, request_fields: dict[str, Any] | None, response_fields: dict[str, Any] | None
) -> dict[str, Any]:
    """Request values, overlaid by response values where the response knows better."""
    values = _request_values(api_key, request_fields)
    if not response_fields:
        return values
    for key, value in _response_values(api_key, response_fields).items():
        if key in values and (key == "member_id" or key == "generation_id" or key == "records"):
            # the request's own ids win, the response's fill in (JoinGroup assigns them); a
            # Produce request's record count is the one the row keeps
            continue
        values[key] = value
    return values
