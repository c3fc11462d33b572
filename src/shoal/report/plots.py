"""The report's plots (matplotlib, Agg, no pyplot state): one function per figure, each writes a PNG.

Figures are built on ``matplotlib.figure.Figure`` directly, so nothing here
touches a display or pyplot's global figure list, and the functions are safe
to call from tests and scripts.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.colors import BoundaryNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: E402

from shoal.registry import SCHEMES  # noqa: E402
from shoal.report.units import fmt_seconds, human_bytes  # noqa: E402

SCHEME_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
GROUP_COLORS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#386cb0"]
COMPUTE, COMM, WAIT = "#4c72b0", "#dd8452", "#c9c9c9"
DPI = 110


MODIFIER_STYLES = ["-", "--", ":", "-."]


def scheme_style(name: str) -> tuple[str, str]:
    """(colour, line style) of a scheme spec, by name alone: ``base[+modifier...][@pins]``.

    Registered bases keep their colour everywhere (``SchemeSpec.color``); an unknown one gets a colour
    from a stable hash of its name. Each modifier combination gets its own
    line style (dashed for the first kind, dotted, dash-dot), so curves that
    coincide remain distinguishable.
    """
    base, _, rest = name.partition("+")
    base = base.split("@")[0]
    spec = SCHEMES.get(base)  # the same base scheme has the same colour in every report, its registered one
    color = (spec.color if spec is not None else None) or SCHEME_COLORS[zlib.crc32(base.encode()) % len(SCHEME_COLORS)]
    modifiers = rest.split("@")[0]
    style = MODIFIER_STYLES[0] if not modifiers else MODIFIER_STYLES[1 + zlib.crc32(modifiers.encode()) % 3]
    return color, style


def group_color(group: int) -> str:
    return GROUP_COLORS[group % len(GROUP_COLORS)]


def save_figure(fig: Figure, path: Path) -> Path:
    """The PNG the page embeds, and an SVG beside it (vector, for papers and slides)."""
    fig.savefig(path, dpi=DPI, facecolor="white")
    fig.savefig(path.with_suffix(".svg"), facecolor="white")
    return path


# -- (a) accuracy against time --------------------------------------------------------------


@dataclass
class Curve:
    """One run's test accuracy over time; ``faint`` for the extra seeds of a scheme."""

    name: str
    points: list[tuple[float, float]]
    color: str
    time_to_target: float | None = None
    style: str = "-"
    faint: bool = False
    band: tuple[list[float], list[float]] | None = None  # min and max over seeds at each point's time


def plot_accuracy(curves: Sequence[Curve], target: float | None, path: Path, time_label: str,
                  metric: str = "accuracy") -> Path:
    """The metric (test accuracy, or task.metric) against time for every scheme: the whole run, and a zoom on the
    region near the target."""
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    full, zoom = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    same = coinciding(curves)
    for ax in (full, zoom):
        for i, c in enumerate(curves):
            if not c.points:
                continue
            t, acc = zip(*c.points)
            label = None if c.faint or ax is zoom else _curve_label(c) + (f", the same curve as {same[i]}"
                                                                           if i in same else "")
            style = (0, (3, 3)) if i in same else c.style  # drawn dashed over the one it hides, so both show
            ax.plot(t, acc, color=c.color, ls=style, lw=0.9 if c.faint else 2.0, alpha=0.35 if c.faint else 1.0,
                    label=label, zorder=3 if i in same else 2)
            if c.band is not None:
                ax.fill_between(t, *c.band, color=c.color, alpha=0.15, lw=0)
            if c.time_to_target is not None and target is not None and not c.faint:
                ax.plot([c.time_to_target], [target], "o", color=c.color, ms=7, mec="white", mew=1.5, zorder=5)
        if target is not None:
            ax.axhline(target, color="#444", ls="--", lw=1,
                       label=None if ax is zoom else f"target {_metric_text(target, metric)}")
        ax.set_xlabel(time_label)
        ax.grid(alpha=0.3)
    accuracy = metric == "accuracy"
    full.set_ylabel(f"test {metric.replace('_', ' ')}")
    if accuracy:
        full.set_ylim(0, 1)
    full.set_title(f"Test {metric.replace('_', ' ')} over time (dot: target reached)")
    fig.legend(*full.get_legend_handles_labels(), loc="outside lower center", ncol=min(3, len(curves) + 1),
               fontsize=9, frameon=False)  # below both panels: never over a curve
    if accuracy:
        _zoom_near_target(zoom, curves, target)
    else:
        _zoom_near_lower_target(zoom, curves, target)
    return save_figure(fig, path)


def _metric_text(value: float, metric: str) -> str:
    return f"{value:.0%}" if metric == "accuracy" else f"{value:g}"


def plot_loss_and_bytes(loss: Sequence[Curve], by_bytes: Sequence[Curve], path: Path, time_label: str,
                        metric: str = "accuracy") -> Path:
    """Test loss against time, and the metric against the bytes every worker sent and received so far."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    for ax, curves in ((left, loss), (right, by_bytes)):
        for c in curves:
            if c.points:
                x, y = zip(*c.points)
                ax.plot(x, y, color=c.color, ls=c.style, lw=2.0, label=c.name)
        ax.grid(alpha=0.3)
    left.set_xlabel(time_label)
    left.set_ylabel("test loss")
    if all(y > 0 for c in loss for _, y in c.points) and any(c.points for c in loss):
        left.set_yscale("log")
        left.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:.3g}"))  # 0.2, 3: not 2x10^-1, 3x10^0
        left.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:.3g}" if f"{y:.1e}"[0] in "25" else ""))
    left.set_title("Test loss over time")
    right.set_xlabel("data sent and received, all workers (bytes, log)")
    right.set_ylabel(f"test {metric.replace('_', ' ')}")
    if any(x > 0 for c in by_bytes for x, _ in c.points):
        right.set_xscale("log")
        right.xaxis.set_major_formatter(lambda x, _: human_bytes(x))
        right.xaxis.set_minor_formatter(lambda x, _: human_bytes(x) if f"{x:.1e}"[0] in "25" else "")
    if metric == "accuracy":
        right.set_ylim(0, 1)
    right.set_title(f"{metric.replace('_', ' ').capitalize()} against data moved (left = cheaper)")
    source = left if any(c.points for c in loss) else right
    fig.legend(*source.get_legend_handles_labels(), loc="outside lower center", ncol=min(6, max(1, len(loss))),
               fontsize=9, frameon=False)  # one legend for both panels, below them
    return save_figure(fig, path)


def median_band(curves: Sequence[Sequence[tuple[float, float]]],
                points: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeds' accuracy curves on one time grid: (t, median, min, max), linearly interpolated.

    The grid runs to the longest curve's end; a curve that ended earlier (a run stopped at its target) is held at
    its last value, which is where that run stood.
    """
    curves = [c for c in curves if c]
    if not curves:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    end = max(c[-1][0] for c in curves)
    start = min(c[0][0] for c in curves)
    t = np.linspace(start, end, points) if end > start else np.array([start])
    held = np.array([np.interp(t, *zip(*c)) if len(c) > 1 else np.full(len(t), c[0][1]) for c in curves])
    return t, np.median(held, axis=0), held.min(axis=0), held.max(axis=0)


def coinciding(curves: Sequence[Curve]) -> dict[int, str]:
    """Curves whose points equal an earlier curve's (BSP with in-network aggregation on an idle network draws
    exactly BSP's curve): index -> the name of the curve it would hide."""
    seen: dict[tuple, str] = {}
    same = {}
    for i, c in enumerate(curves):
        if not c.points or c.faint:
            continue
        key = tuple(c.points)
        if key in seen:
            same[i] = seen[key]
        else:
            seen[key] = c.name
    return same


def _curve_label(c: Curve) -> str:
    reached = "target not reached" if c.time_to_target is None else f"target at {fmt_seconds(c.time_to_target)}"
    return f"{c.name} ({reached})"


def _zoom_near_target(ax: Any, curves: Sequence[Curve], target: float | None) -> None:
    accs = [a for c in curves for _, a in c.points]
    if not accs:
        return
    top = max(accs)
    low = min(target, top) - 0.08 if target is not None else top - 0.1
    ax.set_ylim(max(0.0, low), min(1.0, max(top, target or 0) + 0.01))
    ax.set_title("Zoom: near the target")


def _zoom_near_lower_target(ax: Any, curves: Sequence[Curve], target: float | None) -> None:
    """A metric where lower is better (loss, bits per byte): from the best value to a little above the target."""
    ends = [c.points[-1][1] for c in curves if c.points]
    if not ends:
        return
    values = [v for c in curves for _, v in c.points]
    low = min(values) if target is None else min(min(values), target)
    high = max(min(ends), target if target is not None else min(ends))  # where the curves end, and the target
    span = max(high - low, 0.05 * max(abs(high), 1e-9))
    ax.set_ylim(low - 0.1 * span, high + 0.5 * span)
    ax.set_title("Zoom: near the target")


def plot_seed_times(rows: Sequence[tuple[str, list[float | None], float | None]], limit: float, path: Path,
                    time_label: str) -> Path:
    """Every seed's time to target as a point, one line per scheme, its median as a bar; a seed that never
    reached the target sits at the right edge as a cross (so a median hides nothing)."""
    fig = Figure(figsize=(12, 1.0 + 0.5 * len(rows)), layout="constrained")
    ax = fig.subplots()
    jitter = np.random.default_rng(0)
    for y, (name, times, median) in enumerate(rows):
        color, _ = scheme_style(name)
        reached = [t for t in times if t is not None]
        ax.scatter(reached, y + jitter.uniform(-0.15, 0.15, len(reached)), color=color, s=22, alpha=0.8, zorder=3)
        never = len(times) - len(reached)
        if never:
            ax.scatter([limit] * never, y + jitter.uniform(-0.15, 0.15, never), color=color, marker="x", s=30,
                       zorder=3)
        if median is not None:
            ax.plot([median, median], [y - 0.3, y + 0.3], color=color, linewidth=2.5, zorder=2)
    ax.set_yticks(range(len(rows)), [name for name, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, limit * 1.03)
    ax.axvline(limit, color="#999", linewidth=0.8, linestyle=":")
    ax.set_xlabel(f"time to target ({time_label}); x at the right edge: never reached within the budget")
    ax.set_title("Every seed's time to target (bar: median)")
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path)


# -- (b) where worker time went ---------------------------------------------------------------


def plot_time_split(rows: Sequence[tuple[str, list[dict[str, Any]]]], path: Path) -> Path:
    """One stacked bar per scheme: the share of all worker time spent computing, communicating, waiting."""
    fig = Figure(figsize=(12, 0.9 + 0.55 * len(rows)), layout="constrained")
    ax = fig.subplots()
    names = [name for name, _ in rows]
    for y, (_, workers) in enumerate(rows):
        left = 0.0
        for key, color in (("compute_s", COMPUTE), ("comm_s", COMM), ("wait_s", WAIT)):
            share = _share(workers, key)
            ax.barh(y, share, left=left, color=color, height=0.6, edgecolor="white")
            if share >= 0.06:
                ax.text(left + share / 2, y, f"{share:.0%}", ha="center", va="center", fontsize=9,
                        color="white" if color != WAIT else "#333")
            left += share
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of all workers' time")
    ax.set_title("Where the workers' time went")
    handles = [Patch(color=COMPUTE, label="computing"), Patch(color=COMM, label="communicating"),
               Patch(color=WAIT, label="waiting")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
    return save_figure(fig, path)


def _share(workers: list[dict[str, Any]], key: str) -> float:
    total = sum(w["compute_s"] + w["comm_s"] + w["wait_s"] for w in workers)
    return sum(w[key] for w in workers) / total if total > 0 else 0.0


# -- (e) SIM periods -----------------------------------------------------------------------------


MAX_SIM_COLUMNS = 1500
MAX_SIM_PANELS = 8


def plot_sim_heatmap(events: Sequence[Mapping[str, Any]], path: Path, *, title: str | None = None,
                     time_label: str = "time (s)") -> Path:
    """Heat-map of SIM's aggregation period tau per tensor over time, one panel per group.

    ``events`` are "sim" records ({t, group, names, tau, ...}; other events
    are ignored). A column lasts from one record of its group to the next, so
    irregular record times are drawn to scale. Raises ValueError when there is
    no sim record.
    """
    sim = [e for e in events if e.get("event", "sim") == "sim" and e.get("names")]
    if not sim:
        raise ValueError("no SIM events to plot")
    by_group: dict[int, list[Mapping[str, Any]]] = {}
    for e in sorted(sim, key=lambda e: e["t"]):
        by_group.setdefault(int(e.get("group") or 0), []).append(e)
    groups = sorted(by_group)[:MAX_SIM_PANELS]
    max_tau = max(max((int(v) for v in e["tau"] if v is not None), default=1) for e in sim)
    names = _tensor_names(sim)
    fig = Figure(figsize=(12, 1.3 + len(groups) * max(1.4, 0.24 * len(names))), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(groups), 1, sharex=True, squeeze=False)[:, 0])
    cmap = matplotlib.colormaps["viridis"].resampled(max_tau)
    norm = BoundaryNorm(np.arange(0.5, max_tau + 1.5), cmap.N)
    mesh = None
    for ax, g in zip(axes, groups):
        mesh = _sim_panel(ax, by_group[g], names, cmap, norm)
        ax.set_title(f"group {g}: {human_bytes(_bytes_saved(by_group[g]))} saved", loc="left", fontsize=10)
    axes[-1].set_xlabel(time_label)
    bar = fig.colorbar(mesh, ax=list(axes), ticks=range(1, max_tau + 1), fraction=0.03, pad=0.01)
    bar.set_label("aggregation period τ (iterations)")
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


def _tensor_names(events: Sequence[Mapping[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for e in events:
        names.update(dict.fromkeys(e["names"]))
    return list(names)


def _sim_panel(ax: Any, events: list[Mapping[str, Any]], names: list[str], cmap: Any, norm: Any) -> Any:
    """One group's tau matrix (tensors x records) drawn with each record's own time span."""
    step = max(1, -(-len(events) // MAX_SIM_COLUMNS))
    events = events[::step]
    index = {name: i for i, name in enumerate(names)}
    tau = np.full((len(names), len(events)), np.nan)
    for j, e in enumerate(events):
        for name, value in zip(e["names"], e["tau"]):
            if value is not None:
                tau[index[name], j] = value
    times = np.array([float(e["t"]) for e in events])
    gap = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    edges = np.append(times, times[-1] + (gap if gap > 0 else 1.0))
    mesh = ax.pcolormesh(edges, np.arange(len(names) + 1), np.ma.masked_invalid(tau), cmap=cmap, norm=norm,
                         shading="flat", rasterized=True)
    ax.set_yticks(np.arange(len(names)) + 0.5, names, fontsize=8)
    ax.set_ylim(len(names), 0)
    return mesh


def _bytes_saved(events: list[Mapping[str, Any]]) -> float:
    last = events[-1].get("bytes_saved") or []
    return float(sum(v for v in last if v is not None))
