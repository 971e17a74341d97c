"""Start the local driver JVM with its java command line, not through Spark's shell launcher.

pyspark starts a driver through ``bin/spark-submit`` and ``bin/spark-class``: two bash scripts (with
``dirname``, ``ps`` and ``spark-env.sh`` lookups) that run a first JVM, ``launcher.Main``, only to
print the java command line of the driver, which they then exec; pyspark then looks for the
driver's connection file every 0.1 s. Here the launcher JVM runs once per distinct command (its
arguments, the environment it reads, the JDK and the Spark installation) and its output is kept in
the cache (``spark-launch/``); later drivers start from it directly, and pyspark connects to them
as to a driver started by someone else (``PYSPARK_GATEWAY_PORT``). A session on the demo
dataset then started in 2.07-2.32 s against 2.36-2.49 s through the scripts (6 alternating
pairs), and ``kwire sql`` took 0.97x the time (``farm-bench -n 8``).

Only where the scripts would add nothing: no ``spark-env.sh`` in the configuration folder (the
scripts would source it). Anywhere else, if the launcher fails or says something, and with
``KWIRE_SPARK_DIRECT_LAUNCH=0``, pyspark's own path runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kwire.runtime import cache_dir

__all__ = ["direct_command", "launch_gateway", "launching"]

#: Environment variables whose values the launcher may read (the command is kept per their values).
_READ_BY_LAUNCHER = re.compile(r"^(SPARK_|JAVA_|HADOOP_|YARN_|PYSPARK_|_JAVA_)")
#: How long a driver JVM may take to write its connection file (pyspark itself waits forever).
_START_TIMEOUT_S = 300.0
_KEPT_COMMANDS = 20
_SWITCH = "KWIRE_SPARK_DIRECT_LAUNCH"


def _scala_version(spark_home: Path) -> str | None:
    """The Scala version ``bin/load-spark-env.sh`` exports (the launcher needs it)."""
    try:
        text = (spark_home / "bin" / "load-spark-env.sh").read_text()
    except OSError:
        return None
    found = re.search(r"^export SPARK_SCALA_VERSION=(\S+)\s*$", text, re.MULTILINE)
    return found.group(1) if found else None


def _script_env(spark_home: Path) -> dict[str, str] | None:
    """The environment the driver JVM would get from the scripts; None where they would do more
    (a ``spark-env.sh`` to source, no Scala version to read)."""
    env = dict(os.environ)
    conf_dir = Path(env.get("SPARK_CONF_DIR") or spark_home / "conf")
    scala = env.get("SPARK_SCALA_VERSION") or _scala_version(spark_home)
    if scala is None or (conf_dir / "spark-env.sh").exists() or "SPARK_ENV_LOADED" in env:
        return None
    env.update(
        {
            "SPARK_HOME": str(spark_home),
            "SPARK_ENV_LOADED": "1",
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_SCALA_VERSION": scala,
            "PYTHONHASHSEED": "0",  # bin/spark-submit sets it
        }
    )
    return env


def _state(path: Path) -> list[Any]:
    """What tells a file or folder changed: its path, modification time and size (none: missing)."""
    try:
        found = path.stat()
    except OSError:
        return [str(path)]
    return [str(path), found.st_mtime_ns, found.st_size]


def _java(env: dict[str, str]) -> str:
    home = env.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def direct_command(spark_home: Path, args: list[str], env: dict[str, str]) -> list[str] | None:
    """The driver's java command line for ``spark-submit ARGS`` (``launcher.Main``'s output),
    from the cache or by running the launcher; None if the launcher fails."""
    key_parts = {
        "args": args,
        "env": sorted((k, v) for k, v in env.items() if _READ_BY_LAUNCHER.match(k)),
        "java": _java(env),
        # a new Spark installation or JDK, a changed spark-defaults.conf: a new command
        "files": [_state(spark_home / "jars"), _state(Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf")],
    }
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:32]
    folder = cache_dir("spark-launch")
    kept = folder / f"{key}.cmd"
    with contextlib.suppress(OSError):
        parts = kept.read_bytes().split(b"\0")
        if len(parts) > 1 and parts[-1] == b"":
            return [p.decode() for p in parts[:-1]]
    launcher = [
        _java(env),
        "-Xmx128m",
        "-cp",
        str(spark_home / "jars" / "*"),
        "org.apache.spark.launcher.Main",
    ]
    try:
        done = subprocess.run([*launcher, *args], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # lines for the user (spark-class prints them), a NUL line, then the command's NUL-ended words
    said, mark, body = done.stdout.partition(b"\0\n")
    parts = body.split(b"\0")
    if done.returncode != 0 or said.strip() or not mark or len(parts) < 2 or parts[-1] or not parts[0]:
        return None  # the scripts' way says what went wrong
    command = [p.decode() for p in parts[:-1]]
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as out:
            out.write(body)
        os.replace(out.name, kept)
        for old in sorted(folder.glob("*.cmd"), key=lambda p: p.stat().st_mtime)[:-_KEPT_COMMANDS]:
            old.unlink()
    return command


def launch_gateway(original: Any, conf: Any = None, popen_kwargs: dict[str, Any] | None = None) -> Any:
    """pyspark's ``launch_gateway(conf, popen_kwargs)``, the driver started by :func:`direct_command`
    when it can be (else ``original`` does it all)."""
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.serializers import UTF8Deserializer, read_int

    if "PYSPARK_GATEWAY_PORT" in os.environ or os.name != "posix" or os.environ.get(_SWITCH) == "0":
        return original(conf, popen_kwargs)
    spark_home = Path(_find_spark_home())
    env = _script_env(spark_home)
    args = ["org.apache.spark.deploy.SparkSubmit"]
    for k, v in conf.getAll() if conf else []:
        args += ["--conf", f"{k}={v}"]
    submit = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    if os.environ.get("SPARK_TESTING"):
        submit = f"--conf spark.ui.enabled=false {submit}"
    args += shlex.split(submit)
    command = direct_command(spark_home, args, env) if env is not None else None
    if env is None or command is None:
        return original(conf, popen_kwargs)
    with tempfile.TemporaryDirectory() as conn_dir:
        conn_file = os.path.join(conn_dir, "conn")
        env.update({"SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": conn_file})
        proc = subprocess.Popen(
            command,
            **{**(popen_kwargs or {}), "stdin": subprocess.PIPE, "env": env},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        # the JVM writes the file and renames it into place: once it is there, it is whole
        while proc.poll() is None and not os.path.isfile(conn_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not os.path.isfile(conn_file):
            if proc.poll() is None:
                proc.kill()
            from pyspark.errors import PySparkRuntimeError

            raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
        with open(conn_file, "rb") as info:
            port = read_int(info)
            secret = UTF8Deserializer().loads(info)
    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ.update({"PYSPARK_GATEWAY_PORT": str(port), "PYSPARK_GATEWAY_SECRET": secret})
    try:
        gateway = original(conf, popen_kwargs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    gateway.proc = proc
    return gateway


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """While inside, a driver JVM that pyspark launches is started by :func:`launch_gateway`."""
    import pyspark.core.context

    original = pyspark.core.context.launch_gateway
    pyspark.core.context.launch_gateway = functools.partial(launch_gateway, original)
    try:
        yield
    finally:
        pyspark.core.context.launch_gateway = original
