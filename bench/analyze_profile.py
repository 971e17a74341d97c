"""Where a Spark analysis spends its time, from Spark's own event log.

    python bench/analyze_profile.py [DATASET] [--master local[2]] [--parallel 1] [--only a,b]
                                    [--rules] [--sites N] [--plans] [--operators N] [--conf K=V]
                                    [--jvm-options OPTS]

Runs the full analysis in this process (as ``kwire analyze`` does) with Spark's event log on and
each kwire job's actions labelled, then prints per kwire job: the wall time of its writes, the
DataFrames it made (``frames``), the Spark jobs they ran, the wall time those Spark jobs were
running, and the task time inside them (executor run time, summed over tasks). Wall time outside any Spark job is the driver's: query
analysis, optimisation and physical planning, and committing the output files. Also prints the
session start and the driver JVM's CPU time. Without a DATASET, decodes the demo capture.

``--operators N`` adds the time Spark's own metrics give its sorts and aggregates (``sort time``,
``time in aggregation build``, summed over tasks), in all and for the N costliest operators, with
their keys and kwire job. A pointer, not a bill: an aggregate's build time includes the work of
the operators that feed it inside the same generated stage (on 100k synthetic exchanges,
counting incident_timeline's events per connection before spreading them over two lanes, which
feeds its costliest aggregate before the lanes double the rows, left the job's task time where it
was: 2.89-2.96 s against 2.75-3.14 s).
``--sites N`` adds the driver time per line of ``spark_jobs/`` that called into a DataFrame;
``--plans`` the calls' time by the size of the plan each analysed (a new DataFrame) or ran (an
action): a new DataFrame's analysis costs a fixed few milliseconds and more as its plan grows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_event_log(folder: Path) -> dict[str, dict[str, float]]:
    """Per job description (the kwire job): Spark jobs, their wall seconds (union of the
    intervals they ran), task seconds (executor run time) and tasks."""
    lines = [line for p in sorted(folder.rglob("events_*")) for line in p.read_text().splitlines()]
    jobs: dict[int, dict] = {}
    stage_job: dict[int, int] = {}
    for line in lines:
        ev = json.loads(line)
        kind = ev["Event"]
        if kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            label = props.get("spark.job.description") or props.get("callSite.short") or "?"
            jobs[ev["Job ID"]] = {"label": label, "start": ev["Submission Time"], "task_ms": 0, "tasks": 0}
            for sid in ev.get("Stage IDs", []):
                stage_job[sid] = ev["Job ID"]
        elif kind == "SparkListenerJobEnd":
            jobs[ev["Job ID"]]["end"] = ev["Completion Time"]
        elif kind == "SparkListenerTaskEnd":
            job = jobs.get(stage_job.get(ev["Stage ID"], -1))
            if job is not None:
                job["task_ms"] += (ev.get("Task Metrics") or {}).get("Executor Run Time", 0)
                job["tasks"] += 1
    per: dict[str, dict[str, float]] = defaultdict(
        lambda: {"spark_jobs": 0, "job_s": 0.0, "task_s": 0.0, "tasks": 0}
    )
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for job in jobs.values():
        row = per[job["label"].split(":")[0]]
        row["spark_jobs"] += 1
        row["task_s"] += job["task_ms"] / 1000
        row["tasks"] += job["tasks"]
        spans[job["label"].split(":")[0]].append((job["start"], job.get("end", job["start"])))
    for label, intervals in spans.items():  # union of the intervals: jobs of one label may overlap
        total, cur_s, cur_e = 0, None, None
        for s, e in sorted(intervals):
            if cur_e is None or s > cur_e:
                total += (cur_e - cur_s) if cur_e is not None else 0
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        total += (cur_e - cur_s) if cur_e is not None else 0
        per[label]["job_s"] = total / 1000
    return dict(per)


#: The per-operator timing metrics ``--operators`` sums (milliseconds, per task, in Spark's SQL metrics).
_OPERATOR_TIMES = ("sort time", "time in aggregation build")


def read_operator_times(folder: Path) -> list[tuple[str, str, str, float]]:
    """(kwire job, metric, operator as the plan prints it, milliseconds summed over tasks) of every
    sort and aggregate of the event log's SQL executions: their metrics' accumulators, named in
    each execution's plan, summed over the task updates."""
    lines = [line for p in sorted(folder.rglob("events_*")) for line in p.read_text().splitlines()]
    named: dict[int, tuple[int, str, str]] = {}  # accumulator id -> (execution, metric, operator)
    label_of: dict[int, str] = {}  # execution -> kwire job (the Spark job description)

    def walk(info: dict, execution: int) -> None:
        for metric in info.get("metrics", []):
            if metric["name"] in _OPERATOR_TIMES:
                named[metric["accumulatorId"]] = (execution, metric["name"], info.get("simpleString", ""))
        for child in info.get("children", []):
            walk(child, execution)

    totals: dict[int, float] = defaultdict(float)
    for line in lines:
        ev = json.loads(line)
        kind = ev["Event"]
        if kind.endswith("SQLExecutionStart") or kind.endswith("SQLAdaptiveExecutionUpdate"):
            walk(ev["sparkPlanInfo"], ev["executionId"])
        elif kind == "SparkListenerJobStart":
            props = ev.get("Properties") or {}
            if "spark.sql.execution.id" in props:
                label = props.get("spark.job.description") or "?"
                label_of.setdefault(int(props["spark.sql.execution.id"]), label.split(":")[0])
        elif kind == "SparkListenerTaskEnd":
            for acc in (ev.get("Task Info") or {}).get("Accumulables", []):
                if acc["ID"] in named:
                    with contextlib.suppress(TypeError, ValueError):
                        totals[acc["ID"]] += float(acc["Update"])
    return [
        (label_of.get(named[acc][0], "?"), named[acc][1], named[acc][2], ms)
        for acc, ms in totals.items()
        if ms > 0
    ]


def read_stage_times(folder: Path) -> list[tuple[str, int, float, int, list[str]]]:
    """(kwire job, stage, task milliseconds, tasks, the operators whose SQL metrics its tasks
    updated, in plan order) of every stage of the event log."""
    lines = [line for p in sorted(folder.rglob("events_*")) for line in p.read_text().splitlines()]
    operator_of: dict[int, tuple[int, str]] = {}  # accumulator id -> (position in its plan, operator)
    stage_label: dict[int, str] = {}
    stages: dict[int, dict] = {}

    def walk(info: dict, position: list[int]) -> None:
        position[0] += 1
        here = position[0]
        for metric in info.get("metrics", []):
            operator_of[metric["accumulatorId"]] = (here, info.get("simpleString", "")[:90])
        for child in info.get("children", []):
            walk(child, position)

    for line in lines:
        ev = json.loads(line)
        kind = ev["Event"]
        if kind.endswith("SQLExecutionStart") or kind.endswith("SQLAdaptiveExecutionUpdate"):
            walk(ev["sparkPlanInfo"], [0])
        elif kind == "SparkListenerJobStart":
            label = ((ev.get("Properties") or {}).get("spark.job.description") or "?").split(":")[0]
            for sid in ev.get("Stage IDs", []):
                stage_label[sid] = label
        elif kind == "SparkListenerTaskEnd":
            row = stages.setdefault(ev["Stage ID"], {"ms": 0.0, "tasks": 0, "ops": set()})
            row["ms"] += (ev.get("Task Metrics") or {}).get("Executor Run Time", 0)
            row["tasks"] += 1
            for acc in (ev.get("Task Info") or {}).get("Accumulables", []):
                if acc["ID"] in operator_of:
                    row["ops"].add(operator_of[acc["ID"]])
    return [
        (stage_label.get(sid, "?"), sid, row["ms"], row["tasks"], [op for _, op in sorted(row["ops"])])
        for sid, row in stages.items()
    ]


def print_stage_times(rows: list[tuple[str, int, float, int, list[str]]], n: int) -> None:
    print(
        f"  task time by stage: {sum(r[2] for r in rows) / 1000:.2f}s in {len(rows)} stages; the costliest:"
    )
    for label, sid, ms, tasks, ops in sorted(rows, key=lambda r: -r[2])[:n]:
        print(f"    {ms / 1000:6.2f}s  {label:20s} stage {sid:4d} ({tasks} tasks)")
        for op in ops:
            print(f"             {op}")


def print_operator_times(rows: list[tuple[str, str, str, float]], n: int) -> None:
    for metric in _OPERATOR_TIMES:
        mine = sorted((r for r in rows if r[1] == metric), key=lambda r: -r[3])
        print(f"  {metric}: {sum(r[3] for r in mine) / 1000:.2f}s in {len(mine)} operators; the costliest:")
        for label, _, operator, ms in mine[:n]:
            print(f"    {ms / 1000:6.2f}s  {label:20s} {operator[:110]}")


def _jvm_threads_cpu_s(spark) -> dict[str, float]:
    """The driver JVM's CPU seconds so far per kind of thread (its name, digits dropped: the
    JIT's compiler threads, the collector, task threads, py4j's threads...), from /proc."""
    import re

    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    out: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[re.sub(r"[0-9]+", "N", name)] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return dict(out)


def _codegen_figures(spark) -> dict[str, float]:
    """Spark's code generation counters: classes compiled by Janino in this JVM and the time
    (the histogram's mean over its sample, times its exact count: an estimate)."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    compile_ms = metrics.METRIC_COMPILATION_TIME()
    source = metrics.METRIC_SOURCE_CODE_SIZE()
    return {
        "classes": compile_ms.getCount(),
        "compile_s": compile_ms.getSnapshot().getMean() * compile_ms.getCount() / 1000.0,
        "source_kb": source.getSnapshot().getMean() * source.getCount() / 1024.0,
    }


def _jvm_cpu_s(spark) -> float:
    """The driver JVM's CPU seconds so far (user + system, from /proc)."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The DataFrame methods that run a Spark job (the rest build a new DataFrame, analysing its plan).
_ACTIONS = frozenset({"localCheckpoint", "toArrow", "collect", "count"})
#: Upper bounds of the plan sizes (lines of the analysed plan) ``--plans`` groups calls by.
_PLAN_LINES = (10, 25, 50, 100, 200)


class CallSites:
    """Wall time of every call into a DataFrame or GroupedData method (the driver's work: analysis
    of the new plan, or an action), summed per line of ``spark_jobs/`` that made it. Only the
    outermost call of a thread counts (DataFrame methods call one another). ``plans``: also sum
    the calls by the size of the plan they analysed (a method's result) or ran (an action's
    DataFrame), measured outside the timed call."""

    def __init__(self, plans: bool = False) -> None:
        from pyspark.sql.classic.dataframe import DataFrame
        from pyspark.sql.group import GroupedData

        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.plans = plans
        #: (builds or runs, plan-size bucket) -> [calls, seconds]
        self.by_size: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0, 0.0])
        self._dataframe = DataFrame
        self._depth = threading.local()
        for cls in (DataFrame, GroupedData):
            for name, value in list(vars(cls).items()):
                if callable(value) and not name.startswith("_"):
                    setattr(cls, name, self._wrap(name, value))

    def _wrap(self, name: str, method):
        sites = self

        def timed(*args, **kwargs):
            depth = getattr(sites._depth, "n", 0)
            if depth:
                return method(*args, **kwargs)
            sites._depth.n = 1
            start = time.perf_counter()
            result = None
            try:
                result = method(*args, **kwargs)
                return result
            finally:
                seconds = time.perf_counter() - start
                site = sites._site(name)
                sites.seconds[site] += seconds
                sites.calls[site] += 1
                if sites.plans:
                    sites._by_size(name, args[0] if name in _ACTIONS else result, seconds)
                sites._depth.n = 0

        return timed

    def _by_size(self, name: str, df, seconds: float) -> None:
        if not isinstance(df, self._dataframe):
            return
        lines = df._jdf.queryExecution().analyzed().treeString().count("\n")
        bucket = next((i for i, bound in enumerate(_PLAN_LINES) if lines < bound), len(_PLAN_LINES))
        row = self.by_size["runs" if name in _ACTIONS else "builds", bucket]
        row[0] += 1
        row[1] += seconds

    @staticmethod
    def _site(name: str) -> str:
        frame = sys._getframe(2)
        while frame is not None and "/spark_jobs/" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is None:
            return f"? {name}"
        site = f"{Path(frame.f_code.co_filename).stem}:{frame.f_lineno} {frame.f_code.co_name} {name}"
        caller = frame.f_back  # a shared helper's (materialize, ordered) caller tells which result it is
        if caller is not None and "/spark_jobs/" in caller.f_code.co_filename:
            site += f" < {Path(caller.f_code.co_filename).stem}:{caller.f_lineno} {caller.f_code.co_name}"
        return site

    def print_plans(self) -> None:
        print("  DataFrame calls by the size of their plan (lines of the analysed plan):")
        print(f"    {'':8s} {'lines':>9s} {'calls':>6s} {'seconds':>8s} {'ms a call':>9s}")
        bounds = ["0", *[str(b) for b in _PLAN_LINES]]
        for (kind, bucket), (calls, seconds) in sorted(self.by_size.items()):
            upto = f"<{_PLAN_LINES[bucket]}" if bucket < len(_PLAN_LINES) else f">={bounds[-1]}"
            print(f"    {kind:8s} {upto:>9s} {calls:6.0f} {seconds:8.2f} {1000 * seconds / calls:9.1f}")

    def print(self, n: int) -> None:
        total = sum(self.seconds.values())
        print(
            f"  DataFrame calls: {sum(self.calls.values())}, {total:.1f}s (summed over threads); the longest:"
        )
        for site, secs in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:n]:
            print(f"    {secs:6.2f}s {self.calls[site]:5d}  {site}")


def main_log(folder: Path) -> None:
    for label, row in sorted(read_event_log(folder).items(), key=lambda kv: -kv[1]["job_s"]):
        print(label, row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", type=Path)
    parser.add_argument("--master", default=None, help="default: local[*], as kwire analyze")
    parser.add_argument("--parallel", type=int, default=2, help="kwire jobs at once (as kwire analyze: 2)")
    parser.add_argument("--only", default=None)
    parser.add_argument("--rules", action="store_true", help="print the time Catalyst spent per rule")
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE: one more Spark setting")
    parser.add_argument("--jvm-options", default=None, help="instead of the small-data JIT/GC options")
    parser.add_argument(
        "--plans",
        action="store_true",
        help="print the DataFrame calls' time by the size of the plan they analysed or ran "
        "(best with --parallel 1: two jobs at once share the driver's CPU)",
    )
    parser.add_argument(
        "--operators",
        type=int,
        default=0,
        help="print the sort and aggregate time Spark's metrics give, and the N costliest operators",
    )
    parser.add_argument(
        "--stages",
        type=int,
        default=0,
        help="print the N stages with the most task time, with their operators",
    )
    parser.add_argument(
        "--sites",
        type=int,
        default=0,
        help="print the N lines of spark_jobs/ whose DataFrame calls took longest",
    )
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kwire-profile-"))
    dataset = args.dataset
    if dataset is None:
        dataset = tmp / "demo.kwire"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kwire.cli",
                "decode",
                str(ROOT / "captures/tansu-mixed.pcap"),
                "-o",
                str(dataset),
            ],
            check=True,
            capture_output=True,
        )
    events = tmp / "events"
    events.mkdir()
    load = os.getloadavg()
    print(f"dataset {dataset}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    from spark_jobs import session, submit

    if args.jvm_options is not None:
        session._SMALL_JVM_OPTIONS = args.jvm_options
    from spark_jobs.jobs import parse_job_list
    from spark_jobs.kafka_versions import load_broker_versions
    from spark_jobs.session import build_session, dataset_bytes

    built: dict[str, float] = {}
    frames: dict[str, int] = {}
    made: dict[int, int] = defaultdict(int)  # DataFrames made, per thread (kwire jobs run in threads)
    run_jobs = submit.run_jobs
    from pyspark.sql.classic.dataframe import DataFrame

    frame_init = DataFrame.__init__

    def counted_init(self, *args, **kwargs):
        made[threading.get_ident()] += 1
        frame_init(self, *args, **kwargs)

    DataFrame.__init__ = counted_init

    def timed_run_jobs(tables, names, *args, **kwargs):  # the DataFrames built (analysed), not run
        start, made0 = time.perf_counter(), made[threading.get_ident()]
        try:
            return run_jobs(tables, names, *args, **kwargs)
        finally:
            built[",".join(names)] = time.perf_counter() - start
            frames[",".join(names)] = made[threading.get_ident()] - made0

    submit.run_jobs = timed_run_jobs
    sites = CallSites(plans=args.plans) if args.sites or args.plans else None

    t0 = time.perf_counter()
    spark = build_session(
        args.master,
        "kwire-profile",
        data_bytes=dataset_bytes(dataset),
        extra_conf={
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            **dict(kv.split("=", 1) for kv in args.conf),
        },
    )
    session_s = time.perf_counter() - t0
    cpu0 = _jvm_cpu_s(spark)
    threads0 = _jvm_threads_cpu_s(spark)
    t0 = time.perf_counter()
    _, _, timings = submit.analyse(
        spark,
        dataset,
        tmp / "report",
        jobs=parse_job_list(args.only),
        versions=load_broker_versions(),
        parallel=args.parallel,
    )
    analyse_s = time.perf_counter() - t0
    cpu = _jvm_cpu_s(spark) - cpu0
    threads = _jvm_threads_cpu_s(spark)
    threads = {k: v - threads0.get(k, 0.0) for k, v in threads.items()}  # (threads that ended are not in it)
    rules = spark.sparkContext._jvm.org.apache.spark.sql.catalyst.rules.RuleExecutor.dumpTimeSpent()
    codegen = _codegen_figures(spark)
    from spark_jobs import codegen_cache

    codegen.update(codegen_cache.counts(spark))
    spark.stop()
    per = read_event_log(events)
    print(f"session start {session_s:.1f}s; analysis {analyse_s:.1f}s wall, driver JVM CPU {cpu:.1f}s")
    busiest = sorted(threads.items(), key=lambda kv: -kv[1])[:8]
    print("  its CPU by thread (live threads): " + ", ".join(f"{name} {secs:.1f}s" for name, secs in busiest))
    print(
        f"  {'kwire job':24s} {'build s':>7s} {'frames':>6s} {'spark jobs':>10s} {'in jobs s':>9s} "
        f"{'task s':>7s} {'tasks':>6s}"
    )
    for label, row in sorted(per.items(), key=lambda kv: -kv[1]["job_s"] - built.get(kv[0], 0)):
        print(
            f"  {label:24s} {built.get(label, 0):7.2f} {frames.get(label, 0):6d} {row['spark_jobs']:10.0f} "
            f"{row['job_s']:9.2f} {row['task_s']:7.2f} {row['tasks']:6.0f}"
        )
    print(f"  building the DataFrames (analysis, caches): {sum(built.values()):.1f}s")
    print(
        f"  DataFrames made in the jobs' own calls: {sum(frames.values())}, Spark jobs: "
        f"{sum(r['spark_jobs'] for r in per.values()):.0f}"
    )
    total_jobs = sum(r["job_s"] for r in per.values())
    print(f"  in Spark jobs {total_jobs:.1f}s of {analyse_s:.1f}s (the rest: planning, commits, findings)")
    print(
        "  code generation: {classes} classes compiled, ~{compile_s:.1f}s compiling (mean x count), "
        "{source_kb:.0f} KB of source; kwire's disk cache: {hits} hits, {misses} misses, {stored} stored, "
        "{failed} failed".format(**codegen)
    )
    if args.rules:
        print(rules)
    if args.operators:
        print_operator_times(read_operator_times(events), args.operators)
    if args.stages:
        print_stage_times(read_stage_times(events), args.stages)
    if sites is not None and args.sites:
        sites.print(args.sites)
    if sites is not None and args.plans:
        sites.print_plans()
    print("  writes (wall s, per result):")
    for name, secs in sorted(timings.items(), key=lambda kv: -kv[1]):
        print(f"    {name:30s} {secs:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
