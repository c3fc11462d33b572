"""`shoal train`: one training run from a config file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from shoal.commands.common import backend_override, table_console, user_errors_exit_2
from shoal.progress import TrainProgress, worker_table
from shoal.config import load_config

console = Console(stderr=True)

#: the exit code of a run that diverged (docs/getting-started.md): not 0, and apart from bad input (2) and bugs (1)
DIVERGED_EXIT = 3


@user_errors_exit_2
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file (defaults apply when omitted)."),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                 help="Override a key: section.key=value (repeatable)."),
    backend: Optional[str] = typer.Option(None, "--backend", metavar="sim|ray",
                                          help="sim or ray (overrides backend.name)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default runs/train-<time>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write over an earlier run in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary table."),
    address: Optional[str] = typer.Option(None, "--address", help="ray: join this Ray cluster (\"auto\" or ray://HOST:PORT) instead of starting a local one."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this folder from its last checkpoint (its config.toml unless --config): ray (backend.checkpoint_every_s) or sim (backend.sim_checkpoint_every_s, bit for bit)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config (TOML, every default filled in) and exit; nothing is written."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check everything, load the data, build the model and the training strategy, say what would run, and exit; nothing is written."),
) -> None:
    """Train a model data-parallel on a simulated or real heterogeneous cluster."""
    overrides = list(set_) + backend_override(backend)
    overrides += [f"backend.address={json.dumps(address)}"] if address else []
    if resume is not None and config is None:
        config = resume / "config.toml"
    cfg = load_config(config, overrides)
    if print_config:
        from shoal.config import to_toml

        typer.echo(to_toml(cfg), nl=False)
        return
    if dry_run:
        from shoal.runner import dry_run as describe

        for line in describe(cfg):
            typer.echo(line)
        return
    from shoal.runner import train as run_training  # heavy (torch): only once the config is valid
    out = out or resume or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    with TrainProgress(console, quiet, cfg.run.max_time_s, cfg.run.max_iterations) as update:
        summary = run_training(cfg, out, overwrite=overwrite, progress=update, resume=resume)
    if not quiet:
        _print_summary(summary, out)
    if summary.get("stop_reason") == "interrupted":
        raise typer.Exit(130)
    if summary.get("stop_reason") == "diverged":
        typer.echo(f"error: the run diverged: its loss stopped being finite at {summary['elapsed_s']:.2f} s "
                   f"({summary['backend']} time) after {summary['iterations']} iterations; try a lower optimizer.lr "
                   f"(now {cfg.optimizer.lr:g}); what it wrote is in {out}", err=True)
        raise typer.Exit(DIVERGED_EXIT)


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    out_console = table_console()  # piped or logged: every column whole, a line per row
    out_console.print(worker_table(summary))
    ttt = summary["time_to_target_s"]
    metric = summary.get("metric", "accuracy")
    final, best, target = (summary.get("final_metric"), summary.get("best_metric"), summary.get("target"))
    if metric == "accuracy":
        final, best = summary["final_accuracy"], summary["best_accuracy"]
    fmt = (lambda v: "not measured" if v is None else f"{v:.4f}")  # noqa: E731
    if target is None:
        reached = "no target"
    elif ttt is None:
        reached = f"target {target:g} not reached"
    else:
        reached = f"target {target:g} reached at {ttt:.2f}s"
    out_console.print(
        f"final {metric} {fmt(final)} (best {fmt(best)}), {reached}; {summary['iterations']} iterations in "
        f"{summary['elapsed_s']:.2f}s ({summary['backend']} time), wall {summary['wall_s']:.1f}s"
    )
    if summary.get("stragglers"):
        out_console.print(f"stragglers: {summary['stragglers']['verdict']}")
    model = ", model.safetensors" if summary.get("model_file") else ""
    out_console.print(f"wrote {out}/summary.json, metrics.jsonl, config.toml{model}")
