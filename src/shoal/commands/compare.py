"""`shoal compare`: run several schemes on one config, then write compare.json and report.html (shoal.comparison)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from shoal.commands.common import user_errors_exit_2
from shoal.comparison import command_line, run_comparison
from shoal.report.schemes import bases

# the compressors' names would import torch with the CLI; the modifiers are named by kind here
SCHEMES_HELP = (f"Comma-separated specs base[+modifier...][@section.key=value...]: base {'|'.join(bases())}; "
                "modifiers sim, any compression.method (topk, powersgd, ...), ina or ina-<network.algorithm>; "
                "@ pins a value (kept out of --tune).")
TUNE_HELP = ("Tune KEY over the values for every scheme, e.g. optimizer.lr=0.01,0.02,0.05 (repeatable: the grid is "
             "every combination); each scheme keeps its best median time to target.")


@user_errors_exit_2
def compare(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file (defaults when omitted)."),
    schemes: str = typer.Option(..., "--schemes", help=SCHEMES_HELP),
    seeds: int = typer.Option(1, "--seeds", help="Runs per scheme; seed k uses run.seed + k and medians are reported."),
    tune: list[str] = typer.Option([], "--tune", metavar="KEY=V1,V2,...", help=TUNE_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", metavar="sim|ray",
                                          help="sim or ray (overrides backend.name)."),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                 help="Override a key in every run: section.key=value (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default runs/compare-<time>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write over an earlier comparison in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display and no results table."),
) -> None:
    """Compare schemes (e.g. bsp,ssp,gssp,gssp+gdtopk) on one config and write an HTML report with plots."""
    overrides = list(set_) + ([f"backend.name={backend}"] if backend else [])
    out = out or Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")
    result, report = run_comparison(config, schemes, seeds, overrides, out, overwrite, quiet, tune,
                                    command=command_line(config, schemes, seeds, set_, backend, out, tune))
    if not quiet:
        print_table(result, report)


def print_table(result: dict[str, Any], report: Path) -> None:
    """The results table on stdout, then where the report is."""
    from shoal.report.units import human_bytes

    target = result["target_accuracy"]
    table = Table(title=f"shoal compare ({result['backend']}, {result['seeds']} seed{'s' * (result['seeds'] > 1)})")
    for col in ("scheme", f"time to {target:.0%}", "vs BSP", "final acc", "upload", "iterations"):
        table.add_column(col, justify="left" if col == "scheme" else "right", no_wrap=True)
    for r in result["rows"]:
        ttt, sp, acc = r["time_to_target_s"], r["speedup_vs_bsp"], r["final_accuracy"]
        table.add_row(r["scheme"], "never" if ttt is None else f"{ttt:.1f}s", "-" if sp is None else f"{sp:.2f}x",
                      "-" if acc is None else f"{acc:.4f}", human_bytes(r.get("bytes_up")), f"{r['iterations']:,.0f}")
    Console().print(table)
    typer.echo(f"report: {report}")
