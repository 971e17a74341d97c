"""The README's first command (`bash scripts/demo`) runs the whole main job, deterministically.

It once skipped the analysis when the machine was busy (a `| grep -q` under pipefail raced
kwire's help output), so the test runs it on a fresh copy of the repository while other
processes keep both cores busy, and asserts on the exit code and the report it must write.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real, pytest.mark.spark]

REPO = Path(__file__).resolve().parent.parent
#: What a fresh clone does not have: build output, caches, the venv (copied separately below).
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", ".cache", "out", "__pycache__", "*.kwire", ".pytest_cache"
)
#: Bound on the whole demo: venv refresh, decode and a local Spark analysis on a loaded machine.
DEMO_TIMEOUT_S = 600


def demo_env() -> dict[str, str]:
    """The suite's environment, with no Spark class archive: the copy has none (a fresh clone),
    and its jars' path differs from the suite's, so a run would start a background recorder
    (``spark_jobs.class_archive``) that outlives the test by a minute of CPU."""
    return {**os.environ, "KWIRE_SPARK_CDS": "0"}


@pytest.fixture
def fresh_copy(tmp_path: Path) -> Path:
    """The repository's files without build output, and a venv made from the suite's own.

    Copying the venv keeps the test off PyPI for the 300 MB of pyspark; the demo's own
    `pip install -e .` then re-points kwire at the copy, as it would on a fresh clone.
    """
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=NOT_COPIED, symlinks=True)
    venv = Path(sys.prefix)
    if not (venv / "pyvenv.cfg").is_file():
        pytest.skip("the suite is not running from a venv to copy")
    shutil.copytree(venv, copy / ".venv", symlinks=True)
    return copy


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """One spinning process per core for as long as the test runs."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for proc in spinners:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_demo_decodes_and_analyses_under_load(fresh_copy: Path, busy_cpu: None) -> None:
    result = subprocess.run(
        ["bash", "scripts/demo"],
        cwd=fresh_copy,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=demo_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = fresh_copy / "out" / "demo.kwire" / "report" / "report.html"
    assert report.is_file() and report.stat().st_size > 1000
    assert "report: out/demo.kwire/report/report.html" in result.stdout.splitlines()
    assert (fresh_copy / "out" / "demo.kwire" / "exchanges").is_dir()


def test_demo_fails_loudly_when_a_step_fails(fresh_copy: Path, tmp_path: Path) -> None:
    not_a_capture = tmp_path / "notes.txt"
    not_a_capture.write_text("not a capture\n")
    result = subprocess.run(
        ["bash", "scripts/demo", str(not_a_capture)],
        cwd=fresh_copy,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=demo_env(),
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == f"demo: kwire decode {not_a_capture} failed"
    assert "report:" not in result.stdout
