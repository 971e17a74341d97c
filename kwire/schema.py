"""The kwire dataset schema: defined once here, imported by every writer and reader.

A dataset directory holds two Hive-partitioned Parquet tables:

* ``exchanges/date=YYYY-MM-DD/*.parquet``: one row per request (with its response, if any)
  and one per response whose request was never seen.
* ``connections/date=YYYY-MM-DD/*.parquet``: one row per TCP connection.

Every column carries a one-line description (``COLUMN_DOCS``) that the README reproduces.
"""

from __future__ import annotations

import pyarrow as pa

from decoder.records import MAX_BATCHES_KEPT, MAX_MESSAGE_CRCS_KEPT

__all__ = [
    "BATCH_TYPE",
    "CONNECTIONS_SCHEMA",
    "CONNECTION_COLUMNS",
    "EXCHANGES_SCHEMA",
    "EXCHANGE_COLUMNS",
    "EXCHANGE_STATUSES",
    "PARTITION_ERROR_TYPE",
    "column_docs_markdown",
]

#: Values of ``exchanges.status``.
EXCHANGE_STATUSES = (
    "ok",  # request and its response both decoded
    "no_response_expected",  # Produce with acks=0
    "unanswered",  # request seen, no response before the connection ended or the capture stopped
    "orphan_response",  # response whose request was never seen
    "unknown_api",  # api key/version kwire has no definition for (frame skipped by its length)
    "malformed",  # frame whose body did not decode; decode_error says why
    "truncated",  # frame cut by a gap in the capture or by its end
    "gap",  # proxy: the recorder skipped bytes of the connection, so it cannot tell (decode_error says)
)

_TS = pa.timestamp("us", tz="UTC")

PARTITION_ERROR_TYPE = pa.struct(
    [
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("resource", pa.string()),
        pa.field("error_code", pa.int16()),
        # Produce responses: where the partition's batches landed (null elsewhere; -1 on error)
        pa.field("base_offset", pa.int64()),
        pa.field("log_start_offset", pa.int64()),  # Produce and Fetch v5+
    ]
)

#: One record batch (magic 2) or legacy message (magic 0/1) of a Produce request or a Fetch
#: response, from its header only: enough to tell a retry (same producer id, epoch, base
#: sequence and CRC) from a new batch and to follow a batch from Produce to its ack
#: (``partition_errors.base_offset``) to a Fetch, without keeping a payload byte. The broker
#: may rewrite a batch header it stores, and then its CRC: seen with sarama, which writes a
#: max timestamp of -1 that Kafka corrects (also LogAppendTime topics, format conversion).
#: From ack to Fetch, follow a batch by (topic, partition, acked base offset) and check its
#: producer id, base sequence, record count and first timestamp; the CRC is for retries.
BATCH_TYPE = pa.struct(
    [
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        # Fetch: offset of the batch's first record (legacy compressed wrapper: of its first
        # inner message). Null in Produce requests, where the broker has not assigned it yet.
        pa.field("base_offset", pa.int64()),
        # last offset - base offset (v2: lastOffsetDelta; legacy plain message: 0; legacy
        # wrapper: range of its inner messages, null when they could not be read)
        pa.field("last_offset_delta", pa.int32()),
        pa.field("partition_leader_epoch", pa.int32()),  # v2 only; clients write -1
        pa.field("magic", pa.int8()),  # 2: record batch; 0/1: legacy message
        pa.field("crc", pa.int64()),  # unsigned 32-bit CRC (v2: CRC-32C of the batch; legacy: CRC-32)
        pa.field("compression", pa.string()),  # none, gzip, snappy, lz4, zstd (null: invalid codec)
        pa.field("transactional", pa.bool_()),
        pa.field("control", pa.bool_()),  # transaction marker batch
        pa.field("producer_id", pa.int64()),  # v2 only; -1 when not idempotent
        pa.field("producer_epoch", pa.int16()),  # v2 only
        pa.field("base_sequence", pa.int32()),  # v2 only; -1 when not idempotent (aiokafka, sarama: 0)
        pa.field("record_count", pa.int32()),  # as the header says (legacy: 1, or a wrapper's inner count)
        pa.field("first_timestamp_ms", pa.int64()),  # v2 baseTimestamp; magic 1 message timestamp
        pa.field("max_timestamp_ms", pa.int64()),  # v2 maxTimestamp; magic 1 (wrapper) timestamp
        # legacy compressed wrapper only: its inner messages' CRCs (the broker may rewrite the
        # wrapper, and so its CRC, when it assigns offsets; the inner CRCs survive)
        pa.field("message_crcs", pa.list_(pa.int64())),
    ]
)

_BROKER_TYPE = pa.struct(
    [
        pa.field("node_id", pa.int32()),
        pa.field("host", pa.string()),
        pa.field("port", pa.int32()),
        pa.field("rack", pa.string()),
    ]
)

_METADATA_PARTITION_TYPE = pa.struct(
    [
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("error_code", pa.int16()),
        pa.field("leader", pa.int32()),
        pa.field("leader_epoch", pa.int32()),
        pa.field("replicas", pa.list_(pa.int32())),
        pa.field("isr", pa.list_(pa.int32())),
    ]
)

_API_VERSION_TYPE = pa.struct(
    [
        pa.field("api_key", pa.int16()),
        pa.field("min_version", pa.int16()),
        pa.field("max_version", pa.int16()),
    ]
)

_COORDINATOR_TYPE = pa.struct(
    [
        pa.field("key", pa.string()),
        pa.field("node_id", pa.int32()),
        pa.field("host", pa.string()),
        pa.field("port", pa.int32()),
        pa.field("error_code", pa.int16()),
    ]
)

_FETCH_PARTITION_TYPE = pa.struct(
    [
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("high_watermark", pa.int64()),
        pa.field("record_batches", pa.int32()),
        pa.field("records", pa.int64()),
    ]
)

# (name, type, description). Order is the column order on disk.
EXCHANGE_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("source", pa.string(), "where the row came from: capture file name, or proxy:<listen address>"),
    (
        "connection_id",
        pa.string(),
        "TCP connection id, unique within the source; joins connections.connection_id",
    ),
    ("client_ip", pa.string(), "client address"),
    ("client_port", pa.int32(), "client TCP port"),
    ("broker_ip", pa.string(), "broker address"),
    ("broker_port", pa.int32(), "broker TCP port"),
    ("request_time", _TS, "time the request's first byte was seen (null for an orphan response)"),
    ("response_time", _TS, "time the response's last byte was seen (null when there is none)"),
    ("latency_us", pa.int64(), "response_time - request_time in microseconds"),
    ("api_key", pa.int16(), "Kafka API key"),
    ("api_name", pa.string(), "Kafka API name, e.g. Produce, Metadata"),
    ("api_version", pa.int16(), "API version of the request"),
    ("request_header_version", pa.int8(), "request header version (0, 1 or 2)"),
    ("correlation_id", pa.int32(), "correlation id shared by the request and its response"),
    ("client_id", pa.string(), "client id from the request header"),
    ("client_software_name", pa.string(), "ClientSoftwareName of the connection's ApiVersions v3+ request"),
    (
        "client_software_version",
        pa.string(),
        "ClientSoftwareVersion of the connection's ApiVersions v3+ request",
    ),
    ("request_size", pa.int32(), "request frame size in bytes, including the 4-byte length prefix"),
    ("response_size", pa.int32(), "response frame size in bytes, including the 4-byte length prefix"),
    (
        "status",
        pa.string(),
        "ok, no_response_expected, unanswered, orphan_response, unknown_api, malformed, truncated, gap",
    ),
    ("error_code", pa.int16(), "top-level error code of the response (null where the response has none)"),
    ("error_name", pa.string(), "name of error_code, e.g. NOT_COORDINATOR"),
    (
        "partition_errors",
        pa.list_(PARTITION_ERROR_TYPE),
        "every per-partition/topic/group/resource result of the response, error code 0 included; "
        "Produce results also carry base_offset (first offset of the acked batches) and "
        "log_start_offset (Fetch results: log_start_offset)",
    ),
    (
        "topics",
        pa.list_(pa.string()),
        "topic names named in the request (topic ids where the version uses ids)",
    ),
    ("acks", pa.int16(), "Produce: required acks (0, 1, -1)"),
    ("timeout_ms", pa.int32(), "request timeout field (Produce and others that carry one)"),
    ("transactional_id", pa.string(), "transactional id (Produce, transactional APIs)"),
    ("record_batches", pa.int32(), "Produce: record batches (or legacy message sets) in the request"),
    ("records", pa.int64(), "Produce: records in the request; Fetch: records in the response"),
    (
        "compression",
        pa.string(),
        "Produce: compression codecs used by the batches (none, gzip, snappy, lz4, zstd; comma-joined if mixed)",
    ),
    (
        "batches",
        pa.list_(BATCH_TYPE),
        "Produce requests and Fetch responses: each record batch's identity from its header (topic, "
        "partition, base offset (Fetch), leader epoch, CRC, producer id/epoch, base sequence, record count, "
        "timestamps, codec, transactional/control); legacy message sets: one entry per message, with inner "
        f"CRCs for compressed wrappers. Never a payload byte. At most {MAX_BATCHES_KEPT:,} batches and "
        f"{MAX_MESSAGE_CRCS_KEPT:,} inner CRCs per row; record_batches (Produce) and "
        "fetch_partitions.record_batches (Fetch) count them all",
    ),
    ("group_id", pa.string(), "consumer group id (group APIs)"),
    ("member_id", pa.string(), "group member id (request, or the one assigned in a JoinGroup response)"),
    ("generation_id", pa.int32(), "group generation id"),
    ("coordinator_key", pa.string(), "FindCoordinator: key asked for (comma-joined for v4+ batches)"),
    ("coordinator_key_type", pa.int8(), "FindCoordinator: 0 group, 1 transaction, 2 share"),
    ("coordinator_node", pa.int32(), "FindCoordinator: node id returned (first one for v4+)"),
    (
        "coordinators",
        pa.list_(_COORDINATOR_TYPE),
        "FindCoordinator: every coordinator returned, with its key",
    ),
    ("throttle_time_ms", pa.int32(), "throttle time the broker asked for"),
    ("metadata_brokers", pa.list_(_BROKER_TYPE), "Metadata/DescribeCluster responses: the brokers listed"),
    ("metadata_controller_id", pa.int32(), "Metadata responses: the controller id"),
    (
        "metadata_partitions",
        pa.list_(_METADATA_PARTITION_TYPE),
        "Metadata responses: every partition with leader, epoch, replicas, isr",
    ),
    (
        "fetch_partitions",
        pa.list_(_FETCH_PARTITION_TYPE),
        "Fetch responses: per partition high watermark and record counts",
    ),
    (
        "api_versions",
        pa.list_(_API_VERSION_TYPE),
        "ApiVersions responses: the advertised (api key, min, max) list",
    ),
    ("sasl_mechanism", pa.string(), "SaslHandshake: the mechanism asked for (credentials are never kept)"),
    ("decode_error", pa.string(), "why the frame did not decode (status malformed/truncated/unknown_api)"),
    (
        "injected",
        pa.bool_(),
        "proxy only: true when the proxy answered with an injected error itself (latency and close faults show in its metrics)",
    ),
    ("date", pa.string(), "partition column: UTC date (YYYY-MM-DD) of request_time, else response_time"),
]

CONNECTION_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("source", pa.string(), "where the row came from: capture file name, or proxy:<listen address>"),
    ("connection_id", pa.string(), "TCP connection id, unique within the source"),
    ("client_ip", pa.string(), "client address (the side that sent requests)"),
    ("client_port", pa.int32(), "client TCP port"),
    ("broker_ip", pa.string(), "broker address (the side that answered)"),
    ("broker_port", pa.int32(), "broker TCP port"),
    ("first_packet_time", _TS, "first packet seen"),
    ("last_packet_time", _TS, "last packet seen"),
    ("syn_seen", pa.bool_(), "the connection's SYN was captured"),
    ("end_reason", pa.string(), "how the capture saw it end: fin, rst, idle or open_at_end"),
    (
        "ended_by",
        pa.string(),
        "who ended it first: client_fin, broker_fin, client_rst, broker_rst, refused (the SYN was answered "
        "by a RST), syn_unanswered (no answer to the SYN); null when neither side ended it in the data "
        "(open at the capture's end, idle) or, from the proxy, when it cannot tell",
    ),
    ("end_time", _TS, "time of that first FIN or RST (null when ended_by is null or syn_unanswered)"),
    ("protocol", pa.string(), "kafka, tls or other"),
    ("client_id", pa.string(), "first client id seen on the connection"),
    ("bytes_to_broker", pa.int64(), "payload bytes client -> broker"),
    ("bytes_to_client", pa.int64(), "payload bytes broker -> client"),
    ("frames_to_broker", pa.int64(), "Kafka frames client -> broker"),
    ("frames_to_client", pa.int64(), "Kafka frames broker -> client"),
    ("gap_bytes_to_broker", pa.int64(), "bytes missing from the capture, client -> broker"),
    ("gap_bytes_to_client", pa.int64(), "bytes missing from the capture, broker -> client"),
    ("resyncs", pa.int32(), "times the decoder had to search for the next frame boundary"),
    ("dropped_rows", pa.int64(), "proxy only: exchange rows dropped because the writer fell behind"),
    ("date", pa.string(), "partition column: UTC date (YYYY-MM-DD) of first_packet_time"),
]


def _schema(columns: list[tuple[str, pa.DataType, str]]) -> pa.Schema:
    return pa.schema([pa.field(name, dtype, metadata={"description": doc}) for name, dtype, doc in columns])


EXCHANGES_SCHEMA = _schema(EXCHANGE_COLUMNS)
CONNECTIONS_SCHEMA = _schema(CONNECTION_COLUMNS)


def column_docs_markdown() -> str:
    """Both tables' columns as Markdown tables (the README's schema section)."""
    parts = []
    for title, columns in (("exchanges", EXCHANGE_COLUMNS), ("connections", CONNECTION_COLUMNS)):
        parts.append(f"#### `{title}`\n\n| column | type | meaning |\n|---|---|---|")
        parts.extend(f"| `{name}` | {dtype} | {doc} |" for name, dtype, doc in columns)
        parts.append("")
    return "\n".join(parts)
