"""Process-wide settings for kwire's long-running commands (decode, proxy, Spark decode tasks),
and where kwire keeps what it makes once and reuses."""

from __future__ import annotations

import gc
from pathlib import Path

__all__ = ["cache_dir", "tune_gc"]

_REPO = Path(__file__).resolve().parents[1]


def cache_dir(name: str) -> Path:
    """A folder for files kwire makes once and reuses: the clone's ``.cache/<name>``, or
    ``~/.cache/kwire/<name>`` for an installed kwire (not created here)."""
    if (_REPO / "pyproject.toml").is_file():
        return _REPO / ".cache" / name
    return Path.home() / ".cache" / "kwire" / name


def tune_gc() -> None:
    """Make CPython's cyclic GC run rarely.

    Decoding allocates a few small dicts and lists per frame that die young; with the default
    gen-0 threshold (700) the collector runs every few hundred frames and re-scans everything
    still alive, which measured 40% of decode time (bench/decode_frames.py). Nothing the
    decoder builds forms reference cycles, so collecting rarely loses nothing.
    """
    gc.freeze()  # objects alive now (modules, compiled layouts) are never scanned again
    gc.set_threshold(100_000, 50, 100)
