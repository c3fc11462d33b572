"""`shoal train`: one training run from a config file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shoal.commands.common import user_errors_exit_2
from shoal.config import load_config

console = Console(stderr=True)


@user_errors_exit_2
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML config file (defaults apply when omitted)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a key: section.key=value (repeatable)."),
    backend: Optional[str] = typer.Option(None, "--backend", metavar="sim|ray",
                                          help="sim or ray (overrides backend.name)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default runs/train-<time>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write over an earlier run in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary table."),
    address: Optional[str] = typer.Option(None, "--address", help="ray: join this Ray cluster (\"auto\" or ray://HOST:PORT) instead of starting a local one."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="ray: continue the run in this folder from its last checkpoint (its config.toml unless --config)."),
) -> None:
    """Train a model data-parallel on a simulated or real heterogeneous cluster."""
    overrides = list(set_) + ([f"backend.name={backend}"] if backend else [])
    overrides += [f"backend.address={json.dumps(address)}"] if address else []
    if resume is not None and config is None:
        config = resume / "config.toml"
    cfg = load_config(config, overrides)
    from shoal.runner import train as run_training  # heavy (torch): only once the config is valid
    out = out or resume or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    with _progress(quiet, cfg.run.max_time_s) as update:
        summary = run_training(cfg, out, overwrite=overwrite, progress=update, resume=resume)
    if not quiet:
        _print_summary(summary, out)
    if summary.get("stop_reason") == "interrupted":
        raise typer.Exit(130)


class _progress:
    """A rich progress bar over the time budget, fed by the backend's ticks."""

    def __init__(self, quiet: bool, budget_s: float) -> None:
        self.quiet, self.budget = quiet, budget_s
        self.bar = Progress(
            TextColumn("[bold]training"), BarColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
            console=console, transient=True,
        )

    def __enter__(self) -> Any:
        if self.quiet:
            return None
        self.bar.start()
        self.task = self.bar.add_task("run", total=self.budget, info="")
        return self.update

    def update(self, tick: dict[str, Any]) -> None:
        acc = tick.get("accuracy")
        info = f"t={tick['t']:.1f}s  iters={tick['iterations']}" + (f"  acc={acc:.4f}" if acc is not None else "")
        if tick.get("rates"):  # ray: iterations per second of each group
            info += "  it/s " + "/".join(f"{r:g}" for r in tick["rates"])
        if tick.get("failures"):
            info += f"  failed={tick['failures']}"
        self.bar.update(self.task, completed=min(tick["t"], self.budget), info=info)

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.bar.stop()


def _print_summary(summary: dict[str, Any], out: Path) -> None:
    table = Table(title=f"shoal train: {summary['scheme']} on {summary['backend']} ({summary['stop_reason']})")
    for col in ("worker", "group", "speed", "iterations", "compute s", "wait s", "comm s"):
        table.add_column(col, justify="right")
    for w in summary["per_worker"]:
        table.add_row(str(w["id"]), str(w["group"]), f"{w['speed']:g}", str(w["iterations"]), f"{w['compute_s']:.2f}",
                      f"{w['wait_s']:.2f}", f"{w['comm_s']:.2f}")
    out_console = Console()
    out_console.print(table)
    ttt = summary["time_to_target_s"]
    metric = summary.get("metric", "accuracy")
    final, best, target = (summary.get("final_metric"), summary.get("best_metric"), summary.get("target"))
    if metric == "accuracy":
        final, best = summary["final_accuracy"], summary["best_accuracy"]
    fmt = (lambda v: "-" if v is None else f"{v:.4f}")  # noqa: E731
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
    model = ", model.safetensors" if summary.get("model_file") else ""
    out_console.print(f"wrote {out}/summary.json, metrics.jsonl, config.toml{model}")
