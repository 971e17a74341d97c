"""Counts that tests report at the end of the run (coverage of oracles, fuzz inputs tried).

Tests call ``record(topic, item)`` or ``add(topic, n)``; the ``pytest_terminal_summary`` hook
in conftest.py prints one line per topic, so the figures show in every CI log.
"""

from __future__ import annotations

from collections import defaultdict

_items: dict[str, set[str]] = defaultdict(set)
_counts: dict[str, int] = defaultdict(int)


def record(topic: str, item: str) -> None:
    """Count ``item`` once under ``topic``."""
    _items[topic].add(item)


def add(topic: str, n: int) -> None:
    """Add ``n`` to the counter ``topic``."""
    _counts[topic] += n


def lines() -> list[str]:
    """One line per topic, for the terminal summary."""
    out = [f"{topic}: {len(items)}" for topic, items in sorted(_items.items())]
    out += [f"{topic}: {count}" for topic, count in sorted(_counts.items())]
    return out
