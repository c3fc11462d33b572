"""Fair comparisons: the held-out protocol (development and evaluation seeds), --tune grids and each scheme's own
knobs, the choice per scheme, pinned values, intervals and p-values over seeds."""

from __future__ import annotations

import json
import statistics
import tomllib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import FAST
from shoal.cli import app
from shoal.comparison import Protocol, plan_runs
from shoal.config import ConfigError, load_config
from shoal.report.schemes import parse_scheme, parse_schemes
from shoal.report.tuning import choose, grid_points, interval, mann_whitney, parse_tune, speedup_interval


def _sets(*overrides: str) -> list[str]:
    return [arg for o in list(FAST) + list(overrides) for arg in ("--set", o)]


# -- pure parts ------------------------------------------------------------------------------------


def test_parse_tune_reads_values_as_toml_and_refuses_nonsense():
    assert parse_tune(["optimizer.lr=0.01,0.1", "sync.local_steps=4,8"]) == {
        "optimizer.lr": [0.01, 0.1], "sync.local_steps": [4, 8]}
    for bad, message in [("optimizer.lr", "expected KEY=V1"), ("optimizer.lr=", "expected KEY=V1"),
                         ("optimizer.lr=0.1,0.1", "listed twice")]:
        with pytest.raises(ConfigError, match=message):
            parse_tune([bad])
    with pytest.raises(ConfigError, match="tuned twice"):
        parse_tune(["optimizer.lr=0.1", "optimizer.lr=0.2"])


def test_grid_points_are_every_combination_without_pinned_keys():
    grid = {"optimizer.lr": [0.1, 0.2], "sync.local_steps": [4, 8]}
    assert len(grid_points(grid, {})) == 4
    assert grid_points(grid, {"optimizer.lr": "0.05"}) == [{"sync.local_steps": 4}, {"sync.local_steps": 8}]


def test_choose_prefers_the_best_median_time_then_the_best_final_accuracy():
    points = [
        {"time_to_target_s": [10, None, 12], "final_accuracy": [0.95, 0.90, 0.96]},  # median 12
        {"time_to_target_s": [9, 11, None], "final_accuracy": [0.95, 0.95, 0.93]},  # median 11
        {"time_to_target_s": [5, None, None], "final_accuracy": [0.99, 0.5, 0.5]},  # median unreached
    ]
    assert choose(points) == 1
    tie = [{"time_to_target_s": [10, 10], "final_accuracy": [0.90, 0.91]},
           {"time_to_target_s": [10, 10], "final_accuracy": [0.95, 0.96]}]
    assert choose(tie) == 1
    unreached = [{"time_to_target_s": [None], "final_accuracy": [0.5]},
                 {"time_to_target_s": [None], "final_accuracy": [0.7]}]
    assert choose(unreached) == 1


def test_interval_counts_unreached_as_slowest_and_bootstraps_from_five_seeds():
    assert interval([3.0, None, 1.0]) == {"median": 3.0, "min": 1.0, "max": None, "ci95": None, "n": 3}
    iv = interval([10, 12, 11, 13, 30])
    assert iv["median"] == 12 and iv["min"] == 10 and iv["max"] == 30
    lo, hi = iv["ci95"]
    assert 10 <= lo <= 12 <= hi <= 30


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.1, 100), min_size=5, max_size=9))
def test_bootstrap_interval_of_the_median_contains_the_median(values):
    iv = interval(values)
    eps = 1e-6  # values are reported rounded to 6 decimals
    assert iv["ci95"][0] - eps <= statistics.median(values) <= iv["ci95"][1] + eps
    assert min(values) - eps <= iv["ci95"][0] and iv["ci95"][1] <= max(values) + eps


def test_speedup_interval_is_the_ratio_of_medians_with_a_bootstrap_band():
    sp = speedup_interval([20, 22, 21, 19, 20], [10, 11, 10, 9, 10])
    assert sp["value"] == pytest.approx(2.0)
    assert sp["ci95"][0] <= 2.0 <= sp["ci95"][1]
    assert speedup_interval([None, None, 5], [1, 1, 1])["value"] is None  # the base's median is unreached


def test_a_scheme_spec_pins_values_after_at():
    scheme = parse_scheme("bsp+fp16@optimizer.lr=0.02")
    assert scheme.name == "bsp+fp16@optimizer.lr=0.02"
    assert scheme.overrides == ("sync.scheme=bsp", "compression.method=fp16", "optimizer.lr=0.02")
    assert scheme.pinned == (("optimizer.lr", "0.02"),)
    for bad in ("bsp@lr", "bsp@optimizer.lr", "bsp@sync.scheme=asp", "bsp+fp16@compression.method=topk"):
        with pytest.raises(ConfigError, match="--schemes"):
            parse_scheme(bad)


# -- end to end --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned") / "cmp"
    args = ["compare", *_sets("run.max_time_s=1.5"), "--schemes", "bsp,asp,localsgd@optimizer.lr=0.2",
            "--tune", "optimizer.lr=0.02,0.2", "--tune-seeds", "1", "--seeds", "2", "--out", str(out), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "compare.json").read_text())


def test_compare_tunes_on_development_seeds_and_reports_the_evaluation_seeds_after_them(tuned):
    out, data = tuned
    assert data["tune"] == {"optimizer.lr": [0.02, 0.2]}
    assert "--tune optimizer.lr=0.02,0.2" in data["command"] and "--tune-seeds 1" in data["command"]
    assert data["tuning_seeds"] == [0] and data["eval_seeds"] == [1, 2]
    for row in data["rows"]:
        assert [s["seed"] for s in row["seeds"]] == [1, 2]  # never a seed a value was chosen on
        for e in row["tuning"]:  # every grid point ran on the development seed, in its own folder
            assert [tomllib.loads((out / d / "config.toml").read_text())["run"]["seed"] for d in e["run_dirs"]] == [0]
        best = min(row["tuning"], key=lambda e: (e["median_time_to_target_s"] is None,
                                                 e["median_time_to_target_s"] or 0, -(e["median_final_accuracy"] or 0)))
        assert row["tuned"] == best["point"]
        if row["scheme"].startswith("localsgd"):  # lr pinned: it tunes its own knob, H, with the common budget
            assert row["pinned"] == {"optimizer.lr": "0.2"}
            assert [e["point"] for e in row["tuning"]] == [{"sync.localsgd.local_steps": h} for h in (2, 8, 32)]
            assert data["grids"][row["scheme"]] == {"sync.localsgd.local_steps": [2, 8, 32]}
            continue
        assert [e["point"] for e in row["tuning"]] == [{"optimizer.lr": 0.02}, {"optimizer.lr": 0.2}]
        assert set(row["time_to_target_interval"]) == {"median", "min", "max", "ci95", "n"}
        assert "final_accuracy_interval" in row and "speedup_vs_bsp_interval" in row
        assert row["versus"] in ("bsp", "asp", "localsgd@optimizer.lr=0.2") and "p_value" in row


def test_a_scheme_with_nothing_to_tune_runs_no_development_seed(tmp_path):
    """bsp has no own knob and no shared grid here: it runs only its evaluation seeds (after the development
    seeds, as every scheme's), keeps its defaults, and its row says it tuned nothing; ssp tunes its three points."""
    plan = plan_runs(None, parse_schemes("bsp,ssp"), Protocol(seeds=1, tune_seeds=1), list(FAST))
    assert {run.scheme for run in plan} == {"ssp"} and len(plan) == 3
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["compare", *_sets("run.max_time_s=1"), "--schemes", "bsp,ssp",
                                      "--tune-seeds", "1", "--seeds", "2", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare.json").read_text())
    rows = {r["scheme"]: r for r in data["rows"]}
    assert rows["bsp"]["tuned"] == {} and rows["bsp"]["tuning"] == [] and not (out / "bsp" / "tune").exists()
    assert data["tuning_seeds"] == [0] and data["eval_seeds"] == [1, 2] and len(rows["ssp"]["tuning"]) == 3
    assert sorted((out / "bsp").iterdir()) == [out / "bsp" / "seed-1", out / "bsp" / "seed-2"]


@pytest.mark.timeout(120)
def test_a_comparison_stopped_while_tuning_lists_each_grid_point_apart_and_draws_no_report(tmp_path, monkeypatch):
    """Stopped after two of ssp's three development runs: compare.json has no row (a row of two grid points'
    runs would read as one scheme's seeds) but each point's result so far, and `shoal report` says why it draws
    nothing, in one line."""
    import sys

    execute = sys.modules["shoal.comparison.execute"]
    asked = iter([False, False, True])
    monkeypatch.setattr(execute, "stop_requested", lambda out: next(asked, True))
    out = tmp_path / "cmp"
    stopped = CliRunner().invoke(app, ["compare", *_sets("run.max_time_s=1"), "--schemes", "bsp,ssp",
                                       "--tune-seeds", "1", "--seeds", "2", "--out", str(out), "-q"])
    assert stopped.exit_code == 130, stopped.output
    assert "2 of 3 runs of its tuning phase finished" in stopped.output
    data = json.loads((out / "compare.json").read_text())
    assert data["interrupted"] is True and data["phase"] == "tuning" and data["rows"] == []
    points = [entry["point"] for entry in data["tuning_so_far"]["ssp"]]
    assert points == [{"sync.ssp.staleness": 1}, {"sync.ssp.staleness": 3}]
    assert [len(entry["run_dirs"]) for entry in data["tuning_so_far"]["ssp"]] == [1, 1]
    refused = CliRunner().invoke(app, ["report", str(out)])
    assert refused.exit_code == 2 and "an interrupted comparison (2 of 3 runs of its tuning phase" in refused.output
    assert not (out / "report.html").exists()


def test_a_kept_value_at_the_edge_of_its_grid_is_named():
    from shoal.report.tuning import grid_edges

    assert grid_edges({"h": [2, 8, 32]}, {"h": 32}) == [("h", 32, "largest")]
    assert grid_edges({"h": [8, 2, 32]}, {"h": 2}) == [("h", 2, "smallest")]
    assert grid_edges({"h": [2, 8, 32]}, {"h": 8}) == []
    assert grid_edges({"lr": [0.1, 0.2]}, {"lr": 0.2}) == []  # two values: every choice is an edge
    assert grid_edges({"order": ["a", "b", "c"]}, {"order": "c"}) == []  # no order among names
    both = grid_edges({"h": [2, 8, 32], "lr": [1, 2, 3]}, {"h": 2, "lr": 3})
    assert both == [("h", 2, "smallest"), ("lr", 3, "largest")]


def test_an_edge_is_weighed_against_the_next_value_in_on_the_development_seeds():
    """The kept end's and its neighbour's median time to target come from the row's own tuning record, matched
    by point whatever the order of its keys; a neighbour whose median seed never reached the target is None."""
    from shoal.comparison.results import tuning_warnings
    from shoal.report.tuning import edge_margins

    grids = {"localsgd": {"h": [2, 8, 32], "lr": [0.1, 0.2]}}
    tuning = [{"point": {"lr": lr, "h": h}, "median_time_to_target_s": t}
              for (h, lr), t in {(2, 0.1): 30.0, (8, 0.1): 20.0, (32, 0.1): 18.0, (8, 0.2): None}.items()]
    row = {"scheme": "localsgd", "tuned": {"h": 32, "lr": 0.1}, "tuning": tuning}
    assert edge_margins(row, grids) == [{"key": "h", "kept": 32, "kept_s": 18.0, "next": 8, "next_s": 20.0,
                                         "beyond": 128}]
    low = {**row, "tuned": {"h": 2, "lr": 0.2}}
    assert edge_margins(low, grids) == [{"key": "h", "kept": 2, "kept_s": None, "next": 8, "next_s": None,
                                         "beyond": 1}]
    assert edge_margins({**row, "tuned": {"h": 8, "lr": 0.1}}, grids) == []
    warned, = tuning_warnings([row], grids)
    assert "[2, 8, 32] (median time to target on the development seeds 18 s; 8: 20 s): its best" in warned
    assert "widen it (next value out: 128): --widen 1 (with --resume) adds a value past each end" in warned


def test_the_values_past_an_edge_continue_the_grids_own_step():
    """Geometric grids go on by their ratio, others by their end step; integers stay integers; a value that would
    cross a limit of its key stops there (or halfway, where the limit itself is not allowed)."""
    from shoal.config import key_bounds
    from shoal.report.tuning import beyond_edge, widened_grid

    assert beyond_edge([2, 8, 32], "largest", 2) == [128, 512] and beyond_edge([32, 2, 8], "smallest") == [1]
    assert beyond_edge([0.4, 0.7, 1.0], "largest", 2) == [1.3, 1.6]
    assert beyond_edge([0.4, 0.7, 1.0], "smallest", 2) == [0.1, 0.05]  # -0.2 would leave the positive grid
    assert beyond_edge([0.001, 0.01, 0.1], "smallest") == [0.0001] and beyond_edge([1, 3, 9], "largest") == [27]
    assert beyond_edge([1, 2, 3], "smallest") == []  # no whole number between 0 and 1
    assert beyond_edge([-1.0, 0.0, 1.0], "smallest") == [-2.0]  # a grid that crosses zero may go on crossing
    assert key_bounds("sync.gssp.group_threshold") == ((0, False), (1, True))
    assert key_bounds("sync.ssp.staleness") == ((0, True), None) and key_bounds("no.such.key") == (None, None)
    threshold = key_bounds("sync.gssp.group_threshold")
    assert widened_grid([0.85, 0.95, 0.99], 1, threshold) == [0.75, 0.85, 0.95, 0.99, 1.0]
    assert widened_grid([1, 3, 8], 2, key_bounds("sync.ssp.staleness")) == [0, 1, 3, 8, 13, 18]
    assert widened_grid([2, 8, 32], 1, key_bounds("sync.localsgd.local_steps")) == [1, 2, 8, 32, 128]
    assert widened_grid([0.02, 0.2], 1) == [0.02, 0.2] and widened_grid(["a", "b", "c"], 1) == ["a", "b", "c"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=3, max_size=6, unique=True), st.sampled_from(["smallest", "largest"]),
       st.integers(1, 4))
def test_the_values_out_lie_outside_the_grid_in_order_and_keep_its_type(values, side, steps):
    from shoal.report.tuning import beyond_edge

    out = beyond_edge(values, side, steps)
    assert len(out) <= steps and all(isinstance(v, int) and v >= 1 for v in out)
    walk = [min(values) if side == "smallest" else max(values), *out]
    assert all((b < a) if side == "smallest" else (b > a) for a, b in zip(walk, walk[1:]))  # ever further out
    assert len(out) == steps or side == "smallest"  # only the small side of a positive grid can run out


def test_compare_warns_when_a_scheme_kept_the_edge_of_its_grid(tuned):
    out, data = tuned
    local = next(r for r in data["rows"] if r["scheme"].startswith("localsgd"))
    at_edge = local["tuned"]["sync.localsgd.local_steps"] in (2, 32)
    warned = [w for w in data["warnings"] if w.startswith("tuning:")]
    assert len(warned) == at_edge  # the lr grids have two values: never named
    page = (out / "report.html").read_text()
    assert page.count(">(edge)</span>") == at_edge  # the row is marked in the table too
    if at_edge:
        assert warned[0].startswith("tuning: localsgd@optimizer.lr=0.2 kept sync.localsgd.local_steps = ")
        assert "value of its grid [2, 8, 32]" in page and "its best may lie beyond" in page


def test_the_report_shows_the_tuned_values_and_the_grid(tuned):
    out, data = tuned
    page = (out / "report.html").read_text()
    assert "Tuning grid" in page and "lr 0.02" in page and "lr 0.2" in page and "local_steps 32" in page
    assert "median over seeds and the band" in page
    assert (out / "seed-times.png").is_file() and "seed-times.png" in page  # every seed as a point
    assert "development seeds 0;" in page and "evaluation seeds 1, 2" in page
    assert any(r["p_value"] is not None for r in data["rows"]) and "p = " in page


def test_tuning_a_key_the_scheme_sets_is_one_line_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["compare", *_sets(), "--schemes", "bsp,asp", "--tune", "sync.scheme=bsp,asp",
                                      "--tune-seeds", "1", "--out", str(tmp_path / "c"), "-q"])
    assert result.exit_code == 2
    assert "--tune sync.scheme: scheme bsp sets it itself" in result.output
    assert not (tmp_path / "c").exists()


def test_bootstrap_ends_stay_none_for_unreached_seeds_never_nan():
    """scipy's resamples are read as order statistics: an end among unreached seeds is None, a finite one a number."""
    iv = interval([1, None, None, 2, 3, None])
    assert iv["ci95"][1] is None and iv["ci95"][0] == pytest.approx(iv["ci95"][0]) and iv["ci95"][0] >= 1
    sp = speedup_interval([None, 1, 2, 3, None], [1, None, 2, 3, 4])
    assert sp["ci95"][1] is None and sp["ci95"][0] == 0.0  # resamples where only the base never reached it
    assert interval([5, 5, 5, 5, 5])["ci95"] == [5.0, 5.0]  # ties: no warning, no NaN
    assert interval([4, 8, 6, 5, 7], seed=3) == interval([4, 8, 6, 5, 7], seed=3)  # seeded: repeatable


# -- the held-out protocol ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(-1000, 1000), st.integers(0, 6), st.integers(1, 12))
def test_tuning_and_evaluation_seeds_never_overlap(base, tune_seeds, seeds):
    protocol = Protocol(seeds=seeds, tune_seeds=tune_seeds)
    tuning, evaluation = protocol.tuning_seeds(base), protocol.eval_seeds(base)
    assert len(tuning) == tune_seeds and len(evaluation) == seeds
    assert not set(tuning) & set(evaluation) and (not tuning or max(tuning) < min(evaluation))


def test_the_plan_tunes_on_development_seeds_only_and_every_scheme_with_knobs_gets_the_same_budget():
    grid = {"optimizer.lr": [0.05, 0.1]}
    schemes = parse_schemes("bsp,asp,ssp,localsgd,diloco,gssp")
    plan = plan_runs(None, schemes, Protocol(seeds=10, tune_seeds=2, grid=grid), FAST + ["run.seed=100"])
    assert {p.seed for p in plan} == {100, 101} and all(p.tuning for p in plan)
    configs = {s.name: len({p.point for p in plan if p.scheme == s.name}) for s in schemes}
    assert configs == {"bsp": 2, "asp": 2, "ssp": 6, "localsgd": 6, "diloco": 6, "gssp": 6}
    assert {p.point for p in plan if p.scheme == "ssp"} == {
        (("optimizer.lr", lr), ("sync.ssp.staleness", s)) for lr in (0.05, 0.1) for s in (1, 3, 8)}
    assert Protocol(10, 2).eval_seeds(100) == list(range(102, 112))


def test_every_registered_knob_grid_holds_the_common_budget_and_a_different_one_is_refused():
    from shoal.registry import SCHEMES
    from shoal.sync.base import OWN_GRID_POINTS, SchemeSpec, own_grid_points, register_scheme

    knobs = {name: own_grid_points(e.item) for name, e in SCHEMES.entries().items() if e.item.grid}
    assert set(knobs) >= {"ssp", "gssp", "localsgd", "diloco"} and set(knobs.values()) == {OWN_GRID_POINTS}
    for name, e in SCHEMES.entries().items():  # each knob's values include its default: the default is a candidate
        for key, values in e.item.grid:
            section, option = key.split(".")[1:]
            assert getattr(getattr(load_config(None, []).sync, section), option) in values, (name, key)
    with pytest.raises(ValueError, match="its grid holds 2 points, every scheme's 3"):
        register_scheme(SchemeSpec("twoknob", grid=(("sync.ssp.staleness", (1, 2)),)), "")


def test_tune_without_development_seeds_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["compare", *_sets(), "--schemes", "bsp,asp", "--tune", "optimizer.lr=0.1,0.2",
                                      "--out", str(tmp_path / "c"), "-q"])
    assert result.exit_code == 2 and "--tune needs --tune-seeds K" in result.output
    result = CliRunner().invoke(app, ["compare", *_sets(), "--schemes", "bsp,asp", "--tune-seeds", "2",
                                      "--out", str(tmp_path / "c"), "-q"])
    assert result.exit_code == 2 and "nothing to tune" in result.output


def test_the_interval_and_p_value_match_scipy_on_a_constructed_example():
    from scipy import stats

    times = [12.0, 15.0, 11.0, 19.0, 14.0, 13.0, 30.0, 16.0, 12.5, 17.0]
    ours = interval(times, seed=4)["ci95"]
    theirs = stats.bootstrap((np.asarray(times),), np.median, n_resamples=2000, method="percentile",
                             confidence_level=0.95, rng=np.random.default_rng(4)).confidence_interval
    assert ours == pytest.approx([theirs.low, theirs.high], abs=0.5)  # order statistics vs interpolated percentiles
    assert mann_whitney([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)  # exact: 2 of the 20 orderings are as extreme
    # an unreached seed is slower than every reached one: the same as any time above all others
    assert mann_whitney([10, 11, None, 12], [20, None, None, 9]) == pytest.approx(
        stats.mannwhitneyu([10, 11, 99, 12], [20, 99, 99, 9], alternative="two-sided").pvalue)
    assert mann_whitney([None, None], [None]) is None and mann_whitney([], [1.0]) is None


def test_rows_carry_the_p_value_against_the_best_baseline():
    from shoal.report.rows import add_significance

    def row(name, times):
        return {"scheme": name, "time_to_target_s": sorted(t for t in times if t is not None)[len(times) // 2],
                "reached": sum(t is not None for t in times), "seeds": [{"time_to_target_s": t} for t in times]}

    rows = [row("bsp", [20, 21, 22, 23, 24]), row("asp", [10, 11, 12, 13, 14]), row("gssp", [5, 6, 7, 8, None])]
    add_significance(rows, {"bsp", "asp"})
    assert [r["versus"] for r in rows] == ["asp"] * 3 and rows[1]["p_value"] is None
    assert rows[0]["p_value"] == pytest.approx(mann_whitney([20, 21, 22, 23, 24], [10, 11, 12, 13, 14]))
    assert rows[2]["p_value"] == pytest.approx(mann_whitney([5, 6, 7, 8, None], [10, 11, 12, 13, 14]))


def test_compare_counts_its_runs_per_kind_of_cpu(tuned):
    """Every run, tuning and evaluation alike, says what computed it; compare.json adds them up (13 runs: 2 + 2
    + 3 grid points on one development seed, and 3 kept points on two evaluation seeds)."""
    from shoal.runner import cpu_model

    out, data = tuned
    assert data["machines"] == {cpu_model(): 13}
    assert sum(data["commits"].values()) == 13 and len(data["commits"]) == 1  # one checkout made them all
    assert all(s["machine"]["cpu"] == cpu_model() for row in data["rows"] for s in row["seeds"])
    assert not [w for w in data["warnings"] if w.startswith("machines:")]  # one kind: nothing to warn of


def test_runs_from_several_kinds_of_cpu_are_counted_and_warned_of():
    from shoal.comparison.results import machine_warnings, machines

    runs = [{"machine": {"cpu": "AMD EPYC"}}] * 3 + [{"machine": {"cpu": "Intel Xeon"}}] * 5 + [{}] * 2
    assert machines(runs) == {"Intel Xeon": 5, "AMD EPYC": 3, "unrecorded": 2}
    warned, = machine_warnings(runs)
    assert warned.startswith("machines: the runs were computed on 2 kinds of CPU (Intel Xeon: 5; AMD EPYC: 3)")
    assert machine_warnings(runs[:3] + [{}]) == []  # one recorded kind (the unrecorded ones may be anything)
    from shoal.comparison.results import commits

    codes = [{"code": {"commit": "a" * 40, "dirty": False}}] * 2 + [{"code": {"commit": "b" * 40, "dirty": True}},
                                                                    {"code": {"version": "0.1.0"}}, {}]
    assert commits(codes) == {"aaaaaaaaaa": 2, "unrecorded": 2, "bbbbbbbbbb+dirty": 1}


def test_widen_adds_values_past_every_grids_ends_and_resume_runs_only_the_new_points(tmp_path):
    """A finished comparison widened with --resume: the grid's old points are read, not run again; only the new
    ones run, every scheme's grid alike; compare.json and the command that reproduces it say so."""
    out = tmp_path / "cmp"
    base = ["compare", *_sets("run.max_time_s=0.5"), "--schemes", "bsp,ssp", "--tune-seeds", "1", "--out", str(out),
            "-q"]
    first = CliRunner().invoke(app, base)
    assert first.exit_code == 0, first.output
    old = {p: p.stat().st_mtime_ns for p in out.glob("ssp/tune/*/seed-0/summary.json")}
    assert len(old) == 3
    widened = CliRunner().invoke(app, base + ["--widen", "1", "--resume"])
    assert widened.exit_code == 0, widened.output
    data = json.loads((out / "compare.json").read_text())
    assert data["widen"] == 1 and "--widen 1" in data["command"]
    assert data["grids"]["ssp"] == {"sync.ssp.staleness": [0, 1, 3, 8, 13]}  # s >= 0: the small side stops at 0
    ssp = next(r for r in data["rows"] if r["scheme"] == "ssp")
    assert [e["point"]["sync.ssp.staleness"] for e in ssp["tuning"]] == [0, 1, 3, 8, 13]
    assert {p: p.stat().st_mtime_ns for p in old} == old  # read, not run again
    assert len(list(out.glob("ssp/tune/*/seed-0/summary.json"))) == 5
    assert "widened by 1 value past each end, every scheme alike (--widen)" in (out / "report.html").read_text()


def test_widen_without_tuning_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["compare", *_sets("run.max_time_s=0.5"), "--schemes", "bsp", "--widen", "1",
                                      "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--widen needs --tune-seeds K" in result.output


def test_the_report_says_when_several_cpus_or_commits_made_the_runs(tuned, tmp_path):
    import shutil

    out, data = tuned
    copy = tmp_path / "cmp"
    shutil.copytree(out, copy)
    data = {**data, "machines": {"Intel Xeon": 9, "AMD EPYC": 4}, "commits": {"aaaaaaaaaa": 13}}
    (copy / "compare.json").write_text(json.dumps(data))
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    page = (copy / "report.html").read_text()
    assert "computed on several kinds of CPU: Intel Xeon (9), AMD EPYC (4)" in page
    assert "several commits of shoal" not in page  # one commit: nothing to say
