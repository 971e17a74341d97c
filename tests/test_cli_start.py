"""What a ``kwire`` process loads at start: a run of one command imports only that command's
module, the whole command line is still there for ``kwire --help``, and no BLAS thread pool
spins beside the decoder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OTHERS = ("kwire.analytics_commands", "kwire.capture_command", "kwire.proxy_command", "spark_jobs")


def _python(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_decode_run_loads_no_other_command() -> None:
    out = _python(
        "import sys\n"
        "from kwire.cli import run\n"
        "code = run(['decode', '--help'])\n"
        f"print(code, sorted(m for m in sys.modules if m.startswith({OTHERS!r})))\n"
    )
    code, loaded = out.splitlines()[-1].split(None, 1)  # after the help text
    assert "Usage: kwire decode" in out
    assert (code, loaded) == ("0", "[]"), out


def test_the_whole_command_line_is_still_there() -> None:
    out = _python("from kwire.cli import run\nrun(['--help'])\n")
    commands = [line.split()[0] for line in out.split("Commands:", 1)[1].splitlines() if line.strip()]
    assert commands == ["decode", "capture", "proxy", "analyze", "audit", "sql"]
    # the app tests drive is the whole one too
    out = _python(
        "from kwire.cli import app\nprint(sorted(c.callback.__name__ for c in app.registered_commands))\n"
    )
    assert out.strip() == str(sorted(["decode", "capture", "proxy", "analyze", "audit", "sql"]))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no pool on one core")
def test_no_blas_threads_beside_the_decoder() -> None:
    """pyarrow imports numpy, and numpy's OpenBLAS would start a thread per core."""
    out = _python(
        "import os\n"
        "import kwire.cli, kwire.decode_command\n"
        "threads = lambda: len(os.listdir('/proc/self/task'))\n"
        "before = threads()\n"
        "import numpy\n"
        "print(before, threads())\n"
    )
    before, after = map(int, out.split())
    assert after == before  # (pyarrow's own allocator thread is among ``before``)


def test_a_run_loads_no_pydantic(tmp_path: Path) -> None:
    """typer 0.29 imports pydantic to coerce options, 65-70 ms of every command's start; the
    dependency stops below it (pyproject.toml)."""
    out = _python(
        "import sys\n"
        "from kwire.cli import run\n"
        f"code = run(['decode', 'captures/tansu-kcat.pcap', '-o', {str(tmp_path / 'd.kwire')!r}, '-q'])\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))\n"
    )
    assert out.splitlines()[-1] == "0 []", out


def test_a_decode_process_imports_pyarrow_without_numpy_and_writes_the_same(tmp_path: Path) -> None:
    """``kwire decode`` (``kwire.cli.entry``) imports pyarrow with numpy hidden (``kwire.arrowstart``:
    numpy's import was 40% of pyarrow's); its dataset is the one a process with numpy writes."""
    import pyarrow.parquet as pq

    from kwire.decode_command import decode_captures, decode_writer

    lean = tmp_path / "lean.kwire"
    out = _python(
        "import sys\n"
        f"sys.argv = ['kwire', 'decode', 'captures/tansu-mixed.pcap', '-o', {str(lean)!r}, '-q']\n"
        "from kwire.cli import entry\n"
        "try:\n"
        "    entry()\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'))\n"
    )
    assert out.splitlines()[-1] == "0 []", out
    staging = tmp_path / "full.kwire"
    writer = decode_writer(staging)
    with writer:
        decode_captures(
            [REPO / "captures/tansu-mixed.pcap"], writer.exchanges.append, writer.connections.append
        )
    for table in ("exchanges", "connections"):
        (lean_file,) = (lean / table).rglob("*.parquet")
        (full_file,) = (staging / table).rglob("*.parquet")
        lean_rows, full_rows = pq.read_table(lean_file), pq.read_table(full_file)
        assert lean_rows.num_rows > 10 and lean_rows.equals(full_rows), table


def test_a_pyarrow_that_needs_numpy_is_imported_with_it(tmp_path: Path) -> None:
    """An older pyarrow fails to import without numpy: ``import_pyarrow_without_numpy`` then
    imports it with numpy (here a stand-in package that imports numpy first thing)."""
    fake = tmp_path / "pyarrow"
    fake.mkdir()
    (fake / "__init__.py").write_text("import numpy\nNEEDS = numpy.__name__\n")
    (fake / "parquet.py").write_text("PARQUET = True\n")
    out = _python(
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from kwire.arrowstart import import_pyarrow_without_numpy\n"
        "import_pyarrow_without_numpy()\n"
        "import pyarrow, pyarrow.parquet\n"
        "hidden = any(type(f).__name__ == '_Hidden' for f in sys.meta_path)\n"
        "print(pyarrow.NEEDS, pyarrow.parquet.PARQUET, 'numpy' in sys.modules, hidden)\n"
    )
    assert out.split() == ["numpy", "True", "True", "False"], out  # and nothing is left hidden
