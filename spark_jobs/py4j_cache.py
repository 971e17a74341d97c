"""Remembered class and method look-ups on py4j's gateway.

Every ``F.col``, ``F.lit``, ``F.when``, ... that PySpark builds looks up the JVM class
``org.apache.spark.sql.functions`` (by its full or its simple name) and then the method, each a
round trip to the driver JVM, before the call itself: two of every three calls a job makes
while it builds its DataFrames. py4j does not remember either answer. :func:`install` makes
it remember the ones that cannot change while the gateway lives (a class found by name, a
static method of a class); fields and instance members are looked up every time as before.

Each remembered answer keeps the gateway client it came from and is given only to that same
client (a gateway started later in the process, whose client may reuse a freed ``id``, looks up
afresh). A simple name is remembered as first resolved: a ``java_import`` made later that would
shadow it with another class of the same simple name is not seen (PySpark imports at start).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from py4j import java_gateway as jg
from py4j import protocol as proto

__all__ = ["install"]

_LOCK = threading.Lock()
_INSTALLED = False


def _remembering(lookup: Callable[[Any, str], Any], scope: str, keep: Callable[[Any, Any], bool]) -> Any:
    """A ``__getattr__`` that answers from memory what ``lookup`` found and ``keep`` accepts, per
    gateway client and ``scope`` (the view's id, the class's name)."""
    # key -> (the gateway client, the answer): the client is held so that its id is not reused
    kept: dict[tuple[int, str, str], tuple[object, object]] = {}

    def getattr_(self: Any, name: str) -> Any:
        if name.startswith("_"):  # py4j's own attributes, while the object is being made
            return lookup(self, name)
        client = self._gateway_client
        key = (id(client), getattr(self, scope), name)
        known = kept.get(key)
        if known is not None and known[0] is client:
            return known[1]
        hit = lookup(self, name)
        if keep(self, hit):
            kept[key] = (client, hit)
        return hit

    return getattr_


def _a_class(_view: Any, hit: Any) -> bool:
    return isinstance(hit, jg.JavaClass)  # a package may gain classes: not kept


def _a_static_method(cls: Any, hit: Any) -> bool:
    return isinstance(hit, jg.JavaMember) and hit.target_id == proto.STATIC_PREFIX + cls._fqn


def install() -> None:
    """Remember static look-ups from now on, in this process (idempotent)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        jg.JVMView.__getattr__ = _remembering(jg.JVMView.__getattr__, "_id", _a_class)
        jg.JavaClass.__getattr__ = _remembering(jg.JavaClass.__getattr__, "_fqn", _a_static_method)
        _INSTALLED = True
