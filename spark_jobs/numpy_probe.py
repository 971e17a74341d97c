"""PySpark's "is numpy installed?" probe, kept off the paths a user waits on.

PySpark asks ``pyspark.testing.utils`` whether numpy is installed in two places kwire meets:
the py4j input converters for numpy arrays and scalars (asked about every argument of every
call into the JVM) and ``functions.lit``. Importing that module imports and version-checks
pandas and pyarrow: 0.55 s of a cold ``kwire sql``'s 2.7 s session start (cProfile, demo
dataset), and in ``kwire analyze`` the same, in the middle of the jobs, in a job thread holding
the GIL.

:func:`install` gives both converters a ``can_convert`` that looks for numpy among the modules
already loaded: an object cannot be a numpy array or scalar unless numpy was imported, so the
answer is the same and nothing is imported to give it. ``kwire sql`` then never imports the
module; the analysis still does, at its first ``lit``.
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import types

__all__ = ["install"]


def _array(self: Any, obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray) and obj.ndim == 1


def _scalar(self: Any, obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.generic)


def install() -> None:
    """Replace the two converters' ``can_convert`` (idempotent; before the first JVM call)."""
    types.NumpyArrayConverter.can_convert = _array  # type: ignore[method-assign]
    types.NumpyScalarConverter.can_convert = _scalar  # type: ignore[method-assign]
