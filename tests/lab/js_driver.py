"""Install the kafkajs lab driver (``drivers/js/``) into ``.cache/drivers/js/``.

``npm ci`` runs there over a copy of ``package.json`` + ``package-lock.json`` (so no
``node_modules`` lands in the work tree, and npm's own cache is ``.cache/npm``), then
``driver.js`` is copied beside ``node_modules`` so ``require('kafkajs')`` finds it. A stamp
(hash of the package files) makes the install idempotent: a second call runs no npm and
needs no network. A lock file serialises concurrent installs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "JS_DRIVER_DIR",
    "KAFKAJS_VERSION",
    "JsDriverError",
    "ensure_js_driver",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache"
JS_DRIVER_DIR = CACHE_DIR / "drivers" / "js"
NPM_CACHE = CACHE_DIR / "npm"
SOURCE_DIR = Path(__file__).resolve().parent / "drivers" / "js"
PACKAGE_FILES = ("package.json", "package-lock.json")
#: The kafkajs version pinned in drivers/js/package.json (and its lockfile).
KAFKAJS_VERSION = "2.2.4"
INSTALL_TIMEOUT_S = 600.0
LOCK_TIMEOUT_S = INSTALL_TIMEOUT_S + 60.0


class JsDriverError(RuntimeError):
    """The driver could not be installed (message is one line)."""


def _one_line(text: str, limit: int = 300) -> str:
    """npm's failure in one line: its first two error lines (code, then reason), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("npm error", "npm ERR!"))]
    return ("; ".join(errors[:2]) if errors else (lines or ["(no output)"])[-1])[:limit]


@contextlib.contextmanager
def _locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive flock on *path*, waiting at most *timeout* seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise JsDriverError(f"timed out after {timeout:.0f}s waiting for lock {path}") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_if_changed(path: Path, text: str) -> None:
    """Replace *path* atomically when its content differs from *text*."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _npm_ci() -> None:
    """``npm ci`` in JS_DRIVER_DIR unless the installed package files are the current ones."""
    texts = {name: (SOURCE_DIR / name).read_text() for name in PACKAGE_FILES}
    key = hashlib.sha256("\0".join(texts[name] for name in PACKAGE_FILES).encode()).hexdigest()
    stamp = JS_DRIVER_DIR / "node_modules" / ".kwire-complete"
    if stamp.exists() and stamp.read_text() == key:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise JsDriverError("npm not found (install Node.js >= 14 with npm)")
    for name, text in texts.items():
        _write_if_changed(JS_DRIVER_DIR / name, text)
    command = [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--cache", str(NPM_CACHE)]
    try:
        proc = subprocess.run(
            command, cwd=JS_DRIVER_DIR, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise JsDriverError(f"npm ci in {JS_DRIVER_DIR} timed out") from None
    if proc.returncode != 0:
        raise JsDriverError(
            f"npm ci could not install kafkajs {KAFKAJS_VERSION}: {_one_line(proc.stdout + proc.stderr)}"
        )
    if not (JS_DRIVER_DIR / "node_modules" / "kafkajs" / "package.json").exists():
        raise JsDriverError(f"npm ci ran but kafkajs is not in {JS_DRIVER_DIR / 'node_modules'}")
    stamp.write_text(key)


def _error_names() -> str:
    """The project's error table as "code TAB name" lines, for the driver's error_name field."""
    from decoder.protocol import ERRORS

    return "".join(f"{code}\t{entry[0]}\n" for code, entry in sorted(ERRORS.items()))


def ensure_js_driver() -> list[str]:
    """Install kafkajs and the driver into ``.cache/drivers/js/`` if not done yet; return the
    argv prefix that runs it (append the driver arguments: ``--bootstrap ... --out FILE``).

    Raises JsDriverError (one line) when node or npm is missing or ``npm ci`` fails.
    """
    node = shutil.which("node")
    if node is None:
        raise JsDriverError("node not found (install Node.js >= 14)")
    with _locked(CACHE_DIR / "drivers" / "js.lock"):
        JS_DRIVER_DIR.mkdir(parents=True, exist_ok=True)
        _npm_ci()
        _write_if_changed(JS_DRIVER_DIR / "driver.js", (SOURCE_DIR / "driver.js").read_text())
        _write_if_changed(JS_DRIVER_DIR / "error_names.tsv", _error_names())
    return [node, str(JS_DRIVER_DIR / "driver.js")]
