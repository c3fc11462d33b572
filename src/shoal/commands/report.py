"""`shoal report`: rebuild a comparison's report.html from its folder (after edits, or on another machine)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from shoal.commands.common import user_errors_exit_2
from shoal.errors import ConfigError


@user_errors_exit_2
def report(
    folder: Path = typer.Argument(..., help="A `shoal compare --out` folder (holds compare.json and the runs)."),
) -> None:
    """Redraw the plots and rewrite report.html of an earlier comparison; the runs are not touched."""
    check_compare_folder(folder)
    from shoal.report.html import write_report  # heavy (matplotlib): only once the folder is valid

    typer.echo(f"report: {write_report(folder)}")


def check_compare_folder(folder: Path) -> None:
    """One clear line for a folder that is not a complete comparison (checked before anything is drawn)."""
    index = folder / "compare.json"
    if not index.is_file():
        raise ConfigError(f"{folder}: no compare.json here; run `shoal compare ... --out {folder}` first")
    compare = _read_json(index, "a shoal compare result")
    if compare.get("interrupted"):  # its rows would compare unequal numbers of seeds, or none yet
        raise ConfigError(f"{index}: an interrupted comparison ({compare.get('runs_finished', '?')} of "
                          f"{compare.get('runs_planned', '?')} runs of its {compare.get('phase', 'last')} phase "
                          "finished): no report until every run has; go on with its command and --resume")
    rows, schemes = compare.get("rows"), compare.get("schemes")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{index}: not a shoal compare result (\"rows\" must be a non-empty list of objects)")
    if not isinstance(schemes, list) or not all(isinstance(s, str) for s in schemes):
        raise ConfigError(f"{index}: not a shoal compare result (\"schemes\" must be a list of names)")
    for i, row in enumerate(rows):
        if not isinstance(row.get("scheme"), str) or not isinstance(row.get("run_dir"), str):
            raise ConfigError(f"{index}: rows[{i}] needs \"scheme\" and \"run_dir\" strings")
        run = folder / row["run_dir"]
        if not (run / "summary.json").is_file():
            raise ConfigError(f"{run}: the run of scheme {row['scheme']!r} is missing (no summary.json)")
        _read_json(run / "summary.json", "a run summary")


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not {what} ({type(err).__name__}: {str(err).splitlines()[0][:80]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not {what} (expected a JSON object, got {type(data).__name__})")
    return data
