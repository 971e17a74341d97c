"""The report page and the terminal summary from hand-made results (no Spark, no browser)."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta

from rich.console import Console

from kwire.report_print import print_clients, print_findings, print_summary, print_tables
from spark_jobs.findings import build_findings
from spark_jobs.report import build_page, render_page
from spark_jobs.report_model import NotSeen, seconds_text
from spark_jobs.report_timeline import bucket_width

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=18)  # a second capture, 18 minutes later


def _lane(kind, source, **kw):
    base = {
        "lane_kind": kind,
        "source": source,
        "client_id": None,
        "client_ip": None,
        "broker_ip": None,
        "broker_port": None,
        "node_id": None,
        "client_software_name": None,
        "client_software_version": None,
        "requests": 0,
        "unanswered": 0,
        "error_results": 0,
        "metadata_requests": 0,
        "disconnects": 0,
        "first_bucket": T0,
        "last_bucket_end": T0,
    }
    return base | kw


def _event(kind, source, t, event, count, bucket_s=0.25, detail=None, code=None, **who):
    return {
        "source": source,
        "lane_kind": kind,
        "client_id": who.get("client_id"),
        "client_ip": who.get("client_ip"),
        "broker_ip": who.get("broker_ip"),
        "broker_port": who.get("broker_port"),
        "bucket": t,
        "bucket_s": bucket_s,
        "event": event,
        "detail": detail,
        "code": code,
        "count": count,
    }


def results():
    app = {"client_id": "app", "client_ip": "10.0.0.2"}
    twin = {"client_id": "app", "client_ip": "10.0.0.5"}  # same id, another host: named with its ip
    later = {"client_id": "app", "client_ip": "10.0.0.3"}  # in the other run: just "app"
    quiet = {"client_id": "quiet", "client_ip": "10.0.0.4"}
    b1 = {"broker_ip": "10.0.1.1", "broker_port": 9092}
    timeline = [
        _event("client", "a.pcap", T0 + timedelta(seconds=s / 4), "requests", 3, **app) for s in range(0, 40)
    ]
    # a 12-second incident: errors in 48 buckets of 0.25 s
    timeline += [
        _event(
            "client",
            "a.pcap",
            T0 + timedelta(seconds=20 + s / 4),
            "error",
            1,
            detail="NOT_LEADER_OR_FOLLOWER",
            code=6,
            **app,
        )
        for s in range(48)
    ]
    timeline += [
        _event("broker", "a.pcap", T0 + timedelta(seconds=5), "leader_in", 2, detail="orders", **b1),
        _event("client", "a.pcap", T0, "requests", 1, **twin),
        _event("client", "b.pcap", T1, "requests", 5, bucket_s=1, **later),
        _event("client", "b.pcap", T1, "disconnect", 1, bucket_s=1, detail="broker_rst", **later),
    ]
    return {
        "incident_sources": [
            {
                "source": "a.pcap",
                "first_time": T0,
                "last_time": T0 + timedelta(seconds=62),
                "exchanges": 242,
                "connections": 7,
                "clients": 2,
                "brokers": 1,
                "error_results": 48,
                "bucket_s": 0.25,
                # a proxy's recorder fell behind on five connections (b.pcap's row, from an older
                # analysis, has none of these columns)
                "bytes_not_seen": 2358,
                "connections_with_gaps": 5,
                "gap_rows": 7,
                "dropped_rows": 0,
            },
            {
                "source": "b.pcap",
                "first_time": T1,
                "last_time": T1 + timedelta(seconds=30),
                "exchanges": 10,
                "connections": 2,
                "clients": 1,
                "brokers": 0,
                "error_results": 0,
                "bucket_s": 0.1,
            },
        ],
        "incident_lanes": [
            _lane("broker", "a.pcap", node_id=1, requests=120, **b1),
            _lane(
                "client",
                "a.pcap",
                requests=120,
                error_results=48,
                metadata_requests=3,
                client_software_name="sarama",
                client_software_version="1.42.1",
                **app,
            ),
            _lane("client", "a.pcap", requests=4, **quiet),
            _lane("client", "a.pcap", requests=1, **twin),
            _lane("client", "b.pcap", requests=5, disconnects=1, **later),
        ],
        "incident_timeline": timeline,
        "outages": [
            {
                "source": "a.pcap",
                "start": T0 + timedelta(seconds=20),
                "end": T0 + timedelta(seconds=32),
                "duration_s": 12.0,
                "kind": "frozen",
                "frozen_s": 12.0,
                "requests_unanswered": 30,
                "connections_closed": 0,
                "connections_refused": 0,
                "client_ids": ["app"],
                **b1,
            }
        ],
        "metadata_refresh": [
            {
                "source": "a.pcap",
                "metadata_requests": 3,
                "interval_p50_s": 0.1,
                "interval_max_s": 3.0,
                "longest_gap_s": 40.0,
                "active_s": 60.0,
                "refreshes_periodically": True,
                **app,
            },
            {"source": "a.pcap", "metadata_requests": 0, "interval_p50_s": None, "active_s": 50.0, **quiet},
        ],
        "metadata_stale_windows": [
            {
                "source": "a.pcap",
                "topic": "orders",
                "partition": p,
                "change_time": T0 + timedelta(seconds=5),
                "change_source": "metadata",
                "old_leader": 2,
                "new_leader": 1,
                "stale_s": 40.0 + p,
                "refreshed": False,
                **app,
            }
            for p in range(3)
        ],
        "connection_latency": [
            {
                "scope": "api_broker",
                "api_name": "Produce",
                "requests": 5,
                "p50_ms": 2.0,
                "p99_ms": 9.0,
                "max_ms": 9.0,
                "broker_ip": "10.0.1.1",
                "broker_port": port,
            }
            for port in (9092, 9093)
        ],
        "leader_skew": [
            {
                "topic": "orders",
                "partitions": 6,
                "replication_factor": 1,
                "brokers_used": 1,
                "brokers_in_cluster": 1,
                "brokers_spread_pct": 100,
                "brokers_skew_pct": 0,
                "brokers_leader_skew_pct": 0,
                "leaders": [1],
            }
        ],
    }


def test_summary_counts_runs_span_brokers_clients_and_findings():
    res = results()
    found = build_findings(res)
    page = build_page(res, found, dataset="ds")
    s = page.summary
    assert [x.source for x in s.sources] == ["a.pcap", "b.pcap"]
    assert s.exchanges == 252 and s.errors == 48 and s.connections == 9
    assert s.span_s == 18 * 60 + 30 and s.covered_s == 62 + 30  # 18 minutes apart: a gap
    assert [b.name for b in s.brokers] == ["broker 1 (10.0.1.1:9092)"]
    # one client id on two hosts of a run: each named with its address; else the id alone
    assert sorted(c.name for c in s.clients) == ["app", "app @10.0.0.2", "app @10.0.0.5", "quiet"]
    app = next(c for c in s.clients if c.name == "app @10.0.0.2")
    assert app.software == "sarama 1.42.1" and app.top_errors == [("NOT_LEADER_OR_FOLLOWER", 48)]
    assert s.findings_by_severity["critical"] == 1  # the outage
    assert s.not_seen == NotSeen(2358, 5, 7, 0) and s.sources[1].not_seen == NotSeen(0, 0, 0, 0)
    assert not s.sources[1].not_seen and s.not_seen
    assert NotSeen(0, 0, 0, 3).text() == "3 rows dropped by a proxy's writer"  # no gap: no bytes said


def test_page_reads_top_down_and_shows_every_finding_with_evidence_and_advice():
    res = results()
    found = build_findings(res)
    html = render_page(build_page(res, found, dataset="ds"))
    order = [html.index(f'<section id="{s}">') for s in ("summary", "findings", "timeline", "tables")]
    assert order == sorted(order)
    assert re.findall(r'data-kind="([a-z_]+)"', html) == [f.kind for f in found]
    for f in found:
        assert f.advice.split(":")[0].replace("'", "&#39;") in html
    assert "What to do:" in html and "wire cannot show" in html
    figures = dict(re.findall(r'data-figure="(\w+)" data-value="([^"]*)"', html))
    assert figures == {
        "sources": "2",
        "span_s": str(float(18 * 60 + 30)),
        "brokers": "1",
        "clients": "4",
        "exchanges": "252",
        "errors": "48",
        "bytes_not_seen": "2358",
        "findings": str(len(found)),
    }
    assert "7 exchanges left unknown (status gap)" in html
    # offline: no element loads anything; the CSP forbids it anyway
    markup = re.sub(r"<script[^>]*>.*?</script>", "<script></script>", html, flags=re.S)
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", markup)
    assert "default-src 'none'" in html


def _charts(html: str) -> dict:
    raw = html.split('<script type="application/json" id="kwire-charts">', 1)[1].split("</script>", 1)[0]
    return json.loads(raw)


def _datasets(spec: dict) -> list[list[dict]]:
    """Every list of rows in a chart spec: named (top-level ``datasets``) or inline (``values``)."""
    found = list(spec.get("datasets", {}).values())

    def walk(node):
        if isinstance(node, dict):
            if "values" in node and isinstance(node["values"], list):
                found.append(node["values"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    return found


def test_timeline_marks_each_bucket_apart_with_one_lane_per_client_and_broker():
    res = results()
    html = render_page(build_page(res, build_findings(res), dataset="ds"))
    charts = _charts(html)
    assert set(charts) == {"timeline-0", "timeline-1", "sources-chart", "metadata-chart"}
    spec = charts["timeline-0"]
    marks = json.dumps(spec)
    assert '"line"' not in marks and '"area"' not in marks  # nothing joins two buckets across a gap
    rows = [r for data in _datasets(spec) for r in data]
    lanes = {r["lane"] for r in rows}
    assert {"broker 1 (10.0.1.1:9092)", "app @10.0.0.2", "findings"} <= lanes
    errors = [r for r in rows if r.get("what") == "NOT_LEADER_OR_FOLLOWER"]
    assert len(errors) == 48 and all(r["t2"] - r["t"] == 250 for r in errors)  # 12 s in 0.25 s buckets
    outage = next(r for r in rows if r.get("what") == "broker outage")
    assert outage["t2"] - outage["t"] == 12_000 and outage["lane"] == "broker 1 (10.0.1.1:9092)"
    assert any(r.get("what") == "leader moved here" and r.get("topic") == "orders" for r in rows)
    # the second run has its own timeline, on its own time axis
    other = {r["lane"] for data in _datasets(charts["timeline-1"]) for r in data}
    assert "app" in other and "app @10.0.0.2" not in other


def test_metadata_chart_keeps_sub_second_intervals_and_the_client_that_never_asked():
    res = results()
    spec = _charts(render_page(build_page(res, [], dataset="ds")))["metadata-chart"]
    rows = [r for data in _datasets(spec) for r in data]
    app = next(r for r in rows if r.get("client") == "app @10.0.0.2" and "p50_text" in r)
    assert app["p50_text"] == "0.1 s" and app["max_text"] == "3.0 s"
    assert any(r.get("client") == "quiet" and "never asked" in r.get("note", "") for r in rows)


def _inlined(node, datasets: dict):
    """``node`` with each named data reference replaced by its rows, inline."""
    if isinstance(node, dict):
        if set(node) == {"name"} and node["name"] in datasets:
            return {"values": datasets[node["name"]]}
        return {k: _inlined(v, datasets) for k, v in node.items() if k != "datasets"}
    if isinstance(node, list):
        return [_inlined(v, datasets) for v in node]
    return node


def _unnumbered(text: str) -> str:
    """Altair's view names and the renderer's clip ids count up from one chart to the next."""
    return re.sub(r"view_[0-9a-f]+_\d+", "view", re.sub(r"clip\d+", "clip", text))


def test_charts_carry_their_rows_by_name_and_draw_as_with_rows_inline(monkeypatch):
    """The rows stay out of Altair (``report_charts._Datasets``): each layer names its rows and
    the spec holds them in ``datasets``. The spec with those rows put back inline is the spec
    Altair makes from inline rows, and Vega-Lite draws both the same (vl-convert, SVG)."""
    import vl_convert as vlc

    from spark_jobs import report_charts

    res = results()
    named = build_page(res, build_findings(res), dataset="ds").charts
    monkeypatch.setattr(report_charts._Datasets, "INLINE", True)
    inline = build_page(res, build_findings(res), dataset="ds").charts
    assert set(named) == set(inline) == {"timeline-0", "timeline-1", "sources-chart", "metadata-chart"}
    for name, spec in named.items():
        assert spec["datasets"] and "datasets" not in inline[name], name
        assert "values" not in json.dumps({k: v for k, v in spec.items() if k != "datasets"}), name
        put_back = _inlined(spec, spec["datasets"])
        assert _unnumbered(json.dumps(put_back)) == _unnumbered(json.dumps(inline[name])), name
        drawn = vlc.vegalite_to_svg(spec)
        assert "<svg" in drawn and _unnumbered(drawn) == _unnumbered(vlc.vegalite_to_svg(inline[name])), name


def test_tables_are_aggregated_and_labelled():
    res = results()
    page = build_page(res, [], dataset="ds")
    tables = {t.name: t for t in page.tables}
    stale = tables["metadata_stale_windows"]
    assert len(stale.rows) == 1 and stale.count_text == "1 row, from 3 in the result"
    row = {c.header: cell.text for c, cell in zip(stale.columns, stale.rows[0], strict=True)}
    assert (
        row["leader moves"] == "node 2 → node 1"
        and row["partitions"] == "3"
        and row["client"] == "app @10.0.0.2"
    )
    latency = tables["connection_latency"]
    brokers = [
        cell.text
        for row in latency.rows
        for c, cell in zip(latency.columns, row, strict=True)
        if c.header == "broker"
    ]
    assert brokers == ["10.0.1.1:9092", "10.0.1.1:9093"]  # the port tells the two rows apart
    skew = tables["leader_skew"]
    assert "nodes leading" in [c.header for c in skew.columns]
    html = render_page(page)
    assert 'href="metadata_stale_windows/"' in html and not re.search(r"\b1 rows", html)


def test_seconds_keep_their_precision_and_buckets_fit_the_span():
    assert [seconds_text(v) for v in (0.1, 0.0004, 3.0, 95.4, 0)] == [
        "0.1 s",
        "0.4 ms",
        "3.0 s",
        "95 s",
        "0 s",
    ]
    assert bucket_width(62, 600) == 0.25
    assert bucket_width(600, 600) == 1
    assert bucket_width(86400, 600) == 300  # a day: a 12 s incident is still one bucket of 5 min


def test_terminal_prints_summary_findings_and_clients_then_tables_on_demand():
    res = results()
    found = build_findings(res)
    page = build_page(res, found, dataset="ds")
    out = io.StringIO()
    console = Console(file=out, width=200)
    print_summary(console, page.summary)
    print_findings(console, found)
    print_clients(console, page.summary)
    text = out.getvalue()
    assert "2 sources" in text and "252 exchanges, 48 errors" in text and "1 critical" in text
    assert (
        "not seen: 2,358 bytes on 5 connections lost by the capture or skipped by a proxy's recorder; "
        in text
    )
    assert text.index(" summary ─") < text.index(" findings ─") < text.index("\nclients")
    assert "#1 critical" in text and "what to do:" in text
    assert "app @10.0.0.2" in text and "NOT_LEADER_OR_FOLLOWER x48" in text
    assert "Stale metadata" not in text
    few = io.StringIO()
    print_clients(Console(file=few, width=200), page.summary, limit=1)
    assert "app @10.0.0.2" in few.getvalue() and "quiet" not in few.getvalue()  # the one with errors
    assert "3 more clients (--top, --tables, report.html)" in few.getvalue()
    print_tables(console, page.tables)
    assert "Stale metadata after leadership changes (1 row, from 3 in the result" in out.getvalue()


def test_vega_bundle_is_kept_on_disk_and_read_back(tmp_path, monkeypatch):
    import vl_convert as vlc

    from kwire import runtime
    from spark_jobs import report as report_module

    monkeypatch.setattr(runtime, "cache_dir", lambda name: tmp_path / name)
    report_module.vega_bundle.cache_clear()
    made = report_module.vega_bundle()
    (kept,) = (tmp_path / "vega").iterdir()
    assert kept.read_text(encoding="utf-8") == made and "vegaEmbed" in made

    def no_bundling(**_):
        raise AssertionError("bundled again")

    monkeypatch.setattr(vlc, "javascript_bundle", no_bundling)
    report_module.vega_bundle.cache_clear()
    try:
        assert report_module.vega_bundle() == made
    finally:
        report_module.vega_bundle.cache_clear()


def test_a_dataset_without_traffic_says_so_and_a_skipped_timeline_says_that():
    """An empty dataset used to be reported as if ``incident_timeline`` had not run."""
    for res, said, page_said in (
        ({"incident_sources": [], "incident_timeline": []}, "no traffic: the dataset holds no", "No traffic"),
        ({}, "the incident_timeline job was not run", "job was not run"),
    ):
        page = build_page(res, [], dataset="ds")
        out = io.StringIO()
        print_summary(Console(file=out, width=200), page.summary)
        assert said in out.getvalue(), out.getvalue()
        assert page_said in render_page(page)


def test_chart_data_cannot_end_or_derail_its_script_element():
    from spark_jobs.report import _script_json

    hostile = {"client_id": "<!--<script></script><b>x</b>", "n": [1, "a<b"]}
    text = _script_json(hostile)
    assert "<" not in text and json.loads(text) == hostile
