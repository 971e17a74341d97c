"""Fault rules: which requests to answer with an error, delay, or cut off.

A rule is written ``key=value`` pairs joined by commas::

    api=Produce,topic=t,partition=0,error=KAFKA_STORAGE_ERROR,rate=1,after=5s,for=30s
    api=Fetch,latency=250ms,rate=0.5
    api=JoinGroup,client_id=my-app,close

Match keys (all optional, all must hold): ``api`` (name or key), ``topic``, ``partition``,
``client_id``. Action (exactly one): ``error=NAME|CODE``, ``latency=DURATION``, ``close``.
Timing: ``rate`` (0-1, default 1), ``after`` (start delay from when the rule was loaded: the
proxy's start, or the reload that brought it, default 0), ``for`` (how long it stays active,
default forever). A reload keeps the clock (and the count) of every rule whose text is
unchanged, so re-sending the same rules does not restart their windows. Durations: ``250ms``,
``5s``, ``2m`` or plain seconds. A rules file is YAML or JSON (JSON is YAML): a list of such
strings or of objects with the same keys (``{"api": "Produce", "error": 56}``), or a mapping
whose ``rules`` key holds that list (``proxy.config_file`` reads it, with line numbers).

``RuleSet.replace`` swaps the active rules in one assignment: a connection deciding on a
request sees either the old rules or the new ones, never a mix.

An ``error`` rule answers the request itself, with a response of the request's version that
the proxy builds with ``decoder.message_codec``; the request is not forwarded, so nothing is
written behind the client's back. When a request names several partitions and only some
match, every partition of that request gets the error (the request is not split): a client
then retries all of them, which is what a broker failing the whole request looks like.
"""

from __future__ import annotations

import random
import re
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decoder import message_codec, protocol

__all__ = [
    "Rule",
    "RuleError",
    "RuleSet",
    "build_error_response",
    "load_rules",
    "parse_duration",
    "parse_rule",
    "request_targets",
]

_NAME_TO_KEY = {name.lower(): key for key, name in protocol.API_NAMES.items()}
_ERROR_BY_NAME = {name: code for code, (name, _r, _m) in protocol.ERRORS.items()}
_I32 = struct.Struct(">i")


class RuleError(ValueError):
    """A rule that cannot be understood; ``key`` names the rule key at fault, when one is."""

    key: str | None = None


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``250ms``, ``5s``, ``2m``, ``1h`` or a plain number of seconds."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise RuleError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise RuleError(f"not a duration: {text!r}")
        return float(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise RuleError(f"not a duration: {text!r}")
    value = float(match.group(1))
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def _api_key(value: str | int) -> int:
    if isinstance(value, int) or str(value).lstrip("-").isdigit():
        return int(value)
    key = _NAME_TO_KEY.get(str(value).lower())
    if key is None:
        raise RuleError(f"unknown api {value!r}")
    return key


def _error_code(value: str | int) -> int:
    if isinstance(value, int) or str(value).lstrip("-").isdigit():
        return int(value)
    code = _ERROR_BY_NAME.get(str(value).upper())
    if code is None:
        raise RuleError(f"unknown error name {value!r}")
    return code


@dataclass
class Rule:
    """One fault rule (see the module doc for its syntax)."""

    text: str
    api_key: int | None = None
    topic: str | None = None
    partition: int | None = None
    client_id: str | None = None
    action: str = "error"  # error, latency, close
    error_code: int = 0
    latency_s: float = 0.0
    rate: float = 1.0
    after_s: float = 0.0
    for_s: float | None = None
    applied: int = 0
    #: Where the rule was written (``FILE:LINE``, ``--inject``), for logs and ``GET /rules``.
    origin: str | None = None
    #: ``time.monotonic()`` when the rule was loaded; ``after``/``for`` count from here.
    since: float = field(default_factory=time.monotonic)

    @property
    def needs_body(self) -> bool:
        """True if matching needs the request body (topic or partition criteria), or the
        action builds a response from it."""
        return self.topic is not None or self.partition is not None or self.action == "error"

    def active(self, elapsed_s: float) -> bool:
        if elapsed_s < self.after_s:
            return False
        return self.for_s is None or elapsed_s < self.after_s + self.for_s

    def label(self) -> str:
        return self.text

    def describe(self) -> dict[str, Any]:
        """The rule as JSON-ready values (``GET /rules``)."""
        elapsed = time.monotonic() - self.since
        out: dict[str, Any] = {"rule": self.text, "action": self.action}
        if self.api_key is not None:
            out["api"] = protocol.api_name(self.api_key) or self.api_key
        for name in ("topic", "partition", "client_id"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.action == "error":
            out["error"] = protocol.error_name(self.error_code) or self.error_code
        elif self.action == "latency":
            out["latency_s"] = self.latency_s
        out.update(rate=self.rate, after_s=self.after_s, for_s=self.for_s)
        out.update(active=self.active(elapsed), applied=self.applied, origin=self.origin)
        return out


def parse_rule(spec: str | dict[str, Any], origin: str | None = None) -> Rule:
    """A rule from its text (``api=Produce,error=56``) or from a JSON object; ``origin`` says
    where it was written (``FILE:LINE``)."""
    if isinstance(spec, str):
        text = spec
        items: dict[str, Any] = {}
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            items[key.strip().lower()] = value.strip() if sep else True
    elif isinstance(spec, dict):
        items = {str(k).lower(): v for k, v in spec.items()}
        text = ",".join(f"{k}={v}" if v is not True else k for k, v in items.items())
    else:
        raise RuleError(f"a rule is a string or an object, not {type(spec).__name__}")
    rule = Rule(text=text, origin=origin)
    actions: list[str] = []
    for key, value in items.items():
        try:
            _apply(rule, actions, key, value, text)
        except RuleError as exc:
            exc.key = key
            raise
    if len(actions) != 1:
        raise RuleError(f"a rule needs exactly one action (error=, latency=, close): {text!r}")
    rule.action = actions[0]
    return rule


def _apply(rule: Rule, actions: list[str], key: str, value: Any, text: str) -> None:
    """Set one ``key=value`` of a rule (``actions`` collects the action keys seen)."""
    if key == "api":
        rule.api_key = _api_key(value)
    elif key == "topic":
        rule.topic = str(value)
    elif key == "partition":
        rule.partition = _integer(key, value)
    elif key in ("client_id", "client"):
        rule.client_id = str(value)
    elif key == "error":
        rule.error_code = _error_code(value)
        actions.append("error")
    elif key == "latency":
        rule.latency_s = parse_duration(value)
        actions.append("latency")
    elif key == "close":
        if value is True or str(value).lower() in ("1", "true", "yes"):
            actions.append("close")
    elif key == "rate":
        rule.rate = _number(key, value)
        if not 0 <= rule.rate <= 1:
            raise RuleError(f"rate must be within 0-1: {value}")
    elif key == "after":
        rule.after_s = parse_duration(value)
    elif key == "for":
        rule.for_s = parse_duration(value)
    else:
        raise RuleError(f"unknown rule key {key!r} in {text!r}")


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not (isinstance(value, int) or str(value).lstrip("-").isdigit()):
        raise RuleError(f"{key} must be a whole number, not {value!r}")
    return int(value)


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise RuleError(f"{key} must be a number, not {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RuleError(f"{key} must be a number, not {value!r}") from None


def load_rules(path: str | Path) -> list[Rule]:
    """Rules from a YAML or JSON file: a list of rule strings or objects (or ``rules:`` holding
    one). A mistake raises ``RuleError`` as ``FILE:LINE: what`` (``proxy.config_file``)."""
    from proxy.config_file import read_rules_file

    return read_rules_file(Path(path))


def request_targets(fields: Any, topic_names: dict[str, str]) -> tuple[set[str], set[tuple[str, int]]]:
    """(topics, (topic, partition) pairs) a request names, from its compiled-decoder fields.

    Topic ids are turned into names with ``topic_names`` (learned from Metadata responses).
    """
    topics: set[str] = set()
    pairs: set[tuple[str, int]] = set()

    def walk(node: Any, topic: str | None) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, topic)
            return
        if not isinstance(node, dict):
            return
        own = node.get("topic")
        if isinstance(own, str):
            topic = own
        elif isinstance(node.get("topic_id"), str):
            topic = topic_names.get(node["topic_id"], node["topic_id"])
        elif isinstance(own, list):
            topics.update(t for t in own if isinstance(t, str))
        if topic is not None:
            topics.add(topic)
            partition = node.get("partition")
            if isinstance(partition, int) and not isinstance(partition, bool):
                pairs.add((topic, partition))
        for key, value in node.items():
            if isinstance(value, dict | list) and key not in ("topic", "partition"):
                walk(value, topic)

    walk(fields or {}, None)
    return topics, pairs


@dataclass
class Decision:
    rule: Rule
    action: str


class _Active:
    """One generation of rules, with what the forwarding path's pre-checks need (immutable)."""

    __slots__ = ("any_api", "api_keys", "rules")

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = tuple(rules)
        self.any_api = any(rule.api_key is None for rule in rules)
        self.api_keys = frozenset(rule.api_key for rule in rules if rule.api_key is not None)


class RuleSet:
    """The active rules, with the random source they are judged by.

    Sessions keep a reference to one ``RuleSet`` for their whole life; ``replace`` swaps the
    rules under them (one attribute assignment: each decision reads one generation).
    """

    def __init__(self, rules: list[Rule] | None = None, seed: int | None = None) -> None:
        self.seed = seed
        self._random = random.Random(seed)
        self._active = _Active(list(rules or []))

    @property
    def rules(self) -> list[Rule]:
        return list(self._active.rules)

    @property
    def any_api(self) -> bool:
        return self._active.any_api

    @property
    def api_keys(self) -> frozenset[int]:
        return self._active.api_keys

    def __bool__(self) -> bool:
        return bool(self._active.rules)

    def replace(self, rules: list[Rule]) -> list[Rule]:
        """Make ``rules`` the active rules. A rule whose text equals one active now keeps that
        one's clock and count; the others start their ``after``/``for`` now. The new list."""
        old = {rule.text: rule for rule in self._active.rules}
        now = time.monotonic()
        for rule in rules:
            kept = old.get(rule.text)
            if kept is not None:
                rule.since, rule.applied = kept.since, kept.applied
            else:
                rule.since = now
        self._active = _Active(rules)
        return list(rules)

    def may_apply(self, api_key: int) -> bool:
        """Cheap pre-check on the forwarding path: could any rule act on this api now?"""
        active = self._active
        if not active.rules or not (active.any_api or api_key in active.api_keys):
            return False
        now = time.monotonic()
        return any(rule.active(now - rule.since) and rule.api_key in (None, api_key) for rule in active.rules)

    def needs_body(self, api_key: int) -> bool:
        return any(rule.needs_body for rule in self._active.rules if rule.api_key in (None, api_key))

    def decide(
        self, api_key: int, client_id: str | None, fields: Any, topic_names: dict[str, str]
    ) -> Rule | None:
        """The first active rule that matches this request and wins its rate draw."""
        now = time.monotonic()
        targets: tuple[set[str], set[tuple[str, int]]] | None = None
        for rule in self._active.rules:
            if rule.api_key not in (None, api_key) or not rule.active(now - rule.since):
                continue
            if rule.client_id is not None and rule.client_id != client_id:
                continue
            if rule.topic is not None or rule.partition is not None:
                if targets is None:
                    targets = request_targets(fields, topic_names)
                topics, pairs = targets
                if rule.partition is not None:
                    if not any((rule.topic in (None, t)) and p == rule.partition for t, p in pairs):
                        continue
                elif rule.topic not in topics:
                    continue
            if rule.rate < 1 and self._random.random() >= rule.rate:
                continue
            rule.applied += 1
            return rule
        return None


# ---- building error responses ----------------------------------------------------------


def _roles(fields: list[Any]) -> dict[str, list[Any]]:
    return {f[4]: f for f in fields if f[4] is not None}


def _struct_arrays(fields: list[Any], role: str) -> list[list[Any]]:
    """Array-of-struct fields whose elements carry ``role`` directly."""
    return [f for f in fields if f[1] == "[]" and f[5] and role in _roles(f[5])]


def _fill(
    resp_fields: list[Any],
    resp: dict[str, Any],
    req_fields: list[Any] | None,
    req: dict[str, Any] | None,
    code: int,
    topic_names: dict[str, str],
) -> bool:
    """Set every error code in ``resp`` to ``code`` and mirror the request's topic and
    partition arrays into it. Returns True if per-topic/partition entries were made."""
    made = False
    seen: set[str] = set()
    for level in ("topic", "partition"):
        for out_field in _struct_arrays(resp_fields, level) + _struct_arrays(resp_fields, f"{level}_id"):
            if out_field[3] is not None or req_fields is None or req is None or out_field[0] in seen:
                continue
            seen.add(out_field[0])
            candidates = _struct_arrays(req_fields, level) + _struct_arrays(req_fields, f"{level}_id")
            if not candidates:
                continue
            in_field = candidates[0]
            items = req.get(in_field[0]) or []
            out_items = []
            for item in items:
                element = {f[0]: message_codec._default_value(f) for f in out_field[5] if f[3] is None}
                in_roles = _roles(in_field[5])
                for role, f in _roles(out_field[5]).items():
                    if role in ("topic", "topic_id", "partition") and f[3] is None:
                        source = in_roles.get(role)
                        if source is not None:
                            element[f[0]] = item.get(source[0])
                        elif role == "topic" and "topic_id" in in_roles:
                            tid = item.get(in_roles["topic_id"][0])
                            element[f[0]] = topic_names.get(_uuid_text(tid), "")
                    elif role == "error_code" and f[3] is None:
                        element[f[0]] = code
                _fill(out_field[5], element, in_field[5], item, code, topic_names)
                out_items.append(element)
            resp[out_field[0]] = out_items
            made = made or bool(out_items)
    return made


def _uuid_text(raw: Any) -> str:
    import base64

    return base64.urlsafe_b64encode(bytes(raw or b"")).rstrip(b"=").decode("ascii")


def build_error_response(
    api_key: int,
    api_version: int,
    correlation_id: int,
    request_frame: bytes,
    code: int,
    topic_names: dict[str, str] | None = None,
) -> bytes:
    """A well-formed response frame of the request's version with ``code`` in it.

    Topic and partition arrays of the request are mirrored into the response with ``code``
    as each entry's error; the top-level error code (where the response has one) is set
    only when there are no such entries (Fetch v7+'s top-level code means the whole fetch
    session failed). Everything else takes its "nothing here" value (``default_tree``).
    """
    topic_names = topic_names or {}
    header_version = protocol.request_header_version(api_key, api_version)
    _header, body_at = message_codec.decode_header("request", header_version, request_frame, 4)
    request = message_codec.decode_message(
        "request", api_key, api_version, request_frame, body_at, zero_copy=True
    )
    req_layout = protocol.layout("request", api_key, api_version)
    resp_layout = protocol.layout("response", api_key, api_version)
    if req_layout is None or resp_layout is None:
        raise message_codec.CodecError(f"no definition for api {api_key} v{api_version}")
    response = message_codec.default_tree("response", api_key, api_version)
    made = _fill(resp_layout[1], response, req_layout[1], request, code, topic_names)
    if not made:
        for f in resp_layout[1]:
            if f[4] == "error_code" and f[3] is None:
                response[f[0]] = code
    # FindCoordinator v4+: one coordinator per key asked for.
    if api_key == 10 and "Coordinators" in response and "CoordinatorKeys" in request:
        fields = next(f for f in resp_layout[1] if f[0] == "Coordinators")[5]
        response["Coordinators"] = [
            {
                **{f[0]: message_codec._default_value(f) for f in fields if f[3] is None},
                "Key": key,
                "ErrorCode": code,
                "Port": -1,
            }
            for key in request["CoordinatorKeys"]
        ]
    if "Port" in response:
        response["Port"] = -1
    header = {"CorrelationId": correlation_id}
    payload = message_codec.encode_header(
        "response", protocol.response_header_version(api_key, api_version), header
    ) + message_codec.encode_message("response", api_key, api_version, response)
    return _I32.pack(len(payload)) + payload
