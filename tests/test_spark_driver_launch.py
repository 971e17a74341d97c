"""The local driver JVM starts from its java command line, kept from Spark's own launcher, without
``bin/spark-submit``'s scripts; the command is the one the scripts would have run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home
from spark_fixtures import spark  # noqa: F401 - the shared session fixture

from spark_jobs import driver_launch
from spark_jobs.driver_java import launch_env

SPARK_HOME = Path(_find_spark_home())


@pytest.fixture
def kept(tmp_path, monkeypatch) -> Path:
    """The cache of commands, in a folder of the test's own."""
    folder = tmp_path / "spark-launch"
    monkeypatch.setattr(driver_launch, "cache_dir", lambda name: folder)
    return folder


def _env() -> dict[str, str]:
    with launch_env():  # the JDK kwire's drivers run on
        env = driver_launch._script_env(SPARK_HOME)
    assert env is not None
    return env


def test_the_command_is_what_the_scripts_run_and_it_is_kept(kept, monkeypatch):
    """``spark-submit --version`` through the scripts prints the command they exec
    (``SPARK_PRINT_LAUNCH_COMMAND``): the same words as the direct command, which a second call
    takes from the cache without running the launcher."""
    env = _env()
    args = ["org.apache.spark.deploy.SparkSubmit", "--conf", "spark.driver.memory=1g", "--version"]
    command = driver_launch.direct_command(SPARK_HOME, args, env)
    assert command is not None and command[0] == driver_launch._java(env)
    assert command[-len(args) :] == args and "-Xmx1g" in command
    assert len(list(kept.glob("*.cmd"))) == 1

    script_env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_CONF_DIR")}
    script_env |= {"JAVA_HOME": env["JAVA_HOME"], "SPARK_PRINT_LAUNCH_COMMAND": "1"}
    scripts = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), *args[1:]],
        env=script_env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    printed = [line for line in scripts.stderr.splitlines() if line.startswith("Spark Command: ")]
    assert printed, scripts.stderr[-2000:]
    assert printed[0].removeprefix("Spark Command: ") == " ".join(command)

    def no_launcher(*_a, **_k):
        raise AssertionError("the launcher ran again")

    monkeypatch.setattr(driver_launch.subprocess, "run", no_launcher)
    assert driver_launch.direct_command(SPARK_HOME, args, env) == command
    # another argument is another command: not taken from the cache
    with pytest.raises(AssertionError, match="ran again"):
        driver_launch.direct_command(SPARK_HOME, [*args[:-1], "--help"], env)


def test_a_launcher_that_fails_leaves_the_launch_to_the_scripts(kept):
    """No class to launch, or no JDK: no command, nothing kept (the scripts then say why)."""
    env = _env()
    assert driver_launch.direct_command(SPARK_HOME, [], env) is None
    assert driver_launch.direct_command(SPARK_HOME, ["x"], {**env, "JAVA_HOME": "/no/jdk"}) is None
    assert not list(kept.glob("*.cmd"))


def test_a_spark_env_script_means_the_scripts_run(tmp_path, monkeypatch):
    """The scripts source ``spark-env.sh``; only they can."""
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert driver_launch._script_env(SPARK_HOME) is not None
    (tmp_path / "spark-env.sh").write_text("export SPARK_DRIVER_MEMORY=2g\n")
    assert driver_launch._script_env(SPARK_HOME) is None


def test_the_test_session_was_started_directly(spark):  # noqa: F811
    """The shared session's driver: started from its java command (no scripts in between)."""
    proc = spark.sparkContext._gateway.proc
    assert proc is not None and Path(proc.args[0]).name == "java", proc.args[:3]
    assert spark.range(3).count() == 3
