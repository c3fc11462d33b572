"""report.html: one self-contained page (PNGs inlined as data URIs, inline CSS, no script) per comparison.

``write_report(DIR)`` reads DIR/compare.json and the run folders it names,
draws every PNG into DIR and writes DIR/report.html, so a report can be
rebuilt from the files alone.
"""

from __future__ import annotations

import base64
import html
import json
import tomllib
from pathlib import Path
from typing import Any

from shoal.report import plots
from shoal.report.routing import draw_plan, routing_tables
from shoal.report.runs import RunData, iterations_in, load_run, timeline_window
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
    body = [_header(compare, rows, _config(out, rows), sections), *sections, _footer(compare, rows)]
    page = PAGE.format(title=html.escape(_title(compare)), css=CSS, body="\n".join(body))
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


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" title="{html.escape(path.name)}">'


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


# -- header ---------------------------------------------------------------------------------------


def _header(compare: dict[str, Any], rows: list[dict[str, Any]], cfg: dict[str, Any], sections: list[str]) -> str:
    target = compare.get("target_accuracy")
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in NAV if any(f'<section id="{a}">' in s for s in sections))
    return (f'<header><div class="wrap"><h1>{html.escape(_title(compare))}</h1>'
            f'<p class="setup">{html.escape(describe_setup(cfg, compare))}</p>'
            f'<p class="headline">{html.escape(headline(rows, target, compare.get("backend")))}</p>'
            f'<nav>{nav}</nav></div></header><main>')


NAV = [("accuracy", "Accuracy"), ("loss", "Loss and bytes"), ("results", "Results"), ("tuning", "Tuning"), ("timeline", "Timelines"),
       ("groups", "Groups"), ("sim", "SIM"), ("routing", "Routing")]


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


def headline(rows: list[dict[str, Any]], target: float | None, backend: str | None) -> str:
    """The one-sentence result: which scheme reached the target first, and how that compares to BSP."""
    goal = f"{target:.0%} test accuracy" if target is not None else "the target"
    unit = "wall-clock" if backend == "ray" else "virtual"
    reached = [r for r in rows if r.get("time_to_target_s") is not None]
    if all(r.get("final_accuracy") is None for r in rows):
        return "No accuracy was measured (cost-only runs); the table compares iterations and bytes."
    if not reached:
        return f"No scheme reached {goal} within the budget; the table compares final accuracies."
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


def _accuracy_section(out: Path, compare: dict[str, Any], rows: list[dict[str, Any]], runs: list[RunData],
                      label: str) -> str:
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
    if not any(c.points for c in curves):
        return _section("accuracy", "Test accuracy over time", "", "No evaluations in these runs (backend.mode = "
                        "\"cost\" simulates the schedule only), so there is no accuracy to plot.")
    path = plots.plot_accuracy(curves, compare.get("target_accuracy"), out / "accuracy.png", label)
    seeds_note = (" Each line is the median over seeds and the band spans the slowest to the best seed at each "
                  "time; the dot and the legend give each scheme's median time to target.") if compare.get(
                      "seeds", 1) > 1 else ""
    return _section("accuracy", "Test accuracy over time", _img(path, "test accuracy against time for every scheme"),
                    "The model is evaluated every run.eval_every_s seconds; the dashed line is the target and "
                    f"a dot marks when a scheme first reached it.{seeds_note}")


def _loss_bytes_section(out: Path, compare: dict[str, Any], rows: list[dict[str, Any]], runs: list[RunData],
                       label: str) -> str:
    """Test loss over time and accuracy against bytes moved, one curve per scheme (its first seed)."""
    loss, by_bytes = [], []
    for row, run in zip(rows, runs):
        color, style = plots.scheme_style(row["scheme"])
        loss.append(plots.Curve(row["scheme"], run.losses, color, style=style))
        by_bytes.append(plots.Curve(row["scheme"], run.accuracy_by_bytes, color, style=style))
    if not any(c.points for c in loss + by_bytes):
        return ""
    path = plots.plot_loss_and_bytes(loss, by_bytes, out / "loss_bytes.png", label)
    seeds = " Each curve is the scheme's first seed." if compare.get("seeds", 1) > 1 else ""
    return _section("loss", "Loss, and accuracy against data moved",
                    _img(path, "test loss against time, and test accuracy against bytes moved, for every scheme"),
                    "Left: the test loss at each evaluation. Right: test accuracy against the bytes all workers have "
                    "sent and received by then: a scheme to the left of another reaches the same accuracy with less "
                    f"traffic (compression, SIM and in-network aggregation show here).{seeds}")


# -- (b) table ------------------------------------------------------------------------------------


def _table_section(out: Path, compare: dict[str, Any], rows: list[dict[str, Any]], runs: list[RunData]) -> str:
    target = compare.get("target_accuracy")
    exchange = any(r.get("bytes_exchange") for r in rows)
    tuned = bool(compare.get("tune"))
    heads = ["scheme"] + (["tuned"] if tuned else []) + [
        f"time to {target:.0%}" if target else "time to target", "speed-up vs BSP", "final accuracy",
        "best accuracy", "upload", "download"] + (["group exchange"] if exchange else []) + \
        ["iterations", "computing", "stopped"]
    best = min((r["time_to_target_s"] for r in rows if r.get("time_to_target_s") is not None), default=None)
    body = "".join(_table_row(r, run, best, exchange, tuned) for r, run in zip(rows, runs))
    head = "".join(f"<th>{h}</th>" for h in heads)
    table = f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    split = plots.plot_time_split([(r["scheme"], run.summary.get("per_worker") or []) for r, run in zip(rows, runs)],
                                  out / "time-split.png")
    note = ("Bytes are totals over the run (upload: worker pushes; download: pulls; group exchange: GSSP's "
            "deltas between group servers). Computing: share of all worker time spent computing gradients.")
    if compare.get("seeds", 1) > 1:
        note += (" With several seeds every number is the median, with min..max over seeds below it (and a bootstrap "
                 "90% interval of the median from five seeds on); a seed that never reached the target counts as "
                 "slowest.")
    if tuned:
        note += " Tuned: the grid value each scheme kept (see the tuning grid below)."
    return _section("results", "Results", table + _img(split, "share of worker time computing, communicating, waiting"),
                    note)


def _table_row(row: dict[str, Any], run: RunData, best: float | None, exchange: bool, tuned: bool = False) -> str:
    ttt = row.get("time_to_target_s")
    best_class = ' class="best"' if ttt is not None and ttt == best else ""
    cells = [f"<td><b>{html.escape(row['scheme'])}</b></td>"]
    if tuned:
        cells.append(f"<td>{html.escape(_point(row.get('tuned') or {}) or 'pinned')}</td>")
    cells += [f"<td{best_class}>{_time_cell(row)}</td>",
              f"<td>{_speedup(row.get('speedup_vs_bsp'))}{_sub(_ratio_interval(row.get('speedup_vs_bsp_interval')))}</td>",
              f"<td>{_acc(row.get('final_accuracy'))}{_sub(_range(row.get('final_accuracy_interval'), _acc))}</td>",
              f"<td>{_acc(row.get('best_accuracy'))}</td>",
              f"<td>{human_bytes(row.get('bytes_up'))}</td>", f"<td>{human_bytes(row.get('bytes_down'))}</td>"]
    if exchange:
        cells.append(f"<td>{human_bytes(row.get('bytes_exchange'))}</td>")
    cells += [f"<td>{_count(row.get('iterations'))}</td>",
              f"<td>{_percent(compute_share(run.summary.get('per_worker') or []))}</td>",
              f"<td>{html.escape(str(run.summary.get('stop_reason', '')).replace('_', ' '))}</td>"]
    return f"<tr>{''.join(cells)}</tr>"


def _time_cell(row: dict[str, Any]) -> str:
    text = "not reached" if row.get("time_to_target_s") is None else fmt_seconds(row["time_to_target_s"])
    seeds = row.get("seeds")
    if not seeds:
        return text
    per_seed = ", ".join("–" if s.get("time_to_target_s") is None else f"{s['time_to_target_s']:.3g}" for s in seeds)
    spread = _range(row.get("time_to_target_interval"), fmt_seconds)
    return f'{text}{_sub(spread)}<div class="sub">{row.get("reached", 0)}/{len(seeds)} seeds: {per_seed}</div>'


def _sub(text: str) -> str:
    return f'<div class="sub">{html.escape(text)}</div>' if text else ""


def _range(iv: dict[str, Any] | None, fmt: Any) -> str:
    """``min..max`` (and the bootstrap 90% interval) of an interval record; unreached ends read "never"."""
    if not iv or iv.get("n", 0) < 2:
        return ""
    def f(x: float | None) -> str:
        return "never" if x is None else fmt(x)

    text = f"{f(iv['min'])}..{f(iv['max'])}"
    if iv.get("ci90"):
        text += f" (90%: {f(iv['ci90'][0])}..{f(iv['ci90'][1])})"
    return text


def _ratio_interval(sp: dict[str, Any] | None) -> str:
    if not sp or not sp.get("ci90"):
        return ""
    lo, hi = sp["ci90"]
    return f"90%: {_speedup(lo)}..{'∞' if hi is None else _speedup(hi)}"


def _point(point: dict[str, Any]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in point.items())


# -- (b2) tuning grid ------------------------------------------------------------------------------


def _tuning_section(compare: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """Every scheme's grid: median time to target and final accuracy per point, the kept one in bold."""
    if not compare.get("tune"):
        return ""
    points = list(dict.fromkeys(_point(e["point"]) for r in rows for e in r.get("tuning", [])))
    head = "<th>scheme</th>" + "".join(f"<th>{html.escape(p or 'pinned')}</th>" for p in points)
    body = []
    for row in rows:
        cells = {_point(e["point"]): e for e in row.get("tuning", [])}
        tds = []
        for p in points:
            e = cells.get(p)
            if e is None:
                tds.append("<td>–</td>")
                continue
            t = e["median_time_to_target_s"]
            text = ("not reached" if t is None else fmt_seconds(t)) + f" · {_acc(e['median_final_accuracy'])}"
            chosen = e["point"] == (row.get("tuned") or {})
            shown = f"<b>{html.escape(text)}</b>" if chosen else html.escape(text)
            reached = f'<div class="sub">{e["reached"]}/{len(e["time_to_target_s"])} reached</div>'
            tds.append(f'<td class="best">{shown}{reached}</td>' if chosen else f"<td>{shown}{reached}</td>")
        body.append(f"<tr><td><b>{html.escape(row['scheme'])}</b></td>{''.join(tds)}</tr>")
    grid = ", ".join(f"{k} in {v}" for k, v in compare["tune"].items())
    table = f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
    return _section("tuning", "Tuning grid", table,
                    f"Every scheme ran every grid point ({html.escape(grid)}) with the same seeds; each kept the point "
                    "with the best median time to target (ties: best median final accuracy), in bold. Cells: median "
                    "time to target · median final accuracy. A scheme with a pinned value (scheme@key=value) skips "
                    "that key.")


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


def _timeline_section(out: Path, runs: list[RunData], label: str) -> str:
    logged = [r for r in runs if r.has_iterations]
    missing = [r.name for r in runs if not r.has_iterations]
    parts = []
    if logged:
        window = timeline_window(logged)
        around = ", starting just before GSSP formed its groups" if any(r.split_t is not None for r in logged) else ""
        parts.append(f'<p class="note">Window: {window[0]:.2f} s to {window[1]:.2f} s, the same for every scheme '
                     f"(about a dozen of the slowest worker's iterations{around}). "
                     "Each worker iteration is wait (thin pale bar) &rarr; pull (dark) &rarr; compute (coloured by "
                     "the group its push went to) &rarr; push (dark).</p>")
        for run in logged:
            timeline = plots.Timeline(run.name, iterations_in(run.path, *window), run.speeds, window, _marks(run))
            path, _ = plots.plot_timeline(timeline, out / f"timeline-{_slug(run.name)}.png", label)
            parts.append(_img(path, f"per-worker timeline of {run.name}"))
    if missing:
        parts.append(f'<p class="note">{html.escape(", ".join(missing))}: no per-iteration events in metrics.jsonl '
                     "(run with backend.log_iterations = false), so no timeline.</p>")
    return _section("timeline", "Per-worker timelines", "\n".join(parts),
                    "Where each worker spends its time: under BSP everyone waits for the slowest worker each round; "
                    "GSSP groups workers of similar speed, so a slow worker only holds back its own group.")


def _marks(run: RunData) -> list[tuple[float, str]]:
    marks = [(g["t"], "groups formed" if g.get("reason") == "profiled" else "regroup")
             for g in run.groups if g.get("reason") != "start"]
    end = run.summary.get("elapsed_s")
    if end is not None:
        marks.append((float(end), f"run ended ({str(run.summary.get('stop_reason', '')).replace('_', ' ')})"))
    return marks


# -- (d) groups -----------------------------------------------------------------------------------


def _groups_section(runs: list[RunData]) -> str:
    grouped = [r for r in runs if any(g.get("reason") != "start" for g in r.groups)]
    single = [r for r in runs if r not in grouped]
    parts = [f"<h3>{html.escape(r.name)}</h3>{_groups_table(r)}" for r in grouped]
    if single:
        names = ", ".join(r.name for r in single)
        workers = len(single[0].speeds) or "all"
        parts.append(f'<p class="note">{html.escape(names)}: one group of all {workers} workers throughout.</p>')
    return _section("groups", "Groups found", "\n".join(parts),
                    "GSSP profiles every worker's iteration time, groups similar speeds (Jenks natural breaks on "
                    "log times) and moves a worker when its speed drifts. Group numbers match the timeline colours.")


def _groups_table(run: RunData) -> str:
    events = run.groups[:MAX_GROUP_EVENTS]
    rows = "".join(
        f"<tr><td>{g['t']:.2f} s</td><td>{html.escape(str(g.get('reason', '')))}</td>"
        f"<td class=\"left\">{_group_chips(g)}</td><td class=\"left\">{_moves(g.get('moves'))}</td></tr>"
        for g in events
    )
    more = len(run.groups) - len(events)
    tail = f'<p class="note">… and {more} more regroupings (see metrics.jsonl).</p>' if more > 0 else ""
    return ("<table><thead><tr><th>time</th><th>reason</th><th class=\"left\">groups (worker ids; median measured "
            f"iteration time)</th><th class=\"left\">moves</th></tr></thead><tbody>{rows}</tbody></table>{tail}")


def _group_chips(event: dict[str, Any]) -> str:
    times = event.get("times") or []
    chips = []
    for g, members in enumerate(event.get("groups") or []):
        measured = sorted(times[w] for w in members if w < len(times))
        note = f"; {measured[len(measured) // 2]:.3g} s" if measured else ""
        chips.append(f'<span class="chip" style="background:{plots.group_color(g)}">g{g}: '
                     f"{' '.join(map(str, members))}{note}</span>")
    return " ".join(chips)


def _moves(moves: list[list[int]] | None) -> str:
    if not moves:
        return ""
    return ", ".join(f"w{w}: g{old} &rarr; g{new}" for w, old, new in moves)


# -- (e) SIM, (f) routing -----------------------------------------------------------------------------


def _sim_section(out: Path, runs: list[RunData], label: str) -> str:
    images = []
    for run in runs:
        if run.sim:
            path = plots.plot_sim_heatmap(run.sim, out / f"sim-{_slug(run.name)}.png",
                                          title=f"{run.name}: SIM aggregation period per tensor", time_label=label)
            images.append(_img(path, f"SIM aggregation periods of {run.name}"))
    if not images:
        return ""
    return _section("sim", "SIM: aggregation periods", "\n".join(images),
                    "Similarity-aware aggregation sends a tensor only every τ iterations while the workers' updates "
                    "for it agree; brighter = aggregated less often (τ = 1: every iteration). Tensors under the size "
                    "floor (compression.similarity.min_numel) are always aggregated.")


def _routing_section(out: Path, runs: list[RunData]) -> str:
    parts = []
    for run in runs:
        routing = run.summary.get("routing")
        if isinstance(routing, dict):
            drawn = draw_plan(run, out / f"routing-{_slug(run.name)}.png")
            picture = _img(drawn, f"the routing plan of {run.name} on its topology") if drawn else ""
            parts.append(f"<h3>{html.escape(run.name)}</h3>{routing_tables(routing)}{picture}")
    if not parts:
        return ""
    return _section("routing", "Routing plan", "\n".join(parts),
                    "The in-network aggregation plan each run used (from its summary.json), and the plan drawn on "
                    "its topology (planned again from the run's config.toml: the planners are deterministic).")


# -- frame ------------------------------------------------------------------------------------------


def _section(anchor: str, title: str, content: str, note: str) -> str:
    return f'<section id="{anchor}"><h2>{title}</h2><p class="lede">{note}</p>{content}</section>'


def _footer(compare: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    command = html.escape(compare.get("command", ""))
    dirs = ", ".join(html.escape(r["run_dir"]) + "/" for r in rows)
    p = compare.get("provenance") or {}
    made = (f"<p>Made by shoal {html.escape(str(p.get('shoal', '?')))} on {html.escape(str(p.get('host', '?')))} "
            f"({html.escape(str(p.get('platform', '?')))}, {html.escape(str(p.get('cpu', '?')))}, "
            f"Python {html.escape(str(p.get('python', '?')))}, torch {html.escape(str(p.get('torch', '?')))}), "
            f"{html.escape(str(p.get('created', '?')))}.</p>") if p else ""
    return (f'</main><footer><div class="wrap"><p>Reproduce: <code>{command}</code></p>{made}'
            f"<p>Files beside this page: compare.json (every number above), the plots as PNG and SVG, and one run "
            f"folder per scheme ({dirs}) with config.toml, metrics.jsonl and summary.json.</p></div></footer>")


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
{body}
</body>
</html>
"""

CSS = """
:root { --ink: #1d232b; --muted: #5b6470; --line: #e3e6ea; --accent: #14324a; }
* { box-sizing: border-box; }
body { margin: 0; background: #f3f5f8; color: var(--ink);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
.wrap, main { max-width: 1240px; margin: 0 auto; padding: 0 24px; }
header { background: var(--accent); color: #fff; padding: 26px 0 14px; }
header h1 { margin: 0 0 6px; font-size: 1.6rem; font-weight: 650; }
header .setup { margin: 0; color: #c7d5e2; }
header .headline { margin: 12px 0 14px; font-size: 1.2rem; font-weight: 600; }
nav a { color: #fff; text-decoration: none; margin-right: 18px; opacity: .85; font-size: .95rem; }
nav a:hover { opacity: 1; text-decoration: underline; }
main { padding-top: 22px; padding-bottom: 8px; }
section { background: #fff; border-radius: 10px; box-shadow: 0 1px 3px rgba(20, 30, 45, .1);
          padding: 18px 24px 20px; margin-bottom: 22px; }
h2 { margin: 0 0 4px; font-size: 1.25rem; }
h3 { margin: 18px 0 6px; font-size: 1.05rem; }
.lede, .note { color: var(--muted); margin: 4px 0 12px; }
img { display: block; max-width: 100%; height: auto; margin: 10px auto 6px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; margin: 8px 0 10px; }
th, td { padding: 7px 10px; border-bottom: 1px solid var(--line); text-align: right; vertical-align: top; }
th { font-size: .85rem; color: var(--muted); font-weight: 600; border-bottom: 2px solid var(--line); }
th:first-child, td:first-child, .left { text-align: left; }
tbody tr:hover { background: #f7f9fb; }
.scroll { overflow-x: auto; }
.scroll td { white-space: nowrap; }
td.best { color: #11703a; font-weight: 700; }
.sub { color: var(--muted); font-size: .8rem; font-weight: 400; }
.chip { display: inline-block; color: #fff; border-radius: 999px; padding: 1px 9px; margin: 1px 2px;
        font-size: .85rem; white-space: nowrap; }
table.kv { width: auto; min-width: 50%; }
code { background: #eef1f5; border-radius: 4px; padding: 1px 5px; font-size: .88em; word-break: break-all; }
footer { color: var(--muted); font-size: .9rem; padding: 4px 0 30px; }
"""
