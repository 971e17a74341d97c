"""Make a process's first Arrow conversion cheap: no pandas import behind it.

pyarrow's first ``pa.array(a_list)`` asks whether the list is a pandas object, and to know, it
imports pandas when pandas is installed (it is: pyspark needs it). That import costs a
``kwire decode`` process 0.3-0.5 s of a quiet machine's CPU, and each of its workers as much
again, for nothing: a decode never meets a pandas object. ``skip_pandas_probe`` lets that
first probe find no pandas, so pyarrow notes "no pandas" and does not look again. Calls that
need pandas (``Table.to_pandas``, ``Table.from_pandas``) still import it when made, so code
that does use pandas later in the process keeps working; only ``pa.array`` on a pandas object
would then be read as a plain sequence, which is why only the ``kwire decode`` process calls this
(``kwire.cli.entry``), never library code shared with the Spark jobs or run inside tests.

The same process imports pyarrow with numpy hidden too (pyarrow 16 and later run without it,
and a decode never hands pyarrow a numpy array): importing pyarrow and pyarrow.parquet took
0.129 s with numpy (OpenBLAS kept to one thread) and 0.077 s without (``farm-bench``, 10 runs),
and a ``kwire decode`` of the bench's chatty capture takes about a second. A pyarrow that does
need numpy fails that first import; it is then imported with numpy.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec

__all__ = ["import_pyarrow_without_numpy", "skip_pandas_probe"]


class _Hidden:
    """A meta path finder that says the package ``name`` is not installed (while it is on
    ``sys.meta_path``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name == self.name or name.startswith(self.name + "."):
            raise ModuleNotFoundError(f"{self.name} hidden from pyarrow's start", name=name)
        return None


def _hiding(name: str) -> _Hidden:
    blocker = _Hidden(name)
    sys.meta_path.insert(0, blocker)
    return blocker


def import_pyarrow_without_numpy() -> None:
    """Import pyarrow and pyarrow.parquet with numpy hidden, once per process (no-op if either
    is loaded already); with numpy if this pyarrow cannot do without it."""
    if "pyarrow" in sys.modules or "numpy" in sys.modules:
        return
    blocker = _hiding("numpy")
    try:
        import pyarrow.parquet
    except ImportError:
        for module in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
            del sys.modules[module]
    finally:
        sys.meta_path.remove(blocker)
    import pyarrow.parquet  # noqa: F401  (a no-op unless the first import failed)


def skip_pandas_probe() -> None:
    """Make pyarrow's pandas probe find nothing, once per process (no-op if pandas is loaded)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    blocker = _hiding("pandas")
    try:
        pa.array([0])  # the probe runs here and its answer is kept
    finally:
        sys.meta_path.remove(blocker)
