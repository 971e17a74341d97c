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

from py4j import java_gateway as jg
from py4j import protocol as proto

__all__ = ["install"]

_LOCK = threading.Lock()
_INSTALLED = False


def install() -> None:
    """Remember static look-ups from now on, in this process (idempotent)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        view_lookup, class_lookup = jg.JVMView.__getattr__, jg.JavaClass.__getattr__
        # key -> (the gateway client, the answer): the client held so its id is not reused
        classes: dict[tuple[int, str, str], tuple[object, object]] = {}
        members: dict[tuple[int, str, str], tuple[object, object]] = {}

        def view_getattr(self, name):
            if name.startswith("_"):  # py4j's own attributes, while the object is being made
                return view_lookup(self, name)
            client = self._gateway_client
            key = (id(client), self._id, name)
            kept = classes.get(key)
            if kept is not None and kept[0] is client:
                return kept[1]
            hit = view_lookup(self, name)
            if isinstance(hit, jg.JavaClass):  # a package may gain classes: not kept
                classes[key] = (client, hit)
            return hit

        def class_getattr(self, name):
            if name.startswith("_"):
                return class_lookup(self, name)
            client = self._gateway_client
            key = (id(client), self._fqn, name)
            kept = members.get(key)
            if kept is not None and kept[0] is client:
                return kept[1]
            hit = class_lookup(self, name)
            if isinstance(hit, jg.JavaMember) and hit.target_id == proto.STATIC_PREFIX + self._fqn:
                members[key] = (client, hit)
            return hit

        jg.JVMView.__getattr__ = view_getattr
        jg.JavaClass.__getattr__ = class_getattr
        _INSTALLED = True
