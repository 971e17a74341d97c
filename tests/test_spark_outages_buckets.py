"""Job ``outages``: the time-bucketed helpers give what a plain pass over every response gives.

``spark_jobs.outages`` finds silences, requests answered late, the next answer after an unanswered
request and the answers around a drop anchor from time buckets (a hash aggregate standing for the
responses far from any question) instead of sorting every response. These tests compare each
with a brute-force answer in Python on random rows whose times crowd the bucket edges (100 ms,
1 s, 5 s) and the silence threshold (5 s, one microsecond either way), with equal times across
brokers, probes and responses.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime

import pytest

pytest.importorskip("pyspark")
from spark_fixtures import spark  # noqa: F401

from spark_jobs import outages

pytestmark = pytest.mark.spark

BROKERS = [("run", "10.0.0.1", 9092), ("run", "10.0.0.2", 9092)]
T0_US = 1_714_564_800_000_000  # 2024-05-01T12:00:00Z, a multiple of every bucket width
MIN_SILENCE_S = 5.0
SEEDS = [1, 2, 3]


def _times(rng: random.Random, n: int) -> list[int]:
    """Increasing microsecond offsets: bursts, steps onto and beside bucket edges, and gaps just
    under, at and over the silence threshold."""
    t, out = 0, []
    for _ in range(n):
        step = rng.choice(
            [
                rng.randrange(0, 3),  # the same instant, or a microsecond on
                rng.randrange(0, 20_000),  # bursts: several answers in one 100 ms bucket
                rng.randrange(0, 20_000),
                rng.randrange(0, 300_000),
                100_000 - t % 100_000 + rng.choice([-1, 0, 1]),  # onto a 100 ms edge
                1_000_000 - t % 1_000_000 + rng.choice([-1, 0, 1]),  # onto a second
                5_000_000 + rng.choice([-1, 0, 1]),  # the silence threshold
                rng.randrange(5_000_000, 20_000_000),
            ]
        )
        t += max(step, 0)
        out.append(t)
    return out


def _dt(us: int | None) -> datetime | None:
    return None if us is None else datetime.fromtimestamp((T0_US + us) / 1e6, tz=UTC)


def _exchanges(spark, rng: random.Random):  # noqa: F811
    """Rows (broker, request_time, response_time) in microseconds, and their DataFrame: most
    answered, some unanswered (no response time), a few with no request time."""
    rows = []
    for broker in BROKERS:
        for t in _times(rng, 120):
            kind = rng.random()
            if kind < 0.15:
                rows.append((*broker, t, None))
            elif kind < 0.18:
                rows.append((*broker, None, t))
            else:
                rows.append((*broker, t, t + rng.choice([0, 1, rng.randrange(0, 8_000_000)])))
    schema = (
        "source string, broker_ip string, broker_port int, request_time timestamp, response_time timestamp"
    )
    df = spark.createDataFrame([(s, ip, port, _dt(q), _dt(r)) for s, ip, port, q, r in rows], schema)
    return rows, df


def _probes(spark, rng: random.Random, rows, column: str):  # noqa: F811
    """Probe rows at times taken from the exchanges, a microsecond beside them, or none."""
    picked = []
    for s, ip, port, q, r in rng.sample(rows, 40):
        base = rng.choice([q, r]) if rng.random() < 0.9 else None
        t = None if base is None else base + rng.choice([-1, 0, 0, 1])
        picked.append((s, ip, port, t))
    schema = f"source string, broker_ip string, broker_port int, {column} timestamp"
    return picked, spark.createDataFrame([(s, ip, port, _dt(t)) for s, ip, port, t in picked], schema)


def _us_rows(df, *columns: str) -> list[tuple]:
    from pyspark.sql import functions as F

    types = dict(df.dtypes)
    picked = [(F.unix_micros(c) - T0_US).alias(c) if types[c] == "timestamp" else F.col(c) for c in columns]
    return sorted(df.select(*picked).collect(), key=repr)


def _answers(rows, broker) -> list[tuple[int | None, int | None]]:
    return [(q, r) for s, ip, port, q, r in rows if (s, ip, port) == broker]


def _silences_brute(rows, span: tuple[int, int]) -> list[tuple]:
    out = []
    for broker in BROKERS:
        points = sorted(
            {(r, 1) for _, r in _answers(rows, broker) if r is not None} | {(span[0], 0), (span[1], 2)}
        )
        for (a, ka), (b, kb) in itertools.pairwise(points):
            if ka < 2 and b - a >= MIN_SILENCE_S * 1e6:
                out.append((*broker, a, b, a if ka == 1 else None, b if kb == 1 else None))
    return out


def _silences(spark, rows, df):  # noqa: F811
    times = [t for *_, q, r in rows for t in (q, r) if t is not None]
    span = (min(times) - 3_000_000, max(times) + 7_000_000)
    spans = spark.createDataFrame(
        [("run", _dt(span[0]), _dt(span[1]))], "source string, span_start timestamp, span_end timestamp"
    )
    brokers = df.select(*outages._BROKER).distinct()
    return span, outages._silences(df, brokers, spans, MIN_SILENCE_S)


@pytest.mark.parametrize("seed", SEEDS)
def test_silences_are_the_long_gaps_between_consecutive_responses(spark, seed):  # noqa: F811
    rows, df = _exchanges(spark, random.Random(seed))
    span, silences = _silences(spark, rows, df)
    got = _us_rows(silences, *outages._BROKER, "silence_start", "silence_end", "last_answer", "next_answer")
    want = _silences_brute(rows, span)
    assert [tuple(r) for r in got] == sorted(want, key=repr)
    assert any(b - a == MIN_SILENCE_S * 1e6 for *_, a, b, _la, _na in want)  # the threshold itself is met


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cover_cap", [None, 0])
def test_requests_answered_late_are_counted_per_silence(spark, seed, cover_cap, monkeypatch):  # noqa: F811
    """Also past the cap on cover buckets (0: every request sorted, as without buckets)."""
    if cover_cap is not None:
        monkeypatch.setattr(outages, "_MAX_COVER_BUCKETS", cover_cap)
    rows, df = _exchanges(spark, random.Random(seed))
    span, silences = _silences(spark, rows, df)
    covered = sum(
        (T0_US + b) // 10**6 - (T0_US + a) // 10**6 + 1 for *_, a, b, _la, _na in _silences_brute(rows, span)
    )
    assert outages._cover_buckets(silences) == covered > 0
    late = outages._answered_late(df, silences)
    got = {
        tuple(r[:4]): r[4]
        for r in _us_rows(late, *outages._BROKER, "silence_start", "requests_answered_late")
    }
    want = {}
    for s, ip, port, start, end, _la, _na in _silences_brute(rows, span):
        n = sum(
            1
            for q, r in _answers(rows, (s, ip, port))
            if q is not None and r is not None and start <= q < end and r >= end
        )
        if n:
            want[(s, ip, port, start)] = n
    assert got == want
    assert want, "no silence had a request answered after it: the rows test nothing"


@pytest.mark.parametrize("seed", SEEDS)
def test_the_next_answer_after_an_unanswered_request(spark, seed):  # noqa: F811
    rng = random.Random(seed)
    rows, df = _exchanges(spark, rng)
    probes, probe_df = _probes(spark, rng, rows, "request_time")
    got = _us_rows(outages._alive_after(probe_df, df), *outages._BROKER, "request_time", "answered_after")
    want = []
    for s, ip, port, t in probes:
        answered = [(q, r) for q, r in _answers(rows, (s, ip, port)) if q is not None and r is not None]
        after = [r for q, r in answered if t is None or q > t]
        want.append((s, ip, port, t, min(after) if after else None))
    assert [tuple(r) for r in got] == sorted(want, key=repr)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_answers_around_a_drop_anchor(spark, seed):  # noqa: F811
    rng = random.Random(seed)
    rows, df = _exchanges(spark, rng)
    probes, probe_df = _probes(spark, rng, rows, "anchor")
    got = _us_rows(
        outages._gap_of(probe_df, df, "anchor"), *outages._BROKER, "anchor", "gap_start", "gap_end"
    )
    want = []
    for s, ip, port, t in probes:
        responses = [r for _, r in _answers(rows, (s, ip, port)) if r is not None]
        before = [r for r in responses if t is not None and r <= t]
        after = [r for r in responses if t is None or r > t]
        want.append((s, ip, port, t, max(before) if before else None, min(after) if after else None))
    assert [tuple(r) for r in got] == sorted(want, key=repr)
