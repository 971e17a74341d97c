"""Job 2, error_reaction: what a client does after a partition error (incident 4)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import ex, spark, tables  # noqa: F401

from spark_jobs.error_reaction import error_reaction, error_reaction_headline

pytestmark = pytest.mark.spark

JAVA = {
    "client_id": "java-app",
    "client_ip": "10.0.1.1",
    "client_software_name": "apache-kafka-java",
    "client_software_version": "3.7.0",
}
SARAMA = {
    "client_id": "go-app",
    "client_ip": "10.0.1.2",
    "client_software_name": "sarama",
    "client_software_version": "1.42.1",
}


def _episode(
    who: dict, t: float, code: int, refreshes: bool, *, broker: str = "10.0.0.9", retries: int = 3
) -> list[dict]:
    """An error for orders/0 at t; then either a Metadata request and a success on the new
    leader, or retries to the same broker that keep failing."""
    rows = [ex(t, "Produce", errors=[("orders", 0, code)], broker_ip=broker, **who)]
    if refreshes:
        rows.append(ex(t + 0.1, "Metadata", broker_ip=broker, **who))
        rows.append(ex(t + 0.3, "Produce", errors=[("orders", 0, 0)], broker_ip="10.0.0.8", **who))
    else:
        rows += [
            ex(t + 0.2 * (i + 1), "Produce", errors=[("orders", 0, code)], broker_ip=broker, **who)
            for i in range(retries)
        ]
    return rows


def _by_time(df, client_id):
    return [r for r in sorted(df.collect(), key=lambda r: r.error_time) if r.client_id == client_id]


def test_client_refreshing_on_6_but_not_on_56_gets_different_verdicts(spark):  # noqa: F811
    rows = (
        _episode(JAVA, 0, 56, refreshes=True)
        + _episode(JAVA, 20, 6, refreshes=True)
        + _episode(SARAMA, 0, 56, refreshes=False)
        + _episode(SARAMA, 20, 6, refreshes=True)
        + [ex(60, "Heartbeat")]  # the data goes on long enough to judge
    )
    reactions = error_reaction(tables(spark, rows).exchanges, refresh_within_s=10.0)
    go = _by_time(reactions, "go-app")
    first_56 = go[0]
    assert (first_56.error_code, first_56.verdict) == (56, "retries_without_refresh")
    # three retries, then the next write (which gets 6) to the same broker, before any refresh
    assert first_56.requests_before_refresh == 4
    assert first_56.refresh_time is not None and first_56.metadata_delay_ms > 10_000  # only at t=20.1
    go_6 = [r for r in go if r.error_code == 6]
    assert [r.verdict for r in go_6] == ["refreshes_metadata"]
    assert go_6[0].metadata_delay_ms == pytest.approx(95.0)  # response at 20.005, Metadata at 20.1
    assert go_6[0].first_success_ms == pytest.approx(300.0)
    java = _by_time(reactions, "java-app")
    assert {r.verdict for r in java} == {"refreshes_metadata"}

    head = {r.client_id: r for r in error_reaction_headline(reactions).collect()}
    assert head["go-app"].reaction_56 == "retries_without_refresh"
    assert head["go-app"].reaction_6 == "refreshes_metadata"
    assert head["go-app"].reactions_differ is True
    assert head["go-app"].client_software_name == "sarama"
    assert head["java-app"].reactions_differ is False
    assert head["java-app"].errors_56 == 1 and head["java-app"].errors_6 == 1


def test_no_metadata_request_ever_and_error_at_the_end_of_the_window(spark):  # noqa: F811
    quiet = {"client_id": "quiet", "client_ip": "10.0.2.1"}
    rows = [
        # an error, no retry, no Metadata request ever, 50 s of data after it: gives up
        ex(0, "Produce", errors=[("orders", 1, 6)], **quiet),
        # an error in the last second of the window: too soon to tell
        ex(49.5, "Produce", errors=[("orders", 2, 56)], **quiet),
        ex(50, "Heartbeat", **quiet),
    ]
    got = {r.partition: r for r in error_reaction(tables(spark, rows).exchanges).collect()}
    assert got[1].verdict == "gives_up"
    assert got[1].refresh_time is None and got[1].metadata_delay_ms is None
    assert got[1].first_success_ms is None and got[1].requests_before_refresh == 0
    assert got[2].verdict == "unknown"


def test_client_id_shared_by_two_hosts_is_two_clients(spark):  # noqa: F811
    a = {"client_id": "shared", "client_ip": "10.0.3.1"}
    b = {"client_id": "shared", "client_ip": "10.0.3.2"}
    rows = (
        _episode(a, 0, 56, refreshes=True)
        + _episode(b, 0, 56, refreshes=False, retries=2)
        + [ex(60, "Heartbeat")]
    )
    got = {}
    for r in sorted(error_reaction(tables(spark, rows).exchanges).collect(), key=lambda r: r.error_time):
        got.setdefault(r.client_ip, r)  # each host's first error
    # host A's Metadata request must not count as host B's refresh
    assert got["10.0.3.1"].verdict == "refreshes_metadata"
    assert got["10.0.3.2"].verdict == "retries_without_refresh"
    assert got["10.0.3.2"].refresh_time is None


def test_unwatched_errors_are_ignored(spark):  # noqa: F811
    rows = [ex(0, "Produce", errors=[("orders", 0, 10)]), ex(1, "Produce", errors=[("orders", 0, 0)])]
    assert error_reaction(tables(spark, rows).exchanges).count() == 0
