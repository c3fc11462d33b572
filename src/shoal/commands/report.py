"""`shoal report`: rebuild a comparison's report.html from its folder (after edits, or on another machine)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from shoal.commands.common import user_errors_exit_2
from shoal.config import ConfigError


@user_errors_exit_2
def report(
    folder: Path = typer.Argument(..., help="A `shoal compare --out` folder (holds compare.json and the runs)."),
) -> None:
    """Redraw the plots and rewrite report.html of an earlier comparison; the runs are not touched."""
    check_compare_folder(folder)
    from shoal.report.html import write_report  # heavy (matplotlib): only once the folder is valid

    typer.echo(f"report: {write_report(folder)}")


def check_compare_folder(folder: Path) -> None:
    """One clear line for a folder that is not a complete comparison."""
    index = folder / "compare.json"
    if not index.is_file():
        raise ConfigError(f"{folder}: no compare.json here; run `shoal compare ... --out {folder}` first")
    try:
        rows = json.loads(index.read_text())["rows"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ConfigError(f"{index}: not a shoal compare result ({type(err).__name__})") from None
    for row in rows:
        run = folder / str(row.get("run_dir", row.get("scheme", "?")))
        if not (run / "summary.json").is_file():
            raise ConfigError(f"{run}: the run of scheme {row.get('scheme')!r} is missing (no summary.json)")
