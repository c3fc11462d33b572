"""Fair comparisons: --tune grids, the choice per scheme, pinned values, intervals over seeds."""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import FAST
from shoal.cli import app
from shoal.config import ConfigError
from shoal.report.schemes import parse_scheme
from shoal.report.tuning import choose, grid_points, interval, parse_tune, speedup_interval


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
    assert interval([3.0, None, 1.0]) == {"median": 3.0, "min": 1.0, "max": None, "ci90": None, "n": 3}
    iv = interval([10, 12, 11, 13, 30])
    assert iv["median"] == 12 and iv["min"] == 10 and iv["max"] == 30
    lo, hi = iv["ci90"]
    assert 10 <= lo <= 12 <= hi <= 30


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.1, 100), min_size=5, max_size=9))
def test_bootstrap_interval_of_the_median_contains_the_median(values):
    iv = interval(values)
    eps = 1e-6  # values are reported rounded to 6 decimals
    assert iv["ci90"][0] - eps <= statistics.median(values) <= iv["ci90"][1] + eps
    assert min(values) - eps <= iv["ci90"][0] and iv["ci90"][1] <= max(values) + eps


def test_speedup_interval_is_the_ratio_of_medians_with_a_bootstrap_band():
    sp = speedup_interval([20, 22, 21, 19, 20], [10, 11, 10, 9, 10])
    assert sp["value"] == pytest.approx(2.0)
    assert sp["ci90"][0] <= 2.0 <= sp["ci90"][1]
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
            "--tune", "optimizer.lr=0.02,0.2", "--seeds", "2", "--out", str(out), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "compare.json").read_text())


def test_compare_tunes_every_scheme_and_keeps_its_best_point(tuned):
    out, data = tuned
    assert data["tune"] == {"optimizer.lr": [0.02, 0.2]}
    assert "--tune optimizer.lr=0.02,0.2" in data["command"]
    for row in data["rows"]:
        if row["scheme"].startswith("localsgd"):
            assert row["tuned"] == {} and row["pinned"] == {"optimizer.lr": "0.2"} and len(row["tuning"]) == 1
            continue
        assert [e["point"] for e in row["tuning"]] == [{"optimizer.lr": 0.02}, {"optimizer.lr": 0.2}]
        best = min(row["tuning"], key=lambda e: (e["median_time_to_target_s"] is None,
                                                 e["median_time_to_target_s"] or 0, -(e["median_final_accuracy"] or 0)))
        assert row["tuned"] == best["point"]
        assert row["time_to_target_s"] == best["median_time_to_target_s"]
        assert [s["run_dir"] for s in row["seeds"]] == best["run_dirs"]
        for e in row["tuning"]:  # every grid point of every seed ran, in its own folder
            for d in e["run_dirs"]:
                assert (out / d / "summary.json").exists() and "/tune-optimizer.lr=" in f"/{d}"
        assert set(row["time_to_target_interval"]) == {"median", "min", "max", "ci90", "n"}
        assert "final_accuracy_interval" in row and "speedup_vs_bsp_interval" in row


def test_the_report_shows_the_tuned_values_and_the_grid(tuned):
    out, data = tuned
    page = (out / "report.html").read_text()
    assert "Tuning grid" in page and "lr 0.02" in page and "lr 0.2" in page
    assert "median over seeds and the band" in page


def test_tuning_a_key_the_scheme_sets_is_one_line_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["compare", *_sets(), "--schemes", "bsp,asp", "--tune",
                                      "sync.scheme=bsp,asp", "--out", str(tmp_path / "c"), "-q"])
    assert result.exit_code == 2
    assert "--tune sync.scheme: scheme bsp sets it itself" in result.output
    assert not (tmp_path / "c").exists()


def test_bootstrap_ends_stay_none_for_unreached_seeds_never_nan():
    """scipy's resamples are read as order statistics: an end among unreached seeds is None, a finite one a number."""
    iv = interval([1, None, None, 2, 3, None])
    assert iv["ci90"][1] is None and iv["ci90"][0] == pytest.approx(iv["ci90"][0]) and iv["ci90"][0] >= 1
    sp = speedup_interval([None, 1, 2, 3, None], [1, None, 2, 3, 4])
    assert sp["ci90"][1] is None and sp["ci90"][0] == 0.0  # resamples where only the base never reached it
    assert interval([5, 5, 5, 5, 5])["ci90"] == [5.0, 5.0]  # ties: no warning, no NaN
    assert interval([4, 8, 6, 5, 7], seed=3) == interval([4, 8, 6, 5, 7], seed=3)  # seeded: repeatable
