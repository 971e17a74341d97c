"""Generate ``spark_jobs/broker_versions.json`` from Kafka's broker_api_versions.json facts.

    python -m spark_jobs.gen_broker_versions ../shared/kafka-protocol/broker_api_versions.json

The committed output lets kwire audit traffic without the shared facts folder; a test checks
that the committed file equals what this script produces.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a plain script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.kafka_versions import COMPACT_TABLE, compact_from_source, dump_compact


def generate(source: Path) -> str:
    return dump_compact(compact_from_source(json.loads(source.read_text())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="path to broker_api_versions.json")
    parser.add_argument("-o", "--output", type=Path, default=COMPACT_TABLE, help="default: %(default)s")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        print(f"gen_broker_versions: no such file: {args.source}", file=sys.stderr)
        return 2
    args.output.write_text(generate(args.source))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
