"""Draw a topology with routing plans: who aggregates where, and how loaded things are.

Tiers are stacked by hop distance from the hosts (top-of-rack just above the
hosts, then aggregation, then core/spine); only the PS and the workers are
drawn among the hosts. Aggregation switches are large squares sized by their
worker count and coloured by utilisation; loaded links are coloured by
utilisation and thickened by their stream count. One panel per plan.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import networkx as nx
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LinearSegmentedColormap, Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from shoal.errors import ConfigError
from shoal.network.algorithms import Result
from shoal.network.evaluator import Evaluation
from shoal.network.instance import Instance

CMAP = LinearSegmentedColormap.from_list("utilisation", ["#1a9850", "#a6d96a", "#fdae61", "#d73027", "#67001f"], N=256)
# green idle, orange exactly full (utilisation 1, the centre of the norm), red to dark red overloaded


def _natural(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def layout(inst: Instance) -> dict[str, tuple[float, float]]:
    """Positions: switches layered by distance from the hosts, hosts fanned under their switch."""
    g = inst.graph
    shown_hosts = [inst.ps, *inst.workers]
    sw = [n for n, d in g.nodes(data=True) if d["kind"] == "switch"]
    host_set = [n for n, d in g.nodes(data=True) if d["kind"] == "host"]
    level = nx.multi_source_dijkstra_path_length(g, host_set) if host_set else {}
    layers: dict[int, list[str]] = {}
    for s in sw:
        layers.setdefault(int(level.get(s, 1)), []).append(s)
    pos: dict[str, tuple[float, float]] = {}
    for depth, nodes in layers.items():
        nodes.sort(key=_natural)
        for i, s in enumerate(nodes):
            pos[s] = ((i + 0.5) / len(nodes), float(depth))
    for h in sorted(shown_hosts, key=_natural):
        parents = sorted((v for v in g[h] if v in pos), key=_natural)
        x = pos[parents[0]][0] if parents else 0.5
        pos[h] = (x, 0.0)
    _fan_hosts(pos, shown_hosts)
    return pos


def _fan_hosts(pos: dict[str, tuple[float, float]], hosts: Sequence[str]) -> None:
    """Spread hosts that share a switch so that they do not overlap."""
    groups: dict[float, list[str]] = {}
    for h in hosts:
        groups.setdefault(pos[h][0], []).append(h)
    width = 0.8 / max(len(groups), 1)
    for x, members in groups.items():
        members.sort(key=_natural)
        for i, h in enumerate(members):
            dx = (i - (len(members) - 1) / 2) * width / max(len(members), 1)
            pos[h] = (x + dx, -0.35 * (i % 2))


def draw_plans(inst: Instance, results: Sequence[Result], path: str | Path) -> None:
    """Write one PNG with a panel per result (an algorithm that ran out of time with no plan has none)."""
    plan_figure(inst, results).savefig(path, dpi=110)


def plan_figure(inst: Instance, results: Sequence[Result]) -> Figure:
    """The figure draw_plans saves, laid out, labels decluttered."""
    results = [r for r in results if not r.timed_out]
    if not results:
        raise ConfigError("--plot: no algorithm returned a plan within the time limit, so there is nothing to draw")
    cols = 1 if len(results) == 1 else 2
    rows = math.ceil(len(results) / cols)
    fig = Figure(figsize=(9 * cols, 5.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    pos = layout(inst)
    norm = utilisation_norm(results)
    panels: list[tuple[Axes, Labels]] = []
    for i, res in enumerate(results):
        ax = fig.add_subplot(rows, cols, i + 1)
        panels.append((ax, _panel(ax, inst, res, pos, norm)))
    fig.colorbar(ScalarMappable(norm, CMAP), ax=fig.axes, shrink=0.6, label="utilisation at the plan's claimed rate (>1 = overloaded)")
    fig.legend(handles=_legend(), loc="outside lower center", ncols=6 if cols == 2 else 3, fontsize=8, frameon=False)
    fig.suptitle(f"{inst.graph.graph.get('name', 'topology')}: {len(inst.workers)} workers, PS {inst.ps}, "
                 f"{len(inst.programmable)} programmable switches, B={inst.ps_gbps:g} Gbps, T={inst.worker_gbps:g} Gbps", fontsize=12)
    _declutter(fig, panels)
    return fig


def utilisation_norm(results: Sequence[Result]) -> TwoSlopeNorm:
    """Colours from 0 to the worst overload any plan shows (at least 2x), white-ish at 1: 14x stays 14x."""
    evaluations = [r.evaluation for r in results if r.evaluation is not None]
    worst = max([2.0] + [u for ev in evaluations for u in (ev.max_link_utilisation, ev.max_switch_utilisation)
                         if u is not None and math.isfinite(u)])
    return TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=math.ceil(worst))


def _panel(ax: Axes, inst: Instance, res: Result, pos: dict[str, tuple[float, float]], norm: Normalize) -> Labels:
    g, ev = inst.graph, res.evaluation
    assert ev is not None and res.plan is not None  # draw_plans leaves out results without a plan
    shown = set(pos)
    faint = [(pos[u], pos[v]) for u, v in g.edges() if u in shown and v in shown]
    for (x0, y0), (x1, y1) in faint:
        ax.plot([x0, x1], [y0, y1], color="0.88", lw=0.4, zorder=0)
    cmap = CMAP
    load: dict[frozenset[str], tuple[int, float]] = {}
    for (u, v), n in ev.link_streams.items():
        util = ev.link_utilisation.get((u, v), math.nan)
        key = frozenset((u, v))
        old = load.get(key, (0, 0.0))
        load[key] = (old[0] + n, max(old[1], 0.0 if math.isnan(util) else util))
    for key, (n, util) in load.items():
        u, v = tuple(key)
        if u in pos and v in pos:
            ax.plot([pos[u][0], pos[v][0]], [pos[u][1], pos[v][1]], color=cmap(norm(util)), lw=0.6 + 1.2 * math.log2(1 + n), zorder=1, alpha=0.85)
    labels = _switches(ax, inst, ev, pos, norm)
    _hosts(ax, inst, res, pos)
    n_viol = len(ev.violations)
    worst = max((v.factor for v in ev.violations), default=None)
    bound = f", bound {res.bound_gbps:.1f}" if res.bound_gbps is not None else ""
    viol = f", {n_viol} violations (worst x{worst:.2f})" if n_viol and worst is not None and math.isfinite(worst) else (f", {n_viol} violations" if n_viol else ", no violations")
    ax.set_title(f"{res.algo}: honest rate {ev.min_rate_gbps:.2f} Gbps{bound}; {len(ev.switch_workers)} aggregating switches, {ev.ps_streams} PS streams{viol}", fontsize=9.5)
    ax.set_axis_off()
    top = max(y for _, y in pos.values())
    ax.set_ylim(-0.6, top + 0.45)
    return labels


def _switches(ax: Axes, inst: Instance, ev: Evaluation, pos: dict[str, tuple[float, float]], norm: Normalize) -> Labels:
    g = inst.graph
    prog = set(inst.programmable)
    plain = [s for s in pos if g.nodes[s]["kind"] == "switch" and s not in prog]
    idle = [s for s in prog if s not in ev.switch_workers]
    ax.scatter([pos[s][0] for s in plain], [pos[s][1] for s in plain], s=14, marker="s", color="0.7", zorder=2)
    ax.scatter([pos[s][0] for s in idle], [pos[s][1] for s in idle], s=22, marker="s", facecolor="white", edgecolor="0.2", lw=0.8, zorder=2)
    used = list(ev.switch_workers)
    ax.scatter([pos[s][0] for s in used], [pos[s][1] for s in used], s=[_size(ev.switch_inputs[s]) for s in used],
               marker="s", c=[ev.switch_utilisation[s] for s in used], cmap=CMAP, norm=norm, edgecolor="black", lw=1.0, zorder=3)
    labels = []
    for s in sorted(used, key=lambda s: (-ev.switch_inputs[s], s)):  # the busiest switches are labelled first
        gap = 4 + 0.5 * math.sqrt(_size(ev.switch_inputs[s]))
        children = ev.switch_inputs[s] - ev.switch_workers[s]
        label = f"{s}: {ev.switch_workers[s]}w" + (f" + {children} switch streams" if children else "")
        text = ax.annotate(label, pos[s], textcoords="offset points", xytext=(0, gap), ha="center", fontsize=7, zorder=4,
                           bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
        labels.append((text, [(0, gap), (0, -1.6 * gap), (gap + 14, 0), (-gap - 14, 0), (0, 2.6 * gap), (0, -3 * gap)]))
    return labels


Labels = list[tuple[Any, list[tuple[float, float]]]]  # a panel's switch labels, each with the places it may go


def _declutter(fig: Figure, panels: list[tuple[Axes, Labels]]) -> None:
    """After layout: move each switch label to the first of its places that overlaps no label kept so far; hide it if none.

    Labels go busiest switch first, so a hidden label is a lightly used
    switch; each panel says how many it hid.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax, labels in panels:
        kept: list[Any] = []
        hidden = 0
        for text, places in labels:
            for place in places:
                text.xyann = place
                box = text.get_window_extent(renderer).expanded(1.05, 1.1)
                if not any(box.overlaps(other) for other in kept):
                    kept.append(box)
                    break
            else:
                text.set_visible(False)
                hidden += 1
        if hidden:
            ax.text(0.995, 0.005, f"{hidden} switch label(s) hidden where they would overlap", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=7, color="0.35")


def _size(inputs: int) -> float:
    """Marker area of an aggregating switch: grows with its input streams, but stays on the page."""
    return 40 + 40 * math.sqrt(inputs)


def _hosts(ax: Axes, inst: Instance, res: Result, pos: dict[str, tuple[float, float]]) -> None:
    direct = [w for w, a in res.plan.assignment.items() if a == inst.ps]
    agg = [w for w, a in res.plan.assignment.items() if a != inst.ps]
    ax.scatter([pos[w][0] for w in agg], [pos[w][1] for w in agg], s=9, color="tab:blue", zorder=3)
    ax.scatter([pos[w][0] for w in direct], [pos[w][1] for w in direct], s=9, color="tab:orange", zorder=3)
    ax.scatter([pos[inst.ps][0]], [pos[inst.ps][1]], s=180, marker="*", color="crimson", edgecolor="black", zorder=4)
    ax.annotate(f"PS {inst.ps}", pos[inst.ps], textcoords="offset points", xytext=(0, -13), ha="center", fontsize=7, color="crimson")


def _legend() -> list[Line2D]:
    def mk(marker: str, **kw: object) -> Line2D:
        return Line2D([], [], marker=marker, linestyle="none", **kw)

    return [
        mk("*", color="crimson", markersize=11, label="PS"),
        mk("s", color="#fdae61", markeredgecolor="black", markersize=9, label="aggregating switch (size: input streams; label: workers; colour: utilisation)"),
        mk("s", markerfacecolor="white", markeredgecolor="0.2", markersize=6, label="programmable, unused"),
        mk("s", color="0.7", markersize=5, label="not programmable"),
        mk("o", color="tab:blue", markersize=4, label="worker aggregated in-network"),
        mk("o", color="tab:orange", markersize=4, label="worker sent to the PS"),
    ]
