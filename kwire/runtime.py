"""Process-wide settings for kwire's long-running commands (decode, proxy, Spark decode tasks)."""

from __future__ import annotations

import gc

__all__ = ["tune_gc"]


def tune_gc() -> None:
    """Make CPython's cyclic GC run rarely.

    Decoding allocates a few small dicts and lists per frame that die young; with the default
    gen-0 threshold (700) the collector runs every few hundred frames and re-scans everything
    still alive, which measured 40% of decode time (bench/decode_frames.py). Nothing the
    decoder builds forms reference cycles, so collecting rarely loses nothing.
    """
    gc.freeze()  # objects alive now (modules, compiled layouts) are never scanned again
    gc.set_threshold(100_000, 50, 100)
