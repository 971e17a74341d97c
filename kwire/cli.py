"""The `kwire` command line: thin typer wrappers around the decoder, the proxy and the Spark jobs.

Conventions every command keeps:

* help is plain text as wide as the terminal (never cut at 80 columns, no boxes), and
  ``kwire --install-completion`` / ``--show-completion`` give shell completion;
* a wrong flag or value is one line on stderr (``kwire decode: No such option: --x (see kwire decode
  --help)``) and exit code 2, as every other bad input is;
* ``kwire --version`` prints the version.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import sys
from collections.abc import Callable
from typing import Annotated, Any

# kwire never does linear algebra, but pyarrow imports numpy, whose OpenBLAS starts a spinning
# thread per core: 5% of a bulk decode's CPU here (farm-bench, median of 7 pairs), taken from
# the other decode worker on a 2-core machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer  # after the setting above: numpy reads it when it loads

from kwire import __version__
from kwire.runtime import tune_gc

__all__ = ["build_app", "run"]  # and `app` (built on first use: see __getattr__)

#: Each command: the module that defines it, in the order ``kwire --help`` lists them. A run of
#: one command imports only its module: all of them took 130 ms of each ``kwire decode``.
COMMANDS: dict[str, str] = {
    "decode": "kwire.decode_command",
    "capture": "kwire.capture_command",
    "proxy": "kwire.proxy_command",
    "analyze": "kwire.analytics_commands",
    "audit": "kwire.analytics_commands",
    "sql": "kwire.analytics_commands",
}


def _help_width() -> int:
    """The terminal's width; in a pipe, wide enough that no help line is folded short."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return max(60, shutil.get_terminal_size().columns)
    return 200


def _typer() -> typer.Typer:
    return typer.Typer(
        name="kwire",
        help="Kafka wire-protocol inspection: decode captures, run a recording proxy or a passive sidecar, "
        "analyse with Spark.",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"max_content_width": 400, "terminal_width": _help_width()},
    )


def _show_version(value: bool) -> None:
    if value:
        print(f"kwire {__version__}")
        raise typer.Exit(0)


def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_show_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Kafka wire-protocol inspection."""
    tune_gc()


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with just the command ``only`` (what a run of it
    needs: its help and errors read the same, and the other commands' modules stay unloaded)."""
    cli = _typer()
    cli.callback()(main)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            command: Callable[..., Any] = getattr(importlib.import_module(module), name)
            cli.command()(command)
    return cli


@functools.cache
def _whole_app() -> typer.Typer:
    return build_app()


def __getattr__(name: str) -> Any:
    """``app``: the whole command line, built on first use (tests and benchmarks drive it)."""
    if name == "app":
        return _whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(argv: list[str] | None = None) -> int:
    """The ``kwire`` entry point: the typer app, with command-line mistakes reported in one line."""
    from typer._click import exceptions as click_exceptions
    from typer.exceptions import Abort

    args = sys.argv[1:] if argv is None else argv
    cli = build_app(args[0]) if args and args[0] in COMMANDS else _whole_app()
    try:
        result = cli(args=args, prog_name="kwire", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)
        return 2
    except click_exceptions.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "kwire"
        message = " ".join(exc.format_message().split())
        print(f"{where}: {message} (see {where} --help)", file=sys.stderr)
        return 2
    except click_exceptions.ClickException as exc:
        print(f"kwire: {' '.join(exc.format_message().split())}", file=sys.stderr)
        return exc.exit_code
    except Abort:
        print("kwire: interrupted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    return result if isinstance(result, int) else 0


def entry() -> None:
    """Console-script entry: exit with ``run``'s code."""
    if sys.argv[1:2] == ["decode"]:
        # a process of its own that never meets a pandas object (not done in ``run``, which
        # tests call inside processes that may use pandas)
        from kwire.arrowstart import import_pyarrow_without_numpy, skip_pandas_probe

        import_pyarrow_without_numpy()
        skip_pandas_probe()
    sys.exit(run())


if __name__ == "__main__":
    entry()
