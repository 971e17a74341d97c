"""``kwire proxy --config FILE``: the proxy's settings and fault rules in one YAML file.

The file mirrors the command line (``README.md`` shows a full example; ``kwire-proxy.example.yaml``
is one to copy)::

    listen: 127.0.0.1:9092
    bootstrap: [kafka-1:9092, kafka-2:9092]
    recording: {out: /var/lib/kwire/proxy.kwire, flush_seconds: 10s}
    admin: {listen: 127.0.0.1:9644, token_file: /etc/kwire/admin.token}
    rules:
      - api=Produce,topic=orders,error=KAFKA_STORAGE_ERROR,rate=0.1
      - {api: Fetch, latency: 250ms, for: 2m}

``load_config`` reads it into ``FileConfig.values``, keyed by the name of the ``kwire proxy``
option each setting stands for (``recording.flush_seconds`` -> ``flush_seconds``), so the
command line can override any of them. Every key is checked: an unknown key or a bad value is
a ``ConfigError`` whose message is one line, ``FILE:LINE: what``, from the YAML node's position
(PyYAML's ``compose`` keeps each node's line). Relative paths are taken from the file's folder.

A rules file (``--rules``), and the body of ``PUT /rules``, is the ``rules`` list alone, or a
mapping with just a ``rules`` key (``read_rules_file``, ``parse_rules_text``); JSON is YAML, so the
JSON rules files of earlier versions still load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from proxy.inject import Rule, RuleError, parse_duration, parse_rule

__all__ = [
    "IO_MODES",
    "REMOVED_IO",
    "ConfigError",
    "FileConfig",
    "load_config",
    "parse_rules_text",
    "read_rules_file",
]

#: ``--io`` (``io:``) values: both mean the event loop, the only I/O model; ``auto`` is kept
#: so that existing configs and scripts keep working.
IO_MODES = ("auto", "asyncio")
#: ``--io`` values that were removed -> the one-line error that says why.
REMOVED_IO = {
    "threads": "--io threads was removed: a thread per connection stalled other clients for "
    "seconds when many connections closed at once; use auto or asyncio (the event loop)"
}
_LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A config or rules file that cannot be used; ``str()`` is ``FILE:LINE: what``."""


@dataclass
class FileConfig:
    """What a config file sets: option name -> value, and where each was written."""

    path: Path
    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # option name -> "FILE:LINE key.path"
    rules: list[Rule] | None = None  # None: the file has no ``rules`` key


class _Bad(Exception):
    """A value that does not fit its key (the caller adds the file and line)."""


# ---- value checkers: YAML value -> option value, or _Bad --------------------------------------


def _string(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or str(value).strip() == "":
        raise _Bad(f"expected text, not {_shown(value)}")
    return str(value).strip()


def _address(value: Any) -> str:
    """``HOST:PORT``, or a bare port (kept as the command line takes it)."""
    text = _string(value)
    _host, sep, port = text.rpartition(":")
    if (
        (sep and not port.isdigit())
        or (sep and int(port) > 65535)
        or (not sep and text.isdigit() and int(text) > 65535)
    ):
        raise _Bad(f"{text!r}: expected HOST:PORT with a port from 0 to 65535")
    return text


def _addresses(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise _Bad("expected at least one HOST:PORT")
    return [_address(item) for item in items]


def _host_port(value: Any) -> tuple[str, int]:
    """``HOST:PORT`` or a bare port (on 127.0.0.1)."""
    text = _address(value)
    host, sep, port = text.rpartition(":")
    if not sep:
        if not text.isdigit():
            raise _Bad(f"{text!r}: expected HOST:PORT or a port")
        return "127.0.0.1", int(text)
    return host.strip("[]") or "127.0.0.1", int(port)


def _whole(low: int | None = None, high: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(f"expected a whole number, not {_shown(value)}")
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise _Bad(f"expected a whole number {span}, not {value}")
        return value

    return check


def _seconds(positive: bool = False) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        try:
            seconds = parse_duration(value)
        except RuleError:
            raise _Bad(f"expected a duration (250ms, 10s, 2m or seconds), not {_shown(value)}") from None
        if positive and seconds <= 0:
            raise _Bad(f"expected a duration more than 0, not {_shown(value)}")
        return seconds

    return check


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"expected true or false, not {_shown(value)}")
    return value


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = str(value).strip().lower() if isinstance(value, str) else None
        if text not in allowed:
            raise _Bad(f"expected one of {', '.join(allowed)}, not {_shown(value)}")
        return text

    return check


def _io(value: Any) -> str:
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in REMOVED_IO:
        raise _Bad(REMOVED_IO[text])
    return _choice(*IO_MODES)(value)


def _path(value: Any) -> Path:
    return Path(_string(value)).expanduser()


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)


# ---- the schema: file key -> (option name, checker), or a nested section ----------------------

_Leaf = tuple[str | tuple[str, str], Callable[[Any], Any]]
_SCHEMA: dict[str, Any] = {
    "listen": ("listen", _address),
    "bootstrap": ("bootstrap", _addresses),
    "advertise": ("advertise", _string),
    "broker_port_base": ("broker_port_base", _whole(0, 65535)),
    "io": ("io", _io),
    "header_timeout": ("header_timeout_s", _seconds()),
    "max_memory_mb": ("max_memory_mb", _whole(0)),
    "seed": ("seed", _whole()),
    "log_level": ("log_level", _choice(*_LOG_LEVELS)),
    "tls": {"cert": ("tls_cert", _path), "key": ("tls_key", _path)},
    "upstream": {
        "tls": ("upstream_tls", _flag),
        "ca": ("upstream_ca", _path),
        "insecure": ("upstream_insecure", _flag),
    },
    "recording": {
        "out": ("out", _path),
        "flush_seconds": ("flush_seconds", _seconds(positive=True)),
        "flush_rows": ("flush_rows", _whole(1)),
        "max_queue_mb": ("max_queue_mb", _whole(1)),
        "max_pending_rows": ("max_pending_rows", _whole(1)),
    },
    "admin": {
        "listen": (("metrics_host", "metrics_port"), _host_port),
        "token_file": ("metrics_token_file", _path),
        "open": ("admin_open", _flag),
        "client_ids": ("metrics_client_ids", _whole(0)),
        "tls": {
            "cert": ("admin_tls_cert", _path),
            "key": ("admin_tls_key", _path),
            "client_ca": ("admin_client_ca", _path),
        },
    },
}
_PATHS = {"tls_cert", "tls_key", "upstream_ca", "out", "metrics_token_file"} | {
    "admin_tls_cert",
    "admin_tls_key",
    "admin_client_ca",
}


# ---- reading YAML with line numbers ---------------------------------------------------------------


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _compose(text: str, source: str) -> yaml.Node | None:
    """The YAML document's node tree; ConfigError (with the line) if it is not YAML."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from None


def _value(node: yaml.Node, source: str) -> Any:
    """The plain Python value of a node (scalars, lists, mappings)."""
    try:
        return yaml.SafeLoader("").construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}:{_line(node)}: {str(exc).splitlines()[0]}") from None


def _pairs(node: yaml.MappingNode, source: str, where: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    """(key, key node, value node) of a mapping; a repeated or non-text key is a ConfigError."""
    seen: set[str] = set()
    out = []
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(f"{source}:{_line(key_node)}: {where}keys are words, not {key_node.id}s")
        key = key_node.value
        if key in seen:
            raise ConfigError(f"{source}:{_line(key_node)}: {where}{key} is given twice")
        seen.add(key)
        out.append((key, key_node, value_node))
    return out


def _walk(node: yaml.Node, schema: dict[str, Any], config: FileConfig, source: str, prefix: str) -> None:
    if not isinstance(node, yaml.MappingNode):
        what = f"{prefix.rstrip('.')} must be" if prefix else "the file must be"
        raise ConfigError(f"{source}:{_line(node)}: {what} a mapping of settings")
    for key, key_node, value_node in _pairs(node, source, prefix):
        name = f"{prefix}{key}"
        if key == "rules" and not prefix:
            continue  # read by load_config
        spec = schema.get(key)
        if spec is None:
            known = ", ".join(sorted([*schema, "rules"] if not prefix else schema))
            raise ConfigError(f"{source}:{_line(key_node)}: unknown key {name!r} (known here: {known})")
        if isinstance(spec, dict):
            _walk(value_node, spec, config, source, f"{name}.")
            continue
        option, check = spec
        value = _value(value_node, source)
        try:
            checked = check(value)
        except _Bad as exc:
            raise ConfigError(f"{source}:{_line(value_node)}: {name}: {exc}") from None
        origin = f"{source}:{_line(value_node)} {name}"
        if isinstance(option, tuple):
            for one, part in zip(option, checked, strict=True):
                config.values[one], config.origins[one] = part, origin
        else:
            if option in _PATHS and not checked.is_absolute():
                checked = config.path.parent / checked
            config.values[option], config.origins[option] = checked, origin


def _rules(node: yaml.Node, source: str) -> list[Rule]:
    """Rules from a sequence node: each a rule string or a mapping of rule keys."""
    if not isinstance(node, yaml.SequenceNode):
        raise ConfigError(f"{source}:{_line(node)}: rules must be a list (of rule strings or mappings)")
    rules = []
    for item in node.value:
        value = _value(item, source)
        if isinstance(item, yaml.ScalarNode) and not isinstance(value, str):
            raise ConfigError(f"{source}:{_line(item)}: a rule is text or a mapping, not {_shown(value)}")
        try:
            rules.append(parse_rule(value, origin=f"{source}:{_line(item)}"))
        except RuleError as exc:
            line = _line(item)
            if isinstance(item, yaml.MappingNode) and exc.key is not None:
                for key, _key_node, value_node in _pairs(item, source, "rule "):
                    if key.lower() == exc.key:
                        line = _line(value_node)
            raise ConfigError(f"{source}:{line}: {exc}") from None
    return rules


def load_config(path: str | Path) -> FileConfig:
    """Read and check a ``kwire proxy`` config file. ConfigError (one line) for any mistake;
    OSError if it cannot be read."""
    path = Path(path)
    source = str(path)
    text = _read(path)
    config = FileConfig(path=path)
    root = _compose(text, source)
    if root is None:
        return config  # an empty file sets nothing
    _walk(root, _SCHEMA, config, source, "")
    for key, _key_node, value_node in _pairs(root, source, ""):  # type: ignore[arg-type]
        if key == "rules":
            config.rules = _rules(value_node, source)
    return config


def parse_rules_text(text: str, source: str) -> list[Rule]:
    """Rules from YAML/JSON text: a list, or a mapping with just ``rules``; ConfigError naming
    ``source`` and the line for any mistake."""
    root = _compose(text, source)
    if root is None:
        raise ConfigError(f"{source}:1: no rules given (send [] to remove every rule)")
    if isinstance(root, yaml.MappingNode):
        pairs = _pairs(root, source, "")
        for key, key_node, _value_node in pairs:
            if key != "rules":
                raise ConfigError(
                    f"{source}:{_line(key_node)}: unknown key {key!r} (a rules file holds rules only)"
                )
        if not pairs:
            raise ConfigError(f"{source}:{_line(root)}: no rules key")
        root = pairs[0][2]
    return _rules(root, source)


def read_rules_file(path: Path) -> list[Rule]:
    """Rules from a ``--rules`` file (``parse_rules_text``)."""
    return parse_rules_text(_read(path), str(path))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
