"""The proxy's output directory: a claim held for the proxy's life, and stale files removed at start.

The dataset writer (``kwire.dataset``) writes each Parquet file as ``.part-<id>-<n>.parquet.tmp``
beside its final name and renames it once closed, so a proxy killed with SIGKILL during a roll
leaves the temporary file behind, hidden but taking space, and nothing else would remove it.

Several proxies may write into one directory (their files have distinct names), and another
live proxy's temporary file is not stale. So every proxy holds a shared ``flock`` on
``DIR/.kwire-proxy.lock`` while it runs (the kernel drops it when the process dies, SIGKILL
included), and at start one that can take the lock exclusively, i.e. no other proxy is writing
there, removes the temporary files first. When another proxy holds it, nothing is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

__all__ = ["LOCK_NAME", "TEMPORARY_PATTERN", "claim", "stale_files"]

#: The lock file every running proxy holds shared, under the output directory.
LOCK_NAME = ".kwire-proxy.lock"
#: What ``kwire.dataset.TableWriter`` names a file while it writes it (in ``<table>/date=*/``).
TEMPORARY_PATTERN = ".part-*.parquet.tmp"
_TABLES = ("exchanges", "connections")
#: How long to wait for another proxy that is removing stale files at its own start.
_WAIT_SECONDS = 10.0


def stale_files(out_dir: Path) -> list[Path]:
    """The writer's temporary files under ``out_dir`` (stale unless a live proxy writes there)."""
    return sorted(path for table in _TABLES for path in (out_dir / table).glob(f"date=*/{TEMPORARY_PATTERN}"))


def claim(out_dir: Path) -> tuple[int, list[Path]]:
    """Claim ``out_dir`` for a proxy (created if missing): the lock file's descriptor, to keep
    open until the proxy stops, and the stale temporary files removed (none when another
    proxy is writing there). OSError when the directory cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OSError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    removed: list[Path] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _share(fd)  # another proxy writes here: its temporary files are not stale
        return fd, removed
    try:
        for path in stale_files(out_dir):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    finally:
        fcntl.flock(fd, fcntl.LOCK_SH)  # from exclusive to shared: other proxies may start
    return fd, removed


def _share(fd: int) -> None:
    """Take the shared lock, waiting (bounded) while another proxy holds it exclusively."""
    deadline = time.monotonic() + _WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                return  # go on without it: only another proxy's clean-up could then miss us
            time.sleep(0.01)
