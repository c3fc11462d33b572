"""run.eval_refine: copies of the evaluated model between evaluations, evaluated only when the target is reached.

A refined run trains exactly as the unrefined one; each refined evaluation judges the very model a finer
evaluation schedule sees at that moment; the time to target moves back to the earliest copy from which every
evaluation reached the target; a checkpointed run refines as the uninterrupted one does."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import FAST
from shoal.cli import app
from shoal.backends import checkpoint
from shoal.comparison.results import resolution_warnings
from shoal.config import load_config
from shoal.errors import ConfigError
from shoal.report.runs import load_run
from shoal.runner import train

pytestmark = pytest.mark.timeout(120)

#: reaches 0.9 around 0.9-1.3 virtual seconds; the whole run is kept so that the finer schedule covers every copy
BASE = FAST + ["run.target_accuracy=0.9", "run.stop_at_target=false", "run.max_time_s=1.6"]


def _events(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _trained(events):
    """What the training did: every event but evaluations made only to refine, and the run's own bookkeeping."""
    return [e for e in events if not e.get("refined") and e["event"] not in ("end",)]


def _run(tmp_path, name, *sets):
    summary = train(load_config(None, BASE + list(sets)), tmp_path / name)
    return summary, _events(tmp_path / name)


@pytest.mark.parametrize("period, fine", [
    (("run.eval_every_iterations=40",), ("run.eval_every_iterations=5",)),
    (("run.eval_every_s=0.4",), ("run.eval_every_s=0.05",)),
])
def test_a_refined_run_trains_as_before_and_judges_the_models_a_finer_schedule_sees(tmp_path, period, fine):
    plain, plain_events = _run(tmp_path, "plain", *period)
    refined, refined_events = _run(tmp_path, "refined", *period, "run.eval_refine=8")
    _, fine_events = _run(tmp_path, "fine", *fine)
    assert _trained(refined_events) == _trained(plain_events)  # the same iterations, evaluations and times

    extra = [e for e in refined_events if e.get("refined")]
    assert 1 <= len(extra) == refined["evaluations_refined"] <= 7
    by_iterations = {e["iterations"]: e for e in fine_events if e["event"] == "eval"}
    for e in extra:  # a copy is the model a finer schedule evaluates after as many iterations
        assert e["iterations"] in by_iterations, e
        twin = by_iterations[e["iterations"]]
        assert (e["accuracy"], e["loss"]) == (twin["accuracy"], twin["loss"])

    ttt, before = refined["time_to_target_s"], plain["time_to_target_s"]
    assert ttt is not None and before is not None and ttt <= before
    hits = sorted(e["t"] for e in extra if e["accuracy"] >= 0.9)
    misses = [e["t"] for e in extra if e["accuracy"] < 0.9]
    assert ttt == (hits[0] if hits else before)  # the earliest copy of the unbroken run of hits
    assert len(misses) <= 1 and all(t < ttt for t in misses)  # scanned latest first: it stops at the first miss
    assert refined["bytes_to_target"] <= plain["bytes_to_target"]
    assert refined["final_accuracy"] == plain["final_accuracy"]


@pytest.mark.parametrize("scheme", [
    ("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]"),  # group servers: the mean of their replicas is evaluated
    ("sync.scheme=localsgd", "sync.localsgd.local_steps=4"),  # the model moves only at syncs
    ("sync.scheme=streaming_diloco",),
])
def test_every_kind_of_scheme_trains_as_before_when_refined(tmp_path, scheme):
    plain, plain_events = _run(tmp_path, "plain", "run.eval_every_iterations=40", *scheme)
    refined, refined_events = _run(tmp_path, "refined", "run.eval_every_iterations=40", "run.eval_refine=4", *scheme)
    assert _trained(refined_events) == _trained(plain_events)
    assert refined["evaluations_refined"] >= 1 and refined["time_to_target_s"] <= plain["time_to_target_s"]


def test_off_by_default_and_the_summary_says_nothing_of_it(tmp_path):
    summary, events = _run(tmp_path, "plain", "run.eval_every_iterations=40")
    assert "evaluations_refined" not in summary and not any(e.get("refined") for e in events)


@pytest.mark.parametrize("period, every_s", [("run.eval_every_s=0.4", 0.3),  # the last checkpoints fall mid-period
                                             ("run.eval_every_iterations=40", 0.35)])
def test_a_resumed_refined_run_equals_the_uninterrupted_one(tmp_path, period, every_s):
    sets = BASE + ["cluster.speeds=[1, 1, 2, 3]", f"backend.sim_checkpoint_every_s={every_s}", period,
                   "run.eval_refine=8"]
    whole = train(load_config(None, sets), tmp_path / "whole")
    train(load_config(None, sets + ["run.max_time_s=0.8"]), tmp_path / "cut")
    folder, state = checkpoint.latest(tmp_path / "cut" / "checkpoint")
    assert (folder / "refine.safetensors").exists() and state["refine"]["since_eval"]  # copies kept mid-period
    assert state["refine"]["keep_times"] if "eval_every_s" in period else state["refine"]["kept_mark"] != [0, 0]
    resumed = train(load_config(None, sets), tmp_path / "cut", resume=tmp_path / "cut")
    assert whole["evaluations_refined"] >= 1
    for key in whole:
        if key != "wall_s":
            assert resumed[key] == whole[key], key


def test_the_report_draws_refined_evaluations_in_time_order(tmp_path):
    _run(tmp_path, "refined", "run.eval_every_iterations=40", "run.eval_refine=8")
    run = load_run("bsp", tmp_path / "refined")
    times = [t for t, _ in run.evals]
    regular = [e for e in _trained(_events(tmp_path / "refined")) if e["event"] == "eval"]
    assert times == sorted(times) and len(times) > len(regular)


def test_bad_settings_are_one_clear_error():
    with pytest.raises(ConfigError, match="at most eval_every_iterations"):
        load_config(None, ["run.eval_every_iterations=4", "run.eval_refine=8"])
    with pytest.raises(ConfigError, match="greater than or equal to 1"):
        load_config(None, ["run.eval_refine=0"])


def test_the_resolution_warning_counts_the_refined_ticks():
    row = {"scheme": "bsp", "time_to_target_s": 10.0, "iterations": 1400}
    coarse = load_config(None, ["run.eval_every_iterations=160"])
    refined = load_config(None, ["run.eval_every_iterations=160", "run.eval_refine=8"])
    assert "spans 9 evaluations (every 160 iterations)" in resolution_warnings([row], coarse)[0]
    assert resolution_warnings([row], refined) == []  # 70 ticks of 20 iterations
    assert "spans 9 evaluations (every 160 iterations, refined 2x)" in resolution_warnings(
        [{**row, "iterations": 700}], load_config(None, ["run.eval_every_iterations=160", "run.eval_refine=2"]))[0]


def test_a_comparison_reports_the_refined_times_and_says_nothing_of_resolution(tmp_path):
    sets = [a for o in BASE + ["run.stop_at_target=true", "run.eval_every_iterations=40", "run.eval_refine=8"]
            for a in ("--set", o)]
    result = CliRunner().invoke(app, ["compare", "--schemes", "bsp,asp", "-q", *sets, "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "c" / "compare.json").read_text())
    for row in data["rows"]:  # one seed: the row is its run
        summary = json.loads((tmp_path / "c" / row["run_dir"] / "summary.json").read_text())
        assert row["time_to_target_s"] == summary["time_to_target_s"] and summary["evaluations_refined"] >= 1
    assert not [w for w in data["warnings"] if w.startswith("resolution")]
