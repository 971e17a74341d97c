"""Which JDK runs the Spark driver kwire starts: a newer one installed beside the system's, unless
the user chose (``$KWIRE_JAVA_HOME``, ``$JAVA_HOME``); only for the driver's launch."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from spark_fixtures import spark  # noqa: F401 - the shared session fixture

from spark_jobs import driver_java


def _jdk(root: Path, name: str, version: str, java: bool = True) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    if java:
        (home / "bin" / "java").write_text("#!/bin/sh\n")
    return home


@pytest.fixture
def jvms(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_java, "_JVM_DIR", tmp_path)
    monkeypatch.delenv("KWIRE_JAVA_HOME", raising=False)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    return tmp_path


def test_the_newest_jdk_from_25_is_taken(jvms):
    _jdk(jvms, "java-17-openjdk-amd64", "17.0.15")
    assert driver_java.driver_java_home() is None  # only 17: the environment's java
    _jdk(jvms, "temurin-25-jdk-amd64", "25.0.3")
    _jdk(jvms, "broken-27", "27", java=False)  # no java binary: not a JDK to run
    assert driver_java.driver_java_home() == jvms / "temurin-25-jdk-amd64"
    _jdk(jvms, "temurin-26-jdk", "26.0.1")
    assert driver_java.driver_java_home() == jvms / "temurin-26-jdk"
    assert driver_java.java_major(jvms / "temurin-26-jdk" / "bin" / "java") == 26
    assert driver_java.java_major(jvms / "nowhere" / "bin" / "java") == 0


def test_the_users_choice_wins(jvms, monkeypatch):
    _jdk(jvms, "temurin-25-jdk-amd64", "25.0.3")
    monkeypatch.setenv("JAVA_HOME", "/opt/my-jdk")
    assert driver_java.driver_java_home() is None  # Spark takes $JAVA_HOME itself
    assert driver_java.driver_java() == Path("/opt/my-jdk/bin/java")
    monkeypatch.setenv("KWIRE_JAVA_HOME", "/opt/other")
    assert driver_java.driver_java_home() == Path("/opt/other")
    monkeypatch.setenv("KWIRE_JAVA_HOME", "system")
    assert driver_java.driver_java_home() is None


def test_java_home_is_set_only_while_the_driver_launches(jvms, monkeypatch):
    home = _jdk(jvms, "temurin-25-jdk-amd64", "25.0.3")
    with driver_java.launch_env():
        assert os.environ["JAVA_HOME"] == str(home)
    assert "JAVA_HOME" not in os.environ  # Kafka brokers and tools started later keep theirs
    monkeypatch.setenv("KWIRE_JAVA_HOME", str(home))
    monkeypatch.setenv("JAVA_HOME", "/opt/mine")
    with driver_java.launch_env():
        assert os.environ["JAVA_HOME"] == str(home)
    assert os.environ["JAVA_HOME"] == "/opt/mine"


def test_the_running_driver_is_the_chosen_jdk(spark):  # noqa: F811
    """The tests' own session was launched through ``build_session``: its JVM is the JDK
    :func:`driver_java.driver_java` names (a JDK 25 on machines of this project's kind)."""
    system = spark.sparkContext._jvm.java.lang.System
    assert int(system.getProperty("java.version").split(".")[0]) == driver_java.java_major(
        driver_java.driver_java()
    )
    # The class archive given to this JVM (recorded by its JDK for its class path) must be the one
    # it mapped: a misfit is silent, and only costs speed. jcmd lists the mapped files.
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", "")
    archive = re.search(r"-XX:SharedArchiveFile=(\S+)", options)
    jcmd = driver_java.driver_java().parent / "jcmd"
    if archive is None or not jcmd.is_file():
        pytest.skip("no class archive given to this session, or no jcmd beside its java")
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    info = subprocess.run([str(jcmd), str(pid), "VM.info"], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert "CDS archive(s) mapped at" in info.stdout
    assert archive.group(1) in info.stdout  # the archive's file among the JVM's mappings
