"""Which request API versions each Apache Kafka broker release accepts.

The facts come from ``broker_api_versions.json`` (kept outside the project, in
``shared/kafka-protocol/``). :mod:`spark_jobs.gen_broker_versions` turns it into the compact
table ``spark_jobs/broker_versions.json`` committed here, so the tool works without that
folder. :func:`load_broker_versions` reads either file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPACT_TABLE",
    "DEFAULT_SOURCE",
    "BrokerVersions",
    "compact_from_source",
    "dump_compact",
    "load_broker_versions",
]

#: The generated table committed with the project.
COMPACT_TABLE = Path(__file__).with_name("broker_versions.json")
#: The facts file beside the repository (``../shared/kafka-protocol/...`` from the repo root).
DEFAULT_SOURCE = (
    Path(__file__).resolve().parents[2] / "shared" / "kafka-protocol" / "broker_api_versions.json"
)

#: Key of ApiVersions: a broker that knows it answers a too-new version with UNSUPPORTED_VERSION
#: and its own ranges, so the client retries lower (harmless, KIP-35/KIP-511).
API_VERSIONS_KEY = 18


def compact_from_source(source: dict[str, Any]) -> dict[str, Any]:
    """The compact table from the parsed ``broker_api_versions.json``.

    ``releases`` keeps the file's (chronological) order; each release maps to ``accepts``:
    sorted ``[api_key, min, max]`` triples, and ``advertises`` where the release advertises more
    than it accepts (4.x: Produce v0-2).
    """

    def triples(ranges: dict[str, list[int]]) -> list[list[int]]:
        return sorted([int(k), int(v[0]), int(v[1])] for k, v in ranges.items())

    releases: dict[str, Any] = {}
    for name, rel in source["releases"].items():
        entry: dict[str, Any] = {"accepts": triples(rel["apis"])}
        if rel.get("advertised"):
            entry["advertises"] = triples(rel["advertised"])
        releases[name] = entry
    return {
        "generated_by": "spark_jobs/gen_broker_versions.py from broker_api_versions.json",
        "api_names": {str(k): v for k, v in sorted(source["api_names"].items(), key=lambda kv: int(kv[0]))},
        "releases": releases,
    }


def dump_compact(table: dict[str, Any]) -> str:
    """Serialise the compact table: stable, one release per line (diff-friendly)."""
    lines = ["{"]
    lines.append(f'  "generated_by": {json.dumps(table["generated_by"])},')
    lines.append(f'  "api_names": {json.dumps(table["api_names"], separators=(",", ":"))},')
    lines.append('  "releases": {')
    items = list(table["releases"].items())
    for i, (name, rel) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"    {json.dumps(name)}: {json.dumps(rel, separators=(',', ':'))}{comma}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BrokerVersions:
    """The release table: ``accepts[release][api_key] = (min, max)``, plus what 4.x advertises."""

    api_names: dict[int, str]
    accepts: dict[str, dict[int, tuple[int, int]]]
    advertises: dict[str, dict[int, tuple[int, int]]]

    @property
    def releases(self) -> list[str]:
        return list(self.accepts)

    def resolve(self, version: str) -> str | None:
        """The release name for a user's version string: exact (``4.0``, ``3.9-kraft``), a
        shorter form (``0.9`` -> ``0.9.0``), or a patch release (``2.8.2`` -> ``2.8``)."""
        v = version.strip()
        if v in self.accepts:
            return v
        longer = [r for r in self.accepts if r.startswith(v + ".")]
        if len(longer) == 1:
            return longer[0]
        shorter = [r for r in self.accepts if v.startswith(r + ".")]
        return max(shorter, key=len) if shorter else None

    def rows(
        self, releases: list[str] | None = None
    ) -> list[tuple[str, int, int, int, int | None, int | None]]:
        """``(release, api_key, min, max, advertised_min, advertised_max)`` rows."""
        out = []
        for rel in releases or self.releases:
            adv = self.advertises.get(rel, {})
            for key, (lo, hi) in sorted(self.accepts[rel].items()):
                a = adv.get(key)
                out.append((rel, key, lo, hi, a[0] if a else None, a[1] if a else None))
        return out

    def accepts_request(self, release: str, api_key: int, api_version: int) -> bool:
        rng = self.accepts[release].get(api_key)
        return rng is not None and rng[0] <= api_version <= rng[1]


def _from_compact(table: dict[str, Any]) -> BrokerVersions:
    def ranges(triples: list[list[int]]) -> dict[int, tuple[int, int]]:
        return {k: (lo, hi) for k, lo, hi in triples}

    return BrokerVersions(
        api_names={int(k): v for k, v in table["api_names"].items()},
        accepts={r: ranges(v["accepts"]) for r, v in table["releases"].items()},
        advertises={r: ranges(v["advertises"]) for r, v in table["releases"].items() if "advertises" in v},
    )


def load_broker_versions(path: str | Path | None = None) -> BrokerVersions:
    """Load the release table from ``path`` (the shared facts file or a compact table); without a
    path, the shared file beside the repository if present, else the committed compact table."""
    if path is None:
        path = DEFAULT_SOURCE if DEFAULT_SOURCE.is_file() else COMPACT_TABLE
    data = json.loads(Path(path).read_text())
    if "releases" in data and data["releases"] and "apis" in next(iter(data["releases"].values())):
        data = compact_from_source(data)
    return _from_compact(data)
