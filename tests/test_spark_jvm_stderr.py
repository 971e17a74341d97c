"""The driver JVM's standard error reaches the user without its start-up notices about Spark's
module options, and with everything else (a launch that fails still says why, in its words)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.jvm_stderr import is_notice

ROOT = Path(__file__).resolve().parents[1]
KWIRE = [sys.executable, "-m", "kwire"]


def test_only_the_module_notices_are_left_out():
    assert is_notice(b"WARNING: Using incubator modules: jdk.incubator.vector\n")
    assert is_notice(b"WARNING: package sun.security.action not in java.base\n")
    for kept in (
        b"WARNING: An illegal reflective access operation has occurred\n",
        b"ERROR SparkContext: Error initializing SparkContext.\n",
        b"Error occurred during initialization of boot layer\n",
        b"java.lang.OutOfMemoryError: Java heap space\n",
    ):
        assert not is_notice(kept), kept


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ds = tmp_path_factory.mktemp("jvm-stderr") / "kcat.kwire"
    subprocess.run(
        [*KWIRE, "decode", str(ROOT / "captures" / "tansu-kcat.pcap"), "-o", str(ds), "--quiet"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return ds


def test_a_cold_analysis_prints_no_jvm_notices(dataset, tmp_path):
    """A process of its own starts its own JVM (before, every ``kwire analyze`` began with the
    incubator notice, and on JDK 25 with one more)."""
    done = subprocess.run(
        [
            *KWIRE,
            "analyze",
            str(dataset),
            "-o",
            str(tmp_path / "report"),
            "--only",
            "client_inventory",
            "--local",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "WARNING:" not in done.stderr, done.stderr[-2000:]
    assert "client_inventory" in done.stdout + done.stderr


def test_a_driver_that_cannot_start_says_why_then_one_error_line(dataset, tmp_path):
    done = subprocess.run(
        [*KWIRE, "analyze", str(dataset), "-o", str(tmp_path / "report"), "--local"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KWIRE_JAVA_HOME": str(tmp_path / "no-jdk")},
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert any(f"{tmp_path / 'no-jdk'}/bin/java" in line for line in lines[:-1]), lines  # the launch's words
    assert lines[-1].startswith("error: Spark did not start: [JAVA_GATEWAY_EXITED]"), lines
    assert "Traceback" not in done.stderr
