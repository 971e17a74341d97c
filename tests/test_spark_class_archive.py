"""The Spark driver's class archive: a run maps one if it exists; without one it runs plain and
starts one background recorder (never records in its own JVM, which started twice as slowly)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from spark_fixtures import session_settings

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


def test_the_recorder_analyses_the_bundled_capture(tmp_path):
    """The recording session's analysis runs over rows (its tasks then load and link what a
    real run's do), decoded from the capture ``scripts/demo`` analyses."""
    dataset = class_archive._warm_up_dataset(tmp_path)
    assert list((dataset / "exchanges").rglob("*.parquet")) and list(
        (dataset / "connections").rglob("*.parquet")
    )


def test_off_switch(archive_env, monkeypatch):
    _, started = archive_env
    monkeypatch.setenv("KWIRE_SPARK_CDS", "0")
    assert class_archive.archive_options() == ("", None)
    assert started == []


def _jar(path, entries: dict[str, bytes]) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as jar:
        for name, data in entries.items():
            jar.writestr(name, data)


def test_signed_jars_get_unsigned_copies_once(archive_env, monkeypatch, tmp_path):
    """The JDK archives no class of a signed jar: the recorder copies each signed jar without
    its signature, and drivers put the copies first (``archive_classpath``)."""
    import zipfile

    folder, _ = archive_env
    jars = tmp_path / "pyspark-jars"
    jars.mkdir()
    _jar(
        jars / "signed.jar",
        {
            "META-INF/MANIFEST.MF": b"m",
            "META-INF/X.SF": b"s",
            "META-INF/X.RSA": b"r",
            "a/B.class": b"\xca\xfe",
        },
    )
    _jar(jars / "plain.jar", {"META-INF/MANIFEST.MF": b"m", "c/D.class": b"\xca\xfe"})
    monkeypatch.setattr(class_archive, "_pyspark_jars", lambda: jars)
    assert class_archive.archive_classpath() == ""  # nothing made yet
    (folder / ".driver-test.jars.999999999.tmp").mkdir()  # left by a recorder killed mid-copy
    class_archive._make_classpath()
    copy = folder / "driver-test.jars" / "signed.jar"
    assert class_archive.archive_classpath() == str(copy)
    with zipfile.ZipFile(copy) as z:
        assert sorted(z.namelist()) == ["META-INF/MANIFEST.MF", "a/B.class"]
        assert z.read("a/B.class") == b"\xca\xfe"
    before = copy.stat().st_mtime_ns
    class_archive._make_classpath()  # the archive records the copies' times: never rewritten
    assert copy.stat().st_mtime_ns == before
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("archive", ["-XX:SharedArchiveFile=/a.jsa", ""])
def test_a_driver_with_the_archive_puts_the_copies_first(monkeypatch, archive: str) -> None:
    """``build_session``'s settings (without starting a JVM): the copies go on the class path of
    a driver that maps (or records) the archive, and only then."""
    captured = session_settings(monkeypatch, archive, "/c/janino.jar")
    assert captured.get("spark.driver.extraClassPath") == ("/c/janino.jar" if archive else None)
    if archive:
        assert archive in captured["spark.driver.extraJavaOptions"]
