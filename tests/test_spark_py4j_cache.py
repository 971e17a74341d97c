"""``spark_jobs.py4j_cache`` on a real driver JVM: a static look-up is answered from memory the
second time, the answers still work, and what must not be remembered (instance members, a look-up
from another gateway client) is looked up afresh."""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F
from spark_fixtures import spark  # noqa: F401

from spark_jobs import py4j_cache


class _Counting:
    """Counts the commands a gateway client sends to the JVM, but for py4j's memory commands
    ("m": Python proxies of Java objects were garbage-collected; py4j's finalizer thread sends
    them in the background, whenever it gets to them: CI once counted 5 commands where the code
    under test sent 2)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.inner = client.send_command
        self.sent = 0
        self.lookups = 0  # py4j's reflection commands ("r"): finding a class or a member

    def __enter__(self) -> _Counting:
        def send(command: str, *args: Any, **kwargs: Any) -> Any:
            if not command.startswith("m\n"):
                self.sent += 1
                self.lookups += command.startswith("r\n")
            return self.inner(command, *args, **kwargs)

        self.client.send_command = send
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.send_command = self.inner


def test_static_lookups_are_remembered_and_still_work(spark) -> None:  # noqa: F811
    py4j_cache.install()  # build_session did; a second install is a no-op
    client = spark.sparkContext._gateway._gateway_client
    F.col("warm")  # the first look-ups of functions and col
    with _Counting(client) as again:
        F.col("b")
    # without the cache, on a fresh session with PySpark's DataFrame debugging on: 13 commands,
    # 7 of them look-ups (SparkSession, getActiveSession, PySparkCurrentOrigin, set, clear,
    # functions, col); with it only the calls (the next test counts them with debugging off)
    assert again.sent >= 1
    assert again.lookups == 0
    jvm = spark.sparkContext._jvm
    functions = jvm.org.apache.spark.sql.functions
    assert functions.lit(3).toString() == "3"
    with _Counting(client) as static:
        assert functions.lit(4).toString() == "4"
    assert (static.sent, static.lookups) == (2, 0)  # lit's look-up kept; the call and toString
    row = spark.range(3).select((F.col("id") + F.lit(1)).alias("n"), F.when(F.col("id") > 0, "y")).collect()
    assert [tuple(r) for r in row] == [(1, None), (2, "y"), (3, "y")]


def test_instance_members_are_looked_up_every_time(spark) -> None:  # noqa: F811
    client = spark.sparkContext._gateway._gateway_client
    column = F.col("x")._jc
    column.toString()
    with _Counting(client) as counted:
        assert column.toString() == "x"
    assert (counted.sent, counted.lookups) == (1, 0)  # an instance call: one command, as before


def test_another_gateway_client_is_not_given_remembered_answers(spark) -> None:  # noqa: F811
    jvm = spark.sparkContext._jvm
    jvm.org.apache.spark.sql.functions.lit(1)  # remembered for the session's client

    class _Other:
        """Stands in for the client of a gateway started later (its own JVM)."""

        def __init__(self, real: Any) -> None:
            self.real = real
            self.asked = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def send_command(self, command: str, *args: Any, **kwargs: Any) -> Any:
            self.asked += 1
            return self.real.send_command(command, *args, **kwargs)

    functions = jvm.org.apache.spark.sql.functions
    other = _Other(functions._gateway_client)
    functions._gateway_client = other
    try:
        functions.lit  # noqa: B018 - the look-up is what is tested
    finally:
        functions._gateway_client = other.real
    assert other.asked == 1  # looked up through the other client, not answered from memory


def test_a_column_is_one_call_into_the_jvm(spark) -> None:  # noqa: F811
    """``build_session`` turns PySpark's DataFrame debugging off: with it on, every ``F.*`` call
    also fetched the active session and a setting, and set and cleared the Python call site in
    the JVM (6 commands for this ``F.col`` instead of 1, and a stack walk)."""
    client = spark.sparkContext._gateway._gateway_client
    F.col("warm")
    with _Counting(client) as counted:
        F.col("b")
    assert (counted.sent, counted.lookups) == (1, 0)
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
