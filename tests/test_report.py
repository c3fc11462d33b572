"""The report: plots and report.html from synthetic run folders (no training), and the page in headless Chromium."""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shoal.report.html import headline, write_report
from shoal.report.plots import plot_sim_heatmap
from shoal.report.worker_plots import pick_workers
from shoal.report.runs import load_run, segments, timeline_window
from shoal.report.units import fmt_seconds, human_bytes

SPEEDS = [1.0, 1.0, 4.0, 4.0]
COMPUTE = 0.05


# -- synthetic runs --------------------------------------------------------------------------------


def _iterations(speeds: list[float], until: float, bsp: bool, groups: list[int]) -> list[dict[str, Any]]:
    """Back-to-back iterations: free-running per worker, or BSP rounds paced by the slowest worker."""
    events, comm = [], 0.002
    for w, speed in enumerate(speeds):
        t, clock = 0.0, 0
        step = max(speeds) * COMPUTE + comm if bsp else speed * COMPUTE + comm
        while t + step <= until:
            t += step
            clock += 1
            events.append({"event": "iteration", "t": round(t, 6), "worker": w, "group": groups[w], "clock": clock,
                           "staleness": 0, "compute_s": speed * COMPUTE, "wait_s": step - speed * COMPUTE - comm,
                           "comm_s": comm, "loss": 1.0})
    return sorted(events, key=lambda e: e["t"])


def _sim_events(until: float) -> list[dict[str, Any]]:
    names = ["conv.weight", "conv.bias", "fc.weight"]
    out = []
    for g in (0, 1):
        for c in range(int(until / 0.5)):
            tau = [min(1 + c // 2, 8), 1, min(1 + c // 3, 8)]
            out.append({"event": "sim", "t": 0.5 * c + 0.1 * g, "group": g, "clock": c, "names": names, "tau": tau,
                        "similarity": [0.9, None, 0.8], "bytes_saved": [1000 * c, 0, 4000 * c]})
    return out


def _summary(scheme: str, ttt: float | None, iterations: int, **extra: Any) -> dict[str, Any]:
    workers = [{"id": w, "group": 0, "speed": s, "iterations": 10, "compute_s": s * COMPUTE * 10,
                "wait_s": 0.1 * w, "comm_s": 0.02} for w, s in enumerate(SPEEDS)]
    return {"scheme": scheme, "backend": "sim", "mode": "train", "final_accuracy": 0.9, "best_accuracy": 0.91,
            "target_accuracy": 0.9, "time_to_target_s": ttt, "elapsed_s": 4.0, "wall_s": 1.0,
            "stop_reason": "time_budget", "iterations": iterations, "bytes_up": 123_456_789, "bytes_down": 2_000,
            "bytes_exchange": 0, "groups": [[0, 1, 2, 3]], "per_worker": workers, **extra}


def _write_run(folder: Path, summary: dict[str, Any], events: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.toml").write_text('[model]\nname = "mlp"\n[data]\nname = "digits"\n[cluster]\nworkers = 4\n'
                                        'speeds = [1.0, 1.0, 4.0, 4.0]\n[run]\nmax_time_s = 4.0\nseed = 0\n')
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _start(scheme: str) -> list[dict[str, Any]]:
    return [{"event": "start", "t": 0.0, "scheme": scheme, "speeds": SPEEDS},
            {"event": "groups", "t": 0.0, "groups": [[0, 1, 2, 3]], "reason": "start"}]


def _evals(rate: float) -> list[dict[str, Any]]:
    return [{"event": "eval", "t": t * 0.5, "accuracy": min(0.95, 0.1 + rate * t), "loss": 2.3 * math.exp(-rate * t),
             "iterations": t, "bytes": int(t * 4e6 / (1 + 10 * rate))} for t in range(9)]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """A compare folder with bsp, gssp (groups, regroup), gssp+sim (sim events, routing) and an unlogged ssp run."""
    out = tmp_path_factory.mktemp("synthetic")
    split = [{"event": "groups", "t": 1.0, "groups": [[0, 1], [2, 3]], "reason": "profiled", "times": [0.05, 0.05, 0.2, 0.2]},
             {"event": "groups", "t": 2.0, "groups": [[0], [1, 2, 3]], "reason": "regroup", "moves": [[1, 0, 1]]}]
    grouped = _iterations(SPEEDS, 4.0, False, [0, 0, 1, 1])
    runs = {
        "bsp": (_summary("bsp", 3.0, 80), _start("bsp") + _evals(0.1) + _iterations(SPEEDS, 4.0, True, [0] * 4)),
        "ssp": (_summary("ssp", None, 90), _start("ssp") + _evals(0.05)),
        "gssp": (_summary("gssp", 1.5, 200), _start("gssp") + split + _evals(0.3) + grouped),
        "gssp+sim": (_summary("gssp", 1.0, 200, routing={"algorithm": "grid", "min_rate_gbps": 12.5, "ps": "h0"}),
                     _start("gssp") + split + _evals(0.4) + grouped + _sim_events(4.0)),
    }
    rows = []
    for name, (summary, events) in runs.items():
        _write_run(out / name, summary, events)
        ttt = summary["time_to_target_s"]
        rows.append({**summary, "scheme": name, "run_dir": name, "speedup_vs_bsp": None if ttt is None else 3.0 / ttt})
    compare = {"command": "shoal compare --schemes bsp,ssp,gssp,gssp+sim --out x", "schemes": list(runs), "seeds": 1,
               "backend": "sim", "target_accuracy": 0.9, "max_time_s": 4.0, "rows": rows}
    (out / "compare.json").write_text(json.dumps(compare))
    write_report(out)
    return out


# -- pure helpers ------------------------------------------------------------------------------------


def test_segments_follow_wait_pull_compute_push_and_end_at_t():
    event = {"t": 10.0, "wait_s": 1.0, "comm_s": 0.5, "pull_s": 0.25, "compute_s": 2.0}
    assert segments(event) == [("wait", 6.5, 1.0), ("comm", 7.5, 0.25), ("compute", 7.75, 2.0), ("comm", 9.75, 0.25)]
    even = segments({"t": 3.0, "wait_s": 0, "comm_s": 1.0, "compute_s": 1.0})  # no pull_s: comm split evenly
    assert even == [("comm", 1.0, 0.5), ("compute", 1.5, 1.0), ("comm", 2.5, 0.5)]


def test_human_units():
    assert [human_bytes(v) for v in (None, 0, 999, 1000, 2_470_000, 38_300_000, 485_000_000, 1_810_000_000)] == \
        ["–", "0 B", "999 B", "1.00 kB", "2.47 MB", "38.3 MB", "485 MB", "1.81 GB"]
    assert [fmt_seconds(v) for v in (0.75, 12.345, 150.4)] == ["0.75 s", "12.3 s", "150 s"]


def test_headline_names_the_first_scheme_and_its_speedup():
    rows = [{"scheme": "bsp", "time_to_target_s": 90.0, "speedup_vs_bsp": 1.0, "final_accuracy": 0.95},
            {"scheme": "gssp", "time_to_target_s": 20.0, "speedup_vs_bsp": 4.5, "final_accuracy": 0.96}]
    assert headline(rows, 0.95, "sim") == "gssp reached 95% test accuracy first, after 20 s of virtual time: 4.5x sooner than BSP (90 s)."
    rows[0].update(time_to_target_s=None, speedup_vs_bsp=None)
    rows[1]["speedup_vs_bsp"] = None
    assert headline(rows, 0.95, "sim").endswith("; BSP did not reach it within the budget.")
    rows[1]["time_to_target_s"] = None
    assert headline(rows, 0.95, "sim").startswith("No scheme reached 95% test accuracy")
    cost = [{"scheme": "bsp", "time_to_target_s": None, "final_accuracy": None}]
    assert headline(cost, 0.95, "sim").startswith("No accuracy was measured")


def test_pick_workers_keeps_every_tier():
    speeds = [1.0] * 40 + [8.0] * 40
    chosen = pick_workers(speeds, 10)
    assert len(chosen) == 10 and {speeds[w] for w in chosen} == {1.0, 8.0}
    assert pick_workers([1.0, 2.0], 10) == [0, 1]


def test_timeline_window_starts_before_the_split(synthetic):
    runs = [load_run(n, synthetic / n) for n in ("bsp", "gssp")]
    t0, t1 = timeline_window(runs)
    slowest = 4.0 * COMPUTE + 0.002
    assert t1 - t0 == pytest.approx(12 * slowest)
    assert t0 == pytest.approx(1.0 - 12 * slowest / 4) and t0 < runs[1].split_t < t1


def test_sim_heatmap_from_synthetic_events(tmp_path):
    path = plot_sim_heatmap(_sim_events(4.0) + [{"event": "eval", "t": 1.0}], tmp_path / "sim.png", title="SIM")
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[1] > 1000 and image.shape[0] > 300 and image.std() > 20
    one_group = plot_sim_heatmap([e for e in _sim_events(2.0) if e["group"] == 1], tmp_path / "one.png")
    assert one_group.stat().st_size > 10_000
    with pytest.raises(ValueError, match="no SIM events"):
        plot_sim_heatmap([{"event": "eval", "t": 1.0}], tmp_path / "none.png")


# -- the page --------------------------------------------------------------------------------------------


def test_report_has_every_section_and_only_inline_resources(synthetic):
    page = (synthetic / "report.html").read_text()
    for anchor in ("accuracy", "loss", "results", "timeline", "groups", "sim", "routing"):
        assert f'<section id="{anchor}">' in page
    assert not re.search(r'(src|href)="(?!data:image/png;base64,|#)', page), "only data URIs and in-page anchors"
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 1 + 1 + 1 + 3 + 1 + 1  # accuracy, loss/bytes, split, 3 timelines, sim, routing
    assert "ssp: no per-iteration events" in page
    assert "w1: g0 &rarr; g1" in page and "profiled" in page and "regroup" in page
    assert "rate of the slowest flow" in page and "12.5 Gbit/s" in page
    assert "123 MB" in page and "gssp+sim reached 90% test accuracy first" in page
    for name in ("accuracy.png", "loss_bytes.png", "time-split.png", "timeline-bsp.png", "timeline-gssp.png", "timeline-gssp_sim.png",
                 "sim-gssp_sim.png"):
        assert (synthetic / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (synthetic / "timeline-ssp.png").exists()


def test_report_without_sim_or_routing_omits_those_sections(tmp_path):
    _write_run(tmp_path / "bsp", _summary("bsp", 3.0, 80), _start("bsp") + _evals(0.1))
    rows = [{**_summary("bsp", 3.0, 80), "scheme": "bsp", "run_dir": "bsp", "speedup_vs_bsp": 1.0}]
    (tmp_path / "compare.json").write_text(json.dumps({"schemes": ["bsp"], "seeds": 1, "backend": "sim",
                                                       "target_accuracy": 0.9, "rows": rows}))
    page = write_report(tmp_path).read_text()
    assert '<section id="sim">' not in page and '<section id="routing">' not in page
    assert 'href="#sim"' not in page and "bsp: no per-iteration events" in page


# -- headless Chromium -------------------------------------------------------------------------------------

CHECK_SCRIPT = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message || e.type)); }, true);
window.addEventListener('load', function () {
  var imgs = Array.prototype.map.call(document.images, function (i) { return [i.complete, i.naturalWidth]; });
  // what a reader sees: no two blocks of a section drawn over each other (figures, legends, tables, notes)
  var overlaps = [];
  document.querySelectorAll('section, header, footer').forEach(function (sec) {
    var kids = Array.prototype.filter.call(sec.querySelectorAll('h2, p, img, table, figure, ul, pre, div.chips'),
      function (e) { return e.getBoundingClientRect().height > 0; });
    for (var i = 0; i < kids.length; i++) for (var j = i + 1; j < kids.length; j++) {
      if (kids[i].contains(kids[j]) || kids[j].contains(kids[i])) continue;
      var a = kids[i].getBoundingClientRect(), b = kids[j].getBoundingClientRect();
      var w = Math.min(a.right, b.right) - Math.max(a.left, b.left), h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) overlaps.push((sec.id || sec.tagName) + ': ' + kids[i].tagName + '/' + kids[j].tagName);
    }
  });
  var out = document.createElement('pre');
  out.id = 'shoal-check';
  out.textContent = JSON.stringify({errors: window.__errors, images: imgs, overlaps: overlaps});
  document.body.appendChild(out);
});
</script>"""


def chromium() -> str | None:
    return os.environ.get("SHOAL_CHROMIUM") or next(
        (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None)


def run_chromium(binary: str, profile: Path, *args: str, timeout: float = 60) -> str:
    """Run headless Chromium in its own process group; kill that group (by its PID) whatever happens."""
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--disable-extensions", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
        return stdout
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed (make test installs it with apt-get)")
def test_report_renders_in_headless_chromium(synthetic, tmp_path):
    binary = chromium()
    assert binary is not None
    page = (synthetic / "report.html").read_text()
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("<head>", "<head>\n" + CHECK_SCRIPT, 1))
    dom = run_chromium(binary, tmp_path / "profile-dom", "--virtual-time-budget=10000", "--dump-dom", checked.as_uri())
    found = re.search(r'<pre id="shoal-check">(.*?)</pre>', dom, re.S)
    assert found, "the check script did not run"
    result = json.loads(html.unescape(found.group(1)))
    assert result["errors"] == []
    assert len(result["images"]) == 8 and all(complete and width > 0 for complete, width in result["images"])
    assert result["overlaps"] == []
    assert "Not reached: the target was never met by 3 evaluations in a row" in dom  # ssp's row, explained
    assert "rate of the slowest flow" in dom and "12.5 Gbit/s" in dom  # the routing plan, labelled

    shot = tmp_path / "shot.png"
    run_chromium(binary, tmp_path / "profile-shot", "--hide-scrollbars", "--window-size=1280,2000",
                 f"--screenshot={shot}", (synthetic / "report.html").as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape == (2000, 1280, 3)
    background = np.median(pixels.reshape(-1, 3), axis=0)
    differs = np.abs(pixels - background).sum(axis=2) > 30
    assert pixels.std() > 20 and differs.mean() > 0.2, "the screenshot is (nearly) blank"


def test_a_scheme_looks_the_same_in_every_report_and_its_variants_stay_apart():
    from shoal.report.plots import scheme_style

    assert scheme_style("gssp") == scheme_style("gssp@optimizer.lr=0.02") == ("#d62728", "-")
    bsp, ina = scheme_style("bsp"), scheme_style("bsp+ina-grid")
    assert bsp[0] == ina[0] and bsp[1] == "-" and ina[1] != "-"  # same colour, another line style
    assert scheme_style("gssp+sim") != scheme_style("gssp")
    assert scheme_style("mystery") == scheme_style("mystery")  # a stable colour for names it does not know
    assert len({scheme_style(s)[0] for s in ("bsp", "asp", "ssp", "gssp", "localsgd", "diloco")}) == 6


def test_every_plot_has_an_svg_beside_its_png(tmp_path):
    from shoal.report.plots import Curve, plot_accuracy

    path = plot_accuracy([Curve("bsp", [(0.0, 0.1), (1.0, 0.9)], "#1f77b4", 1.0)], 0.9, tmp_path / "a.png", "s")
    assert path.exists() and (tmp_path / "a.svg").read_text().lstrip().startswith("<?xml")


def test_the_timeline_legend_shows_only_what_is_drawn():
    from shoal.report.plots import group_color
    from shoal.report.worker_plots import _timeline_legend

    labels = lambda handles: [h.get_label() for h in handles]  # noqa: E731
    assert labels(_timeline_legend([0, 1], {"compute"})) == ["compute, group 0", "compute, group 1"]
    full = _timeline_legend([1], {"compute", "comm", "wait"})
    assert labels(full)[1:] == ["communication", "waiting (thin pale bar, the group's colour)"]
    from matplotlib.colors import to_hex

    assert to_hex(full[-1].get_facecolor()) == group_color(1)  # the same hue as the bars it stands for


def test_the_routing_section_is_tables_not_a_dump():
    from shoal.report.routing import routing_tables

    page = routing_tables({"algorithm": "grid", "rate_gbps": 12.5, "worker_nodes": ["e0.0", "e0.0", "server"],
                            "dataplane": {"switches": {"e0.0": {"completed": 7, "fallbacks_full": 1}}}})
    assert "<td class=\"left\">e0.0</td><td>2</td><td class=\"left\">0, 1</td>" in page  # who is summed where
    assert "<td class=\"left\">server</td><td>1</td><td class=\"left\">2</td>" in page
    assert "<th>fallbacks full</th>" in page and "<td>7</td>" in page  # the switch's counters
    assert "worker_nodes" not in page and "{" not in page  # no raw JSON


def test_the_routing_plan_reads_as_labelled_values_with_units():
    from shoal.report.routing import plan_rows

    rows = dict(plan_rows({"algorithm": "grid", "min_rate_gbps": 12.5, "max_switch_utilisation": 0.0904526,
                           "violations": [], "notes": ["time_limit"], "aggregation_switches": {"e0.0": 2},
                           "solve_s": 0.01234, "worker_nodes": ["e0.0"]}))
    assert rows == {"planner": "grid", "rate of the slowest flow": "12.5 Gbit/s", "busiest switch": "9.0%",
                    "workers summed at each switch": "e0.0: 2", "capacity violations": "none",
                    "planning time": "0.0123 s", "notes": "time_limit"}


def test_every_schemes_curve_has_visible_pixels(synthetic):
    """In the accuracy and loss plots, each scheme's colour is drawn (a hidden curve would leave none)."""
    from shoal.report.plots import scheme_style

    schemes = [r["scheme"] for r in json.loads((synthetic / "compare.json").read_text())["rows"]]
    for name in ("accuracy.png", "loss_bytes.png"):
        pixels = np.asarray(Image.open(synthetic / name).convert("RGB")).astype(int)
        for scheme in schemes:
            rgb = np.array([int(scheme_style(scheme)[0][i:i + 2], 16) for i in (1, 3, 5)])
            near = (np.abs(pixels - rgb).sum(axis=2) < 40).sum()
            assert near > 150, f"{scheme}'s curve is not visible in {name} ({near} pixels of its colour)"


def test_the_routing_section_draws_the_plan_the_run_used(tmp_path):
    """A real in-network run: its plan is planned again from config.toml and drawn beside the tables."""
    from shoal.config import load_config
    from shoal.runner import train

    cost = ["backend.mode=cost", "cluster.workers=6", "cluster.compute_s=0.001", "run.max_iterations=60", "data.name=digits",
            "model.name=mlp", "model.hidden=[16]", "network.aggregation=ina", "network.topology=fattree:k=4",
            "network.programmable=all"]
    summary = train(load_config(None, cost), tmp_path / "bsp_ina")
    rows = [{**summary, "scheme": "bsp+ina-grid", "run_dir": "bsp_ina"}]
    (tmp_path / "compare.json").write_text(json.dumps({"schemes": ["bsp+ina-grid"], "seeds": 1, "backend": "sim",
                                                       "target_accuracy": 0.9, "rows": rows}))
    page = write_report(tmp_path).read_text()
    assert "the routing plan of bsp+ina-grid on its topology" in page
    picture = tmp_path / "routing-bsp_ina-grid.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.with_suffix(".svg").exists()
    (tmp_path / "bsp_ina" / "config.toml").write_text("[network]\nbogus = 1\n")  # a config that no longer loads: tables only
    page = write_report(tmp_path).read_text()
    assert '<section id="routing">' in page and "the routing plan of" not in page


def test_timeline_mark_labels_never_overlap():
    """Groupings and regroups close together: each label goes up a line until it clears the ones before."""
    from shoal.report.worker_plots import Timeline, timeline_figure

    marks = [(1.0, "groups formed"), (1.3, "regroup"), (1.6, "groups formed"), (2.0, "regroup"), (6.0, "run ended")]
    fig, _ = timeline_figure(Timeline("gssp", [], [1.0, 2.0], (0.0, 10.0), marks), "virtual time (s)")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text() in {m for _, m in marks}]
    assert len(boxes) == len(marks)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    title = ax.title if ax.get_title() else ax._left_title
    assert not any(b.overlaps(title.get_window_extent(renderer)) for b in boxes)  # the title sits above them


def test_the_page_comes_from_its_templates_and_escapes_what_runs_wrote(synthetic, tmp_path):
    """A scheme name or a provenance field is text: markup in it is shown, never run."""
    out = tmp_path / "cmp"
    shutil.copytree(synthetic, out)
    compare = json.loads((out / "compare.json").read_text())
    compare["provenance"] = {**(compare.get("provenance") or {}), "host": "<script>alert(1)</script>"}
    (out / "compare.json").write_text(json.dumps(compare))
    page = write_report(out).read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    from shoal.report.page import environment

    assert set(environment().list_templates()) >= {"report.html.j2", "macros.html.j2", "report.css"}
    assert page.count('<section id="') == len(set(re.findall(r'<section id="(\w+)"', page)))  # one per kind


def test_curves_that_coincide_are_named_and_drawn_apart():
    from shoal.report.plots import Curve, coinciding

    same = [(0.0, 0.1), (1.0, 0.9)]
    curves = [Curve("bsp", same, "#111"), Curve("ssp", [(0.0, 0.1), (1.0, 0.8)], "#222"),
              Curve("bsp+ina-grid", list(same), "#333")]
    assert coinciding(curves) == {2: "bsp"}


def test_the_report_explains_not_reached_and_bounds_a_speed_up_over_a_bsp_that_missed(tmp_path):
    """BSP never reached the target in the 4 s budget, GSSP did at 1.5 s: its speed-up reads "> 2.7x"; the row
    that says not reached is explained with run.target_patience."""
    runs = {"bsp": _summary("bsp", None, 80), "gssp": _summary("gssp", 1.5, 200)}
    rows = []
    for name, summary in runs.items():
        _write_run(tmp_path / name, summary, _start(name) + _evals(0.1))
        rows.append({**summary, "scheme": name, "run_dir": name, "speedup_vs_bsp": None})
    (tmp_path / "compare.json").write_text(json.dumps({"command": "x", "schemes": list(runs), "seeds": 1,
                                                       "backend": "sim", "target_accuracy": 0.9, "max_time_s": 4.0,
                                                       "rows": rows}))
    page = write_report(tmp_path).read_text()
    assert "&gt; 2.7x" in page and "a lower bound" in page
    assert "Not reached: the target was never met by 3 evaluations in a row (run.target_patience" in page
