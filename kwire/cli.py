"""The `kwire` command line: thin typer wrappers around the decoder, the proxy and the Spark jobs."""

from __future__ import annotations

import typer

from kwire.analytics_commands import analyze, audit, sql
from kwire.decode_command import decode
from kwire.proxy_command import proxy
from kwire.runtime import tune_gc

app = typer.Typer(
    name="kwire",
    help="Kafka wire-protocol inspection: decode captures, run a recording proxy, analyse with Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Kafka wire-protocol inspection."""
    tune_gc()


for command in (decode, proxy, analyze, audit, sql):
    app.command()(command)


if __name__ == "__main__":
    app()
