"""``kwire sql``: Spark SQL over a dataset and its analysis results, printed like ``kwire decode -T``.

A query runs in one of two places:

* a **warm server** started with ``kwire sql DATASET --serve``: a Spark session that stays up with
  a Spark Connect endpoint on loopback (``sc://127.0.0.1:15002``) and the dataset registered as
  catalog tables. It leaves ``DATASET/.kwire-sql-server.json``; a later ``kwire sql DATASET QUERY``
  finds it and sends the query there, paying no JVM start, and so do ``kwire analyze`` and
  ``kwire audit`` (:func:`warm_session`). Notebooks and BI tools that speak Spark Connect can use
  the same endpoint.
* otherwise a **local session** started for this one command (a JVM start, several seconds).

Output: ``-T table|json|jsonl|csv|fields`` with :class:`kwire.rowprint.RowPrinter`, times in UTC
with microseconds. A failing query prints one line on stderr and exits 1; the JVM's own output
(warnings, logs, Java stack traces) goes to a log file, never to the terminal.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from spark_jobs.class_archive import pid_alive

__all__ = [
    "SERVER_FILE",
    "ServerInfo",
    "error_line",
    "find_server",
    "register_tables",
    "register_views",
    "serve",
    "sql",
    "warm_session",
]

#: The warm server's address file, inside the dataset it serves.
SERVER_FILE = ".kwire-sql-server.json"
DEFAULT_PORT = 15002  # Spark Connect's usual port: what notebooks and BI tools try first

#: One row per partition (or resource) result of an exchange.
_PARTITION_ERRORS_SQL = """
SELECT source, connection_id, client_id, client_ip, client_software_name, broker_ip, broker_port,
       request_time, response_time, api_key, api_name, api_version, correlation_id, group_id,
       pe.topic, pe.topic_id, pe.partition, pe.resource, pe.error_code, date
FROM exchanges LATERAL VIEW explode(partition_errors) pe_t AS pe
"""


def _fail(message: str, code: int = 2) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return typer.Exit(code)


def error_line(exc: BaseException) -> str:
    """One line for a failed query: Spark's error class and message, never a Java stack trace;
    with the first cause's message when Spark's says less (a file that is not Parquet: which
    file is Spark's, what is wrong with it the cause's)."""
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError: the Java exception's message
    text = str(java.getMessage() if java is not None else exc).strip()
    if not text:
        return type(exc).__name__
    line = _first_line(text)
    root = _root_cause(java) if java is not None else None
    if root and root not in line:
        line = f"{line}: {root}"
    # Spark Connect wraps the message: "(org.apache.spark.sql.AnalysisException) [CLASS] text"
    return re.sub(r"^\([\w.$]+\)\s*", "", line)


def _first_line(text: str) -> str:
    # Spark's error classes end their first line with "SQLSTATE: <code>", which says nothing here
    return re.sub(r"\s*SQLSTATE: \w+\s*$", "", text.strip().splitlines()[0].strip())


def _root_cause(java: Any, depth: int = 10) -> str | None:
    """The first line of the deepest cause's message of a Java exception (py4j), if it has one."""
    found = None
    with contextlib.suppress(Exception):  # a JVM gone or a py4j error: no cause to add
        cause = java.getCause()
        while cause is not None and depth > 0:
            message = cause.getMessage()
            if message:
                found = _first_line(str(message))
            cause, depth = cause.getCause(), depth - 1
    return found


# --- views and tables -------------------------------------------------------------------------


def _result_dirs(dataset: Path) -> dict[str, Path]:
    """Analysis results under DATASET/report/ that can be a table: ``name -> folder``."""
    report = dataset / "report"
    if not report.is_dir():
        return {}
    return {
        sub.name: sub
        for sub in sorted(report.iterdir())
        if sub.is_dir() and sub.name.isidentifier() and any(sub.glob("*.parquet"))
    }


def _mentions(query: str | None) -> set[str] | None:
    """The lower-case words of a query (None for no query: register everything)."""
    return None if query is None else {w.lower() for w in re.findall(r"[A-Za-z_]\w*", query)}


def view_names(dataset: Path, results: dict[str, Path] | None = None) -> list[str]:
    """The views :func:`register_views` makes over ``dataset``, without reading any table."""
    return [
        "exchanges",
        "connections",
        "partition_errors",
        *(_result_dirs(dataset) if results is None else results),
    ]


def register_views(
    spark, dataset: Path, query: str | None = None, registered: set[str] | None = None
) -> list[str]:
    """Temp views in ``spark``: exchanges, connections, partition_errors and one per result.
    Returns every view's name, registered or not.

    With ``query``, a table is only read (a file listing, a footer read, a plan analysed) when
    the query names it: a cold ``kwire sql`` then does not pay for tables it never reads. A
    query that names none of them (``SHOW TABLES``, ``SELECT 1``) registers them all.
    ``registered``: views registered before, skipped, and to which those registered now are
    added (queries read from stdin register their tables as they name them).
    """
    from spark_jobs.common import load_table

    done = registered if registered is not None else set()
    results = _result_dirs(dataset)
    views = view_names(dataset, results)
    wanted = _mentions(query)
    if wanted is not None and not wanted & {v.lower() for v in views}:
        wanted = None

    def due(name: str, *needed_by: str) -> bool:
        named = wanted is None or any(n.lower() in wanted for n in (name, *needed_by))
        return named and name not in done

    if due("exchanges", "partition_errors"):  # the partition_errors view reads exchanges
        load_table(spark, dataset, "exchanges").createOrReplaceTempView("exchanges")
        done.add("exchanges")
    if due("connections"):
        load_table(spark, dataset, "connections").createOrReplaceTempView("connections")
        done.add("connections")
    if due("partition_errors"):
        spark.sql(_PARTITION_ERRORS_SQL).createOrReplaceTempView("partition_errors")
        done.add("partition_errors")
    for name, folder in results.items():
        if due(name):
            spark.read.parquet(str(folder)).createOrReplaceTempView(name)
            done.add(name)
    return views


def _ddl(spark, schema) -> str:
    return spark._jvm.org.apache.spark.sql.types.DataType.fromJson(schema.json()).toDDL()


def register_tables(spark, dataset: Path) -> list[str]:
    """Catalog tables (seen by every Spark Connect session, unlike temp views) over the dataset:
    exchanges and connections (partitioned by ``date``, with kwire's schema), one per analysis
    result, and the view partition_errors."""
    from spark_jobs.common import connections_spark_schema, exchanges_spark_schema

    def q(path: Path) -> str:
        return str(path.resolve()).replace("\\", "\\\\").replace("'", "\\'")

    names = []
    for name, schema in (
        ("exchanges", exchanges_spark_schema()),
        ("connections", connections_spark_schema()),
    ):
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.sql(
            f"CREATE TABLE {name} ({_ddl(spark, schema)}) USING parquet PARTITIONED BY (date) "
            f"LOCATION '{q(dataset / name)}'"
        )
        if (dataset / name).is_dir():
            spark.sql(f"ALTER TABLE {name} RECOVER PARTITIONS")
        names.append(name)
    spark.sql("DROP VIEW IF EXISTS partition_errors")
    spark.sql(f"CREATE VIEW partition_errors AS {_PARTITION_ERRORS_SQL}")
    names.append("partition_errors")
    for name, folder in _result_dirs(dataset).items():
        spark.sql(f"DROP TABLE IF EXISTS {name}")
        spark.sql(f"CREATE TABLE {name} USING parquet LOCATION '{q(folder)}'")
        names.append(name)
    return names


# --- the warm server --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    """What ``DATASET/.kwire-sql-server.json`` says of a running ``kwire sql --serve``."""

    url: str
    host: str
    port: int
    pid: int
    dataset: str
    tables: list[str]


def _read_server_file(dataset: Path) -> ServerInfo | None:
    try:
        doc = json.loads((dataset / SERVER_FILE).read_text())
        return ServerInfo(**{k: doc[k] for k in ServerInfo.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def find_server(dataset: Path) -> ServerInfo | None:
    """The warm server serving ``dataset``, if one runs and accepts connections; else None."""
    info = _read_server_file(dataset)
    if info is None or Path(info.dataset) != dataset.resolve():
        return None
    if not pid_alive(info.pid) or not _accepts(info.host, info.port):
        return None
    return info


@contextlib.contextmanager
def _jvm_output_to(log: Path) -> Iterator[None]:
    """Start the JVM inside this block with its stderr (and stdout) going to ``log``: the JVM
    inherits file descriptors 1 and 2 when it starts, and keeps them; this process's are restored."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _start_session(
    master: str | None,
    app: str,
    log: Path,
    extra_conf: dict[str, str] | None = None,
    data_bytes: int | None = None,
    dataset: Path | None = None,
):
    from spark_jobs.driver_warmup import dataset_warm_up
    from spark_jobs.session import build_session

    try:
        with _jvm_output_to(log):
            spark = build_session(
                master, app, extra_conf=extra_conf, data_bytes=data_bytes, warm_up=dataset_warm_up(dataset)
            )
    except Exception as exc:
        raise _fail(f"Spark did not start: {error_line(exc)} (JVM log: {log})", 1) from None
    return spark


def _dataset_state(dataset: Path) -> frozenset[tuple[str, int, int]]:
    """The dataset's Parquet files with their sizes and times: it changes when files do."""
    found = set()
    for p in dataset.rglob("*.parquet"):
        with contextlib.suppress(OSError):
            st = p.stat()
            found.add((str(p), st.st_size, st.st_mtime_ns))
    return frozenset(found)


def serve(
    dataset: Path,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    master: str | None = None,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run a Spark session with a Spark Connect endpoint at ``sc://host:port`` serving ``dataset``
    as catalog tables, until SIGINT/SIGTERM (or ``stop`` is set). Writes DATASET/.kwire-sql-server.json
    while it runs, and registers the tables again when the dataset's Parquet files change (a new
    ``kwire analyze``). The JVM's log goes to DATASET/.kwire-sql-server.log."""
    if _accepts(host, port, 0.5):
        raise _fail(f"{host}:{port} is already in use (another server? choose --port)")
    from spark_jobs.session import dataset_bytes

    log = dataset / ".kwire-sql-server.log"
    warehouse = tempfile.mkdtemp(prefix="kwire-sql-warehouse-")
    # Small data gets the small-data settings, the JVM's too (the JIT's first tier): on the demo
    # dataset, eight `kwire analyze` runs one after the other on a new server took 14.7, 9.9, 9.1,
    # 9.2, 8.9, 8.5, 8.9 and 8.3 s with them, 19.8, 12.1, 9.7, 8.5, 8.7, 7.8, 8.9 and 8.3 s with
    # the full JIT, which never earned back its start. Running an analysis in the server before
    # it serves made the later ones slower (10.7-11.2 s).
    spark = _start_session(
        master,
        "kwire-sql-server",
        log,
        {
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
            # catalog tables are external (the dataset's own folders); nothing lands in the cwd
            "spark.sql.warehouse.dir": Path(warehouse).as_uri(),
        },
        data_bytes=dataset_bytes(dataset),
        dataset=dataset,
    )
    stop = stop or threading.Event()
    state = dataset / SERVER_FILE
    quiet: QuietAfterJvmExit | None = None
    try:
        tables = register_tables(spark, dataset)
        url = f"sc://{host}:{port}"
        info = ServerInfo(url, host, port, os.getpid(), str(dataset.resolve()), tables)
        state.write_text(json.dumps(info.__dict__, indent=2) + "\n")
        print(
            f"serving {dataset} at {url} (Spark Connect): tables {', '.join(tables)}; "
            f"`kwire sql {dataset} QUERY` uses it; Ctrl-C stops it",
            flush=True,
        )
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, lambda *_: stop.set())
        if ready is not None:
            ready.set()
        seen = changed = _dataset_state(dataset)
        jvm = getattr(spark.sparkContext._gateway, "proc", None)  # the driver JVM this process started
        if jvm is not None:
            quiet = QuietAfterJvmExit(jvm)
            logging.getLogger().addFilter(quiet)
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(1.0):
                if jvm is not None and jvm.poll() is not None and not stop.is_set():
                    # killed, or out of memory: nothing serves the endpoint any more
                    error = _fail(
                        f"the Spark JVM serving {dataset} exited (code {jvm.returncode}); its log: {log}", 1
                    )
                    if threading.current_thread() is threading.main_thread():
                        # The command's own process: its files go, then it ends at once. Whatever
                        # else would run on the way out (pyspark's stop, py4j's finalizers, threads
                        # whose JVM end is gone) can only add noise to the one line above.
                        _remove_server_file(dataset, state)
                        shutil.rmtree(warehouse, ignore_errors=True)
                        sys.stdout.flush()
                        os._exit(1)
                    raise error
                now = _dataset_state(dataset)
                # A new decode or `kwire analyze` run: serve what is there once it has stopped
                # changing for a second (an analysis on this server writes its results one by one).
                settled, changed = now == changed, now
                if now != seen and settled:
                    seen = now
                    tables = register_tables(spark, dataset)
                    info = ServerInfo(url, host, port, os.getpid(), str(dataset.resolve()), tables)
                    state.write_text(json.dumps(info.__dict__, indent=2) + "\n")
    finally:
        from py4j.protocol import Py4JError

        _remove_server_file(dataset, state)
        # a JVM already gone (SIGTERM to the whole process group, as a service manager sends it,
        # reaches it too) has nothing left to stop
        with contextlib.suppress(Py4JError, OSError), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # pyspark's "Unable to cleanly shutdown"
            spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)
        if quiet is not None:  # after the stop, whose calls a JVM already gone fails too
            logging.getLogger().removeFilter(quiet)  # a process that goes on logs as before


class QuietAfterJvmExit(logging.Filter):
    """Drops py4j's report of a call its JVM dropped once that JVM has exited.

    py4j logs every call that loses its connection (``Exception while sending command.`` and a
    traceback, on the root logger, from whichever thread made the call: a warm-up step, a
    connection py4j opened for the JVM's callbacks). A server whose JVM is killed says so in
    one line of its own; those reports only came before that line now and then, when a call was
    in flight as the JVM died. A report waits up to ``wait`` seconds for the JVM to be gone (the
    connection breaks as the process exits, a moment before its exit can be collected) and is
    shown if it still runs: a call that fails while its JVM lives is news."""

    MESSAGE = "Exception while sending command."

    def __init__(self, jvm: subprocess.Popen, wait: float = 2.0) -> None:
        super().__init__()
        self.jvm = jvm
        self.wait = wait

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != self.MESSAGE:
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.jvm.wait(self.wait)
        return self.jvm.poll() is None


def _remove_server_file(dataset: Path, state: Path) -> None:
    """Remove DATASET's server file if this process wrote it."""
    with contextlib.suppress(OSError):
        info = _read_server_file(dataset)
        if info is not None and info.pid == os.getpid():
            state.unlink()


# --- printing ---------------------------------------------------------------------------------


def _utc(value: Any) -> Any:
    """Spark hands a TIMESTAMP back as a naive datetime in this process's local time: make it an
    aware UTC time (printed with a Z), in nested values too."""
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.astimezone(dt.UTC)
    if isinstance(value, dict):
        return {k: _utc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utc(v) for v in value]
    return value


def _utc_columns(schema) -> set[str]:
    """Top-level columns whose type holds a TIMESTAMP (not a TIMESTAMP_NTZ, which has no zone)."""
    return {f.name for f in schema.fields if re.search(r"\btimestamp\b(?!_ntz)", f.dataType.simpleString())}


def _print_result(df, fmt: str, limit: int) -> int:
    """Collect up to ``limit`` rows (0: all) of ``df`` and print them; returns the rows printed."""
    from kwire.rowprint import RowPrinter

    rows = df.limit(limit + 1).collect() if limit else df.collect()
    more = bool(limit) and len(rows) > limit
    rows = rows[:limit] if limit else rows
    columns = list(df.columns)
    stamped = _utc_columns(df.schema)
    dicts = []
    for r in rows:
        d = r.asDict(recursive=True)
        for c in stamped:
            d[c] = _utc(d[c])
        dicts.append(d)
    printer = RowPrinter(fmt, columns, sys.stdout)
    printer.write(dicts)
    printer.close()
    if more:
        print(f"(first {limit} rows shown; --limit N to see more, --limit 0 for all)", file=sys.stderr)
    return len(dicts)


def _quiet_pyspark_errors() -> None:
    """PySpark logs every failed query's error with its Java stack trace (as JSON, on stderr)
    before raising it: the one-line error printed here says it already."""
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True


def _run_query(spark, text: str, fmt: str, limit: int) -> bool:
    try:
        _print_result(spark.sql(text), fmt, limit)
    except Exception as exc:  # any Spark error (Py4JError, PySparkException): one line, session kept
        if isinstance(exc, BrokenPipeError):
            raise
        print(f"error: {error_line(exc)}", file=sys.stderr, flush=True)
        return False
    return True


#: How long a server found in DATASET/.kwire-sql-server.json (or given by --remote) has to answer
#: a first request: something else listening on its port would otherwise hold the command for as
#: long as the Connect client retries (minutes). ``$KWIRE_SQL_ANSWER_SECONDS`` overrides it.
_ANSWER_SECONDS = 30.0


def _remote_session(info: ServerInfo):
    """A Spark Connect session on ``info``'s server, once the server has answered a first
    request (its Spark version); raises if it did not within ``_ANSWER_SECONDS``."""
    from pyspark.sql import SparkSession

    got: dict[str, Any] = {}

    def connect() -> None:
        try:
            spark = SparkSession.builder.remote(info.url).getOrCreate()
            spark.version  # noqa: B018 - a round trip: the server answers
            got["spark"] = spark
        except Exception as exc:  # handed to the caller below
            got["error"] = exc

    thread = threading.Thread(target=connect, name="kwire-connect", daemon=True)
    thread.start()
    wait = float(os.environ.get("KWIRE_SQL_ANSWER_SECONDS", _ANSWER_SECONDS))
    thread.join(wait)
    if thread.is_alive():
        # The Connect client's thread stays stuck in its retries, and its exit hooks with it:
        # the process would never end. Say so in one line and leave at once.
        _fail(
            f"cannot use the Spark Connect server at {info.url}: no answer in {wait:g} s "
            "(is it a Spark Connect server? --local runs without it)"
        )
        sys.stdout.flush()
        os._exit(1)
    if "error" in got:
        raise got["error"]
    return got["spark"]


def warm_session(dataset: Path, data_bytes: int | None):
    """A Spark Connect session on the warm server serving ``dataset`` (``kwire sql --serve``),
    with the SQL settings for ``data_bytes`` of data; None when no server serves it. ``kwire
    analyze`` and ``kwire audit`` run there: no JVM to start, and a JVM whose planner is compiled."""
    from spark_jobs.session import session_sql_conf

    info = find_server(dataset)
    if info is None:
        return None
    try:
        spark = _remote_session(info)
        for key, value in session_sql_conf(data_bytes).items():  # this session's alone
            spark.conf.set(key, value)
    except Exception as exc:
        raise _fail(f"cannot use the Spark Connect server at {info.url}: {error_line(exc)}", 1) from None
    return spark


# --- the command ------------------------------------------------------------------------------


def sql(
    dataset: Annotated[Path, typer.Argument(help="dataset directory")],
    query: Annotated[
        str | None, typer.Argument(help="a Spark SQL query; without it, read queries from stdin")
    ] = None,
    fmt: Annotated[
        str, typer.Option("-T", "--format", help="table | json | jsonl | csv | fields (as kwire decode -T)")
    ] = "table",
    limit: Annotated[int, typer.Option(help="rows to print per query (0: all)")] = 100,
    master: Annotated[str | None, typer.Option(help="Spark master URL [default: local[*]]")] = None,
    serve_: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="keep a warm Spark session with a Spark Connect endpoint; later `kwire sql` calls "
            "on this dataset use it (and notebooks/BI tools can connect)",
        ),
    ] = False,
    host: Annotated[
        str, typer.Option(help="--serve: address to listen on (loopback by default)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="--serve: Spark Connect port")] = DEFAULT_PORT,
    remote: Annotated[
        str | None,
        typer.Option(
            help="Spark Connect URL to send queries to (sc://host:port) [default: the dataset's server]"
        ),
    ] = None,
    local: Annotated[
        bool, typer.Option("--local", help="start a local session even when a server serves the dataset")
    ] = False,
) -> None:
    """Spark SQL over the dataset and its analysis results.

    Tables: exchanges, connections, partition_errors (one row per partition result), and one per
    result under DATASET/report/. Without a query: one query per line until EOF or quit.
    `kwire sql DATASET --serve` keeps Spark warm for later queries.
    """
    from kwire.rowprint import FORMATS

    if fmt not in FORMATS:
        raise _fail(f"-T {fmt}: unknown format (one of {', '.join(FORMATS)})")
    if limit < 0:
        raise _fail("--limit must be 0 (all rows) or more")
    if not dataset.is_dir():
        raise _fail(f"no dataset at {dataset}")
    if not (dataset / "exchanges").is_dir() and not (dataset / "connections").is_dir():
        raise _fail(f"{dataset} is not a kwire dataset (no exchanges/ or connections/ inside)")
    if serve_:
        if query is not None:
            raise _fail("--serve takes no query: it serves until stopped")
        serve(dataset, host=host, port=port, master=master)
        return

    info = None
    if remote is not None:
        m = re.fullmatch(r"sc://([^:/]+):(\d+)/?", remote)
        if not m:
            raise _fail(f"--remote {remote}: expected sc://HOST:PORT")
        info = ServerInfo(remote, m[1], int(m[2]), 0, str(dataset.resolve()), [])
    elif not local:
        info = find_server(dataset)
    registered: set[str] | None = None  # a local session's views made so far (a server has its tables)
    if info is not None:
        try:
            spark = _remote_session(info)
        except Exception as exc:
            raise _fail(f"cannot use the Spark Connect server at {info.url}: {error_line(exc)}", 1) from None
        views = info.tables
    else:
        log = Path(tempfile.gettempdir()) / f"kwire-sql-{os.getpid()}.log"
        from spark_jobs.session import dataset_bytes

        spark = _start_session(master, "kwire-sql", log, data_bytes=dataset_bytes(dataset), dataset=dataset)
        with contextlib.suppress(OSError):
            log.unlink()  # the JVM keeps writing to its open file; nothing is left behind
        # a query's tables are registered as it names them: queries read from stdin too, so the
        # prompt does not wait for every result's footer (27 on the demo dataset: 2.6 s)
        registered = set()
        try:
            views = (
                view_names(dataset) if query is None else register_views(spark, dataset, query, registered)
            )
        except Exception as exc:
            raise _fail(f"cannot read {dataset}: {error_line(exc)}", 1) from None

    _quiet_pyspark_errors()
    if query is not None:
        raise typer.Exit(0 if _run_query(spark, query, fmt, limit) else 1)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"tables: {', '.join(views)}; one query per line, 'quit' or Ctrl-D to leave")
    failed = False
    while True:
        if interactive:
            print("kwire-sql> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.strip().rstrip(";").strip()
        if not text or text.startswith("--"):
            continue
        if text.lower() in ("quit", "exit", r"\q"):
            break
        started = time.perf_counter()
        if registered is not None:
            try:
                register_views(spark, dataset, text, registered)
            except Exception as exc:  # one unreadable result: said, the session kept for the others
                print(f"error: cannot read {dataset}: {error_line(exc)}", file=sys.stderr, flush=True)
                failed = True
                continue
        ok = _run_query(spark, text, fmt, limit)
        failed |= not ok
        if interactive and ok:
            print(f"({time.perf_counter() - started:.2f}s)", file=sys.stderr)
    raise typer.Exit(1 if failed else 0)
