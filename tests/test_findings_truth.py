"""The findings kwire prints for every real capture it ships, checked against the truth of the run.

Every lab scenario (``captures/lab/<name>/``: a real Apache Kafka cluster, real clients, a tcpdump
capture and a ``truth.json`` written from the clients' and brokers' own logs) and every shipped
Tansu capture is decoded in one ``kwire decode`` (each file keeps its own ``source``) and
analysed once. Then, per run, the findings must be what its truth says: the kinds, the clients
they name and their counts (records lost, batches dropped, errors, retries), and nothing
alarming where nothing went wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from spark_fixtures import spark  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "captures" / "lab"
SCENARIOS = sorted(d.name for d in LAB.iterdir() if (d / "capture.pcap.gz").is_file())
SHIPPED = sorted(p.name for p in (ROOT / "captures").glob("*.pcap"))
ALARMS = ("critical", "warning")
#: Errors a client library reports for a request the broker never answered.
CLIENT_SIDE = {"NETWORK_EXCEPTION": "no answer", "REQUEST_TIMED_OUT": "no answer"}


def _source(name: str) -> str:
    return f"{name}/capture.pcap.gz" if name in SCENARIOS else name


def _truth(name: str) -> dict[str, Any]:
    return json.loads((LAB / name / "truth.json").read_text())


@pytest.fixture(scope="module")
def analysed(spark, tmp_path_factory) -> dict[str, Any]:  # noqa: F811
    from spark_jobs.findings import load_findings
    from spark_jobs.report import load_results
    from spark_jobs.submit import analyse

    out = tmp_path_factory.mktemp("truth")
    files = [str(LAB / n / "capture.pcap.gz") for n in SCENARIOS] + [
        str(ROOT / "captures" / n) for n in SHIPPED
    ]
    done = subprocess.run(
        [sys.executable, "-m", "kwire", "decode", *files, "-o", str(out / "ds")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    analyse(spark, out / "ds", out / "rep")
    findings: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in load_findings(out / "rep"):
        findings[f["source"]].append(f)
    results = load_results(out / "rep")
    return {"findings": findings, "results": results}


def _of(analysed: dict[str, Any], name: str, kind: str | None = None) -> list[dict[str, Any]]:
    rows = analysed["findings"].get(_source(name), [])
    return [f for f in rows if kind is None or f["kind"] == kind]


def _alarms(analysed: dict[str, Any], name: str) -> set[str]:
    return {f["kind"] for f in _of(analysed, name) if f["severity"] in ALARMS}


def _by_client(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in rows:
        assert f["client_id"] not in out, f"two {f['kind']} findings for {f['client_id']}"
        out[f["client_id"]] = f
    return out


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _faults(truth: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(broker ip, fault start, broker back) for every broker the scenario stopped."""
    start: dict[str, float] = {}
    out = []
    for e in truth["timeline"]:
        if e["kind"] in ("broker_paused", "broker_killed", "coordinator_stopping") and e.get("ip"):
            start.setdefault(e["ip"], e["ts"])
        elif e["kind"] in ("broker_started", "coordinator_started") and e.get("ip") in start:
            out.append((e["ip"], start.pop(e["ip"]), e["ts"]))
    return out


# ------------------------------------------------------------------------------ every run


def test_every_run_has_its_own_findings(analysed) -> None:
    assert set(analysed["findings"]) == {_source(n) for n in SCENARIOS + SHIPPED}


def test_no_finding_text_shows_a_raw_none(analysed) -> None:
    for rows in analysed["findings"].values():
        for f in rows:
            assert "None" not in f["summary"] and "None" not in (f["advice"] or ""), f["summary"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_records_lost_equal_the_truth(analysed, name: str) -> None:
    """Per client: records dropped after an error (truth ``failed``) and acked then missing
    from the log (truth ``lost``) are the finding's counts; clients that lost nothing have none."""
    truth = _truth(name)["clients"]
    found = _by_client(_of(analysed, name, "records_lost"))
    source = _source(name)
    on_wire = {r["client_id"] for r in analysed["results"].get("delivery", []) if r["source"] == source}
    # a client whose Produce requests never reached the wire (a probe that never got past
    # ApiVersions on 000-old-broker) failed inside the library: unsupported_version says why
    expected = {
        c: t for c, t in truth.items() if (t.get("failed") or 0) + (t.get("lost") or 0) > 0 and c in on_wire
    }
    assert set(found) == set(expected), {c: f["summary"] for c, f in found.items()}
    for client, t in expected.items():
        f = found[client]
        assert f["severity"] == "critical"
        if set(t.get("failed_by_error") or {}) <= set(CLIENT_SIDE) and not t.get("acked"):
            # never one answer (upgrade-audit: Kafka 0.10.2's client against 4.1, which closes
            # the connection on its Produce v2): the records that never left the library are
            # not on the wire, only those in requests it got out
            assert 0 < f["count"] <= t["failed"] and f["evidence"]["records_acked"] == 0
            assert set(f["evidence"]["dropped_by_error"]) == {"no answer"}
            continue
        assert f["count"] == (t.get("failed") or 0) + (t.get("lost") or 0), f["summary"]
        assert f["evidence"]["records_dropped"] == (t.get("failed") or 0)
        assert f["evidence"]["records_lost"] == (t.get("lost") or 0)
        assert f["evidence"]["records_sent"] == t["sent"], f["summary"]
        # the library's own names for "the connection closed" / "no answer in time" are the
        # wire's "no answer"
        said = {CLIENT_SIDE.get(k, k): v for k, v in (t.get("failed_by_error") or {}).items()}
        assert f["evidence"]["dropped_by_error"] == said


# ------------------------------------------------------------------------------ per incident


def test_006_healthy_run_gives_no_warning_and_no_critical(analysed) -> None:
    truth = _truth("006-healthy")
    assert all(t["acked"] == t["sent"] and not t["lost"] for t in truth["clients"].values() if t["sent"])
    rows = _of(analysed, "006-healthy")
    assert [f["summary"] for f in rows if f["severity"] in ALARMS] == []
    assert [f["kind"] for f in rows] == ["client_inventory"]


def test_003_storage_error_sarama_127_drops_and_never_refreshes(analysed) -> None:
    truth = _truth("003-jbod-disk-failure")["clients"]
    assert _alarms(analysed, "003-jbod-disk-failure") == {"records_lost", "no_refresh_after_error"}
    [f] = _of(analysed, "003-jbod-disk-failure", "no_refresh_after_error")
    sarama = truth["sarama-1.27.0-producer"]
    assert f["client_id"] == "sarama-1.27.0-producer" and f["severity"] == "critical"
    ev = f["evidence"]
    assert ev["verdict"] == "drop_without_retry"
    assert f["count"] == ev["errors"] == sarama["failed_by_error"]["KAFKA_STORAGE_ERROR"]
    assert ev["batches_dropped"] == ev["records_dropped"] == sarama["failed"]
    assert ev["retries"] == 0
    assert "upgrade" in f["advice"] and "1.43.3" in f["advice"]


def test_003_sarama_verdicts_differ_and_match_their_own_logs(analysed) -> None:
    """sarama 1.27.0 drops on KAFKA_STORAGE_ERROR, 1.43.3 refreshes and retries; the retries the
    wire shows (every error code) are the retries each library logged."""
    truth = _truth("003-jbod-disk-failure")["clients"]
    source = _source("003-jbod-disk-failure")
    rows = [
        r
        for r in analysed["results"]["error_reaction"]
        if r["source"] == source and r["api_name"] == "Produce"
    ]
    verdict = {r["client_id"]: r["verdict"] for r in rows if r["error_code"] == 56}
    assert verdict["sarama-1.27.0-producer"] == "drop_without_retry"
    assert verdict["sarama-1.43.3-producer"] == "refresh_then_retry"
    for client in ("sarama-1.27.0-producer", "sarama-1.43.3-producer"):
        wire = sum(r["retries"] for r in rows if r["client_id"] == client)
        assert wire == truth[client]["log"]["retry"], client


def test_004_acks1_lost_acked_records_acks_all_did_not(analysed) -> None:
    truth = _truth("004-acks1-loss")
    risky = {c for c, t in truth["clients"].items() if t.get("acks") in ("0", "1") and t.get("sent")}
    warned = {f["client_id"] for f in _of(analysed, "004-acks1-loss", "acks_data_loss_risk")}
    assert warned == risky == {"java-4.1.1-acks1", "confluent-kafka-acks1"}
    lost = {f["client_id"]: f["count"] for f in _of(analysed, "004-acks1-loss", "records_lost")}
    assert lost == {c: t["lost"] for c, t in truth["clients"].items() if t.get("lost")}
    assert _alarms(analysed, "004-acks1-loss") <= {
        "records_lost",
        "acks_data_loss_risk",
        "broker_unreachable",
        "coordinator_unavailable",
    }


@pytest.mark.parametrize("name", ["001-broker-drops-out", "004-acks1-loss", "000-coordinator-load"])
def test_broker_unreachable_matches_the_brokers_that_were_stopped(analysed, name: str) -> None:
    faults = _faults(_truth(name))
    found = _of(analysed, name, "broker_unreachable")
    assert sorted(f["broker"].split(":")[0] for f in found) == sorted(ip for ip, _, _ in faults)
    for ip, start, back in faults:
        [f] = [f for f in found if f["broker"].startswith(ip + ":")]
        assert f["severity"] == "critical"
        assert abs((f["first_time"] - _at(start)).total_seconds()) <= 2.0, (f["first_time"], _at(start))
        assert abs((f["last_time"] - _at(back)).total_seconds()) <= 3.0, (f["last_time"], _at(back))
        assert f["evidence"]["wire_cannot_show"]


def test_001_no_loss_and_no_client_blamed(analysed) -> None:
    truth = _truth("001-broker-drops-out")["clients"]
    assert all(not t.get("lost") and not t.get("failed") for t in truth.values())
    assert _alarms(analysed, "001-broker-drops-out") == {"broker_unreachable"}


def test_000_old_broker_drops_requests_and_probes_cannot_talk(analysed) -> None:
    truth = _truth("000-old-broker")
    [f] = _of(analysed, "000-old-broker", "old_broker_dropped_requests")
    assert f["broker"].split(":")[0] in {b["ip"] for b in truth["brokers"].values()}
    assert f["severity"] == "critical" and f["count"] > 0
    assert f["evidence"]["episodes_answered_again"] >= 1  # drops followed by answered requests
    # the clients pinned to 0.9 lost nothing though the broker dropped some of their requests
    pinned = {c for c, role in truth["client_roles"].items() if not role["probe"]}
    assert pinned <= set(f["evidence"]["clients"])
    assert not _of(analysed, "000-old-broker", "records_lost")
    # each probe (defaults: sends ApiVersions) is named, and only those
    probes = {c for c, role in truth["client_roles"].items() if role["probe"]}
    named = {g["client_id"] for g in _of(analysed, "000-old-broker", "unsupported_version")}
    assert named == probes
    assert all(truth["clients"][c]["acked"] == 0 for c in named)
    assert not _of(analysed, "000-old-broker", "reconnect_churn")  # explained by unsupported_version


def test_000_coordinator_load_names_the_group_and_its_coordinators(analysed) -> None:
    truth = _truth("000-coordinator-load")
    found = _of(analysed, "000-coordinator-load", "coordinator_unavailable")
    assert found and all(truth["group"] in f["summary"] for f in found)
    assert not _of(analysed, "000-coordinator-load", "records_lost")
    assert not _of(analysed, "000-coordinator-load", "no_refresh_after_error")


def test_002_skew_names_broker_1_only(analysed) -> None:
    truth = _truth("002-skew")
    [f] = _of(analysed, "002-skew", "leader_skew")
    led = truth["partitions_led_by_broker"]
    assert f["broker"] == max(led, key=led.get) == "1"
    # the wire also sees __consumer_offsets, which the truth's topic list leaves out
    assert led["1"] <= f["count"] <= led["1"] + 5
    assert _alarms(analysed, "002-skew") == {"leader_skew"}


# ------------------------------------------------------------------------------ Tansu captures


@pytest.mark.parametrize("name", SHIPPED)
def test_tansu_answers_acks0_produce(analysed, name: str) -> None:
    """Every shipped Tansu capture has an acks=0 producer, and Tansu answers it (see
    captures/README.md): a broker protocol violation."""
    found = [
        f
        for f in _of(analysed, name, "broker_protocol_violation")
        if f["evidence"]["kind"] == "answered_acks0"
    ]
    assert len(found) == 1 and found[0]["count"] >= 1


def test_kcat_cannot_parse_tansu_apiversions(analysed) -> None:
    """kcat with defaults fails on Tansu's ApiVersions v3 answer ("Read underflow", README)."""
    [f] = [
        f
        for f in _of(analysed, "tansu-kcat.pcap", "client_cannot_parse_broker")
        if f["evidence"]["answer"] == "ApiVersions v3"
    ]
    assert f["client_id"] == "kwire-test-kcat" and f["count"] >= 2
    assert set(f["evidence"]["closed_by"]) <= {"client_fin", "client_rst"}
