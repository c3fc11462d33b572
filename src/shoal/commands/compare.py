"""`shoal compare`: run several schemes on one config, then write compare.json and report.html (shoal.comparison)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from shoal.commands.common import backend_override, table_console, user_errors_exit_2
from shoal.comparison import STOP_FILE, Interrupted, command_line, phase_of, run_comparison
from shoal.report.schemes import bases

# the compressors' names would import torch with the CLI; the modifiers are named by kind here
SCHEMES_HELP = (f"Comma-separated specs base[+modifier...][@section.key=value...]: base {'|'.join(bases())}; "
                "modifiers sim, balance, balance-steps, balance-deadline (sync.balance), any compression.method (topk, powersgd, ...), ina or ina-<network.algorithm>; "
                "@ pins a value (kept out of --tune).")
TUNE_HELP = ("Tune KEY over the values for every scheme, e.g. optimizer.lr=0.01,0.02,0.05 (repeatable: the grid is "
             "every combination); needs --tune-seeds. Each scheme keeps its best median time to target on the "
             "development seeds.")
TUNE_SEEDS_HELP = ("Development seeds: every scheme tries every point of its grid (--tune, times its own knobs' grid) "
                   "on run.seed .. run.seed+K-1 and keeps the best; the --seeds evaluation seeds follow them.")
WIDEN_HELP = ("With --tune-seeds: N more values past each end of every numeric grid of 3+ values (--tune's and each "
              "scheme's own), continuing its step (2,8,32 -> 1..128); every scheme alike. With --resume on a "
              "finished comparison only the new points run (and the evaluation seeds of a row whose choice moves).")


@user_errors_exit_2
def compare(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file (defaults when omitted)."),
    schemes: str = typer.Option(..., "--schemes", help=SCHEMES_HELP),
    seeds: int = typer.Option(1, "--seeds", help="Evaluation runs per scheme (seeds after the --tune-seeds ones); "
                                                 "rows report medians, intervals and p-values."),
    tune: list[str] = typer.Option([], "--tune", metavar="KEY=V1,V2,...", help=TUNE_HELP),
    tune_seeds: int = typer.Option(0, "--tune-seeds", metavar="K", help=TUNE_SEEDS_HELP),
    own_knobs: bool = typer.Option(True, "--own-knobs/--no-own-knobs",
                                   help="With --tune-seeds: also tune each scheme's own knobs (SSP's s, localsgd's H, "
                                        "diloco's outer lr, GSSP's grouping threshold), 3 points each."),
    widen: int = typer.Option(0, "--widen", metavar="N", help=WIDEN_HELP),
    backend: Optional[str] = typer.Option(None, "--backend", metavar="sim|ray",
                                          help="sim or ray (overrides backend.name)."),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                 help="Override a key in every run: section.key=value (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default runs/compare-<time>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write over an earlier comparison in --out."),
    resume: bool = typer.Option(False, "--resume", help="Keep the finished runs already in --out whose config is the "
                                                        "planned one; run only the rest (an interrupted comparison). "
                                                        "A file --out/STOP stops a comparison after its runs in "
                                                        "flight."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Runs at a time, each in its own process (sim results do not "
                                                     "depend on the machine's load)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display and no results table."),
) -> None:
    """Compare schemes on one config (bsp,ssp,gssp,gssp+gdtopk, ...) and write an HTML report with plots."""
    overrides = list(set_) + backend_override(backend)
    out = out or Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")
    try:
        result, report = run_comparison(config, schemes, seeds, overrides, out, overwrite, quiet, tune,
                                        command=command_line(config, schemes, seeds, set_, backend, out, tune,
                                                             tune_seeds, own_knobs, widen),
                                        tune_seeds=tune_seeds, own_knobs=own_knobs, jobs=jobs, resume=resume,
                                        widen=widen)
    except Interrupted as stop:
        cut = ", ".join(stop.plan[i].run_dir for i in stop.cut) or "none in flight"
        how = f"stopped as {out}/{STOP_FILE} asked, after the runs in flight" if stop.drained else "interrupted"
        typer.echo(f"{how}: {len(stop.finished)} of {len(stop.plan)} runs of its {phase_of(stop.plan)} phase "
                   f"finished; cut short: {cut}; {out}/compare.json lists what finished, marked interrupted (no "
                   "report); add --resume to go on where it stopped", err=True)
        raise typer.Exit(130) from None
    if not quiet:
        print_table(result, report)


def print_table(result: dict[str, Any], report: Path) -> None:
    """The results table on stdout, then where the report is."""
    from shoal.report.tuning import BOOTSTRAP_FROM
    from shoal.report.units import human_bytes

    target = result["target_accuracy"] if result.get("target") is None else result["target"]
    goal = f"{target:.0%}" if result.get("target") is None else f"{target:g}"
    metric = result.get("metric", "accuracy")
    seeds = result["eval_seeds"] if result.get("tune_seeds") else result["seeds"]
    what = f"evaluation seeds {seeds[0]}..{seeds[-1]}" if isinstance(seeds, list) else \
        f"{seeds} seed{'s' * (seeds > 1)}"
    table = Table(title=f"shoal compare ({result['backend']}, {what})")
    many = any("seeds" in r for r in result["rows"])
    cols = ["scheme", f"time to {goal}"] + (["95% interval", "reached", "p"] if many else []) + [
        "vs BSP", f"final {metric}", "upload", "iterations"]
    for col in cols:
        table.add_column(col, justify="left" if col == "scheme" else "right", no_wrap=True)
    for r in result["rows"]:
        ttt, sp = r["time_to_target_s"], r["speedup_vs_bsp"]
        acc = r["final_accuracy"] if metric == "accuracy" else r.get("final_metric")
        cells = [r["scheme"], "never" if ttt is None else f"{ttt:.1f}s"]
        if many:
            iv = (r.get("time_to_target_interval") or {}).get("ci95")
            p = r.get("p_value")
            cells += ["-" if not iv else f"{_s(iv[0])}..{_s(iv[1])}", f"{r.get('reached', 0)}/{len(r.get('seeds', []))}",
                      "-" if p is None else f"{p:.3g}"]
        table.add_row(*cells, "-" if sp is None else f"{sp:.2f}x", "-" if acc is None else f"{acc:.4f}",
                      human_bytes(r.get("bytes_up")), f"{r['iterations']:,.0f}")
    table_console().print(table)  # piped or logged: every column whole, a line per row
    versus = next((r["versus"] for r in result["rows"] if r.get("versus")), None)
    if many and versus:
        typer.echo(f"p: two-sided Mann-Whitney U of the per-seed times against the best baseline, {versus}")
    if many and any(len(r.get("seeds", [])) < BOOTSTRAP_FROM for r in result["rows"]):
        typer.echo(f"95% interval: a bootstrap interval of the median, from {BOOTSTRAP_FROM} seeds on (--seeds)")
    typer.echo(f"report: {report}")


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s"
