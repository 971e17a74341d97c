"""The compiled parts (decoder/_layoutvm.c, decoder/_pcapscan.c, decoder/_rowvalues.c,
decoder/_framecore.c, kwire/_rowarrow.c); everything else is in pyproject.toml.

A build failure fails ``pip install`` (and so ``scripts/bootstrap-venv``) with the compiler's
message: the extension is not optional.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "decoder._layoutvm",
            ["decoder/_layoutvm.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wno-missing-braces"],
            optional=False,
        ),
        Extension(
            "decoder._rowvalues",
            ["decoder/_rowvalues.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
            optional=False,
        ),
        Extension(
            "decoder._pcapscan",
            ["decoder/_pcapscan.c"],
            depends=["decoder/_slots.h"],
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
            optional=False,
        ),
        Extension(
            "decoder._framecore",
            ["decoder/_framecore.c"],
            depends=["decoder/_slots.h"],
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
            optional=False,
        ),
        Extension(
            "kwire._rowarrow",
            ["kwire/_rowarrow.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
            optional=False,
        ),
    ]
)
