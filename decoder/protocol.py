"""The protocol table at run time: API names, version ranges, header rules, error codes.

Everything here comes from ``kafka_protocol.json``, which ``generate_protocol`` writes from
Kafka's own message definitions. Decode functions are compiled once per (api key, version,
direction) on first use and cached; nothing walks the JSON while frames are decoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from decoder.codegen import compile_message

__all__ = [
    "API_NAMES",
    "ERRORS",
    "api_name",
    "error_name",
    "is_known",
    "request_decoder",
    "request_header_version",
    "response_decoder",
    "response_header_version",
    "version_range",
]

TABLE_PATH = Path(__file__).with_name("kafka_protocol.json")
_TABLE: dict[str, Any] = json.loads(TABLE_PATH.read_text(encoding="utf-8"))

Decoder = Callable[[Any, int, int], tuple[dict[str, Any], int]]

API_NAMES: dict[int, str] = {int(k): v["name"] for k, v in _TABLE["apis"].items()}
#: code -> (name, retriable, invalid_metadata)
ERRORS: dict[int, tuple[str, bool, bool]] = {int(k): tuple(v) for k, v in _TABLE["errors"].items()}  # type: ignore[misc]

# (api_key, version) -> (flexible, layout id), per direction
_VERSIONS: dict[str, dict[tuple[int, int], tuple[bool, int]]] = {
    direction: {
        (int(key), int(version)): (bool(flex), layout_id)
        for key, api in _TABLE["apis"].items()
        for version, (flex, layout_id) in api.get(direction, {}).items()
    }
    for direction in ("request", "response")
}
_LAYOUTS: list[Any] = _TABLE["layouts"]
_REQUEST_HEADER_V0 = {tuple(pair) for pair in _TABLE["header_rules"]["request_header_v0"]}
_RESPONSE_HEADER_V0 = set(_TABLE["header_rules"]["response_header_v0_always"])
_compiled: dict[tuple[str, int, int], Decoder | None] = {}


def api_name(api_key: int) -> str | None:
    """The API's name (e.g. ``Produce``), or None for a key kwire has no definition for."""
    return API_NAMES.get(api_key)


def error_name(code: int | None) -> str | None:
    """Kafka's name for an error code (``NONE`` for 0); ``UNKNOWN_CODE_<n>`` if not in the table."""
    if code is None:
        return None
    entry = ERRORS.get(code)
    return entry[0] if entry else f"UNKNOWN_CODE_{code}"


def is_known(api_key: int, api_version: int) -> bool:
    """True if the request (api key, version) has a definition."""
    return (api_key, api_version) in _VERSIONS["request"]


def version_range(api_key: int) -> tuple[int, int] | None:
    """(min, max) request version with a definition, or None for an unknown key."""
    versions = [v for (k, v) in _VERSIONS["request"] if k == api_key]
    return (min(versions), max(versions)) if versions else None


def is_flexible(api_key: int, api_version: int) -> bool:
    entry = _VERSIONS["request"].get((api_key, api_version))
    return bool(entry and entry[0])


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header version for (key, version) under KIP-482's rules."""
    if (api_key, api_version) in _REQUEST_HEADER_V0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header version; ApiVersions responses always use v0 (clients parse them blind)."""
    if api_key in _RESPONSE_HEADER_V0:
        return 0
    entry = _VERSIONS["response"].get((api_key, api_version))
    return 1 if entry and entry[0] else 0


def _decoder(direction: str, api_key: int, api_version: int) -> Decoder | None:
    key = (direction, api_key, api_version)
    if key in _compiled:
        return _compiled[key]
    entry = _VERSIONS[direction].get((api_key, api_version))
    if entry is None:
        return None  # not cached: hostile streams may name any (key, version)
    _compiled[key] = compile_message(_LAYOUTS[entry[1]], entry[0])
    return _compiled[key]


#: (header version, body decoder or None) per ``plan_key``, per direction: the hot path's one
#: look-up (decoder/_framecore.c reads these two dicts too, by name, so replacing them empties both).
_request_plans: dict[int, tuple[int, Decoder | None]] = {}
_response_plans: dict[int, tuple[int, Decoder | None]] = {}
_PLANS_MAX = 65536  # hostile streams may name any (key, version): past this, plans are not kept


def plan_key(api_key: int, api_version: int) -> int:
    """The key of (api key, version) in the plan caches: both as 16-bit fields of one int."""
    return (api_key & 0xFFFF) << 16 | (api_version & 0xFFFF)


def request_plan(api_key: int, api_version: int) -> tuple[int, Decoder | None]:
    """(request header version, body decoder or None) in one cached look-up, for the hot path."""
    return _plan(_request_plans, api_key, api_version, request_header_version, request_decoder)


def response_plan(api_key: int, api_version: int) -> tuple[int, Decoder | None]:
    """(response header version, body decoder or None) of a response in ``api_version``'s layout,
    cached as :func:`request_plan`."""
    return _plan(_response_plans, api_key, api_version, response_header_version, response_decoder)


def _plan(
    cache: dict[int, tuple[int, Decoder | None]],
    api_key: int,
    api_version: int,
    header_version: Callable[[int, int], int],
    body_decoder: Callable[[int, int], Decoder | None],
) -> tuple[int, Decoder | None]:
    key = plan_key(api_key, api_version)
    plan = cache.get(key)
    if plan is None:
        plan = (header_version(api_key, api_version), body_decoder(api_key, api_version))
        if len(cache) < _PLANS_MAX:
            cache[key] = plan
    return plan


def request_decoder(api_key: int, api_version: int) -> Decoder | None:
    """Compiled body decoder for a request, or None if kwire has no definition for it."""
    return _decoder("request", api_key, api_version)


def response_decoder(api_key: int, api_version: int) -> Decoder | None:
    """Compiled body decoder for a response, or None if kwire has no definition for it."""
    return _decoder("response", api_key, api_version)


def layout(direction: str, api_key: int, api_version: int) -> tuple[bool, list[Any]] | None:
    """(flexible, field layout) of a message from the protocol table, or None if undefined.

    Each field is ``[name, type, flags, tag, role, children]`` (see ``generate_protocol``).
    For code that needs every field (re-encoding, building responses), not just the roles.
    """
    entry = _VERSIONS[direction].get((api_key, api_version))
    return (entry[0], _LAYOUTS[entry[1]]) if entry else None


def header_layout(direction: str, version: int) -> list[Any]:
    """Field layout of request header v0-2 or response header v0-1."""
    return _TABLE["headers"][direction][str(version)]


def all_versions(direction: str) -> list[tuple[int, int]]:
    """Every (api key, version) with a definition in ``direction``, sorted."""
    return sorted(_VERSIONS[direction])
