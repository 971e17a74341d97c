"""The compiled parts (decoder/_layoutvm.c, decoder/_pcapscan.c, decoder/_rowvalues.c,
decoder/_framecore.c, decoder/_tcpfast.c, decoder/_readahead.c, kwire/_rowarrow.c, kwire/_exchangerows.c); everything
else is in pyproject.toml.

A build failure fails ``pip install`` (and so ``scripts/bootstrap-venv``) with the compiler's
message: the extension is not optional.
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c99", "-Wall"]


def _compiled(name: str, *, flags: tuple[str, ...] = (), depends: tuple[str, ...] = ()) -> Extension:
    """The extension ``name`` (``package._module``) built from ``package/_module.c``."""
    return Extension(
        name,
        [name.replace(".", "/") + ".c"],
        depends=list(depends),
        extra_compile_args=_FLAGS + list(flags),
        optional=False,
    )


setup(
    ext_modules=[
        _compiled("decoder._layoutvm", flags=("-Wno-missing-braces",)),
        _compiled("decoder._rowvalues"),
        _compiled("decoder._pcapscan", depends=("decoder/_slots.h",)),
        _compiled("decoder._framecore", depends=("decoder/_slots.h",)),
        _compiled("decoder._tcpfast", depends=("decoder/_slots.h",)),
        _compiled("decoder._readahead"),
        _compiled("kwire._rowarrow"),
        _compiled("kwire._exchangerows", depends=("decoder/_slots.h",)),
    ]
)
