"""Regenerate the incident lab's captures: ``captures/lab/<scenario>/`` for every scenario.

Usage::

    .venv/bin/python captures/make_lab_captures.py            # every scenario
    .venv/bin/python captures/make_lab_captures.py 001-broker-drops-out

Each scenario fetches what it needs (Kafka releases from Maven Central, client drivers)
into the git-ignored ``.cache/``, runs real brokers and clients on 127.0.0.0/8, and writes
``capture.pcap.gz``, ``truth.json`` and the clients' own records into its folder.
``captures/lab/manifest.json`` lists every scenario with its capture's size and digest and
the headline figures of its truth. Needs root (tcpdump on lo) and free ports 9092/9093/2181
on 127.0.0.2-127.0.0.10; a scenario refuses to start when they are busy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from lab.scenarios import SCENARIOS, scenario  # noqa: E402

LAB_DIR = HERE / "lab"
MANIFEST = LAB_DIR / "manifest.json"


def headline(truth: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader wants first: per client sent/acked/failed/lost."""
    keys = ("sent", "acked", "failed", "unresolved", "lost", "duplicated", "failed_by_error")
    return {cid: {k: c[k] for k in keys if k in c} for cid, c in truth["clients"].items() if c.get("sent")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"scenarios (default: all of {', '.join(SCENARIOS)})")
    args = parser.parse_args(argv)
    names = args.names or list(SCENARIOS)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    for name in names:
        module = scenario(name)
        out_dir = LAB_DIR / name
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"kwire-lab-{name}-") as work:
            truth = module.run(out_dir, Path(work))
        capture = out_dir / "capture.pcap.gz"
        manifest[name] = {
            "description": module.DESCRIPTION,
            "kafka_version": truth.get("kafka_version"),
            "capture": f"{name}/capture.pcap.gz",
            "bytes": capture.stat().st_size,
            "sha256": hashlib.sha256(capture.read_bytes()).hexdigest(),
            "packets": truth.get("capture_packets"),
            "clients": headline(truth),
            "made": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }
        MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {capture.stat().st_size / 1e6:.2f} MB in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
