"""`kwire sql`: -T formats, microsecond UTC times, one-line errors, and the warm Spark Connect server.

The dataset is a shipped capture decoded by `kwire decode`, plus one analysis result written as
Parquet; every printed row is compared with the rows pyarrow reads from the same files. The cold
path and the server run as real `kwire` processes (a real JVM each), bounded by timeouts and
stopped by process group.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")
import typer
from spark_fixtures import spark  # noqa: F401
from typer.testing import CliRunner
from warm_server import warm_server

from kwire.analytics_commands import audit
from kwire.sql_command import SERVER_FILE, QuietAfterJvmExit, error_line, find_server, register_views, sql
from spark_jobs.submit import analyse

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]
KWIRE = [sys.executable, "-m", "kwire"]
QUERY = (
    "SELECT correlation_id, api_name, request_time, latency_us FROM exchanges "
    "WHERE response_time IS NOT NULL ORDER BY request_time, connection_id, correlation_id"
)
app = typer.Typer()
app.command()(sql)
app.command()(audit)
runner = CliRunner()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """captures/tansu-mixed.pcap decoded, with one result under report/ as `kwire analyze` leaves it."""
    ds = tmp_path_factory.mktemp("sql") / "mixed.kwire"
    subprocess.run(
        [*KWIRE, "decode", str(ROOT / "captures" / "tansu-mixed.pcap"), "-o", str(ds)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (ds / "report" / "client_summary").mkdir(parents=True)
    pq.write_table(
        pa.table({"client_id": ["a", "b"], "requests": [3, 5]}),
        ds / "report" / "client_summary" / "part-0.parquet",
    )
    return ds


def expected_rows(ds: Path) -> list[dict]:
    """The QUERY's rows straight from the Parquet files, times as `-T json` prints them."""
    table = pq.ParquetDataset(ds / "exchanges").read(
        columns=["connection_id", "correlation_id", "api_name", "request_time", "response_time", "latency_us"]
    )
    rows = [r for r in table.to_pylist() if r["response_time"] is not None]
    rows.sort(key=lambda r: (r["request_time"], r["connection_id"], r["correlation_id"]))
    return [
        {
            "correlation_id": r["correlation_id"],
            "api_name": r["api_name"],
            "request_time": r["request_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "latency_us": r["latency_us"],
        }
        for r in rows
    ]


def test_json_csv_table_print_the_parquet_rows(spark, dataset):  # noqa: F811
    want = expected_rows(dataset)
    assert len(want) > 100 and any(not r["request_time"].endswith("000Z") for r in want)

    out = runner.invoke(app, ["sql", str(dataset), QUERY, "-T", "json", "--limit", "0"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == want

    out = runner.invoke(app, ["sql", str(dataset), QUERY, "-T", "csv", "--limit", "0"])
    assert out.exit_code == 0, out.output
    got = list(csv.DictReader(io.StringIO(out.stdout)))
    assert got == [{k: str(v) for k, v in r.items()} for r in want]

    out = runner.invoke(app, ["sql", str(dataset), QUERY, "--limit", "5"])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["correlation_id", "api_name", "request_time", "latency_us"]
    assert [line.split() for line in lines[1:]] == [[str(v) for v in r.values()] for r in want[:5]]
    assert "first 5 rows shown" in out.stderr


def test_results_and_partition_errors_are_tables(spark, dataset):  # noqa: F811
    out = runner.invoke(
        app, ["sql", str(dataset), "SELECT sum(requests) AS n FROM client_summary", "-T", "jsonl"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {"n": 8}
    pe = runner.invoke(
        app, ["sql", str(dataset), "SELECT count(*) AS n FROM partition_errors", "-T", "jsonl"]
    )
    table = pq.ParquetDataset(dataset / "exchanges").read(columns=["partition_errors"]).to_pylist()
    assert json.loads(pe.stdout) == {"n": sum(len(r["partition_errors"] or []) for r in table)}


@pytest.mark.parametrize(
    ("query", "error_class"),
    [
        ("SELECT nope FROM nowhere", "TABLE_OR_VIEW_NOT_FOUND"),
        ("SELEC 1", "PARSE_SYNTAX_ERROR"),
        ("SELECT CAST('x' AS INT)", "CAST_INVALID_INPUT"),  # fails at run time, not analysis
    ],
)
def test_bad_query_is_one_line_in_process(spark, dataset, query, error_class):  # noqa: F811
    out = runner.invoke(app, ["sql", str(dataset), query])
    assert out.exit_code == 1
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"error: [{error_class}]"), line


def test_bad_options_exit_2(dataset, tmp_path):
    for args, message in [
        ([str(dataset), "SELECT 1", "-T", "xml"], "unknown format"),
        ([str(tmp_path / "none"), "SELECT 1"], "no dataset"),
        ([str(dataset), "SELECT 1", "--remote", "localhost:1"], "sc://HOST:PORT"),
        ([str(dataset), "SELECT 1", "--serve"], "takes no query"),
    ]:
        out = runner.invoke(app, ["sql", *args])
        assert out.exit_code == 2, (args, out.output)
        (line,) = out.stderr.splitlines()
        assert message in line


def test_error_line_strips_connect_wrapping():
    assert error_line(ValueError("(org.apache.spark.sql.AnalysisException) [X] bad\nmore")) == "[X] bad"


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*KWIRE, "sql", *args], capture_output=True, text=True, timeout=timeout)


def test_cold_process_bad_query_has_one_stderr_line(dataset):
    """A real process with its own JVM: the JVM's warnings and logs stay off the terminal."""
    done = _run([str(dataset), "SELECT nope FROM nowhere", "--local"])
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith(
        "error: [TABLE_OR_VIEW_NOT_FOUND]"
    ), done.stderr


def test_cold_process_imports_no_pandas(dataset):
    """PySpark's numpy probe imports pandas (0.55 s of a cold run) unless ``numpy_probe`` is
    installed: a cold query answers with neither pandas nor ``pyspark.testing`` loaded."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('loaded:', sorted(m for m in ('pandas', 'pyspark.testing.utils')"
        " if m in sys.modules), file=sys.stderr))\n"
        "from kwire.cli import run\n"
        f"sys.exit(run(['sql', {str(dataset)!r}, 'SELECT count(*) AS n FROM exchanges', '--local', '-T', 'csv']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["n", str(pq.read_table(dataset / "exchanges").num_rows)]
    assert "loaded: []" in done.stderr.splitlines(), done.stderr


def test_numpy_probe_answers_as_pyspark_does():
    import numpy as np
    from pyspark.sql import types

    from spark_jobs import numpy_probe

    numpy_probe.install()
    array, scalar = types.NumpyArrayConverter(), types.NumpyScalarConverter()
    assert array.can_convert(np.array([1, 2])) and not array.can_convert(np.ones((2, 2)))
    assert scalar.can_convert(np.int64(3)) and scalar.can_convert(np.float32(1.5))
    for other in ([1, 2], 3, "x", None, b"\x00"):
        assert not array.can_convert(other) and not scalar.can_convert(other)


def _free_port() -> int:
    import socket

    for port in range(41540, 41560):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 41540-41559")


def _kwire(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*KWIRE, *args], capture_output=True, text=True, timeout=timeout, env=env)


def result_files(report: Path) -> dict[str, tuple[pa.Schema, dict, list[dict]]]:
    """Every result folder of an analysis: its file's schema (with Spark's metadata) and rows."""
    found = {}
    for folder in sorted(p for p in report.iterdir() if p.is_dir()):
        table = pq.ParquetDataset(folder).read()
        found[folder.name] = (table.schema, table.schema.metadata, table.to_pylist())
    return found


def test_warm_server_answers_later_queries(spark, dataset):  # noqa: F811
    port = _free_port()
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with warm_server(dataset, port, **popen) as server:
        info = find_server(dataset)
        assert info.url == f"sc://127.0.0.1:{port}" and info.pid == server.pid
        assert {"exchanges", "connections", "partition_errors", "client_summary"} <= set(info.tables)

        done = _run([str(dataset), QUERY, "-T", "json", "--limit", "0"])
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == expected_rows(dataset)
        assert done.stderr == ""

        done = _run([str(dataset), "SELECT sum(requests) AS n FROM client_summary", "-T", "csv"])
        assert (done.returncode, done.stdout) == (0, "n\n8\n"), done.stderr

        bad = _run([str(dataset), "SELECT nope FROM nowhere"])
        assert bad.returncode == 1 and bad.stdout == ""
        (line,) = bad.stderr.splitlines()
        assert line.startswith("error: [TABLE_OR_VIEW_NOT_FOUND]"), bad.stderr

        # The server survives a failed query; a result written later (a new `kwire analyze`)
        # becomes a table without a restart.
        again = _run([str(dataset), "SELECT count(*) AS n FROM connections", "-T", "jsonl"])
        assert again.returncode == 0 and json.loads(again.stdout)["n"] > 0, again.stderr
        (dataset / "report" / "late_result").mkdir()
        pq.write_table(pa.table({"x": [1, 2, 3]}), dataset / "report" / "late_result" / "part-0.parquet")
        deadline = time.monotonic() + 120
        while "late_result" not in find_server(dataset).tables:
            assert time.monotonic() < deadline, "late_result not registered in 120 s"
            time.sleep(0.5)
        late = _run([str(dataset), "SELECT sum(x) AS s FROM late_result", "-T", "csv"])
        assert (late.returncode, late.stdout) == (0, "s\n6\n"), late.stderr

        # `kwire analyze` and `kwire audit` run on the server when it serves the dataset: the
        # same result files (schema, Spark's metadata, rows) as an analysis in a local session.
        served = dataset.parent / "served-report"
        done = _kwire(["analyze", str(dataset), "-o", str(served)], timeout=900)
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip().endswith("on the warm server"), done.stdout[-500:]
        local = dataset.parent / "local-report"
        analyse(spark, dataset, local)
        assert result_files(served) == result_files(local)
        assert len(result_files(local)) >= 20  # every job's results, the findings too
        audited = _kwire(["audit", str(dataset), "--broker-version", "0.9", "--json"])
        assert audited.returncode == 1, audited.stderr  # 0.9 knows none of the newer versions
        here = runner.invoke(app, ["audit", str(dataset), "--broker-version", "0.9", "--json", "--local"])
        assert (here.exit_code, json.loads(here.stdout)) == (1, json.loads(audited.stdout))
        assert json.loads(audited.stdout)["violations"]
        # the server is still there and serving after the analysis closed its session
        after = _run([str(dataset), "SELECT count(*) AS n FROM exchanges", "-T", "csv"])
        assert after.returncode == 0 and after.stdout.split()[1] == str(
            len(pq.read_table(dataset / "exchanges"))
        )

        # SIGTERM stops it cleanly, removing its file.
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=120)
        assert server.returncode == 0
        assert f"sc://127.0.0.1:{port}" in out
        assert not (dataset / SERVER_FILE).exists()


def test_a_server_stops_quietly_on_a_group_sigterm_and_says_so_when_its_jvm_dies(dataset):
    """A service manager stops the whole process group (the JVM too): exit 0, no traceback (there
    was one, from stopping a JVM already gone). A JVM killed under a running server (the OOM
    killer): one line and exit 1 at once (the server used to go on serving nothing)."""
    from realkafka import descendants

    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with warm_server(dataset, _free_port(), **popen) as server:
        os.killpg(server.pid, signal.SIGTERM)
        _, err = server.communicate(timeout=120)
        assert server.returncode == 0 and err.strip() == "", err[-3000:]
    with warm_server(dataset, _free_port(), **popen) as server:
        (jvm,) = [pid for pid, name in descendants(server.pid) if name == "java"]
        os.kill(jvm, signal.SIGKILL)
        _, err = server.communicate(timeout=60)
        assert server.returncode == 1, err[-3000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: the Spark JVM serving {dataset} exited"), err
    assert not (dataset / SERVER_FILE).exists()


def test_py4j_reports_of_a_dead_jvm_are_dropped_and_of_a_live_one_kept():
    """py4j logs a traceback for each call its JVM dropped, from whichever thread made it; one came
    before the server's one line now and then (the test above: 1 of 39 runs). A report is
    shown while the JVM (here a real process standing in for it) still runs, dropped once it has
    exited; other records pass."""
    import logging

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("root", logging.ERROR, __file__, 1, message, None, None)

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        quiet = QuietAfterJvmExit(child, wait=0.2)
        assert quiet.filter(record(QuietAfterJvmExit.MESSAGE))  # alive: news
        child.kill()
        assert not quiet.filter(record(QuietAfterJvmExit.MESSAGE))  # waited for it to be gone
        assert quiet.filter(record("something else"))
    finally:
        child.kill()
        child.wait(10)


def test_a_server_file_pointing_at_a_silent_port_is_one_line_not_a_hang(dataset, tmp_path):
    """Something else listening where DATASET/.kwire-sql-server.json says the server is (a stale
    file, a port taken since): the commands say so in one line and exit 1, in bounded time."""
    import socket

    ds = tmp_path / "ds"
    ds.mkdir()
    for table in ("exchanges", "connections"):
        (ds / table).symlink_to(dataset / table)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts connections, never answers
        port = silent.getsockname()[1]
        info = {"url": f"sc://127.0.0.1:{port}", "host": "127.0.0.1", "port": port}
        info |= {"pid": os.getpid(), "dataset": str(ds.resolve()), "tables": []}
        (ds / SERVER_FILE).write_text(json.dumps(info))
        env = {**os.environ, "KWIRE_SQL_ANSWER_SECONDS": "3"}
        for args in (
            ["sql", str(ds), "SELECT 1"],
            ["analyze", str(ds)],
            ["audit", str(ds), "--broker-version", "4.0"],
        ):
            done = subprocess.run([*KWIRE, *args], capture_output=True, text=True, timeout=120, env=env)
            assert (done.returncode, done.stdout) == (1, ""), (args, done.stderr)
            assert done.stderr.splitlines() == [
                f"error: cannot use the Spark Connect server at sc://127.0.0.1:{port}: no answer in 3 s "
                "(is it a Spark Connect server? --local runs without it)"
            ], done.stderr
    assert not (ds / "report").exists() or not any((ds / "report").iterdir())


def test_queries_from_stdin_one_per_line(spark, dataset):  # noqa: F811
    lines = (
        "SELECT count(*) AS n FROM connections;\n"
        "-- a comment\n\n"
        "SELECT nope FROM nowhere\n"
        "SELECT sum(requests) AS n FROM client_summary\n"
        "quit\n"
        "SELECT 1 AS never\n"
    )
    out = runner.invoke(app, ["sql", str(dataset), "-T", "jsonl"], input=lines)
    assert out.exit_code == 1  # one query failed; the others still ran
    connections = pq.ParquetDataset(dataset / "connections").read().num_rows
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"n": connections}, {"n": 8}]
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: [TABLE_OR_VIEW_NOT_FOUND]")


def test_queries_register_only_the_tables_they_name(spark, dataset):  # noqa: F811
    """A cold ``kwire sql`` reads a table (its files listed, a footer read) only for a query
    that names it; queries from stdin register theirs as they come. A query that names none
    (``SHOW TABLES``) registers them all, so the session's catalog is complete when asked."""
    registered: set[str] = set()
    views = register_views(spark, dataset, "SELECT sum(requests) FROM client_summary", registered)
    assert registered == {"client_summary"}
    assert views[:3] == ["exchanges", "connections", "partition_errors"] and "client_summary" in views
    register_views(spark, dataset, "SELECT count(*) FROM PARTITION_ERRORS", registered)  # reads exchanges
    assert registered == {"client_summary", "exchanges", "partition_errors"}
    register_views(spark, dataset, "SHOW TABLES", registered)
    assert registered == set(views)


def test_an_unreadable_result_is_one_line_and_stdin_queries_go_on(dataset, tmp_path):
    """Before, every result was read before the first query from stdin: one damaged result file
    ended the session with nothing answered (and a healthy prompt waited 2.6 s for 27 results)."""
    ds = tmp_path / "copy.kwire"
    shutil.copytree(dataset, ds)
    (ds / "report" / "broken_result").mkdir()
    (ds / "report" / "broken_result" / "part-0.parquet").write_bytes(b"not parquet at all")
    lines = "SELECT count(*) AS n FROM broken_result\nSELECT sum(requests) AS n FROM client_summary\n"
    done = subprocess.run(
        [*KWIRE, "sql", str(ds), "-T", "jsonl", "--local"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [{"n": 8}]
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: cannot read {ds}: ") and "broken_result" in line, line
