"""What `shoal train` shows while a run goes: a bar with percent and ETA, or plain lines when not on a terminal.

The backends call ``update(tick)`` with ``t`` (run time: virtual on sim,
wall on ray), ``iterations``, ``accuracy`` and, on ray, ``rates`` and
``failures``; during start-up a tick also carries ``status`` (what is
being started). The budget that ends first decides the percentage: the time
budget (``run.max_time_s``) or the iteration budget
(``run.max_iterations``); the ETA is wall time, extrapolated from the wall
time spent so far. A run that stops at its target fills the bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def stderr_console() -> Console:
    """Where progress goes: standard error, so standard output stays the run's results."""
    return Console(stderr=True)


PLAIN_EVERY_S = 10.0  # wall seconds between plain progress lines
COMPACT_ABOVE = 32  # workers beyond which the summary shows quantiles and the extremes, not every worker


def budget_fraction(tick: dict[str, Any], max_time_s: float, max_iterations: int) -> float | None:
    """How far the run is through whichever budget ends first (None: no finite budget)."""
    parts = []
    if math.isfinite(max_time_s) and max_time_s > 0:
        parts.append(tick.get("t", 0.0) / max_time_s)
    if max_iterations:
        parts.append(tick.get("iterations", 0) / max_iterations)
    return min(1.0, max(parts)) if parts else None


def eta_s(fraction: float | None, wall_elapsed_s: float) -> float | None:
    """Wall seconds left at the pace so far (None until there is progress to extrapolate)."""
    if fraction is None or fraction <= 0 or wall_elapsed_s <= 0:
        return None
    return wall_elapsed_s * (1 - fraction) / fraction


def clock(seconds: float | None) -> str:
    """``1:05`` or ``1:02:03``; ``-`` for unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def describe(tick: dict[str, Any], fraction: float | None, eta: float | None) -> str:
    """One line of what the run is doing now."""
    if tick.get("status"):  # start-up: what is being started
        return str(tick["status"])
    acc = tick.get("accuracy")
    parts = [f"t={tick['t']:.1f}s", f"iters={tick['iterations']}", f"acc={acc:.4f}" if acc is not None else "acc -"]
    if tick.get("rates"):  # ray: iterations per second of each group
        parts.append("it/s " + "/".join(f"{r:g}" for r in tick["rates"]))
    if tick.get("failures"):
        parts.append(f"failed={tick['failures']}")
    if fraction is not None:
        parts.append(f"{fraction:.0%}, ETA {clock(eta)}")
    return "  ".join(parts)


class TrainProgress:
    """A context manager handing the backend its ``update`` callback (None when quiet)."""

    def __init__(self, console: Console, quiet: bool, max_time_s: float, max_iterations: int,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.console, self.quiet = console, quiet
        self.max_time_s, self.max_iterations = max_time_s, max_iterations
        self.now = now
        self.start = now()
        self.last_plain = -math.inf
        self.bar = Progress(TextColumn("[bold]training"), BarColumn(), TextColumn("{task.fields[info]}"),
                            TimeElapsedColumn(), console=console, transient=True)
        self.task: Any = None

    def __enter__(self) -> Callable[[dict[str, Any]], None] | None:
        if self.quiet:
            return None
        self.start = self.now()
        if self.console.is_terminal:
            self.bar.start()
            self.task = self.bar.add_task("run", total=1.0, info="starting")
        return self.update

    def update(self, tick: dict[str, Any]) -> None:
        if tick.get("note"):  # something the user should read once (a fallback): a line that stays
            self.console.print(f"training: {tick['note']}", highlight=False, soft_wrap=True)
            return
        fraction = None if tick.get("status") else budget_fraction(tick, self.max_time_s, self.max_iterations)
        line = describe(tick, fraction, eta_s(fraction, self.now() - self.start))
        if self.task is not None:
            self.bar.update(self.task, completed=fraction or 0.0, info=line)
        elif self.now() - self.last_plain >= PLAIN_EVERY_S or tick.get("status"):
            self.last_plain = self.now()
            self.console.print(f"training: {line}", highlight=False, soft_wrap=True)

    def __exit__(self, *exc: Any) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=1.0)  # stopped at the target, or interrupted: the bar is done
            self.bar.stop()


def worker_table(summary: dict[str, Any], limit: int = COMPACT_ABOVE) -> Table:
    """Every worker, or beyond ``limit`` workers the quantiles and the slowest and fastest three."""
    workers = summary["per_worker"]
    title = f"shoal train: {summary['scheme']} on {summary['backend']} ({summary['stop_reason']})"
    table = Table(title=title)
    columns = ("iterations", "compute_s", "wait_s", "comm_s")
    if len(workers) <= limit:
        for col in ("worker", "group", "speed", "iterations", "compute s", "wait s", "comm s"):
            table.add_column(col, justify="right")
        for w in workers:
            table.add_row(str(w["id"]), str(w["group"]), f"{w['speed']:g}", *_cells(w, columns))
        return table
    table.title = f"{title}: {len(workers)} workers, quantiles and extremes by iterations"
    for col in ("", "worker", "speed", "iterations", "compute s", "wait s", "comm s"):
        table.add_column(col, justify="right")
    for label, q in (("min", 0.0), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("max", 1.0)):
        table.add_row(label, "", "", *(_fmt(key, _quantile([w[key] for w in workers], q)) for key in columns))
    ranked = sorted(workers, key=lambda w: (w["iterations"], w["id"]))
    for label, picked in (("slowest", ranked[:3]), ("fastest", ranked[-3:][::-1])):
        for w in picked:
            table.add_row(label, str(w["id"]), f"{w['speed']:g}", *_cells(w, columns))
    return table


def _quantile(values: Sequence[float], q: float) -> float:
    return float(np.quantile(values, q))


def _fmt(key: str, value: float) -> str:
    return f"{value:.0f}" if key == "iterations" else f"{value:.2f}"


def _cells(worker: dict[str, Any], columns: Sequence[str]) -> list[str]:
    return [_fmt(key, worker[key]) for key in columns]
