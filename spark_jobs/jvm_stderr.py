"""The local driver JVM's standard error, passed on without the JVM's start-up notices.

Spark's launcher gives every driver ``--add-modules=jdk.incubator.vector`` and
``--add-opens`` for packages some JDKs no longer have; the JVM then prints, on every
``kwire analyze`` and ``kwire sql``, lines such as::

    WARNING: Using incubator modules: jdk.incubator.vector
    WARNING: package sun.security.action not in java.base

They say nothing about the user's data. :func:`launching` starts the driver JVM with its standard
error on a pipe, and a thread passes every line on to where it would have gone (file descriptor
2 at the launch) except those notices (:data:`_NOTICE`), so Spark's own errors and anything else
the JVM prints still show, in order.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pyspark.core.context

__all__ = ["is_notice", "launching"]

#: The JVM's start-up notices about module options (JDK 17 to 25 word them so).
_NOTICE = re.compile(rb"^WARNING: (Using incubator modules: |package \S+ not in \S+$)")


def is_notice(line: bytes) -> bool:
    """Whether a line of the JVM's standard error is one of its module-option notices."""
    return _NOTICE.match(line.rstrip(b"\r\n")) is not None


def _pass_on(read: int, target: int) -> None:
    """Copy the JVM's lines from ``read`` to ``target``, notices left out; read to the end
    whatever happens to the copy, so the JVM never blocks on a full pipe."""
    with open(read, "rb") as pipe:
        try:
            for line in pipe:
                if not is_notice(line):
                    with contextlib.suppress(OSError):
                        os.write(target, line)
        finally:
            os.close(target)


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """While inside, a driver JVM that pyspark launches has its standard error filtered."""
    original = pyspark.core.context.launch_gateway

    def launch(conf: Any = None, popen_kwargs: dict[str, Any] | None = None) -> Any:
        # where the JVM's standard error would have gone: file descriptor 2 as it is now
        # (``kwire sql`` points it at a log file while the JVM starts)
        target = os.dup(2)
        read, write = os.pipe()
        copier = threading.Thread(target=_pass_on, args=(read, target), name="kwire-jvm-stderr", daemon=True)
        copier.start()  # before the launch: a JVM that fails to start still has its say
        try:
            return original(conf, {**(popen_kwargs or {}), "stderr": write})
        except BaseException:
            copier.join(2.0)  # the JVM has exited: its last lines, before the caller's error
            raise
        finally:
            os.close(write)  # the JVM holds its own copy

    pyspark.core.context.launch_gateway = launch
    try:
        yield
    finally:
        pyspark.core.context.launch_gateway = original
