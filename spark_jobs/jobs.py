"""The job registry: name -> ``run(tables, **options) -> {result name: DataFrame}``.

A job's first result has the job's own name; results are written to ``REPORT_DIR/<result>/``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pyspark.sql import DataFrame

from spark_jobs import (
    client_inventory,
    connection_health,
    coordinator_errors,
    delivery,
    error_reaction,
    leader_skew,
    metadata_refresh,
    outages,
    producer_acks,
    protocol_anomalies,
    report_timeline,
    timelines,
    unsupported_versions,
)
from spark_jobs.common import Tables, combine_runs

__all__ = ["JOBS", "parse_job_list", "run_jobs"]

JOBS: dict[str, Callable[..., dict[str, DataFrame]]] = {
    "unsupported_versions": unsupported_versions.run,
    "error_reaction": error_reaction.run,
    "delivery": delivery.run,
    "metadata_refresh": metadata_refresh.run,
    "producer_acks": producer_acks.run,
    "coordinator_errors": coordinator_errors.run,
    "connection_health": connection_health.run,
    "outages": outages.run,
    "protocol_anomalies": protocol_anomalies.run,
    "leader_skew": leader_skew.run,
    "client_inventory": client_inventory.run,
    "timelines": timelines.run,
    "incident_timeline": report_timeline.run,
}


def parse_job_list(text: str | None) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]`` (all jobs when empty); ValueError naming unknown jobs."""
    if not text:
        return list(JOBS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise ValueError(f"unknown job(s): {', '.join(unknown)} (known: {', '.join(JOBS)})")
    return names


def run_jobs(
    tables: Tables,
    names: Iterable[str],
    options: dict[str, dict[str, Any]] | None = None,
    *,
    combined: bool = False,
    **context: Any,
) -> dict[str, DataFrame]:
    """Run the named jobs lazily: the returned DataFrames compute when written or collected.

    ``options[job]`` are that job's keyword parameters; ``context`` (spark, versions,
    target_releases) goes to every job, which ignores what it does not use. Each run (``source``)
    is analysed on its own; ``combined`` makes all runs one (``common.combine_runs``): a client
    seen in several runs is then one client.
    """
    if combined:
        tables = combine_runs(tables)
    results: dict[str, DataFrame] = {}
    for name in names:
        results.update(JOBS[name](tables, **context, **(options or {}).get(name, {})))
    return results
