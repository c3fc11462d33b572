"""The `shoal` command line. Each command lives in `shoal.commands.<name>`.

Exit codes: 0 success, 2 bad input (one line, no traceback),
1 internal error.
"""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException  # what typer's own click raises for usage errors

from shoal.commands.common import DEBUG
from shoal.commands.compare import compare
from shoal.commands.report import report
from shoal.commands.route import route
from shoal.commands.schema import schema
from shoal.commands.trace import trace
from shoal.commands.train import train
from shoal.errors import InternalError

app = typer.Typer(
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags without metavars, no boxes
    help="Data-parallel training on heterogeneous clusters (GSSP, SIM, GDTopK, GRID).",
)
app.command("train")(train)
app.command("compare")(compare)
app.command("report")(report)
app.command("route")(route)
app.command("trace")(trace)
app.command("schema")(schema)


def _version(value: bool) -> None:
    if value:
        from shoal import __version__

        typer.echo(f"shoal {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="Print the full traceback behind an error line (your "
                                     "plug-in's own exception, or an internal error's).")) -> None:
    """Data-parallel training on heterogeneous clusters (GSSP, SIM, GDTopK, GRID)."""
    DEBUG["on"] = debug


def main() -> None:
    """Entry point of the `shoal` script: usage errors are one line and exit 2; no arguments print the help."""
    try:
        code = app(standalone_mode=False)
    except TyperException as err:
        ctx = getattr(err, "ctx", None)
        if type(err).__name__ == "NoArgsIsHelpError":
            typer.echo(ctx.get_help() if ctx else "")
            code = 0
        elif hasattr(err, "format_message"):
            where = f"; see '{ctx.command_path} --help'" if ctx else ""
            typer.echo(f"error: {err.format_message().rstrip('.')}{where}", err=True)
            code = getattr(err, "exit_code", 2)
        else:
            raise
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        code = 130
    except InternalError as err:  # the traceback is in metrics.jsonl, the summary was written
        if DEBUG["on"] and err.details:
            typer.echo(err.details.rstrip(), err=True)
        typer.echo(f"error: {err}", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)
