"""report.html: one self-contained page (PNGs inlined as data URIs, inline CSS, no script) per comparison.

``write_report(DIR)`` reads DIR/compare.json and the run folders it names,
draws every PNG into DIR and writes DIR/report.html, so a report can be
rebuilt from the files alone. This module gathers the numbers and draws the
plots; the page itself is the Jinja2 template ``templates/report.html.j2``
(autoescaped: every value from a run is text, never markup).
"""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path
from typing import Any

from shoal.report import pareto, plots, worker_plots
from shoal.report.page import template
from shoal.report.routing import draw_plan, routing_data
from shoal.report.runs import RunData, iterations_in, load_run, timeline_window
from shoal.report.tuning import grid_edges
from shoal.report.units import fmt_seconds, human_bytes

MAX_GROUP_EVENTS = 25


def write_report(out: Path) -> Path:
    """Draw the plots into ``out`` and write ``out``/report.html; returns its path."""
    compare = json.loads((out / "compare.json").read_text())
    rows = compare["rows"]
    runs = [load_run(row["scheme"], out / row["run_dir"]) for row in rows]
    label = time_label(compare.get("backend"))
    sections = [part for part in (
        _accuracy_section(out, compare, rows, runs, label),
        _loss_bytes_section(out, compare, rows, runs, label),
        _table_section(out, compare, rows, runs),
        _tuning_section(compare, rows),
        _timeline_section(out, runs, label),
        _groups_section(runs),
        _sim_section(out, runs, label),
        _routing_section(out, runs),
    ) if part]
    for part in sections:
        part["nav"] = NAV[part["anchor"]]
    page = template().render(
        title=_title(compare), setup=describe_setup(_config(out, rows), compare),
        headline=headline(rows, goal_of(compare), compare.get("backend")), sections=sections,
        footer=_footer(compare, rows))
    path = out / "report.html"
    path.write_text(page)
    return path


def time_label(backend: str | None) -> str:
    return "wall-clock time (s)" if backend == "ray" else "virtual time (s)"


def _title(compare: dict[str, Any]) -> str:
    return f"shoal compare: {', '.join(compare['schemes'])}"


def _config(out: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    path = out / rows[0]["run_dir"] / "config.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def _img(path: Path, alt: str) -> dict[str, str]:
    """An image to inline: its PNG as base64, its alt text and its file name."""
    return {"data": base64.b64encode(path.read_bytes()).decode("ascii"), "alt": alt, "name": path.name}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


# -- header ---------------------------------------------------------------------------------------


NAV = {"accuracy": "Accuracy", "loss": "Loss and bytes", "results": "Results", "tuning": "Tuning",
       "timeline": "Timelines", "groups": "Groups", "sim": "SIM", "routing": "Routing"}


def describe_setup(cfg: dict[str, Any], compare: dict[str, Any]) -> str:
    """One sentence: model, data, cluster, stragglers, budget."""
    model, data, cluster, run = (cfg.get(k, {}) for k in ("model", "data", "cluster", "run"))
    parts = [f"{model.get('name', '?')} on {data.get('name', '?')}",
             f"{cluster.get('workers', '?')} workers ({_speeds_text(cluster)})"]
    stragglers = cluster.get("stragglers", {})
    if stragglers.get("probability"):
        parts.append(f"transient stragglers ({stragglers['probability']:.0%} chance per iteration of a "
                     f"{_g(stragglers.get('slowdown'))}x slow spell)")
    unit = "wall" if compare.get("backend") == "ray" else "virtual"
    parts.append(f"budget {_g(run.get('max_time_s'))} {unit} seconds")
    seeds = compare.get("seeds", 1)
    parts.append(f"{seeds} seeds (medians shown)" if seeds > 1 else f"seed {run.get('seed', 0)}")
    return "; ".join(parts) + f"; {compare.get('backend', 'sim')} backend."


def _g(value: Any) -> str:
    """A number in the shortest form, or '?' when a hand-edited config lacks it."""
    return f"{value:g}" if isinstance(value, (int, float)) else "?"


def _speeds_text(cluster: dict[str, Any]) -> str:
    speeds, profile = cluster.get("speeds"), cluster.get("profile", "uniform")
    if speeds and len(speeds) <= 16:
        return f"slowdowns {', '.join(f'{s:g}' for s in speeds)}"
    if speeds:
        return f"slowdowns from {min(speeds):g} to {max(speeds):g}"
    if profile == "tiers":
        return f"tiers of slowdown {', '.join(f'{s:g}' for s in cluster.get('tiers', []))}"
    return f"{profile} speeds"


def goal_of(compare: dict[str, Any]) -> tuple[str, float | None]:
    """The comparison's metric and its target: accuracy and target_accuracy, or task.metric and run.target."""
    metric = compare.get("metric") or "accuracy"
    target = compare.get("target")
    if target is None and metric == "accuracy":
        target = compare.get("target_accuracy")
    return metric, target


def _goal_text(goal: tuple[str, float | None]) -> str:
    metric, target = goal
    if target is None:
        return "the target"
    return f"{target:.0%} test accuracy" if metric == "accuracy" else f"{target:g} {metric.replace('_', ' ')}"


def headline(rows: list[dict[str, Any]], goal: tuple[str, float | None] | float | None, backend: str | None) -> str:
    """The one-sentence result: which scheme reached the target first, and how that compares to BSP."""
    goal = _goal_text(goal if isinstance(goal, tuple) else ("accuracy", goal))
    unit = "wall-clock" if backend == "ray" else "virtual"
    reached = [r for r in rows if r.get("time_to_target_s") is not None]
    if all(r.get("final_accuracy") is None for r in rows):
        return "No accuracy was measured (cost-only runs); the table compares iterations and bytes."
    if not reached:
        return f"No scheme reached {goal} within the budget; the table compares the final values."
    best = min(reached, key=lambda r: r["time_to_target_s"])
    text = f"{best['scheme']} reached {goal} first, after {fmt_seconds(best['time_to_target_s'])} of {unit} time"
    bsp = next((r for r in rows if r["scheme"] == "bsp"), None)
    if best["scheme"] == "bsp":
        return text + "."
    if bsp is not None and best.get("speedup_vs_bsp") is not None:
        return text + f": {best['speedup_vs_bsp']:.1f}x sooner than BSP ({fmt_seconds(bsp['time_to_target_s'])})."
    if bsp is not None:
        return text + "; BSP did not reach it within the budget."
    return text + "."


# -- (a) accuracy -------------------------------------------------------------------------------

Section = dict[str, Any]


def _accuracy_section(out: Path, compare: dict[str, Any], rows: list[dict[str, Any]], runs: list[RunData],
                      label: str) -> Section:
    curves = []
    for row, run in zip(rows, runs):
        color, style = plots.scheme_style(row["scheme"])  # the same scheme looks the same in every report
        if len(row.get("seeds", [])) > 1:
            evals = [load_run(row["scheme"], out / seed["run_dir"]).evals for seed in row["seeds"]]
            t, median, lo, hi = plots.median_band(evals)
            curves.append(plots.Curve(row["scheme"], list(zip(t.tolist(), median.tolist())), color,
                                      row.get("time_to_target_s"), style, band=(lo.tolist(), hi.tolist())))
        else:
            curves.append(plots.Curve(row["scheme"], run.evals, color, row.get("time_to_target_s"), style))
    section: Section = {"anchor": "accuracy", "seeds": compare.get("seeds", 1), "image": None}
    metric, target = goal_of(compare)
    if any(c.points for c in curves):
        path = plots.plot_accuracy(curves, target, out / "accuracy.png", label, metric)
        section["image"] = _img(path, f"test {metric.replace('_', ' ')} against time for every scheme")
    return section


def _loss_bytes_section(out: Path, compare: dict[str, Any], rows: list[dict[str, Any]], runs: list[RunData],
                        label: str) -> Section | None:
    """Test loss over time and accuracy against bytes moved, one curve per scheme (its first seed)."""
    loss, by_bytes = [], []
    for row, run in zip(rows, runs):
        color, style = plots.scheme_style(row["scheme"])
        loss.append(plots.Curve(row["scheme"], run.losses, color, style=style))
        by_bytes.append(plots.Curve(row["scheme"], run.accuracy_by_bytes, color, style=style))
    if not any(c.points for c in loss + by_bytes):
        return None
    path = plots.plot_loss_and_bytes(loss, by_bytes, out / "loss_bytes.png", label, goal_of(compare)[0])
    front = pareto.plot_pareto(pareto.points_of(rows), out / "bytes_time.png", label)
    return {"anchor": "loss", "seeds": compare.get("seeds", 1),
            "image": _img(path, "test loss against time, and test accuracy against bytes moved, for every scheme"),
            "pareto": _img(front, "bytes moved against time to target, per seed and median, with the Pareto front")
            if front else None}


# -- (b) table ------------------------------------------------------------------------------------


def _table_section(out: Path, compare: dict[str, Any], rows: list[dict[str, Any]], runs: list[RunData]) -> Section:
    metric, target = goal_of(compare)
    exchange = any(r.get("bytes_exchange") for r in rows)
    tuned = bool(compare.get("tune_seeds") or compare.get("tune"))
    name = metric.replace("_", " ")
    heads = ["scheme"] + (["tuned"] if tuned else []) + [
        "time to target" if target is None else f"time to {target:.0%}" if metric == "accuracy" else
        f"time to {target:g} {name}", "speed-up vs BSP", f"final {name}", f"best {name}", "upload", "download"] + \
        (["group exchange"] if exchange else []) + ["iterations", "computing", "stopped"]
    best = min((r["time_to_target_s"] for r in rows if r.get("time_to_target_s") is not None), default=None)
    split = plots.plot_time_split([(r["scheme"], run.summary.get("per_worker") or []) for r, run in zip(rows, runs)],
                                  out / "time-split.png")
    seeds = None
    if any(r.get("seeds") for r in rows):
        points = [(r["scheme"], [s.get("time_to_target_s") for s in r.get("seeds") or []], r.get("time_to_target_s"))
                  for r in rows]
        path = plots.plot_seed_times(points, float(compare.get("max_time_s") or 1.0), out / "seed-times.png",
                                     time_label(compare.get("backend")))
        seeds = _img(path, "every seed's time to target per scheme")
    limit = float(compare.get("max_time_s") or 0.0)
    bsp_missed = any(r["scheme"] == "bsp" and r.get("time_to_target_s") is None for r in rows)
    return {"anchor": "results", "heads": heads, "exchange": exchange, "tuned": tuned,
            "seeds": compare.get("seeds", 1), "patience": _patience(out, rows),
            "unreached": any(r.get("time_to_target_s") is None for r in rows),
            "bound": bsp_missed and any(r.get("time_to_target_s") for r in rows),
            "rows": [_table_row(r, run, best, metric, limit if bsp_missed else None, compare.get("grids"))
                     for r, run in zip(rows, runs)],
            "split": _img(split, "share of worker time computing, communicating, waiting"), "seed_times": seeds,
            "versus": next((r["versus"] for r in rows if r.get("versus")), None),
            "eval_seeds": compare.get("eval_seeds"), "tuning_seeds": compare.get("tuning_seeds"),
            "warnings": compare.get("warnings") or []}


def _patience(out: Path, rows: list[dict[str, Any]]) -> int | None:
    """run.target_patience of the comparison (its first run's config.toml), for the "not reached" note."""
    path = out / rows[0].get("run_dir", "") / "config.toml" if rows else None
    if path is None or not path.is_file():
        return None
    from shoal.config.sections import RunConfig

    default = RunConfig.model_fields["target_patience"].default
    return int(tomllib.loads(path.read_text()).get("run", {}).get("target_patience", default))


def _table_row(row: dict[str, Any], run: RunData, best: float | None, metric: str = "accuracy",
               bsp_budget: float | None = None, grids: dict[str, Any] | None = None) -> dict[str, Any]:
    """One scheme's cells, formatted. ``bsp_budget``: BSP missed the target within this time budget, so a scheme
    that reached it is at least budget / its time faster (a lower bound, "> 7.1x")."""
    ttt, seeds, grids = row.get("time_to_target_s"), row.get("seeds"), grids or {}
    per_seed = None if not seeds else ", ".join(
        "–" if s.get("time_to_target_s") is None else f"{s['time_to_target_s']:.3g}" for s in seeds)
    return {
        "scheme": row["scheme"], "tuned": _point(row.get("tuned") or {}) or "pinned",
        "edge": bool(grid_edges(grids.get(row["scheme"], {}), row.get("tuned") or {})),
        "best": ttt is not None and ttt == best, "time": "not reached" if ttt is None else fmt_seconds(ttt),
        "time_spread": _range(row.get("time_to_target_interval"), fmt_seconds), "per_seed": per_seed,
        "reached": row.get("reached", 0), "n_seeds": len(seeds or []),
        "p": None if row.get("p_value") is None else f"p = {row['p_value']:.3g} vs {row['versus']}",
        "speedup": _speedup(row.get("speedup_vs_bsp")) if not (bsp_budget and ttt and row["scheme"] != "bsp")
        else f"> {bsp_budget / ttt:.1f}x",
        "speedup_interval": _ratio_interval(row.get("speedup_vs_bsp_interval")),
        **_finals(row, metric), "up": human_bytes(row.get("bytes_up")),
        "down": human_bytes(row.get("bytes_down")), "exchange": human_bytes(row.get("bytes_exchange")),
        "iterations": _count(row.get("iterations")),
        "computing": _percent(compute_share(run.summary.get("per_worker") or [])),
        "stopped": str(run.summary.get("stop_reason", "")).replace("_", " "),
    }


def _finals(row: dict[str, Any], metric: str) -> dict[str, str]:
    """The final and best value cells: accuracy as a percentage, another metric as a number."""
    if metric == "accuracy":
        return {"final": _acc(row.get("final_accuracy")), "final_interval": _range(row.get("final_accuracy_interval"),
                                                                                   _acc),
                "best_accuracy": _acc(row.get("best_accuracy"))}
    number = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    return {"final": number(row.get("final_metric")), "final_interval": "",
            "best_accuracy": number(row.get("best_metric"))}


def _range(iv: dict[str, Any] | None, fmt: Any) -> str:
    """``min..max`` (and the bootstrap 95% interval) of an interval record; unreached ends read "never"."""
    if not iv or iv.get("n", 0) < 2:
        return ""
    def f(x: float | None) -> str:
        return "never" if x is None else fmt(x)

    text = f"{f(iv['min'])}..{f(iv['max'])}"
    if iv.get("ci95"):
        text += f" (95%: {f(iv['ci95'][0])}..{f(iv['ci95'][1])})"
    return text


def _ratio_interval(sp: dict[str, Any] | None) -> str:
    if not sp or not sp.get("ci95"):
        return ""
    lo, hi = sp["ci95"]
    return f"95%: {_speedup(lo)}..{'∞' if hi is None else _speedup(hi)}"


def _point(point: dict[str, Any]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in point.items())


# -- (b2) tuning grid ------------------------------------------------------------------------------


def _tuning_section(compare: dict[str, Any], rows: list[dict[str, Any]]) -> Section | None:
    """Every scheme's grid: median time to target and final accuracy per point, the kept one in bold."""
    if not compare.get("tune_seeds") and not compare.get("tune"):
        return None
    metric = goal_of(compare)[0]
    table = [{"scheme": row["scheme"], "cells": [_tuning_cell(e, row, metric) for e in row.get("tuning", [])]}
             for row in rows]
    grid = ", ".join(f"{k} in {v}" for k, v in (compare.get("tune") or {}).items()) or "no shared grid"
    return {"anchor": "tuning", "columns": max((len(r["cells"]) for r in table), default=0), "rows": table,
            "grid": grid, "seeds": ", ".join(map(str, compare.get("tuning_seeds") or [])),
            "widen": compare.get("widen") or 0}


def _tuning_cell(entry: dict[str, Any] | None, row: dict[str, Any], metric: str = "accuracy") -> dict[str, Any] | None:
    if entry is None:
        return None
    t = entry["median_time_to_target_s"]
    return {"point": _point(entry["point"]) or "pinned",
            "text": ("not reached" if t is None else fmt_seconds(t)) + " · " + (
                _acc(entry["median_final_accuracy"]) if metric == "accuracy" or entry.get("median_final_metric") is None
                else f"{entry['median_final_metric']:.4g}"),
            "chosen": entry["point"] == (row.get("tuned") or {}), "reached": entry["reached"],
            "seeds": len(entry["time_to_target_s"])}


def compute_share(workers: list[dict[str, Any]]) -> float | None:
    total = sum(w["compute_s"] + w["comm_s"] + w["wait_s"] for w in workers)
    return sum(w["compute_s"] for w in workers) / total if total > 0 else None


def _speedup(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _acc(value: float | None) -> str:
    return "–" if value is None else f"{value:.2%}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _count(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


# -- (c) timelines --------------------------------------------------------------------------------


def _timeline_section(out: Path, runs: list[RunData], label: str) -> Section:
    logged = [r for r in runs if r.has_iterations]
    section: Section = {"anchor": "timeline", "images": [], "missing": [r.name for r in runs if not r.has_iterations],
                        "window": None, "around_split": False,
                        "verdicts": [(r.name, r.summary["stragglers"]["verdict"]) for r in runs
                                     if (r.summary.get("stragglers") or {}).get("verdict")]}
    if logged:
        window = timeline_window(logged)
        section |= {"window": window, "around_split": any(r.split_t is not None for r in logged)}
        for run in logged:
            timeline = worker_plots.Timeline(run.name, iterations_in(run.path, *window), run.speeds, window, _marks(run))
            path, _ = worker_plots.plot_timeline(timeline, out / f"timeline-{_slug(run.name)}.png", label)
            section["images"].append(_img(path, f"per-worker timeline of {run.name}"))
    for run in runs:
        if run.balance:
            unit, per_worker = _balanced_unit(run.path / "config.toml")
            path = worker_plots.plot_batch_sizes(run.name, run.balance, run.speeds, per_worker,
                                                 float(run.summary.get("elapsed_s") or run.balance[-1]["t"]),
                                                 out / f"batches-{_slug(run.name)}.png", label, unit)
            what = "local steps" if unit == "steps" else "batch size"
            section["images"].append(_img(path, f"each worker's {what} over time in {run.name}"))
    return section


def _balanced_unit(config: Path) -> tuple[str, int]:
    """What a balanced run sized, "batch" or "steps" (sync.balance), and how much each worker did before the
    first resize (data.batch_size, or the scheme's H), from the run's config.toml (batches of 32 without one)."""
    if not config.exists():
        return "batch", 32
    cfg = tomllib.loads(config.read_text())
    sync = cfg.get("sync", {})
    if sync.get("balance") == "steps":
        return "steps", int(sync.get(sync.get("scheme", ""), {}).get("local_steps", 1))
    return "batch", int(cfg.get("data", {}).get("batch_size", 32))


def _marks(run: RunData) -> list[tuple[float, str]]:
    marks = [(g["t"], "groups formed" if g.get("reason") == "profiled" else "regroup")
             for g in run.groups if g.get("reason") != "start"]
    end = run.summary.get("elapsed_s")
    if end is not None:
        marks.append((float(end), f"run ended ({str(run.summary.get('stop_reason', '')).replace('_', ' ')})"))
    return marks


# -- (d) groups -----------------------------------------------------------------------------------


def _groups_section(runs: list[RunData]) -> Section:
    grouped = [r for r in runs if any(g.get("reason") != "start" for g in r.groups)]
    single = [r for r in runs if r not in grouped]
    return {"anchor": "groups", "grouped": [_group_events(r) for r in grouped], "single": [r.name for r in single],
            "workers": (len(single[0].speeds) or "all") if single else None}


def _group_events(run: RunData) -> dict[str, Any]:
    events = run.groups[:MAX_GROUP_EVENTS]
    return {"name": run.name, "more": len(run.groups) - len(events),
            "events": [{"t": g["t"], "reason": str(g.get("reason", "")), "chips": _group_chips(g),
                        "moves": g.get("moves") or []} for g in events]}


def _group_chips(event: dict[str, Any]) -> list[dict[str, Any]]:
    """One chip per group: its colour, members and median measured iteration time."""
    times = event.get("times") or []
    chips = []
    for g, members in enumerate(event.get("groups") or []):
        measured = sorted(times[w] for w in members if w < len(times))
        chips.append({"group": g, "color": plots.group_color(g), "members": list(members),
                      "note": f"; {measured[len(measured) // 2]:.3g} s" if measured else ""})
    return chips


# -- (e) SIM, (f) routing -----------------------------------------------------------------------------


def _sim_section(out: Path, runs: list[RunData], label: str) -> Section | None:
    images = []
    for run in runs:
        if run.sim:
            path = plots.plot_sim_heatmap(run.sim, out / f"sim-{_slug(run.name)}.png",
                                          title=f"{run.name}: SIM aggregation period per tensor", time_label=label)
            images.append(_img(path, f"SIM aggregation periods of {run.name}"))
    return {"anchor": "sim", "images": images} if images else None


def _routing_section(out: Path, runs: list[RunData]) -> Section | None:
    parts = []
    for run in runs:
        routing = run.summary.get("routing")
        if isinstance(routing, dict):
            drawn = draw_plan(run, out / f"routing-{_slug(run.name)}.png")
            parts.append({"name": run.name, "tables": routing_data(routing),
                          "picture": _img(drawn, f"the routing plan of {run.name} on its topology") if drawn else None})
    return {"anchor": "routing", "runs": parts} if parts else None


# -- frame ------------------------------------------------------------------------------------------


def _footer(compare: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    p = compare.get("provenance") or {}
    keys = ("shoal", "host", "platform", "cpu", "python", "torch", "created")
    spread = {name: compare.get(name) or {} for name in ("machines", "commits")}
    return {"command": compare.get("command", ""), "run_dirs": [r["run_dir"] for r in rows],
            "provenance": {k: str(p.get(k, "?")) for k in keys} if p else None,
            "spread": {name: ", ".join(f"{k} ({n})" for k, n in counts.items())
                       for name, counts in spread.items() if len(counts) > 1}}
