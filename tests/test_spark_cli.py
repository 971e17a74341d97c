"""`kwire audit`, `kwire analyze` and `kwire sql` end to end on tiny datasets written to disk."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("pyspark")
import typer
from spark_fixtures import at, conn, ex, spark, write_dataset  # noqa: F401
from typer.testing import CliRunner

from kwire.analytics_commands import analyze, audit, sql

pytestmark = pytest.mark.spark

app = typer.Typer()
app.command()(analyze)
app.command()(audit)
app.command()(sql)
runner = CliRunner()


@pytest.fixture
def old_clients(tmp_path):
    rows = [
        ex(
            0,
            "Produce",
            api_version=2,
            client_id="legacy-producer",
            errors=[("orders", 0, 0)],
            acks=1,
            records=5,
        ),
        ex(
            1,
            "ApiVersions",
            api_version=3,
            client_id="new-lib",
            client_software_name="librdkafka",
            client_software_version="2.3.0",
        ),
        ex(2, "Metadata", api_version=12, client_id="new-lib"),
    ]
    return write_dataset(tmp_path / "ds", rows, [conn()])


def test_audit_flags_produce_v2_for_4_0(spark, old_clients):  # noqa: F811
    result = runner.invoke(app, ["audit", str(old_clients), "--broker-version", "4.0", "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["broker_version"] == "4.0"
    assert [(v["client_id"], v["api_name"], v["api_version"], v["reason"]) for v in doc["violations"]] == [
        ("legacy-producer", "Produce", 2, "advertised_but_rejected")
    ]
    assert [(f["kind"], f["severity"], f["client_id"]) for f in doc["findings"]] == [
        ("unsupported_version", "critical", "legacy-producer")
    ]


def test_audit_flags_api_versions_for_0_9(spark, old_clients):  # noqa: F811
    result = runner.invoke(app, ["audit", str(old_clients), "--broker-version", "0.9"])
    assert result.exit_code == 1, result.output
    assert "Kafka 0.9.0: 3 (client, api, version) combinations rejected" in result.stdout
    doc = json.loads(
        runner.invoke(app, ["audit", str(old_clients), "--broker-version", "0.9", "--json"]).stdout
    )
    flagged = {(v["api_key"], v["api_version"]): v for v in doc["violations"]}
    assert flagged[(18, 3)]["reason"] == "not_in_release" and flagged[(18, 3)]["client_id"] == "new-lib"
    assert set(flagged) == {(18, 3), (0, 2), (3, 12)}  # 0.9 knows Produce v0-1 and Metadata v0 only


def test_audit_clean_dataset_exits_0(spark, tmp_path):  # noqa: F811
    ds = write_dataset(tmp_path / "ok", [ex(0, "Produce", api_version=9), ex(1, "Metadata", api_version=12)])
    result = runner.invoke(app, ["audit", str(ds), "--broker-version", "3.9"])
    assert result.exit_code == 0, result.output
    assert "0 (client, api, version) combinations rejected" in result.stdout


def test_audit_bad_input_exits_2_with_one_line(tmp_path, old_clients):
    missing = runner.invoke(app, ["audit", str(tmp_path / "nope"), "--broker-version", "4.0"])
    assert missing.exit_code == 2
    assert "no dataset" in missing.output and "Traceback" not in missing.output
    unknown = runner.invoke(app, ["audit", str(old_clients), "--broker-version", "5.7"])
    assert unknown.exit_code == 2
    assert "unknown Kafka release '5.7'" in unknown.output and "3.9-kraft" in unknown.output


def test_a_damaged_parquet_file_is_one_line_naming_it_and_exit_1(spark, old_clients):  # noqa: F811
    """Spark failing on the data (here a file that is no longer Parquet) is one line, with what
    is wrong with which file, never a Python or a Java stack trace (it was both, 200 lines)."""
    (victim,) = (old_clients / "exchanges").rglob("*.parquet")
    victim.write_bytes(b"no longer Parquet " * 64)
    for args in (
        ["analyze", str(old_clients), "-o", str(old_clients / "report"), "--local"],
        ["audit", str(old_clients), "--broker-version", "4.0", "--local"],
        ["sql", str(old_clients), "SELECT count(*) FROM exchanges"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args[0], result.output[-3000:])
        lines = result.output.strip().splitlines()
        assert "Traceback" not in result.output and not any(line.startswith("\tat ") for line in lines)
        error = [line for line in lines if line.startswith("error:")]
        assert len(error) == 1, (args[0], lines[-20:])
        assert victim.name in error[0] and "is not a Parquet file" in error[0], error


def test_analyze_writes_results_and_report_then_sql_reads_them(spark, tmp_path):  # noqa: F811
    shared = {
        "client_id": "go-app",
        "client_ip": "10.0.1.2",
        "client_software_name": "sarama",
        "client_software_version": "1.42.1",
    }
    rows = [ex(0, "ApiVersions", api_version=3, **shared)]
    rows += [
        ex(1 + 0.2 * i, "Produce", api_version=7, acks=1, records=3, errors=[("orders", 0, 56)], **shared)
        for i in range(4)
    ]
    rows += [
        ex(20, "Produce", api_version=7, acks=1, errors=[("orders", 0, 6)], **shared),
        ex(20.1, "Metadata", api_version=7, **shared),
    ]
    rows += [
        ex(30, "Heartbeat", group_id="g", error_code=16),
        ex(31, "Heartbeat", group_id="g", error_code=16),
    ]
    rows += [ex(40, "Fetch", status="unanswered", connection_id="c9"), ex(60, "Heartbeat")]
    ds = write_dataset(
        tmp_path / "ds", rows, [conn(), conn(connection_id="c9", end_reason="rst", last_packet_time=at(45))]
    )
    result = runner.invoke(app, ["analyze", str(ds), "--broker-version", "4.0", "--top", "3", "--tables"])
    assert result.exit_code == 0, result.output
    report = ds / "report"
    for name in (
        "unsupported_versions",
        "error_reaction_headline",
        "producer_acks",
        "coordinator_errors",
        "connection_broken",
        "client_inventory",
    ):
        assert any((report / name).glob("*.parquet")), name
    page = (report / "report.html").read_text()
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)  # charts: inline Vega
    assert "default-src 'none'" in page and " src=" not in markup and "<link" not in markup
    assert page.index('id="findings"') < page.index('id="timeline"') < page.index("Client inventory")
    # sarama: retries on 56 without new metadata, refreshes after 6
    assert "got KAFKA_STORAGE_ERROR 4 times on Produce and sent the failed requests again" in page
    from spark_jobs.findings import load_findings

    kinds = {f["kind"]: f for f in load_findings(report)}
    assert kinds["no_refresh_after_error"]["client_id"] == "go-app"
    assert kinds["no_refresh_after_error"]["severity"] == "warning"  # retried, nothing dropped
    assert kinds["no_refresh_after_error"]["evidence"]["verdict"] == "retry_without_refresh"
    # one client column: the short name, the full label as its title
    assert 'title="&#39;go-app&#39; at 10.0.1.2 (sarama 1.42.1)">go-app</td>' in page
    assert "findings" in result.stdout
    assert "no_refresh_after_error x1" in result.stdout  # the findings counted by kind
    # --tables: the supporting tables name each client as the timeline does, one line per row
    # even off a terminal (the runner's stdout is not one: no folding at 80 columns).
    headline = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("│") and "retry_without_refresh" in line and "KAFKA_STORAGE_ERROR" in line
    ]
    assert len(headline) == 1 and "│ go-app " in headline[0], result.stdout
    assert not re.search(r"\de[+-]0", result.stdout)  # numbers printed without an exponent

    one = runner.invoke(app, ["sql", str(ds), "SELECT reaction_56, reaction_6 FROM error_reaction_headline"])
    assert one.exit_code == 0, one.output
    assert "retry_without_refresh" in one.stdout
    lines = (
        "SELECT count(*) AS n FROM partition_errors WHERE error_code = 56;\nSELECT nope FROM nowhere\nquit\n"
    )
    interactive = runner.invoke(app, ["sql", str(ds)], input=lines)
    assert interactive.exit_code == 1  # the second query failed, with a one-line error
    assert re.search(r"^n\n4$", interactive.stdout, re.M) and "error:" in interactive.output
    bad = runner.invoke(app, ["analyze", str(ds), "--only", "nope"])
    assert bad.exit_code == 2 and "unknown job" in bad.output
