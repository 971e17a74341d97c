"""Check that two analyses of one dataset wrote the same results, row for row.

    python bench/compare_reports.py REPORT_A REPORT_B

For a change meant to make the analysis faster and nothing else: run ``kwire analyze DATASET -o
REPORT_A`` with the old code and ``-o REPORT_B`` with the new, then compare. Every result folder
(findings included) must exist in both, with the same schema and the same rows in the same order
(results are written sorted). Prints the first difference of each result that differs; exits 0
when all are the same, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq


def read_results(report: Path) -> dict[str, tuple[str, list[dict]]]:
    """Per result folder under ``report``: its schema (as text) and its rows in file order."""
    out = {}
    for folder in sorted(p for p in report.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.parquet"))
        if files:
            table = pq.ParquetDataset(folder).read()
            out[folder.name] = (str(table.schema), table.to_pylist())
    return out


def differences(a: dict[str, tuple[str, list[dict]]], b: dict[str, tuple[str, list[dict]]]) -> list[str]:
    found = [f"{name}: only in the first" for name in sorted(set(a) - set(b))]
    found += [f"{name}: only in the second" for name in sorted(set(b) - set(a))]
    for name in sorted(set(a) & set(b)):
        (schema_a, rows_a), (schema_b, rows_b) = a[name], b[name]
        if schema_a != schema_b:
            found.append(f"{name}: schemas differ")
        elif len(rows_a) != len(rows_b):
            found.append(f"{name}: {len(rows_a)} rows against {len(rows_b)}")
        else:
            at = next((i for i, (x, y) in enumerate(zip(rows_a, rows_b, strict=True)) if x != y), None)
            if at is not None:
                found.append(f"{name}: row {at} differs:\n  {rows_a[at]}\n  {rows_b[at]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    a, b = read_results(args.first), read_results(args.second)
    found = differences(a, b)
    for line in found:
        print(line)
    rows = sum(len(r) for _, r in a.values())
    print(f"{len(a)} results, {rows} rows: " + ("the same" if not found else f"{len(found)} differ"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
