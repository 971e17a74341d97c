"""The HTML report and its findings, from hand-made result rows (no Spark needed)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from spark_jobs.report import findings, render_html

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def _results():
    return {
        "error_reaction": [
            {
                "source": "a.pcap",
                "client_id": "go-app",
                "client_ip": "10.0.0.2",
                "client_software_name": "sarama",
                "client_software_version": "1.42.1",
                "api_name": "Produce",
                "error_code": 56,
                "error_name": "KAFKA_STORAGE_ERROR",
                "verdict": "drop_without_retry",
                "errors": 40,
                "batches_dropped": 40,
                "records_dropped": 40,
                "n_drop_without_retry": 40,
            },
        ],
        "error_reaction_headline": [
            {
                "source": "a.pcap",
                "client_id": "go-app",
                "client_ip": "10.0.0.2",
                "errors_56": 40,
                "reaction_56": "drop_without_retry",
                "errors_6": 3,
                "reaction_6": "refresh_then_retry",
                "reactions_differ": True,
            },
        ],
        "producer_acks": [
            {
                "client_id": "p",
                "client_ip": "10.0.0.3",
                "client_software_name": None,
                "client_software_version": None,
                "acks_label": "1",
                "requests": 10,
                "records": 100,
                "data_loss_risk": True,
            },
            {
                "client_id": "q",
                "client_ip": "10.0.0.4",
                "client_software_name": None,
                "client_software_version": None,
                "acks_label": "all",
                "requests": 10,
                "records": 100,
                "data_loss_risk": False,
            },
        ],
        "leader_skew_brokers": [
            {
                "node_id": 1,
                "host": "b1",
                "port": 9092,
                "in_cluster": True,
                "replicas": 30,
                "leaders": 30,
                "topics_led": 30,
                "leader_share_pct": 100.0,
                "fair_share_pct": 33.3,
            },
        ],
        "latency_timeline": [
            {
                "bucket": T0 + timedelta(minutes=i),
                "api_name": "Produce",
                "requests": 5,
                "p50_ms": 2.0,
                "p99_ms": 5.0 + i,
                "max_ms": 9.0,
            }
            for i in range(5)
        ],
    }


def test_findings_order_and_content():
    found = findings(_results())
    assert found[0].severity == "critical" and "go-app" in found[0].title and "sarama" in found[0].title
    titles = " | ".join(f.title for f in found)
    assert "writes with acks=1" in titles
    assert found[0].kind == "no_refresh_after_error" and found[0].client_id == "go-app"
    assert "broker 1 leads 100% of partitions" in titles
    assert [f.severity for f in found] == sorted(
        (f.severity for f in found), key=["critical", "warning", "info"].index
    )


def test_page_is_self_contained_with_tables_after_findings():
    page = render_html(_results(), findings(_results()), dataset="ds")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    markup = re.sub(r"<script[^>]*>.*?</script>", "<script></script>", page, flags=re.S)
    assert "<link" not in markup and " src=" not in markup
    assert page.index('id="findings"') < page.index("Producer acks")
    # without the incident_timeline job the page says so rather than drawing nothing
    assert "No timeline: the <code>incident_timeline</code> job was not run" in page


def test_outage_and_old_broker_findings_name_the_broker_and_the_counts():
    from spark_jobs.findings import build_findings

    results = {
        "outages": [
            {
                "source": "001.pcap",
                "broker_ip": "127.0.0.3",
                "broker_port": 9092,
                "kind": "frozen_then_dead",
                "start": T0,
                "end": T0 + timedelta(seconds=34.6),
                "duration_s": 34.6,
                "frozen_s": 30.1,
                "requests_unanswered": 218,
                "connections_closed": 9,
                "connections_refused": 17,
                "client_ids": ["java-4.1.1-producer", "sarama-1.43.3-producer"],
            }
        ],
        "old_broker_drops": [
            {
                "broker_ip": "127.0.0.2",
                "broker_port": 9092,
                "cause": "unsupported_apiversions",
                "requests_dropped": 12,
            },
            {"broker_ip": "127.0.0.2", "broker_port": 9092, "cause": None, "requests_dropped": 5},
        ],
    }
    found = build_findings(results)
    assert [(f.kind, f.severity, f.broker, f.count) for f in found] == [
        ("broker_unreachable", "critical", "127.0.0.3:9092", 218),
        ("old_broker_dropped_requests", "critical", "127.0.0.2:9092", 12),
    ]
    assert "34.6 s" in found[0].summary and "17 connections refused" in found[0].summary
    assert found[0].row()["evidence"].startswith("{")
