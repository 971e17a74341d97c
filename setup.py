"""kwire's compiled parts (decoder/_layoutvm.c, decoder/_scan.c); everything else is in pyproject.toml.

A build failure fails ``pip install`` (and so ``scripts/bootstrap-venv``) with the compiler's
message: the extensions are not optional.
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c99", "-Wall", "-Wno-missing-braces"]

setup(
    ext_modules=[
        Extension(name, [f"{name.replace('.', '/')}.c"], extra_compile_args=_FLAGS, optional=False)
        for name in ("decoder._layoutvm", "decoder._scan")
    ]
)
