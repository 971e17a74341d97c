"""report.html of shipped captures, loaded in headless Chromium (Debian's ``chromium``).

The dataset holds two runs: the lab's leader-skew capture and a Tansu capture taken at another
time, so the page has two timelines and a gap between them. Checks that the page loads with no
console error and asks the network for nothing, that its summary figures are the dataset's own
(counted here with pyarrow, not by the jobs), that every finding is on it, and saves a screenshot
to ``out/test-artifacts/`` (git-ignored).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
import pyarrow.compute as pc
import pyarrow.dataset as pads
import typer
from chromium_page import chromium_binary, load_page
from spark_fixtures import spark  # noqa: F401
from typer.testing import CliRunner

from kwire.analytics_commands import analyze

pytestmark = [pytest.mark.spark, pytest.mark.real]

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "test-artifacts"
CAPTURES = [ROOT / "captures" / "lab" / "002-skew" / "capture.pcap.gz", ROOT / "captures" / "tansu-kcat.pcap"]
READY = "window.kwireChartsReady !== undefined"
PAGE_VALUES = {
    "charts": "window.kwireChartsReady",
    "drawn": "document.querySelectorAll('.chart svg.marks').length",
    "figures": "Object.fromEntries([...document.querySelectorAll('[data-figure]')]"
    ".map(e => [e.dataset.figure, e.dataset.value]))",
    "kinds": "[...document.querySelectorAll('article.finding')].map(e => e.dataset.kind)",
    "text": "document.body.innerText",
}

app = typer.Typer()
app.command()(analyze)
runner = CliRunner()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    if chromium_binary() is None:
        pytest.skip("chromium is not installed (scripts/install-system-deps)")
    out = tmp_path_factory.mktemp("report") / "ds"
    done = subprocess.run(
        [sys.executable, "-m", "kwire", "decode", *map(str, CAPTURES), "-o", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out


def _dataset_figures(ds: Path, source: str | None = None) -> dict[str, str]:
    """The summary's figures counted from the dataset itself."""
    ex = pads.dataset(ds / "exchanges", format="parquet", partitioning="hive").to_table()
    co = pads.dataset(ds / "connections", format="parquet", partitioning="hive").to_table()
    if source:
        ex = ex.filter(pc.equal(ex["source"], source))
        co = co.filter(pc.equal(co["source"], source))
    rows = ex.select(
        [
            "source",
            "client_id",
            "client_ip",
            "broker_ip",
            "broker_port",
            "status",
            "error_code",
            "partition_errors",
            "request_time",
            "response_time",
        ]
    ).to_pylist()
    asked = [r for r in rows if r["status"] != "orphan_response"]
    errors = sum(
        (1 if r["error_code"] not in (None, 0) else 0)
        + sum(1 for p in r["partition_errors"] or [] if p["error_code"] != 0)
        for r in rows
    )
    times = [t for r in rows for t in (r["request_time"], r["response_time"]) if t is not None]
    times += [t for t in co["first_packet_time"].to_pylist() + co["last_packet_time"].to_pylist() if t]
    per_source = Counter(r["source"] for r in rows)
    spans = {}
    for src in per_source:
        mine = [t for r in rows if r["source"] == src for t in (r["request_time"], r["response_time"]) if t]
        mine += [
            t
            for r in co.to_pylist()
            if r["source"] == src
            for t in (r["first_packet_time"], r["last_packet_time"])
            if t
        ]
        spans[src] = (min(mine), max(mine))
    return {
        "sources": str(len(per_source)),
        "exchanges": str(len(rows)),
        "errors": str(errors),
        "clients": str(len({(r["source"], r["client_id"], r["client_ip"]) for r in asked})),
        "brokers": str(len({(r["source"], r["broker_ip"], r["broker_port"]) for r in asked})),
        "span_s": (max(times) - min(times)).total_seconds(),
        "spans": spans,
    }


def _check_page(page: Path, truth: dict, findings: list[dict], shot: Path) -> dict:
    loaded = load_page(page, ready=READY, values=PAGE_VALUES, screenshot=shot, timeout=120)
    assert loaded.errors == [], loaded.errors
    assert loaded.external_requests == [], loaded.external_requests
    v = loaded.values
    assert v["charts"] > 0 and v["drawn"] == v["charts"], v  # every chart drew, none failed
    figures = v["figures"]
    for name in ("sources", "exchanges", "errors", "clients", "brokers"):
        assert figures[name] == truth[name], (name, figures, truth)
    assert float(figures["span_s"]) == pytest.approx(truth["span_s"], abs=1e-6)
    assert figures["findings"] == str(len(findings))
    assert v["kinds"] == [f["kind"] for f in findings]
    text = re.sub(r"\s+", " ", v["text"])
    for f in findings:
        assert re.sub(r"\s+", " ", f["summary"]) in text, f["summary"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return v


def test_report_of_two_captures_in_headless_chromium(dataset, spark):  # noqa: F811
    from spark_jobs.findings import load_findings

    result = runner.invoke(app, [str(dataset)])
    assert result.exit_code == 0, result.output
    report = dataset / "report"
    findings = load_findings(report)
    truth = _dataset_figures(dataset)
    assert truth["sources"] == "2"
    values = _check_page(report / "report.html", truth, findings, ARTIFACTS / "report-two-captures.png")
    assert values["charts"] == 4  # a timeline per run, the runs' spans, the Metadata intervals
    # the terminal shows the same: summary, findings, clients; no table without --tables
    out = result.stdout
    assert f"{int(truth['exchanges']):,} exchanges, {int(truth['errors']):,} errors" in out
    assert out.index(" summary ─") < out.index(" findings ─") < out.index("\nclients")
    for i, f in enumerate(findings, 1):
        assert f"#{i} {f['severity']}" in out
    assert "Client inventory" not in out and "supporting tables: --tables prints them" in out


def test_report_of_one_source_out_of_two(dataset, spark):  # noqa: F811
    bad = runner.invoke(app, [str(dataset), "--source", "nope.pcap"])
    assert bad.exit_code == 2 and "no source nope.pcap" in bad.output
    source = CAPTURES[1].name
    result = runner.invoke(
        app, [str(dataset), "--source", source, "--only", "incident_timeline,client_inventory"]
    )
    assert result.exit_code == 0, result.output
    report = dataset / f"report-{source}"
    from spark_jobs.findings import load_findings

    truth = _dataset_figures(dataset, source)
    assert truth["sources"] == "1"
    values = _check_page(
        report / "report.html", truth, load_findings(report), ARTIFACTS / "report-one-source.png"
    )
    assert values["charts"] == 1  # its timeline only (no metadata_refresh job run)
    assert CAPTURES[0].name not in values["text"]
