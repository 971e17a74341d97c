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

__all__ = ["JOBS", "SCHEDULE", "parse_job_list", "run_jobs", "scheduled"]

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

#: The order ``submit.analyse`` starts the jobs in, longest first, so that the two at a time end
#: together: each job's wall time alone, in a run of them one at a time on the demo dataset
#: (2026-12-07): error_reaction 4.7 s (it computes ``delivery.shared_fates``, which delivery then
#: reuses), outages 2.0, unsupported_versions 1.4 (2.4 as the first job, warming the JVM),
#: incident_timeline 1.2, connection_health 1.2, metadata_refresh 0.9, delivery 0.9, leader_skew
#: 0.7, coordinator_errors 0.5, protocol_anomalies 0.4, client_inventory 0.3, the rest 0.1-0.2.
#: Started in :data:`JOBS`' order instead, error_reaction ran beside the others and
#: incident_timeline ran alone at the end: the demo's analysis took 12.5-12.7 s against 11.0-11.3
#: s in this order (two runs each, alternating; the cores busy 1.6 of 2 against 1.7).
SCHEDULE: tuple[str, ...] = (
    "error_reaction",
    "outages",
    "unsupported_versions",
    "incident_timeline",
    "connection_health",
    "metadata_refresh",
    "delivery",
    "leader_skew",
    "coordinator_errors",
    "protocol_anomalies",
    "client_inventory",
    "producer_acks",
    "timelines",
)
assert set(SCHEDULE) == set(JOBS), "every job has its place in SCHEDULE"


def scheduled(names: Iterable[str]) -> list[str]:
    """``names`` in the order to start them (:data:`SCHEDULE`)."""
    return sorted(names, key=SCHEDULE.index)


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
