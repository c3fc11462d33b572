"""What leaving the straggler out would have saved (shoal/whatif.py), in summary.json and the CLI's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.config import load_config
from shoal.runner import train

from conftest import FAST

pytestmark = pytest.mark.timeout(120)

FINE = ["run.eval_every_s=0.02", "run.max_time_s=10", "run.target_accuracy=0.93"]


def test_one_slow_worker_is_named_and_its_cost_estimated_by_an_exact_replay(tmp_path: Path):
    """Speeds 1, 1, 1, 4 under BSP: worker 3 held the others back. Without it, the progress the run made by its
    target is k (N - 1) / N iterations of the others if progress is per update, k if per sample, in between by
    the run's gradient noise scale; the replay takes exactly the time a real (train-mode) run of the others takes for as many iterations."""
    summary = train(load_config(None, FAST + ["cluster.speeds=[1,1,1,4]", *FINE]), tmp_path / "slow")
    stragglers = summary["stragglers"]
    estimate = stragglers["without_culprit"]
    assert stragglers["culprit"] == 3 and estimate["worker"] == 3 and estimate["to"] == "target"
    k = summary_iterations_at_target(tmp_path / "slow")
    assert estimate["iterations"] == [round(k * 3 / 4), k]
    low, high = estimate["speedup"]
    assert 2.5 < low < high < 4.5 and estimate["time_s"][0] < estimate["time_s"][1]
    assert "without it the same progress would take" in stragglers["verdict"]
    point = estimate["estimate"]  # by the run's gradient noise scale: between the two rules
    assert point["noise_scale"] == summary["gradient_noise_scale"] > 0
    assert estimate["iterations"][0] <= point["iterations"] <= estimate["iterations"][1]
    assert "by the run's gradient noise scale" in stragglers["verdict"]
    for iterations, seconds in zip(estimate["iterations"] + [point["iterations"]],
                                   estimate["time_s"] + [point["time_s"]]):
        real = train(load_config(None, FAST + ["cluster.workers=3", "cluster.speeds=[1,1,1]", *FINE,
                                               f"run.max_iterations={iterations}", "run.stop_at_target=false"]),
                     tmp_path / f"without-{iterations}")
        assert real["elapsed_s"] == pytest.approx(seconds, rel=1e-6)


def summary_iterations_at_target(run: Path) -> int:
    summary = json.loads((run / "summary.json").read_text())
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    return next(e["iterations"] for e in evals if e["t"] == summary["time_to_target_s"])


def test_a_scheme_with_local_models_says_why_there_is_no_estimate(tmp_path: Path):
    summary = train(load_config(None, FAST + ["cluster.speeds=[1,1,1,4]", "sync.scheme=localsgd",
                                              "sync.localsgd.local_steps=2", *FINE]), tmp_path / "run")
    estimate = summary["stragglers"]["without_culprit"]
    assert "local models" in estimate["skipped"] and "no estimate without it" in summary["stragglers"]["verdict"]


def test_the_cli_prints_the_estimate_with_the_verdict(tmp_path: Path):
    sets = [arg for s in FAST + ["cluster.speeds=[1,1,1,4]", *FINE] for arg in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "shoal", "train", *sets, "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "worker 3 held the others back" in text and "without it the same progress would take" in text
