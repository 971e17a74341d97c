"""``kwire decode`` does not pay for importing pandas (``kwire.arrowstart``), and pandas still works
afterwards in a process that wants it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CAPTURE = Path(__file__).resolve().parents[1] / "captures" / "tansu-kafka-python.pcap"


def _python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_decode_writes_its_dataset_without_importing_pandas(tmp_path: Path) -> None:
    out = tmp_path / "out.kwire"
    code = f"""
import sys
from kwire.cli import entry
sys.argv = ["kwire", "decode", {str(CAPTURE)!r}, "-o", {str(out)!r}, "--quiet", "-j", "1"]
try:
    entry()
except SystemExit as exc:
    assert not exc.code, exc.code
print("pandas" in sys.modules)
"""
    assert _python(code) == "False"
    import pyarrow.dataset as ds

    assert ds.dataset(out / "exchanges", format="parquet", partitioning="hive").count_rows() > 0


def test_pandas_conversions_still_work_after_the_probe_was_skipped() -> None:
    code = """
import sys
import pyarrow as pa
from kwire.arrowstart import skip_pandas_probe
skip_pandas_probe()
assert "pandas" not in sys.modules
assert pa.array([1, None]).null_count == 1
import pandas as pd
table = pa.Table.from_pandas(pd.DataFrame({"a": [1.0, float("nan")]}))
print(table.column("a").null_count, table.to_pandas().shape)
"""
    assert _python(code) == "1 (2, 1)"
