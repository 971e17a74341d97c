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
