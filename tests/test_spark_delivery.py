"""The ``delivery`` audit and the ``error_reaction`` verdicts on the incident lab's real captures,
checked against each run's truth (``captures/lab/<scenario>/truth.json``: the clients' own
send/ack/error events and the read-back after the capture, never the capture itself).

Each capture is decoded by ``kwire decode`` into its own dataset under a name that is its
scenario (so each run keeps its own ``source``); the datasets' files are then gathered into
one, and the four runs and the shipped Tansu captures are analysed together in one Spark
pipeline. Every figure asserted is read from a truth file
or a manifest, never hard-coded: the lab can regenerate its captures.

What the truth calls ``failed`` is what the client gave up on; the wire shows it as a batch
that got an error and was never sent again (``dropped``). ``lost`` is acked and never read
back; the wire shows it as an acked batch whose offset the last Fetch response covering it
shows holding another batch.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
from pyspark.sql import functions as F
from spark_fixtures import spark  # noqa: F401
from typer.testing import CliRunner

from kwire.cli import app
from spark_jobs.common import load_tables
from spark_jobs.delivery import _per_batch, batch_fates, delivery, produce_attempts
from spark_jobs.error_reaction import HEALTHY, error_reaction, error_reaction_headline, reaction_events

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "captures" / "lab"
SCENARIOS = ("001-broker-drops-out", "002-skew", "003-jbod-disk-failure", "004-acks1-loss")
TANSU = ("tansu-aiokafka", "tansu-confluent", "tansu-kafka-python", "tansu-kcat")
Rows = list[dict[str, Any]]


def truth(scenario: str) -> dict[str, Any]:
    return json.loads((LAB / scenario / "truth.json").read_text())


def producers(scenario: str) -> dict[str, dict[str, Any]]:
    """The truth of every client that produced, by client id."""
    return {c["client_id"]: c for c in truth(scenario)["clients"].values() if c["sent"] > 0}


class Lab:
    """The results of one pipeline over every decoded capture, as rows."""

    def __init__(
        self,
        delivery_rows: Rows,
        summary: Rows,
        events: Rows,
        headline: Rows,
        per_batch: tuple[tuple[str, list[Any]], ...] = (),
    ) -> None:
        self.delivery = delivery_rows
        self.summary = summary
        self.events = events
        self.headline = headline
        #: every batch's row as made (one-attempt batches without the aggregate), and all grouped
        self.per_batch = per_batch

    def totals(self, source: str) -> dict[str, Counter[str]]:
        """Per client id of ``source``: every count column summed over its partitions, and the
        records failed/dropped by error (``failed:<ERROR>``, ``dropped:<ERROR>``)."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for r in self.delivery:
            if r["source"] != source:
                continue
            sums = out[r["client_id"]]
            for k, v in r.items():
                if isinstance(v, int) and not isinstance(v, bool) and k != "partition":
                    sums[k] += v
            for kind in ("failed", "dropped"):
                for name, n in (r[f"{kind}_by_error"] or {}).items():
                    sums[f"{kind}:{name}"] += n
        return out

    def reaction(self, source: str, client_id: str, code: int) -> dict[str, Any]:
        rows = [
            r
            for r in self.summary
            if r["source"] == source
            and r["client_id"] == client_id
            and r["error_code"] == code
            and r["api_name"] == "Produce"
        ]
        assert len(rows) == 1, (client_id, code, rows)
        return rows[0]


@pytest.fixture(scope="module")
def lab(spark, tmp_path_factory) -> Iterator[Lab]:  # noqa: F811
    root = tmp_path_factory.mktemp("lab-delivery")
    runner = CliRunner()
    captures = {name: LAB / name / "capture.pcap.gz" for name in SCENARIOS}
    captures |= {name: REPO / "captures" / f"{name}.pcap" for name in TANSU}
    combined = root / "all"  # one dataset of every run: one scan, a small plan
    for name, path in captures.items():
        # the capture's file name is its rows' source: name it after the scenario
        link = root / f"{name}{''.join(path.suffixes)}"
        link.symlink_to(path)
        out = root / name
        result = runner.invoke(app, ["decode", str(link), "-o", str(out), "-q"])
        assert result.exit_code == 0, result.output
        for part in out.rglob("*.parquet"):
            dest = combined / part.relative_to(out).parent / f"{name}-{part.name}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            part.rename(dest)
    both = load_tables(spark, combined)
    attempts = produce_attempts(both.exchanges).cache()
    fates = batch_fates(both.exchanges, both.connections, attempts=attempts).cache()
    events = reaction_events(both.exchanges, both.connections, attempts=attempts, fates=fates).cache()
    summary = error_reaction(events, both.exchanges).cache()
    per_batch = tuple(
        (df.schema.simpleString(), df.orderBy("batch_key").collect())
        for df in (_per_batch(attempts), _per_batch(attempts, group_all=True))
    )
    try:
        yield Lab(
            [r.asDict() for r in delivery(both.exchanges, both.connections, fates=fates).collect()],
            [r.asDict() for r in summary.collect()],
            [r.asDict() for r in events.collect()],
            [r.asDict() for r in error_reaction_headline(summary).collect()],
            per_batch,
        )
    finally:  # the session is shared: leave its memory to the next module
        spark.catalog.clearCache()


def source(name: str) -> str:
    return f"{name}.pcap.gz" if name in SCENARIOS else f"{name}.pcap"


# ------------------------------------------------------------------------------ delivery


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_producer_acked_what_its_truth_says(lab: Lab, scenario: str) -> None:
    """Records acked on the wire are the records each client saw acked, exactly."""
    got = lab.totals(source(scenario))
    for client_id, t in producers(scenario).items():
        assert got[client_id]["records_acked"] == t["acked"], client_id


def test_jbod_disk_failure_sarama_1_27_drops_what_it_failed(lab: Lab) -> None:
    """003: sarama 1.27.0 got KAFKA_STORAGE_ERROR and never sent those batches again: the
    records it dropped are the records it reported failed, by error, exactly. Every other
    producer (sarama 1.43.3, Java, librdkafka) dropped nothing."""
    got = lab.totals(source("003-jbod-disk-failure"))
    expected = producers("003-jbod-disk-failure")
    old = expected["sarama-1.27.0-producer"]
    assert old["failed"] > 0 and set(old["failed_by_error"]) == {"KAFKA_STORAGE_ERROR"}
    assert got["sarama-1.27.0-producer"]["records_dropped"] == old["failed"]
    assert (
        got["sarama-1.27.0-producer"]["dropped:KAFKA_STORAGE_ERROR"]
        == old["failed_by_error"]["KAFKA_STORAGE_ERROR"]
    )
    for client_id, t in expected.items():
        assert got[client_id]["records_dropped"] == t["failed"], client_id
        assert got[client_id]["records_lost"] == 0, client_id
    # sarama 1.43.3 re-encodes what it retries (new timestamps, new CRC): its retries cannot be
    # linked by identity; they are read off its behaviour and said to be so
    assert got["sarama-1.43.3-producer"]["records_failed"] > 0
    new = [
        r for r in lab.delivery if r["client_id"] == "sarama-1.43.3-producer" and r["batches_resent_unlinked"]
    ]
    assert new and all("re-encode" in r["wire_cannot_show"] for r in new)


def test_acks1_leader_kill_loses_what_the_read_back_misses(lab: Lab) -> None:
    """004: every message was acked, yet the read-back misses some of the acks=1 producers':
    on the wire those are acked batches whose offsets the new leader's log (its higher leader
    epoch) holds other batches at. The acks=all control loses none."""
    got = lab.totals(source("004-acks1-loss"))
    expected = producers("004-acks1-loss")
    assert sum(t["lost"] for t in expected.values()) > 0
    for client_id, t in expected.items():
        assert got[client_id]["records_lost"] == t["lost"], client_id
        assert got[client_id]["records_dropped"] == t["failed"] == 0, client_id
    # only where the killed broker led
    run = truth("004-acks1-loss")
    killed = {int(p) for p, node in run["leaders_before"].items() if node == run["victim"]}
    lost = [r for r in lab.delivery if r["source"] == source("004-acks1-loss") and r["records_lost"]]
    assert lost and {r["partition"] for r in lost} <= killed
    assert all(r["lost_offsets"] for r in lost)


@pytest.mark.parametrize("scenario", ["001-broker-drops-out", "002-skew"])
def test_healthy_runs_drop_and_lose_nothing(lab: Lab, scenario: str) -> None:
    got = lab.totals(source(scenario))
    expected = producers(scenario)
    assert expected
    for client_id, t in expected.items():
        assert t["failed"] == t["lost"] == 0
        assert got[client_id]["records_dropped"] == 0, client_id
        assert got[client_id]["records_lost"] == 0, client_id
        assert got[client_id]["records_unknown"] == 0, client_id


def test_tansu_captures_match_their_manifest(lab: Lab) -> None:
    """The shipped Tansu captures: records acked and acks=0 records as each client reported
    them; none lost. kcat cannot talk to Tansu (its ApiVersions v3 answer is unreadable to it):
    what it did send never got acked."""
    manifest = json.loads((REPO / "captures" / "manifest.json").read_text())["captures"]
    for name in TANSU:
        got = lab.totals(source(name))
        for scenario in manifest[name]["scenarios"]:
            sums = got[scenario["client_id"]]
            assert sums["records_acked"] == scenario["acked"], name
            assert sums["records_lost"] == 0
            if scenario["errors"]:  # kcat: it says what failed, not per step what it sent
                assert sums["records_dropped"] > 0 and sums["records_acked"] == 0, name
                continue
            acks0 = sum(s["sent"] for s in scenario["steps"] if s["acks"] == 0)
            assert acks0 > 0 and sums["records_unacknowledged"] == acks0, name
            assert sums["records_dropped"] == sums["records_unknown"] == 0, name


# ------------------------------------------------------------------------------ reactions


def sarama_log(scenario: str, client: str) -> list[str]:
    return (LAB / scenario / "clients" / f"{client}.log").read_text().splitlines()


def storage_error_reactions(lines: list[str]) -> list[str]:
    """What a sarama log says it did after each KAFKA_STORAGE_ERROR ("Disk error"): for each
    partition it put into retry because of one, ``refresh_then_retry`` when it fetched metadata
    before selecting a broker again, else ``retry_without_refresh``."""
    out = []
    for i, line in enumerate(lines):
        found = re.search(r"state change to \[retrying\] on (\S+)/(\d+) because .*Disk error", line)
        if not found:
            continue
        topic, partition = found.groups()
        rest = lines[i + 1 :]
        selected = next(
            (
                j
                for j, later in enumerate(rest)
                if f"producer/leader/{topic}/{partition} selected broker" in later
            ),
            None,
        )
        assert selected is not None, line
        refreshed = any("client/metadata fetching metadata" in later for later in rest[:selected])
        out.append("refresh_then_retry" if refreshed else "retry_without_refresh")
    return out


def test_sarama_verdicts_on_storage_error_differ_and_agree_with_their_logs(lab: Lab) -> None:
    """003 (incident 4): sarama 1.27.0 drops on KAFKA_STORAGE_ERROR (its log shows no retry
    and no metadata fetch for it), sarama 1.43.3 refreshes metadata and retries on the new
    leader (its log: retrying, fetching metadata, selected broker)."""
    scenario = "003-jbod-disk-failure"
    src = source(scenario)
    old_truth = producers(scenario)["sarama-1.27.0-producer"]
    old = lab.reaction(src, "sarama-1.27.0-producer", 56)
    new = lab.reaction(src, "sarama-1.43.3-producer", 56)

    old_log = storage_error_reactions(sarama_log(scenario, "sarama-1.27.0-producer"))
    assert old_log == []  # 1.27.0 never retries a storage error: the library fails the message
    assert old["verdict"] == "drop_without_retry" and old["verdict"] not in HEALTHY
    assert old["retries"] == 0 and old["n_drop_without_retry"] == old["errors"]
    assert old["records_dropped"] == old_truth["failed_by_error"]["KAFKA_STORAGE_ERROR"]

    new_log = storage_error_reactions(sarama_log(scenario, "sarama-1.43.3-producer"))
    assert new_log and set(new_log) == {"refresh_then_retry"}
    assert new["verdict"] == "refresh_then_retry"
    assert new["errors"] == new["retries"] == new["refreshes"] == len(new_log)
    assert new["batches_dropped"] == new["records_dropped"] == 0
    # 1.43.3 re-encodes its retries: each one is inferred, and the row says so
    assert new["retries_inferred"] == new["retries"] and "re-encode" in new["wire_cannot_show"]
    moved = [
        e
        for e in lab.events
        if e["source"] == src and e["client_id"] == "sarama-1.43.3-producer" and e["error_code"] == 56
    ]
    assert moved and all(e["retry_same_broker"] is False for e in moved)

    head = {r["client_id"]: r for r in lab.headline if r["source"] == src}
    assert head["sarama-1.27.0-producer"]["reaction_56"] != head["sarama-1.43.3-producer"]["reaction_56"]
    assert head["sarama-1.27.0-producer"]["dropped_56"] == old["batches_dropped"] > 0


def test_other_clients_move_on_after_a_storage_error(lab: Lab) -> None:
    """003: the Java client and librdkafka also got KAFKA_STORAGE_ERROR; each re-sent every
    failed batch (same producer id and sequence, or same CRC) and dropped none."""
    src = source("003-jbod-disk-failure")
    for client_id in ("java-4.1.1-producer", "confluent-kafka-producer"):
        row = lab.reaction(src, client_id, 56)
        assert row["verdict"] in HEALTHY, client_id
        assert row["retries"] == row["errors"] > 0 and row["batches_dropped"] == 0, client_id


def test_a_batch_takes_its_fields_from_its_first_attempt_whatever_the_plan_reads_first(
    spark,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Attempts of one batch that disagree (a client re-sending a batch with another record count)
    give the batch the first attempt's fields, even when the plan reads the later attempt first.
    Acked at two offsets no fetch shows (both copies unconfirmed), the check names the first."""
    out = tmp_path / "kafka-python"
    result = CliRunner().invoke(
        app, ["decode", str(REPO / "captures" / "tansu-kafka-python.pcap"), "-o", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    tables = load_tables(spark, out)
    attempts = produce_attempts(tables.exchanges)
    one = attempts.where(F.col("outcome") == "acked").orderBy("request_time").limit(1).collect()[0]
    later = (
        attempts.where(F.col("batch_key") == one["batch_key"])
        .withColumn("request_time", F.col("request_time") + F.expr("INTERVAL 1 SECOND"))
        .withColumn("correlation_id", F.col("correlation_id") + 1000)
        .withColumn("record_count", F.col("record_count") + 7)
        .withColumn("acks", F.lit(-5))
        .withColumn("offset", F.col("offset") + 100)
    )
    # one partition, the later attempt first: first() took its fields, and max_by by the check alone
    # the later copy
    ours = F.col("batch_key") == one["batch_key"]
    mixed = (
        later.unionByName(attempts)
        .withColumn("attempts", F.when(ours, 2).otherwise(F.col("attempts")).cast("long"))
        .withColumn("offset", F.when(ours, F.col("offset") + 1_000_000).otherwise(F.col("offset")))
        .coalesce(1)
    )
    fates = batch_fates(tables.exchanges, tables.connections, attempts=mixed)
    row = fates.where(F.col("batch_key") == one["batch_key"]).collect()
    assert len(row) == 1 and row[0]["attempts"] == 2
    assert (row[0]["record_count"], row[0]["acks"]) == (one["record_count"], one["acks"])
    assert row[0]["last_correlation_id"] == one["correlation_id"] + 1000
    first_copy = one["offset"] + 1_000_000
    assert row[0]["acked_offsets"] == [first_copy, first_copy + 100]
    assert (row[0]["fetch_check"], row[0]["checked_offset"]) == ("unconfirmed", first_copy)


def test_batches_sent_once_skip_the_aggregate_and_get_the_same_rows(lab: Lab) -> None:
    """Every lab and Tansu batch: its row made from its one attempt equals the aggregate's, schema
    included, and the re-sent batches are among them."""
    (schema, rows), (grouped_schema, grouped_rows) = lab.per_batch
    assert schema == grouped_schema
    assert len(rows) > 1000 and {r["attempts"] for r in rows} >= {1, 2}
    assert rows == grouped_rows
