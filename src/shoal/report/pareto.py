"""Bytes against time to target: every scheme's seeds and medians, and the Pareto front of the medians.

A low-communication scheme trades time for traffic; whether it is worth it
depends on the link. The front answers "which schemes are not beaten on both
at once": a scheme is on it when no other reaches the target at most as late
*and* with at most as many bytes, better in one. Seeds that never reached
the target have neither number and are counted in the legend.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from shoal.report.plots import save_figure, scheme_style  # (plots selects the Agg backend first)
from shoal.report.units import human_bytes


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "p", "<", ">")  # a study of up to 12 rows: no two alike


@dataclass(frozen=True)
class Point:
    """One scheme on the bytes-time plane: each reached seed's (time, bytes), the medians, seeds that missed."""

    scheme: str
    seeds: tuple[tuple[float, float], ...]
    median: tuple[float, float] | None
    missed: int = 0


def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """The names of the non-dominated ``(name, time, bytes)`` points, fastest first."""
    front = []
    for name, t, b in points:
        dominated = any(t2 <= t and b2 <= b and (t2 < t or b2 < b) for _, t2, b2 in points)
        if not dominated:
            front.append((t, b, name))
    return [name for _, _, name in sorted(front)]


def points_of(rows: Sequence[dict]) -> list[Point]:
    """The plane's points from compare.json rows (one seed or several)."""
    out = []
    for row in rows:
        runs = row.get("seeds") or [row]
        seeds = tuple((r["time_to_target_s"], r["bytes_to_target"]) for r in runs
                      if r.get("time_to_target_s") is not None and r.get("bytes_to_target") is not None)
        t, b = row.get("time_to_target_s"), row.get("bytes_to_target")
        out.append(Point(row["scheme"], seeds, (t, b) if t is not None and b is not None else None,
                         len(runs) - len(seeds)))
    return out


def plot_pareto(points: Sequence[Point], path: Path, time_label: str) -> Path | None:
    """Small dots: seeds; large: medians; the line joins the medians on the front. None when nothing reached."""
    if not any(p.seeds for p in points):
        return None
    fig = Figure(figsize=(9, 5.5 + 0.25 * len(points)), layout="constrained")
    ax = fig.subplots()
    for p, marker in zip(points, itertools.cycle(MARKERS)):
        color, _ = scheme_style(p.scheme)  # variants of one scheme share its colour: the marker tells them apart
        label = p.scheme + (f" ({p.missed} seed{'s' if p.missed > 1 else ''} missed)" if p.missed else "")
        label = textwrap.fill(label if p.median is not None else label + ": median not reached", 90)
        if p.seeds:
            ax.scatter([t for t, _ in p.seeds], [b for _, b in p.seeds], color=color, marker=marker, s=16,
                       alpha=0.45, zorder=2)
        ax.scatter([p.median[0]] if p.median else [], [p.median[1]] if p.median else [], color=color, marker=marker,
                   s=100, edgecolor="black", zorder=4, label=label)
    medians = [(p.scheme, *p.median) for p in points if p.median is not None]
    front = {name: (t, b) for name, t, b in medians if name in pareto_front(medians)}
    if len(front) > 1:
        xs, ys = zip(*sorted(front.values()))
        ax.step(xs, ys, where="post", color="#444", linewidth=1.2, linestyle="--", zorder=3, label="Pareto front")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(lambda y, _: human_bytes(y))
    ax.yaxis.set_minor_formatter(lambda y, _: human_bytes(y) if f"{y:.1e}"[0] in "25" else "")
    ax.set_xlabel(f"time to target ({time_label})")
    ax.set_ylabel("bytes sent and received by then, all workers (log)")
    ax.set_title("Bytes against time to target (large: median; small: each seed)")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncol=1, frameon=False, fontsize=8)
    return save_figure(fig, path)
