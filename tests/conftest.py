"""Shared fixtures for real-traffic tests: a Tansu broker and tcpdump captures.

The helpers themselves live in ``realkafka.py`` (imported by bare name: ``tests/``
has no ``__init__.py``, so pytest puts it on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from realkafka import TansuBroker, Tcpdump, started_tansu, tcpdump_available


@pytest.fixture(scope="session")
def tansu() -> Iterator[TansuBroker]:
    """A Tansu broker (memory storage) on 127.0.0.1, shared by the whole session."""
    broker = started_tansu()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def capture(tmp_path: Path) -> Callable[..., Tcpdump]:
    """Factory: ``with capture(port, name="x") as dump:`` captures those ports on lo
    to ``tmp_path / "x.pcap"`` (``dump.path``). Skips if tcpdump cannot capture here.
    """
    reason = tcpdump_available()
    if reason:
        pytest.skip(reason)

    def make(*ports: int, name: str = "capture") -> Tcpdump:
        return Tcpdump(tmp_path / f"{name}.pcap", ports)

    return make


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the figures tests recorded (oracle coverage, fuzz inputs) at the end of every run."""
    import coverage_report

    lines = coverage_report.lines()
    if lines:
        terminalreporter.section("kwire test figures")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True, scope="module")
def _drop_cached_dataframes() -> Iterator[None]:
    """Unpersist what a test module's jobs cached in the shared Spark session.

    The jobs cache intermediate tables for the caller to read; over a whole session those
    blocks pile up in the 1 GB test driver and left too little memory for aggregation
    (AGGREGATE_OUT_OF_MEMORY, seen after ~380 tests).
    """
    yield
    import sys

    if "pyspark" not in sys.modules:  # never start a JVM for modules that did not
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.catalog.clearCache()
    from spark_jobs import common

    common.forget_cached_software()
