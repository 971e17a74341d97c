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
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec

__all__ = ["skip_pandas_probe"]


class _NoPandas:
    """A meta path finder that says pandas is not installed (while it is on ``sys.meta_path``)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas hidden from pyarrow's first probe", name=name)
        return None


def skip_pandas_probe() -> None:
    """Make pyarrow's pandas probe find nothing, once per process (no-op if pandas is loaded)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])  # the probe runs here and its answer is kept
    finally:
        sys.meta_path.remove(blocker)
