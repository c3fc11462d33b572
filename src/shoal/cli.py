"""The `shoal` command line. Each command lives in `shoal.commands.<name>`.

Exit codes: 0 success, 2 bad input (one line, no traceback),
1 internal error.
"""

from __future__ import annotations

import sys

import typer

from shoal.commands.compare import compare
from shoal.commands.report import report
from shoal.commands.route import route
from shoal.commands.train import train

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Data-parallel training on heterogeneous clusters (GSSP, SIM, GDTopK, GRID).",
)
app.command("train")(train)
app.command("compare")(compare)
app.command("report")(report)
app.command("route")(route)


def _version(value: bool) -> None:
    if value:
        from shoal import __version__

        typer.echo(f"shoal {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Data-parallel training on heterogeneous clusters (GSSP, SIM, GDTopK, GRID)."""


def main() -> None:
    """Entry point of the `shoal` script."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
