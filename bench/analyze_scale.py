"""Benchmark: the full kwire analysis on synthetic datasets of 1M and 10M exchanges.

    python bench/analyze_scale.py [--sizes 1000000,10000000] [--master local[2]] [--workdir DIR]

For each size it synthesizes a dataset (vectorised with numpy/pyarrow, written in the dataset
layout), runs every Spark job on ``local[2]`` writing their Parquet results, and runs the same
headline queries on Spark SQL and on DuckDB over the same files as a reference. Prints rows/s
and how the time grows from one size to the next. Target: 10M rows analysed in under 2 minutes
on 2 cores. The per-result times are the writes only: shared intermediates are computed
(checkpointed) while the jobs build their results. For each job's Spark jobs and task time from
Spark's event log: ``--keep --workdir DIR``, then ``bench/analyze_profile.py DIR/ds_<N>
--master local[2]`` (with ``KWIRE_SPARK_PROFILE=large``, as here).

The mix: 60 clients (Java, librdkafka, sarama, kafka-python, some that announce no software;
one client id shared by three hosts), 3 brokers, Produce/Fetch-heavy traffic with Metadata,
group and coordinator APIs, a KAFKA_STORAGE_ERROR episode on broker 2 with its leaders moving
to broker 3, a NOT_COORDINATOR storm, unanswered requests, acks 0/1/all producers, reconnects,
and every Produce request's record batches (one v2 batch per partition; a batch after a failed
one of its client and partition is its retry, with the same identity), so that the delivery and
error_reaction jobs follow batches as on real traffic (before 2026-11-29 there were none).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kwire.schema import CONNECTIONS_SCHEMA, EXCHANGES_SCHEMA

START_US = 1_714_604_400_000_000  # 2024-05-01T23:00:00Z: the window crosses midnight (2 dates)
WINDOW_S = 7200
BROKERS = [("10.1.0.1", 1), ("10.1.0.2", 2), ("10.1.0.3", 3)]

# api key -> (name, weight, latency median ms)
APIS = {
    0: ("Produce", 0.34, 4.0),
    1: ("Fetch", 0.34, 120.0),
    2: ("ListOffsets", 0.02, 2.0),
    3: ("Metadata", 0.02, 2.0),
    8: ("OffsetCommit", 0.07, 3.0),
    9: ("OffsetFetch", 0.02, 2.0),
    10: ("FindCoordinator", 0.01, 1.0),
    11: ("JoinGroup", 0.005, 30.0),
    12: ("Heartbeat", 0.12, 1.0),
    14: ("SyncGroup", 0.005, 5.0),
    18: ("ApiVersions", 0.005, 0.5),
    22: ("InitProducerId", 0.005, 2.0),
}
# software -> (name, version, max version per api key, share of clients)
SOFTWARE = [
    (
        "apache-kafka-java",
        "3.7.0",
        {0: 10, 1: 16, 2: 8, 3: 12, 8: 9, 9: 9, 10: 4, 11: 9, 12: 4, 14: 5, 18: 3, 22: 4},
    ),
    ("librdkafka", "2.3.0", {0: 9, 1: 11, 2: 7, 3: 12, 8: 8, 9: 8, 10: 2, 11: 5, 12: 3, 14: 3, 18: 3, 22: 4}),
    ("sarama", "1.42.1", {0: 7, 1: 11, 2: 4, 3: 7, 8: 7, 9: 7, 10: 2, 11: 5, 12: 3, 14: 3, 18: 3, 22: 4}),
    (
        None,
        None,
        {0: 8, 1: 11, 2: 5, 3: 9, 8: 8, 9: 8, 10: 3, 11: 6, 12: 4, 14: 4, 18: 2, 22: 3},
    ),  # kafka-python-ish
    (
        "confluent-kafka-go",
        "2.2.0",
        {0: 2, 1: 11, 2: 7, 3: 12, 8: 8, 9: 8, 10: 2, 11: 5, 12: 3, 14: 3, 18: 3, 22: 4},
    ),
]
N_CLIENTS = 60
TOPICS = [f"topic-{i:02d}" for i in range(40)]
PARTS_PER_TOPIC = 6


def _strings(values: list[str | None], idx: np.ndarray) -> pa.Array:
    return pa.array(values, pa.string()).take(pa.array(idx))


def synthesize(root: Path, n: int, seed: int = 7) -> dict[str, int]:
    """Write ``n`` exchange rows (and their connections) under ``root``; return table sizes."""
    rng = np.random.default_rng(seed)
    keys = np.array(list(APIS))
    weights = np.array([APIS[k][1] for k in keys])
    api_key = keys[rng.choice(len(keys), n, p=weights / weights.sum())].astype(np.int16)
    t_us = np.sort(START_US + rng.integers(0, WINDOW_S * 1_000_000, n))

    # clients: software, id, ip; client 0-2 share one client id on three hosts
    cl = rng.integers(0, N_CLIENTS, n)
    sw_of_client = rng.choice(len(SOFTWARE), N_CLIENTS, p=[0.35, 0.25, 0.15, 0.15, 0.10])
    client_ids = [f"svc-{c % 40:02d}" if c >= 3 else "svc-orders" for c in range(N_CLIENTS)]
    client_ips = [f"10.2.{c // 200}.{c % 200 + 1}" for c in range(N_CLIENTS)]
    acks_of_client = rng.choice(np.array([-1, 1, 0], np.int16), N_CLIENTS, p=[0.7, 0.2, 0.1])
    sw = sw_of_client[cl]
    max_v = np.zeros((len(SOFTWARE), 128), np.int16)
    for i, (_, _, versions) in enumerate(SOFTWARE):
        for k, v in versions.items():
            max_v[i, k] = v
    api_version = max_v[sw, api_key]

    broker = rng.integers(0, len(BROKERS), n)
    # connections: a client reconnects to a broker every ~20 min (churny clients every ~30 s)
    churn_s = np.where(np.arange(N_CLIENTS) % 15 == 0, 30, 1200)
    epoch = (t_us - START_US) // (churn_s[cl] * 1_000_000)
    conn_num = (cl.astype(np.int64) * len(BROKERS) + broker) * 100_000 + epoch
    conn_codes, conn_idx = np.unique(conn_num, return_inverse=True)

    # status: acks=0 produce has no response; 0.3% unanswered
    acks = np.where(api_key == 0, acks_of_client[cl], np.int16(-2))
    status_idx = np.zeros(n, np.int8)  # 0 ok, 1 no_response_expected, 2 unanswered
    status_idx[acks == 0] = 1
    status_idx[(rng.random(n) < 0.003) & (status_idx == 0)] = 2
    answered = status_idx == 0
    lat_ms = np.array([APIS[k][2] if k in APIS else 1.0 for k in range(128)])[api_key]
    latency_us = (rng.lognormal(0, 0.6, n) * lat_ms * 1000).astype(np.int64)
    incident = (t_us > START_US + 3000 * 1_000_000) & (t_us < START_US + 3600 * 1_000_000)
    latency_us[incident & (broker == 1)] *= 5

    # top-level errors: NOT_COORDINATOR / LOAD_IN_PROGRESS storm on group APIs for 10 minutes
    group_api = np.isin(api_key, [8, 9, 11, 12, 14])
    storm = (
        group_api
        & (t_us > START_US + 1200 * 1_000_000)
        & (t_us < START_US + 1800 * 1_000_000)
        & (broker == 0)
    )
    error_code = np.where(answered, 0, -9999).astype(np.int16)
    error_code[storm & answered] = np.where(rng.random(int((storm & answered).sum())) < 0.7, 16, 14)
    # partition results for Produce/Fetch/OffsetCommit: 1-3 partitions each
    has_parts = answered & np.isin(api_key, [0, 1, 8])
    n_parts = np.where(has_parts, rng.integers(1, 4, n), 0)
    offsets = np.concatenate([[0], np.cumsum(n_parts)]).astype(np.int32)
    total = int(offsets[-1])
    row_of = np.repeat(np.arange(n), n_parts)
    topic_of_client = rng.integers(0, len(TOPICS), N_CLIENTS)
    p_topic = (topic_of_client[cl[row_of]] + rng.integers(0, 2, total)) % len(TOPICS)
    p_part = rng.integers(0, PARTS_PER_TOPIC, total).astype(np.int32)
    leader_of = (p_topic * PARTS_PER_TOPIC + p_part) % len(BROKERS)
    p_err = np.zeros(total, np.int16)
    on_b2 = (leader_of == 1) & incident[row_of] & (api_key[row_of] == 0)
    p_err[on_b2] = np.where(rng.random(int(on_b2.sum())) < 0.5, 56, 6)
    p_err[(rng.random(total) < 0.001)] = 3
    topic_names = _strings(TOPICS, p_topic)
    pe_values = pa.StructArray.from_arrays(
        [
            topic_names,
            pa.nulls(total, pa.string()),
            pa.array(p_part),
            pa.nulls(total, pa.string()),
            pa.array(p_err),
            # an acked Produce partition has the base offset the broker gave it
            pa.array(np.arange(total, dtype=np.int64), mask=(api_key[row_of] != 0) | (p_err != 0)),
            pa.nulls(total, pa.int64()),
        ],
        fields=list(EXCHANGES_SCHEMA.field("partition_errors").type.value_type),
    )
    partition_errors = pa.ListArray.from_arrays(pa.array(offsets), pe_values, mask=pa.array(~has_parts))
    topics = pa.ListArray.from_arrays(pa.array(offsets), topic_names, mask=pa.array(~has_parts))
    batches = _batches(rng, n, api_key, cl, t_us, has_parts, n_parts, offsets, p_topic, p_part, p_err)

    # Metadata responses: 24 partitions each (a client's block), 3 brokers; broker 2's leaders
    # move to broker 3 from the incident on (epoch + 1)
    is_md = answered & (api_key == 3)
    md_rows = np.flatnonzero(is_md)
    k = 24
    all_parts = len(TOPICS) * PARTS_PER_TOPIC
    start = (cl[md_rows] * 7) % all_parts
    gidx = (start[:, None] + np.arange(k)[None, :]).ravel() % all_parts
    mp_topic, mp_part = gidx // PARTS_PER_TOPIC, (gidx % PARTS_PER_TOPIC).astype(np.int32)
    base_leader = (gidx % len(BROKERS)).astype(np.int32)
    moved = (base_leader == 1) & np.repeat(t_us[md_rows] > START_US + 3000 * 1_000_000, k)
    leader = np.where(moved, 2, base_leader).astype(np.int32) + 1  # node ids 1..3
    replicas_flat = ((base_leader[:, None] + np.arange(3)[None, :]) % 3 + 1).astype(np.int32).ravel()
    rep_off = pa.array(np.arange(0, 3 * len(gidx) + 1, 3, dtype=np.int32))
    replicas = pa.ListArray.from_arrays(rep_off, pa.array(replicas_flat))
    mp_type = EXCHANGES_SCHEMA.field("metadata_partitions").type.value_type
    mp_values = pa.StructArray.from_arrays(
        [
            _strings(TOPICS, mp_topic),
            pa.nulls(len(gidx), pa.string()),
            pa.array(mp_part),
            pa.array(np.zeros(len(gidx), np.int16)),
            pa.array(leader),
            pa.array(np.where(moved, 1, 0).astype(np.int32)),
            replicas,
            replicas,
        ],
        fields=list(mp_type),
    )
    md_off = np.zeros(n + 1, np.int32)
    md_off[1:] = np.cumsum(np.where(is_md, k, 0))
    metadata_partitions = pa.ListArray.from_arrays(pa.array(md_off), mp_values, mask=pa.array(~is_md))
    b_type = EXCHANGES_SCHEMA.field("metadata_brokers").type.value_type
    nb = len(md_rows) * 3
    b_values = pa.StructArray.from_arrays(
        [
            pa.array(np.tile(np.arange(1, 4, dtype=np.int32), len(md_rows))),
            _strings([b[0] for b in BROKERS], np.tile(np.arange(3), len(md_rows))),
            pa.array(np.full(nb, 9092, np.int32)),
            pa.nulls(nb, pa.string()),
        ],
        fields=list(b_type),
    )
    mb_off = np.zeros(n + 1, np.int32)
    mb_off[1:] = np.cumsum(np.where(is_md, 3, 0))
    metadata_brokers = pa.ListArray.from_arrays(pa.array(mb_off), b_values, mask=pa.array(~is_md))

    # ApiVersions responses: the 20 client APIs as advertised by a 3.7 broker
    is_av = answered & (api_key == 18)
    adv = [
        (0, 0, 10),
        (1, 0, 16),
        (2, 0, 8),
        (3, 0, 12),
        (8, 0, 9),
        (9, 0, 9),
        (10, 0, 4),
        (11, 0, 9),
        (12, 0, 4),
        (14, 0, 5),
        (18, 0, 3),
        (22, 0, 4),
    ]
    n_av = int(is_av.sum())
    av_type = EXCHANGES_SCHEMA.field("api_versions").type.value_type
    av_values = pa.StructArray.from_arrays(
        [pa.array(np.tile(np.array(c, np.int16), n_av)) for c in zip(*adv, strict=True)], fields=list(av_type)
    )
    av_off = np.zeros(n + 1, np.int32)
    av_off[1:] = np.cumsum(np.where(is_av, len(adv), 0))
    api_versions = pa.ListArray.from_arrays(pa.array(av_off), av_values, mask=pa.array(~is_av))

    sw_names = [s[0] for s in SOFTWARE]
    sw_versions = [s[1] for s in SOFTWARE]
    status_names = ["ok", "no_response_expected", "unanswered"]
    group_ids = [f"group-{c % 12}" for c in range(N_CLIENTS)]
    api_names = [APIS.get(i, ("?",))[0] for i in range(128)]
    resp_us = np.where(answered, t_us + latency_us, 0)
    records = np.where(api_key == 0, rng.integers(1, 200, n), 0)
    err = pa.array(error_code, mask=~answered)
    columns = {
        "source": pa.array(np.full(n, "bench.pcap", object), pa.string()),
        "connection_id": pa.array(conn_idx.astype(np.int64)).cast(pa.string()),
        "client_ip": _strings(client_ips, cl),
        "client_port": pa.array((30000 + conn_idx % 30000).astype(np.int32)),
        "broker_ip": _strings([b[0] for b in BROKERS], broker),
        "broker_port": pa.array(np.full(n, 9092, np.int32)),
        "request_time": pa.array(t_us, pa.timestamp("us", tz="UTC")),
        "response_time": pa.array(resp_us, pa.timestamp("us", tz="UTC"), mask=~answered),
        "latency_us": pa.array(latency_us, mask=~answered),
        "api_key": pa.array(api_key),
        "api_name": _strings(api_names, api_key),
        "api_version": pa.array(api_version),
        "request_header_version": pa.array(np.where(api_version >= 9, 2, 1).astype(np.int8)),
        "correlation_id": pa.array((np.arange(n) % 2_000_000_000).astype(np.int32)),
        "client_id": _strings(client_ids, cl),
        "client_software_name": _strings(sw_names, sw),
        "client_software_version": _strings(sw_versions, sw),
        "request_size": pa.array(np.where(api_key == 0, 100 + records * 120, 80).astype(np.int32)),
        "response_size": pa.array(np.where(api_key == 1, 4000, 60).astype(np.int32), mask=~answered),
        "status": _strings(status_names, status_idx),
        "error_code": err,
        "partition_errors": partition_errors,
        "topics": topics,
        "acks": pa.array(acks, mask=api_key != 0),
        "timeout_ms": pa.array(np.full(n, 30000, np.int32)),
        "batches": batches,
        "record_batches": pa.array(
            batches.value_lengths().fill_null(0).to_numpy().astype(np.int32), mask=api_key != 0
        ),
        "records": pa.array(records, mask=api_key != 0),
        "compression": pa.array(np.full(n, None, object), pa.string()),
        "metadata_brokers": metadata_brokers,
        "metadata_partitions": metadata_partitions,
        "api_versions": api_versions,
        "injected": pa.array(np.zeros(n, bool)),
    }
    columns["group_id"] = pa.array(np.where(group_api, np.array(group_ids, object)[cl], None), pa.string())
    columns["error_name"] = pa.array(
        np.where(
            error_code == 16,
            "NOT_COORDINATOR",
            np.where(error_code == 14, "COORDINATOR_LOAD_IN_PROGRESS", "NONE"),
        ).astype(object),
        pa.string(),
        mask=~answered,
    )
    file_schema = EXCHANGES_SCHEMA.remove(EXCHANGES_SCHEMA.get_field_index("date"))
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in file_schema]
    table = pa.Table.from_arrays(arrays, schema=file_schema)
    day = (t_us // 86_400_000_000) * 86_400
    _write_by_date(root / "exchanges", table, day)

    # connections: one row per connection id
    order = np.argsort(conn_idx, kind="stable")
    first = np.full(len(conn_codes), np.iinfo(np.int64).max)
    last = np.zeros(len(conn_codes), np.int64)
    np.minimum.at(first, conn_idx, t_us)
    np.maximum.at(last, conn_idx, np.where(answered, resp_us, t_us))
    any_row = order[np.searchsorted(conn_idx[order], np.arange(len(conn_codes)))]
    m = len(conn_codes)
    end_reason = rng.choice(4, m, p=[0.6, 0.1, 0.1, 0.2])
    ccols = {
        "source": pa.array(np.full(m, "bench.pcap", object), pa.string()),
        "connection_id": pa.array(np.arange(m, dtype=np.int64)).cast(pa.string()),
        "client_ip": _strings(client_ips, cl[any_row]),
        "client_port": pa.array((30000 + np.arange(m) % 30000).astype(np.int32)),
        "broker_ip": _strings([b[0] for b in BROKERS], broker[any_row]),
        "broker_port": pa.array(np.full(m, 9092, np.int32)),
        "first_packet_time": pa.array(first - 1000, pa.timestamp("us", tz="UTC")),
        "last_packet_time": pa.array(last + 1000, pa.timestamp("us", tz="UTC")),
        "syn_seen": pa.array(np.ones(m, bool)),
        "end_reason": _strings(["fin", "rst", "idle", "open_at_end"], end_reason),
        "protocol": pa.array(np.full(m, "kafka", object), pa.string()),
        "client_id": _strings(client_ids, cl[any_row]),
    }
    cfile_schema = CONNECTIONS_SCHEMA.remove(CONNECTIONS_SCHEMA.get_field_index("date"))
    carrays = [ccols[f.name] if f.name in ccols else pa.nulls(m, f.type) for f in cfile_schema]
    _write_by_date(
        root / "connections",
        pa.Table.from_arrays(carrays, schema=cfile_schema),
        (first // 86_400_000_000) * 86_400,
    )
    return {"exchanges": n, "connections": m, "partition_results": total}


def _batches(
    rng: np.random.Generator,
    n: int,
    api_key: np.ndarray,
    cl: np.ndarray,
    t_us: np.ndarray,
    has_parts: np.ndarray,
    n_parts: np.ndarray,
    offsets: np.ndarray,
    p_topic: np.ndarray,
    p_part: np.ndarray,
    p_err: np.ndarray,
) -> pa.ListArray:
    """The record batches of every Produce request: one v2 batch per partition (an answered
    request's are the partitions of its results). A batch sent after a failed one of the same
    client and partition is its retry: the same identity (producer id, epoch and base sequence
    for an idempotent client, 60% of them; the CRC for all), as a real producer sends it again.
    Without batches the delivery and error_reaction jobs had no Produce batch to follow."""
    is_produce = api_key == 0
    nb = np.where(is_produce, np.where(has_parts, n_parts, rng.integers(1, 4, n)), 0)
    b_off = np.concatenate([[0], np.cumsum(nb)]).astype(np.int32)
    total = int(b_off[-1])
    row = np.repeat(np.arange(n), nb)
    topic = rng.integers(0, len(TOPICS), total)
    part = rng.integers(0, PARTS_PER_TOPIC, total).astype(np.int32)
    copied = has_parts[row]
    src = offsets[row] + (np.arange(total) - b_off[row])
    topic[copied], part[copied] = p_topic[src[copied]], p_part[src[copied]]
    failed = np.zeros(total, bool)
    failed[copied] = p_err[src[copied]] != 0
    client = cl[row].astype(np.int64)
    # per (client, topic, partition) in time order: a batch's sequence is the count of batches
    # before it that did not fail (a failed batch's retry takes its sequence)
    order = np.lexsort((t_us[row], part, topic, client))
    group = (client * len(TOPICS) + topic) * PARTS_PER_TOPIC + part
    g = group[order]
    starts = np.r_[True, g[1:] != g[:-1]]
    ok = (~failed[order]).astype(np.int64)
    before = np.cumsum(ok) - ok
    seq_sorted = before - np.maximum.accumulate(np.where(starts, before, 0))
    seq = np.empty(total, np.int64)
    seq[order] = seq_sorted
    idempotent = (np.arange(N_CLIENTS) % 5 < 3)[client]
    crc = (group * 2_000_003 + seq) % (1 << 32)
    records = (1 + crc * 7919 % 99).astype(np.int32)  # a retry holds the same records
    first_ms = t_us[row] // 1000
    b_type = EXCHANGES_SCHEMA.field("batches").type.value_type
    values = {
        "topic": _strings(TOPICS, topic),
        "partition": pa.array(part),
        "base_offset": pa.array(np.zeros(total, np.int64)),
        "last_offset_delta": pa.array(records - 1),
        "partition_leader_epoch": pa.array(np.full(total, -1, np.int32)),
        "magic": pa.array(np.full(total, 2, np.int8)),
        "crc": pa.array(crc),
        "transactional": pa.array(np.zeros(total, bool)),
        "control": pa.array(np.zeros(total, bool)),
        "producer_id": pa.array(np.where(idempotent, 1000 + client, -1)),
        "producer_epoch": pa.array(np.where(idempotent, 0, -1).astype(np.int16)),
        "base_sequence": pa.array(np.where(idempotent, seq * 100, -1).astype(np.int32)),
        "record_count": pa.array(records),
        "first_timestamp_ms": pa.array(first_ms),
        "max_timestamp_ms": pa.array(first_ms),
    }
    fields = [values[f.name] if f.name in values else pa.nulls(total, f.type) for f in b_type]
    return pa.ListArray.from_arrays(
        pa.array(b_off), pa.StructArray.from_arrays(fields, fields=list(b_type)), mask=pa.array(~is_produce)
    )


def _write_by_date(base: Path, table: pa.Table, day_s: np.ndarray, rows_per_file: int = 2_000_000) -> None:
    for day in np.unique(day_s):
        date = time.strftime("%Y-%m-%d", time.gmtime(int(day)))
        out = base / f"date={date}"
        out.mkdir(parents=True, exist_ok=True)
        part = table.filter(pa.array(day_s == day))
        for i, offset in enumerate(range(0, part.num_rows, rows_per_file)):
            pq.write_table(
                part.slice(offset, rows_per_file), out / f"part-{i:03d}.parquet", row_group_size=500_000
            )


# Headline queries, each in Spark SQL and DuckDB dialects, over views/tables named like the dataset.
HEADLINES = {
    "requests_and_latency_per_api": (
        "SELECT api_name, count(*) AS requests, percentile_approx(latency_us, 0.99) AS p99_us FROM exchanges GROUP BY api_name",
        "SELECT api_name, count(*) AS requests, approx_quantile(latency_us, 0.99) AS p99_us FROM exchanges GROUP BY api_name",
    ),
    "produce_acks_per_client": (
        "SELECT client_id, client_ip, acks, count(*) AS requests, sum(records) AS records FROM exchanges WHERE api_key = 0 GROUP BY client_id, client_ip, acks",
        "SELECT client_id, client_ip, acks, count(*) AS requests, sum(records) AS records FROM exchanges WHERE api_key = 0 GROUP BY client_id, client_ip, acks",
    ),
    "partition_errors_per_client": (
        "SELECT client_id, client_ip, pe.error_code, count(*) AS n FROM exchanges LATERAL VIEW explode(partition_errors) t AS pe WHERE pe.error_code <> 0 GROUP BY client_id, client_ip, pe.error_code",
        "SELECT client_id, client_ip, pe.error_code, count(*) AS n FROM (SELECT client_id, client_ip, unnest(partition_errors) AS pe FROM exchanges) WHERE pe.error_code <> 0 GROUP BY client_id, client_ip, pe.error_code",
    ),
    "unanswered_per_client": (
        "SELECT client_id, client_ip, count(*) AS unanswered FROM exchanges WHERE status = 'unanswered' GROUP BY client_id, client_ip",
        "SELECT client_id, client_ip, count(*) AS unanswered FROM exchanges WHERE status = 'unanswered' GROUP BY client_id, client_ip",
    ),
    "coordinator_errors_per_group": (
        "SELECT group_id, broker_ip, error_code, count(*) AS n, min(response_time) AS first, max(response_time) AS last FROM exchanges WHERE error_code IN (14, 15, 16) GROUP BY group_id, broker_ip, error_code",
        "SELECT group_id, broker_ip, error_code, count(*) AS n, min(response_time) AS first, max(response_time) AS last FROM exchanges WHERE error_code IN (14, 15, 16) GROUP BY group_id, broker_ip, error_code",
    ),
}


def run_size(n: int, workdir: Path, master: str, keep: bool) -> dict[str, float]:
    from spark_jobs.common import load_tables
    from spark_jobs.kafka_versions import load_broker_versions
    from spark_jobs.session import build_session
    from spark_jobs.submit import analyse

    root = workdir / f"ds_{n}"
    if root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()
    sizes = synthesize(root, n)
    gen_s = time.perf_counter() - t0
    print(
        f"\n== {n:,} exchanges ({sizes['connections']:,} connections, {sizes['partition_results']:,} partition results): generated in {gen_s:.1f}s"
    )

    spark = build_session(master, "kwire-bench")
    t0 = time.perf_counter()
    _, results, timings = analyse(
        spark, root, root / "report", versions=load_broker_versions(), target_releases=["4.0"]
    )
    analyse_s = time.perf_counter() - t0
    print(
        f"full analysis ({len(results)} results) on {master}: {analyse_s:.1f}s = {n / analyse_s:,.0f} rows/s"
    )
    for name, secs in sorted(timings.items(), key=lambda kv: -kv[1]):
        print(f"  {name:30s} {secs:6.1f}s")

    tables = load_tables(spark, root)
    tables.exchanges.createOrReplaceTempView("exchanges")
    spark_q, duck_q = {}, {}
    for name, (sql, _) in HEADLINES.items():
        t0 = time.perf_counter()
        rows = spark.sql(sql).collect()
        spark_q[name] = (time.perf_counter() - t0, len(rows))
    try:
        import duckdb
    except ImportError:
        duckdb = None
        print("duckdb not installed: skipping the reference run (pip install duckdb)")
    if duckdb is not None:
        con = duckdb.connect()
        con.execute(
            f"CREATE VIEW exchanges AS SELECT * FROM read_parquet('{root}/exchanges/*/*.parquet', hive_partitioning = true)"
        )
        for name, (_, sql) in HEADLINES.items():
            t0 = time.perf_counter()
            rows = con.sql(sql).to_arrow_table().to_pylist()
            duck_q[name] = (time.perf_counter() - t0, len(rows))
    print(f"  {'headline query':32s} {'spark s':>8s} {'rows':>6s} {'duckdb s':>9s} {'rows':>6s}")
    for name in HEADLINES:
        s_t, s_n = spark_q[name]
        d_t, d_n = duck_q.get(name, (float("nan"), -1))
        flag = "" if d_n in (-1, s_n) else "  <- row counts differ"
        print(f"  {name:32s} {s_t:8.2f} {s_n:6d} {d_t:9.2f} {d_n:6d}{flag}")
    if not keep:
        shutil.rmtree(root)
    return {"rows": n, "generate_s": gen_s, "analyse_s": analyse_s, "rows_per_s": n / analyse_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1000000,10000000", help="comma-separated row counts (default: %(default)s)"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", type=Path, default=None, help="where datasets go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the synthesized datasets")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kwire-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stats = [run_size(n, workdir, args.master, args.keep) for n in sizes]
    print("\n== summary")
    for s in stats:
        print(
            f"  {s['rows']:>12,} rows: analysis {s['analyse_s']:6.1f}s, {s['rows_per_s']:>10,.0f} rows/s (generation {s['generate_s']:.1f}s)"
        )
    for a, b in itertools.pairwise(stats):
        print(
            f"  {a['rows']:,} -> {b['rows']:,} rows (x{b['rows'] / a['rows']:.0f}): time x{b['analyse_s'] / a['analyse_s']:.2f}"
        )
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
