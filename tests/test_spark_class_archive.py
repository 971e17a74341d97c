"""The Spark driver's class archive: a run maps one if it exists; without one it runs plain and
starts one background recorder (never records in its own JVM, which started twice as slowly)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_jobs import class_archive


class _FakeProc:
    def __init__(self, pid: int):
        self.pid = pid


@pytest.fixture
def archive_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KWIRE_SPARK_CDS_DIR", str(tmp_path))
    monkeypatch.delenv("KWIRE_SPARK_CDS", raising=False)
    monkeypatch.delenv("KWIRE_SPARK_CDS_RECORDING", raising=False)
    monkeypatch.setattr(class_archive, "_key", lambda: "driver-test")
    started: list[list[str]] = []

    def popen(args, **kwargs):
        started.append(list(args))
        assert kwargs.get("start_new_session") is True  # detached: outlives the run
        return _FakeProc(os.getpid())  # a live pid: the recorder counts as running

    monkeypatch.setattr(subprocess, "Popen", popen)
    return tmp_path, started


def test_no_archive_runs_plain_and_starts_one_recorder(archive_env):
    folder, started = archive_env
    assert class_archive.archive_options() == ("", None)
    assert started == [["nice", "-n", "19", sys.executable, "-m", "spark_jobs.class_archive"]]
    assert (folder / "recorder.lock").read_text() == str(os.getpid())
    # a second run while the recorder lives starts no other
    assert class_archive.archive_options() == ("", None)
    assert len(started) == 1


def test_stale_lock_starts_a_new_recorder(archive_env):
    folder, started = archive_env
    (folder / "recorder.lock").write_text("999999999")  # no such process
    class_archive.archive_options()
    assert len(started) == 1


def test_an_archive_is_mapped(archive_env):
    folder, started = archive_env
    (folder / "driver-test.jsa").write_bytes(b"x")
    options, recording = class_archive.archive_options()
    assert f"-XX:SharedArchiveFile={folder / 'driver-test.jsa'}" in options
    assert recording is None and started == []


def test_the_recorder_session_records(archive_env, monkeypatch):
    folder, started = archive_env
    monkeypatch.setenv("KWIRE_SPARK_CDS_RECORDING", "1")
    options, recording = class_archive.archive_options()
    assert recording == folder / f"driver-test.{os.getpid()}.recording"
    assert f"-XX:ArchiveClassesAtExit={recording}" in options
    assert started == []


def test_off_switch(archive_env, monkeypatch):
    _, started = archive_env
    monkeypatch.setenv("KWIRE_SPARK_CDS", "0")
    assert class_archive.archive_options() == ("", None)
    assert started == []
