"""Shared Spark fixture and row builders for the Spark job tests.

Import explicitly in a test module: ``from tests.spark_fixtures import spark  # noqa: F401``.
Rows are built from :mod:`kwire.schema` with defaults for every column, so a test states only
what matters: ``ex(t=1.0, api="Produce", pe=[("orders", 0, 56)])``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kwire.schema import CONNECTION_COLUMNS, CONNECTIONS_SCHEMA, EXCHANGE_COLUMNS, EXCHANGES_SCHEMA

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)

API_KEYS = {
    "Produce": 0,
    "Fetch": 1,
    "ListOffsets": 2,
    "Metadata": 3,
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "FindCoordinator": 10,
    "JoinGroup": 11,
    "Heartbeat": 12,
    "SyncGroup": 14,
    "ApiVersions": 18,
    "InitProducerId": 22,
}

_corr = itertools.count(1)


def session_settings(
    monkeypatch: pytest.MonkeyPatch, archive: str = "", classpath: str = "", data_bytes: int | None = 1
) -> dict[str, str]:
    """The settings ``build_session("local[2]", data_bytes=data_bytes)`` gives a new local
    session, without starting one (the test session's JVM is already running, and
    ``build_session`` would return it): ``archive`` and ``classpath`` stand for the class
    archive's options and its class path (none by default)."""
    from spark_jobs import session

    captured: dict[str, str] = {}

    class Builder:
        def appName(self, _: str) -> Builder:
            return self

        def master(self, _: str) -> Builder:
            return self

        def config(self, key: str, value: str) -> Builder:
            captured[key] = value
            return self

        def getOrCreate(self) -> None:
            raise RuntimeError("stop here")

    monkeypatch.setattr(session.SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(session.SparkSession, "builder", Builder())
    monkeypatch.setattr(session, "archive_options", lambda: (archive, None))
    monkeypatch.setattr(session, "archive_classpath", lambda: classpath)
    with pytest.raises(RuntimeError, match="stop here"):
        session.build_session("local[2]", data_bytes=data_bytes)
    return captured


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import build_session

    session = build_session(
        "local[2]",
        "kwire-tests",
        shuffle_partitions=2,
        # the jobs' plans (delivery, outages, error_reaction) are large, and a whole run's plans
        # pile up in one driver: 1 and 2 GB ran out of heap late in full runs (GC overhead limit,
        # AGGREGATE_OUT_OF_MEMORY); the machine has 24 GB
        driver_memory="4g",
        # tiny data: compiling generated code and adaptive re-planning cost more than they save
        extra_conf={
            "spark.ui.enabled": "false",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        },
    )
    yield session
    session.stop()


@contextmanager
def spark_settings(spark, settings: dict[str, str | None]) -> Iterator[None]:
    """``settings`` on the shared session for a block (None: unset), then each key as it was."""

    def put(values: dict[str, str | None]) -> None:
        for key, value in values.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)

    before = {key: spark.conf.get(key, None) for key in settings}
    try:
        put(settings)
        yield
    finally:
        put(before)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pe(topic: str, partition: int | None, error_code: int, resource: str | None = None) -> dict[str, Any]:
    return {
        "topic": topic,
        "topic_id": None,
        "partition": partition,
        "resource": resource,
        "error_code": error_code,
    }


def ex(
    t: float = 0.0,
    api: str = "Produce",
    *,
    latency_ms: float = 5.0,
    errors: list[tuple] | None = None,
    **columns: Any,
) -> dict[str, Any]:
    """One exchanges row. ``t``: request time in seconds after T0; ``api``: API name (sets key);
    ``errors``: partition results as ``(topic, partition, code[, resource])`` tuples."""
    row: dict[str, Any] = dict.fromkeys(name for name, _, _ in EXCHANGE_COLUMNS)
    status = columns.get("status", "ok")
    request_time = at(t)
    answered = status in ("ok", "orphan_response")
    response_time = request_time + timedelta(milliseconds=latency_ms) if answered else None
    row.update(
        source="test.pcap",
        connection_id="c1",
        client_ip="10.0.0.1",
        client_port=40000,
        broker_ip="10.0.0.9",
        broker_port=9092,
        request_time=request_time,
        response_time=response_time,
        latency_us=int(latency_ms * 1000) if answered else None,
        api_key=API_KEYS.get(api, columns.get("api_key")),
        api_name=api,
        api_version=0,
        request_header_version=1,
        correlation_id=next(_corr),
        client_id="app",
        request_size=100,
        response_size=50 if answered else None,
        status=status,
        error_code=0 if answered else None,
        partition_errors=[pe(*e) for e in errors] if errors is not None else None,
        injected=False,
    )
    row.update(columns)
    if status == "orphan_response":
        row["request_time"] = None
    if errors is not None and "topics" not in columns:
        row["topics"] = sorted({e[0] for e in errors if e[0]})
    when = row["request_time"] or row["response_time"]
    row["date"] = when.strftime("%Y-%m-%d")
    return row


def conn(**columns: Any) -> dict[str, Any]:
    """One connections row (defaults: c1 from 10.0.0.1 to 10.0.0.9:9092, T0..T0+60s, fin)."""
    row: dict[str, Any] = dict.fromkeys(name for name, _, _ in CONNECTION_COLUMNS)
    row.update(
        source="test.pcap",
        connection_id="c1",
        client_ip="10.0.0.1",
        client_port=40000,
        broker_ip="10.0.0.9",
        broker_port=9092,
        first_packet_time=T0,
        last_packet_time=at(60),
        syn_seen=True,
        end_reason="fin",
        protocol="kafka",
        client_id="app",
    )
    row.update(columns)
    row["date"] = row["first_packet_time"].strftime("%Y-%m-%d")
    return row


def exchanges_df(spark, rows: list[dict[str, Any]]):
    from spark_jobs.common import exchanges_spark_schema

    names = [name for name, _, _ in EXCHANGE_COLUMNS]
    return spark.createDataFrame([tuple(r[n] for n in names) for r in rows], exchanges_spark_schema())


def connections_df(spark, rows: list[dict[str, Any]]):
    from spark_jobs.common import connections_spark_schema

    names = [name for name, _, _ in CONNECTION_COLUMNS]
    return spark.createDataFrame([tuple(r[n] for n in names) for r in rows], connections_spark_schema())


def tables(spark, exchanges: list[dict[str, Any]], connections: list[dict[str, Any]] | None = None):
    from spark_jobs.common import Tables

    return Tables(exchanges_df(spark, exchanges), connections_df(spark, connections or []))


def write_dataset(
    root: Path, exchanges: list[dict[str, Any]], connections: list[dict[str, Any]] = ()
) -> Path:
    """Write rows in the dataset layout (Hive ``date=`` partitions, the date not in the files)."""
    for name, schema, rows in (
        ("exchanges", EXCHANGES_SCHEMA, exchanges),
        ("connections", CONNECTIONS_SCHEMA, connections),
    ):
        by_date: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_date.setdefault(r["date"], []).append(r)
        file_schema = schema.remove(schema.get_field_index("date"))
        for date, part in by_date.items():
            out = root / name / f"date={date}"
            out.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pylist(
                [{k: v for k, v in r.items() if k != "date"} for r in part], schema=file_schema
            )
            pq.write_table(table, out / "part-0.parquet")
    return root


def collect(df, *cols: str) -> list[tuple]:
    """Rows of ``df`` as tuples of ``cols``, sorted (None first) for stable assertions."""
    rows = [tuple(r[c] for c in cols) for r in df.collect()]
    return sorted(rows, key=lambda r: tuple((v is not None, v if v is not None else 0) for v in r))
