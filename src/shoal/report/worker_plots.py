"""The report's per-worker figures: who computed, communicated and waited when (the timeline), and each worker's
batch size under ``sync.balance``. Split from plots.py, whose helpers (colours, saving) they share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from shoal.report.plots import group_color, save_figure  # (plots selects the Agg backend first)
from shoal.report.runs import segments

MAX_TIMELINE_WORKERS = 32


# -- (c) per-worker timeline ---------------------------------------------------------------------


@dataclass
class Timeline:
    """One run's iterations inside a window, with what is needed to label them."""

    name: str
    iterations: list[dict[str, Any]]
    speeds: list[float]
    window: tuple[float, float]
    marks: list[tuple[float, str]]  # (time, label): groups formed, regroups, run ended


def plot_timeline(tl: Timeline, path: Path, time_label: str) -> tuple[Path, float]:
    """Gantt chart of each worker's wait / pull / compute / push; returns the path and the compute share."""
    fig, share = timeline_figure(tl, time_label)
    return save_figure(fig, path), share


def timeline_figure(tl: Timeline, time_label: str) -> tuple[Figure, float]:
    """The figure plot_timeline saves, laid out, with the compute share of its window."""
    workers = pick_workers(tl.speeds, MAX_TIMELINE_WORKERS)
    row = {w: i for i, w in enumerate(workers)}
    fig = Figure(figsize=(12, 1.5 + 0.3 * len(workers)), layout="constrained")
    FigureCanvasAgg(fig)  # measured label placement needs a renderer
    ax = fig.subplots()
    bars: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    for event in tl.iterations:
        if event["worker"] in row:
            for kind, start, duration in segments(event):
                bars.setdefault((event["worker"], kind, int(event.get("group") or 0)), []).append((start, duration))
    groups_seen = sorted({g for _, _, g in bars})
    for (w, kind, g), spans in bars.items():
        _draw(ax, row[w], kind, group_color(g), spans)
    share = _compute_share(bars, tl.window, len(workers))
    marks = _decorate_timeline(ax, tl, workers, time_label, share, len(tl.speeds))
    kinds = {kind for _, kind, _ in bars}
    fig.legend(handles=_timeline_legend(groups_seen, kinds), loc="outside lower center",
               ncol=min(len(groups_seen) + 2, 6),
               frameon=False, fontsize=9)
    _stack_marks(fig, ax, marks)
    return fig, share


def _draw(ax: Any, y: int, kind: str, color: str, spans: list[tuple[float, float]]) -> None:
    if kind == "compute":
        ax.broken_barh(spans, (y - 0.36, 0.72), facecolors=color, edgecolor="white", linewidth=0.3)
    elif kind == "comm":
        ax.broken_barh(spans, (y - 0.36, 0.72), facecolors="#222222")
    else:
        ax.broken_barh(spans, (y - 0.12, 0.24), facecolors=color, alpha=0.35)


def _compute_share(bars: dict[tuple[int, str, int], list[tuple[float, float]]], window: tuple[float, float],
                   workers: int) -> float:
    t0, t1 = window
    busy = sum(max(0.0, min(s + d, t1) - max(s, t0)) for (_, kind, _), spans in bars.items() if kind == "compute"
               for s, d in spans)
    return busy / (workers * (t1 - t0)) if t1 > t0 and workers else 0.0


def _decorate_timeline(ax: Any, tl: Timeline, workers: list[int], time_label: str, share: float, total: int) -> list[Any]:
    labels = [f"w{w} ({tl.speeds[w]:g}x)" if w < len(tl.speeds) else f"w{w}" for w in workers]
    ax.set_yticks(range(len(workers)), labels)
    ax.set_ylim(len(workers) - 0.5, -0.5)
    ax.set_xlim(*tl.window)
    shown = sorted(m for m in tl.marks if tl.window[0] <= m[0] <= tl.window[1])
    levels = _mark_levels([t for t, _ in shown], tl.window)
    marks = []
    for (t, label), level in zip(shown, levels):
        ax.axvline(t, color="#000", ls=":", lw=1.2)
        marks.append(ax.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"), xytext=(2, 2 + MARK_LINE * level),
                                 textcoords="offset points", fontsize=8, va="bottom", ha="left", annotation_clip=False))
    ax.set_xlabel(time_label)
    ax.set_ylabel("worker (slowdown)")
    subset = f", {len(workers)} of {total} workers shown" if len(workers) < total else ""
    ax.set_title(f"{tl.name}: workers computed {share:.0%} of the time in this window{subset}", loc="left",
                 pad=16 + MARK_LINE * max(levels, default=0))
    ax.grid(axis="x", alpha=0.3)
    return marks


MARK_LINE = 11  # points between stacked mark labels


def _stack_marks(fig: Figure, ax: Any, marks: list[Any]) -> None:
    """After layout, put each mark's label on the lowest line where it overlaps no label before it; the title clears them."""
    if not marks:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    top = 0
    for text in marks:
        for level in range(len(marks)):
            text.xyann = (2, 2 + MARK_LINE * level)
            box = text.get_window_extent(renderer).expanded(1.02, 1.0)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(box)
        top = max(top, level)
    ax.set_title(ax.get_title(loc="left"), loc="left", pad=16 + MARK_LINE * top)


def _mark_levels(times: list[float], window: tuple[float, float], gap: float = 0.09) -> list[int]:
    """Label heights for vertical marks: a mark closer than ``gap`` (of the window) to the one before goes a line up."""
    levels: list[int] = []
    last: dict[int, float] = {}
    width = max(window[1] - window[0], 1e-12)
    for t in times:
        level = next(lv for lv in range(len(times) + 1) if lv not in last or (t - last[lv]) / width >= gap)
        last[level] = t
        levels.append(min(level, 3))
    return levels


def _timeline_legend(groups: list[int], kinds: set[str]) -> list[Patch]:
    """Swatches for what the chart draws, and only that: waiting is a thin bar in the group's own pale colour."""
    handles = [Patch(color=group_color(g), label=f"compute, group {g}") for g in groups]
    if "comm" in kinds:
        handles.append(Patch(color="#222222", label="communication"))
    if kinds - {"compute", "comm"}:
        handles.append(Patch(color=group_color(groups[0] if groups else 0), alpha=0.35,
                             label="waiting (thin pale bar, the group's colour)"))
    return handles


def plot_batch_sizes(name: str, resizes: Sequence[Mapping[str, Any]], speeds: Sequence[float], per_worker: int,
                     end_t: float, path: Path, time_label: str, unit: str = "batch") -> Path:
    """sync.balance: each worker's batch size (``unit`` "batch") or local steps between averagings ("steps")
    over time, a step line per worker from ``per_worker`` at 0 (data.batch_size, or H)."""
    workers = pick_workers(speeds, MAX_TIMELINE_WORKERS) if speeds else sorted(
        {int(w) for r in resizes for w in r["sizes"]})
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"]
    slowest = max(speeds, default=1.0)
    for w in workers:
        times, sizes = [0.0], [per_worker]
        for r in resizes:
            if str(w) in r["sizes"]:
                times.append(float(r["t"]))
                sizes.append(int(r["sizes"][str(w)]))
        times.append(max(end_t, times[-1]))
        sizes.append(sizes[-1])
        speed = speeds[w] if w < len(speeds) else 1.0
        ax.step(times, sizes, where="post", lw=1.4, color=cmap(0.9 * math.log(speed) / math.log(slowest))
                if slowest > 1 else cmap(0.0), label=f"w{w} ({speed:g}x)")
    ax.set_xlabel(time_label)
    steps = unit == "steps"
    ax.set_ylabel("local steps between averagings" if steps else "batch size (samples)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    resized = f"{len(resizes)} resize{'s' if len(resizes) != 1 else ''}"
    ax.set_title(f"{name}: each worker's {'local steps' if steps else 'batch'}, sized to its measured speed "
                 f"({resized})", loc="left")
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, ncol=min(len(workers), 8), loc="outside lower center", frameon=False)
    return save_figure(fig, path)


def pick_workers(speeds: Sequence[float], limit: int) -> list[int]:
    """Every worker, or ``limit`` of them spread evenly over the speed order (so every tier stays visible)."""
    n = len(speeds)
    if n <= limit:
        return list(range(n))
    by_speed = sorted(range(n), key=lambda w: (speeds[w], w))
    chosen = {by_speed[round(i * (n - 1) / (limit - 1))] for i in range(limit)}
    return sorted(chosen)
