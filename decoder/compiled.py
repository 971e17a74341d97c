"""Loading kwire's compiled modules (built by ``pip install``, so by ``scripts/bootstrap-venv``).

``KWIRE_PURE_PYTHON=1`` makes every one of them absent: the Python references alone run.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load"]


def load(name: str, what: str, package: str = "decoder") -> ModuleType | None:
    """``<package>.<name>`` (compiled from ``<package>/<name>.c``), or None in pure-Python mode."""
    if os.environ.get("KWIRE_PURE_PYTHON") == "1":
        return None
    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError as exc:
        raise ImportError(
            f"{package}.{name} (kwire's {what}, {package}/{name}.c) is not built: run "
            "`bash scripts/bootstrap-venv`, which compiles it (needs a C compiler and Python's headers), "
            "or set KWIRE_PURE_PYTHON=1 to use the Python reference alone"
        ) from exc
