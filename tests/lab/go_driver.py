"""Build the Go lab drivers (sarama 1.27.0, sarama 1.43.3, franz-go) into ``.cache``.

Sources live in ``tests/lab/drivers/go/``: ``labdriver/`` is the shared lab interface
(arguments, events, pacing, counts), ``sarama/`` is ONE driver source built twice
(``go.mod`` pins IBM/sarama 1.43.3; ``sarama-1.27.0.mod`` points the same import path
at Shopify/sarama 1.27.0 with a ``replace``, used through ``go build -modfile``),
``franz-go/`` is the franz-go driver.

Everything the go command fetches or caches goes under ``.cache/go`` (modules,
build cache) and binaries to ``.cache/drivers/go/<name>``. The module proxy is
reachable here but the checksum database is not, so builds run with
``GOSUMDB=off -mod=readonly``: the committed ``go.sum`` files pin every module's
hash and the go command refuses anything they do not list.

``python tests/lab/go_driver.py build [NAME...]`` builds (all by default);
``python tests/lab/go_driver.py errnames`` regenerates ``labdriver/errnames.go``
from ``decoder/kafka_protocol.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BIN_DIR",
    "GO_DRIVERS",
    "GO_SRC",
    "GoDriver",
    "GoDriverError",
    "ensure_go_driver",
    "error_names_go",
    "go_env",
]

ROOT = Path(__file__).resolve().parents[2]
GO_SRC = ROOT / "tests" / "lab" / "drivers" / "go"
CACHE = ROOT / ".cache"
BIN_DIR = CACHE / "drivers" / "go"
#: Upper bound for one ``go build`` (a cold build fetches modules and compiles them).
BUILD_TIMEOUT_S = 900.0


class GoDriverError(RuntimeError):
    """A Go driver could not be built (one-line message; the full output is in ``.build.log``)."""


@dataclass(frozen=True)
class GoDriver:
    """Where one driver's source is and which library module it pins."""

    module_dir: str  #: folder under ``GO_SRC`` holding ``main.go`` and ``go.mod``
    modfile: str | None  #: alternative go.mod in that folder (its ``.sum`` sits beside it)
    library_module: str  #: the module the driver exists to exercise


GO_DRIVERS: dict[str, GoDriver] = {
    "sarama-1.27.0": GoDriver("sarama", "sarama-1.27.0.mod", "github.com/Shopify/sarama"),
    "sarama-1.43.3": GoDriver("sarama", None, "github.com/IBM/sarama"),
    "franz-go": GoDriver("franz-go", None, "github.com/twmb/franz-go"),
}


def go_env() -> dict[str, str]:
    """The environment for every go command: all caches under ``.cache/go``, no sumdb."""
    go = CACHE / "go"
    return {
        **os.environ,
        "GOPATH": str(go),
        "GOMODCACHE": str(go / "mod"),
        "GOCACHE": str(go / "build"),
        "GOFLAGS": "-modcacherw -mod=readonly -buildvcs=false",
        "GOTOOLCHAIN": "local",
        "GOSUMDB": "off",
        "CGO_ENABLED": "0",
    }


def _source_files(driver: GoDriver) -> list[Path]:
    """Every file whose change must trigger a rebuild of *driver*."""
    files = [*sorted((GO_SRC / "labdriver").glob("*.go")), GO_SRC / "labdriver" / "go.mod"]
    folder = GO_SRC / driver.module_dir
    files += sorted(folder.glob("*.go"))
    if driver.modfile:
        files += [folder / driver.modfile, folder / Path(driver.modfile).with_suffix(".sum")]
    else:
        files += [folder / "go.mod", folder / "go.sum"]
    return files


def _stamp(driver: GoDriver, go_version: str) -> str:
    """Hash of the sources and the Go version: the binary is current when it matches."""
    digest = hashlib.sha256(go_version.encode())
    for path in _source_files(driver):
        digest.update(str(path.relative_to(GO_SRC)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path, timeout: float = BUILD_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive lock on *path* (bounded wait), so parallel callers build once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GoDriverError(f"timed out waiting for the build lock {path}") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go_version(env: dict[str, str]) -> str:
    try:
        return subprocess.run(
            ["go", "version"], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise GoDriverError(f"the go command is not usable: {exc}") from exc


def ensure_go_driver(name: str) -> list[str]:
    """Build Go driver *name* (a ``GO_DRIVERS`` key) if needed; return its argv prefix.

    Idempotent and safe to call from parallel processes: a stamp file beside the
    binary records the hash of its sources, so a second call does nothing. Raises
    GoDriverError with a one-line reason when the build fails.
    """
    try:
        driver = GO_DRIVERS[name]
    except KeyError:
        raise GoDriverError(f"unknown Go driver {name!r} (known: {', '.join(GO_DRIVERS)})") from None
    binary = BIN_DIR / name
    stamp_path = BIN_DIR / f"{name}.stamp"
    env = go_env()
    stamp = _stamp(driver, _go_version(env))
    with _locked(BIN_DIR / f".{name}.lock"):
        if binary.exists() and stamp_path.exists() and stamp_path.read_text() == stamp:
            return [str(binary)]
        command = ["go", "build", "-trimpath", "-o", str(binary)]
        if driver.modfile:
            command.append(f"-modfile={driver.modfile}")
        command.append(".")
        log_path = BIN_DIR / f"{name}.build.log"
        try:
            proc = subprocess.run(
                command,
                cwd=GO_SRC / driver.module_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise GoDriverError(f"go build of {name} took longer than {BUILD_TIMEOUT_S:.0f}s") from None
        log_path.write_text(f"$ {' '.join(command)}\n{proc.stdout}{proc.stderr}")
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("#")]
            reason = lines[0] if lines else f"exit code {proc.returncode}"
            raise GoDriverError(f"go build of {name} failed: {reason} (see {log_path})")
        stamp_path.write_text(stamp)
    return [str(binary)]


def error_names_go() -> str:
    """Go source of ``labdriver.ErrorNames`` (code -> name), from ``decoder/kafka_protocol.json``."""
    table = json.loads((ROOT / "decoder" / "kafka_protocol.json").read_text())["errors"]
    lines = [
        "// Code generated by tests/lab/go_driver.py errnames from decoder/kafka_protocol.json; DO NOT EDIT.",
        "",
        "package labdriver",
        "",
        "// ErrorNames maps a Kafka protocol error code to its name.",
        "var ErrorNames = map[int16]string{",
    ]
    codes = sorted((int(code), row[0]) for code, row in table.items())
    width = max(len(f"{code}:") for code, _ in codes) + 1  # gofmt aligns the values
    lines += [f'\t{f"{code}:":<{width}}"{name}",' for code, name in codes]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _main(argv: list[str]) -> int:
    if argv[:1] == ["errnames"]:
        (GO_SRC / "labdriver" / "errnames.go").write_text(error_names_go())
        return 0
    if argv[:1] == ["build"]:
        for name in argv[1:] or list(GO_DRIVERS):
            started = time.monotonic()
            print(name, " ".join(ensure_go_driver(name)), f"{time.monotonic() - started:.1f}s")
        return 0
    print("usage: go_driver.py build [NAME...] | errnames", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
