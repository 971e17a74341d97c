"""A new local driver warms its cold paths on the idle core while the session is built
(``spark_jobs.driver_warmup``): every step works against the real JVM, a step that fails is
only recorded, and a new session starts the warm-up once, from its own SparkContext."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyspark.core.context import SparkContext
from spark_fixtures import ex, spark, write_dataset  # noqa: F401 - spark: the shared session fixture

from spark_jobs import driver_warmup
from spark_jobs.driver_warmup import WarmUp, dataset_warm_up, warming

ROOT = Path(__file__).resolve().parents[1]


def _dataset(root: Path) -> Path:
    return write_dataset(root / "ds.kwire", [ex(0.0, "Metadata"), ex(1.0, "Produce")])


def test_every_step_runs_in_the_real_driver(spark, tmp_path):  # noqa: F811
    """Run in this thread against the test session's JVM: a Spark upgrade that moved a class or
    a method the warm-up calls fails here, not silently in every run."""
    warm_up = dataset_warm_up(_dataset(tmp_path))
    assert warm_up is not None and warm_up.footer is not None and warm_up.footer.suffix == ".parquet"
    assert [f.name for f in warm_up.folders] == ["exchanges"]  # no connections/ folder: not listed
    warm_up.run(spark.sparkContext)
    assert warm_up.done.is_set()
    assert warm_up.failed == []


def test_a_step_that_fails_is_recorded_and_the_others_still_run(spark, tmp_path):  # noqa: F811
    warm_up = WarmUp(["{not a schema"], [tmp_path])  # a folder without Parquet: no footer to open
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
    warm_up.run(spark.sparkContext)
    assert warm_up.done.is_set()
    assert len(warm_up.failed) == 1 and warm_up.failed[0].startswith("schemas: "), warm_up.failed
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(None)) == jobs_before + 1  # the job ran


def test_only_a_context_made_inside_starts_it_once(monkeypatch, tmp_path):
    """The warm-up starts when ``warming`` sees a new SparkContext made, not for one that was
    running already, and never once the block is left or when it is switched off."""
    started: list[object] = []

    class Recording(WarmUp):
        def run(self, sc):
            started.append(sc)
            self.done.set()

    made = object()
    monkeypatch.setattr(SparkContext, "getOrCreate", classmethod(lambda cls, conf=None: made))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    original = SparkContext.__dict__["getOrCreate"]

    warm_up = Recording([], [tmp_path])
    with warming(warm_up) as active:
        assert active is warm_up
        assert SparkContext.getOrCreate() is made
    assert warm_up.done.wait(10) and started == [made]
    assert SparkContext.__dict__["getOrCreate"] is original
    assert SparkContext.getOrCreate() is made and started == [made]  # outside: not again

    monkeypatch.setattr(SparkContext, "_active_spark_context", made)  # one runs already
    with warming(Recording([], [tmp_path])):
        SparkContext.getOrCreate()
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setenv("KWIRE_SPARK_WARM_UP", "0")
    with warming(Recording([], [tmp_path])) as active:
        assert active is None
        SparkContext.getOrCreate()
    assert started == [made]
    assert dataset_warm_up("hdfs://nn/kwire/ds") is None  # a cluster path is not looked at here
    assert driver_warmup.enabled() is False


_NEW_SESSION = """
import json, sys
from spark_jobs.driver_warmup import dataset_warm_up
from spark_jobs.session import build_session, dataset_bytes
warm_up = dataset_warm_up(sys.argv[1])
spark = build_session(None, "kwire-warm-up-test", data_bytes=dataset_bytes(sys.argv[1]), warm_up=warm_up)
finished = warm_up.done.wait(60)
rows = spark.read.parquet(sys.argv[1] + "/exchanges").count()
print(json.dumps({"finished": finished, "failed": warm_up.failed, "rows": rows}))
"""


def test_a_new_session_warms_up_beside_its_construction(tmp_path):
    """A process of its own (a new JVM): the warm-up runs through, and prints nothing."""
    dataset = _dataset(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _NEW_SESSION, str(dataset)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"finished": True, "failed": [], "rows": 2}
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr[-3000:]
