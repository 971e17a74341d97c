"""Every lab client driver by one name: ``driver_argv("sarama-1.27.0")`` and so on.

The drivers themselves are built by their own modules (``java_driver``, ``go_driver``,
``js_driver``; the Python libraries run from the project's venv through
``drivers/py_driver.py``). They all take the same arguments and write the same events
(``drivers/README.md``); this module only maps a name to the command that runs one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["CLIENTS", "driver_argv"]

PY_DRIVER = Path(__file__).resolve().parent / "drivers" / "py_driver.py"


def _java(version: str) -> Callable[[], list[str]]:
    def build() -> list[str]:
        from lab.java_driver import ensure_java_driver

        return ensure_java_driver(version)

    return build


def _go(name: str) -> Callable[[], list[str]]:
    def build() -> list[str]:
        from lab.go_driver import ensure_go_driver

        return ensure_go_driver(name)

    return build


def _python(library: str) -> Callable[[], list[str]]:
    return lambda: [sys.executable, str(PY_DRIVER), "--library", library]


def _kafkajs() -> list[str]:
    from lab.js_driver import ensure_js_driver

    return ensure_js_driver()


#: name -> builder of the command prefix; the name is what truth files and tests call the client.
CLIENTS: dict[str, Callable[[], list[str]]] = {
    "java-0.10.2.2": _java("0.10.2.2"),
    "java-2.8.2": _java("2.8.2"),
    "java-3.9.2": _java("3.9.2"),
    "java-4.1.1": _java("4.1.1"),
    "sarama-1.27.0": _go("sarama-1.27.0"),
    "sarama-1.43.3": _go("sarama-1.43.3"),
    "franz-go": _go("franz-go"),
    "confluent-kafka": _python("confluent-kafka"),
    "kafka-python": _python("kafka-python"),
    "aiokafka": _python("aiokafka"),
    "kafkajs": _kafkajs,
}


def driver_argv(name: str) -> list[str]:
    """The command prefix that runs client *name* (built and cached on first use)."""
    try:
        build = CLIENTS[name]
    except KeyError:
        raise ValueError(f"unknown lab client {name!r} (known: {', '.join(CLIENTS)})") from None
    return build()
