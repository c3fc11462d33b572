"""`shoal train` end to end through the real console script: outputs, exit codes, no half-written runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST, ROOT, default_sigint

SHOAL = [str(Path(sys.executable).with_name("shoal"))]


def shoal(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(SHOAL + list(args), capture_output=True, text=True, cwd=cwd, timeout=300)


def _sets(*overrides: str) -> list[str]:
    return [arg for o in list(FAST) + list(overrides) for arg in ("--set", o)]


def test_train_writes_the_run_files(tmp_path):
    result = shoal("train", *_sets(), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "config.toml", "metrics.jsonl", "model.json", "model.safetensors", "summary.json"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["scheme"] == "bsp" and summary["backend"] == "sim"
    assert "final accuracy" in result.stdout


@pytest.mark.slow
def test_resolved_config_reproduces_the_run(tmp_path):
    assert shoal("train", *_sets("sync.scheme=ssp"), "--out", str(tmp_path / "a"), "-q").returncode == 0
    again = shoal("train", "--config", str(tmp_path / "a" / "config.toml"), "--out", str(tmp_path / "b"), "-q")
    assert again.returncode == 0, again.stderr
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--set", "cluster.workers=0"], "cluster.workers"),
        (["--set", "cluster.wrokers=3"], "cluster.wrokers: unknown key"),
        (["--set", "cluster.speeds=[1, 2]"], "speeds has 2 entries but workers = 8"),
        (["--set", "cluster.link_gbps=-5"], "cluster.link_gbps"),
        (["--set", "data.name=npz:/no/such/file.npz"], "does not exist"),
        (["--set", "sync.scheme=gossip"], "sync.scheme"),
        (["--config", "/no/such/config.toml"], "config file not found"),
        (["--set", "cluster.workers"], "expected section.key=value"),
        (["--backend", "ray", "--set", "backend.mode=cost"], "cost mode is simulator-only"),
        (["--backend", "ray", "--set", "run.eval_refine=4"], "refining the time to target is simulator-only"),
        (["--resume", "/no/such/run"], "config file not found"),
        (["--set", "optimizer.lr=inf"], "optimizer.lr: must be a finite number, got inf"),
        (["--set", "optimizer.weight_decay=inf"], "optimizer.weight_decay: must be a finite number"),
        (["--set", "cluster.compute_s=inf"], "cluster.compute_s: must be a finite number"),
        (["--set", "cluster.latency_ms=inf"], "cluster.latency_ms: must be a finite number"),
        (["--set", "run.max_time_s=inf"], "run.max_time_s: must be a finite number"),
        (["--set", "cluster.lognormal_sigma=1000"], "cluster.lognormal_sigma"),
        (["--set", "data.batch_size=100000"], "data.batch_size: 100000 is larger than the smallest worker's shard"),
        (["--set", "optimizer.lr_decay_epochs=[-1]"], "optimizer.lr_decay_epochs.0"),
        (["--set", "compression.gdtopk.final_density_fast=0.5"], "must not exceed final_density_slow"),
        (["--set", "sync.gssp.groups=\"auto2\""], "sync.gssp.groups: 'auto2' is not valid: expected a valid integer or 'auto'"),
        (["--set", "cluster=3"], "cluster: expected a [cluster] table, got 3"),
        (["--set", "run.seed.x=1"], "run.seed is a value, not a section"),
        (["--set", "clustr.workers=2"], "clustr: unknown key (did you mean 'cluster'?)"),
        (["--set", "sync.stalenes=2"], "sync.stalenes: unknown key (did you mean 'ssp.staleness'?)"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, fragment):
    out = tmp_path / "run"
    result = shoal("train", *args, "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr
    assert not out.exists()


def test_too_many_workers_for_the_data_is_rejected(tmp_path):
    result = shoal("train", *_sets("cluster.workers=5000"), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "5000 workers but only" in result.stderr
    assert not (tmp_path / "run").exists()


def test_malformed_data_file_is_rejected_before_writing(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip archive")
    result = shoal("train", *_sets(f"data.name=npz:{bad}"), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_earlier_run_is_never_overwritten_by_accident(tmp_path):
    out = tmp_path / "run"
    assert shoal("train", *_sets(), "--out", str(out), "-q").returncode == 0
    before = (out / "summary.json").read_text()
    again = shoal("train", *_sets("run.seed=5"), "--out", str(out), "-q")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert (out / "summary.json").read_text() == before
    assert shoal("train", *_sets("run.seed=5"), "--out", str(out), "-q", "--overwrite").returncode == 0


@pytest.mark.slow
def test_mnist_bsp_example_reaches_95_percent(tmp_path):
    result = shoal("train", "--config", str(ROOT / "examples" / "mnist_bsp.toml"), "--out", str(tmp_path / "r"), "-q")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["best_accuracy"] >= 0.95 and summary["time_to_target_s"] is not None
    assert summary["wall_s"] < 180


def test_a_diverging_run_stops_with_valid_json(tmp_path):
    out = tmp_path / "run"
    result = shoal("train", *_sets("optimizer.lr=1e12", "run.max_time_s=5"), "--out", str(out))
    assert result.returncode == 3 and "the run diverged" in result.stderr
    def strict(text: str):  # json.loads accepts a bare NaN unless told otherwise
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))

    events = [strict(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = strict((out / "summary.json").read_text())
    assert summary["stop_reason"] == "diverged" and events[-1]["event"] == "end"
    assert summary["elapsed_s"] < 1.0


@pytest.mark.parametrize("command", ["train", "compare"])
def test_an_unwritable_out_folder_is_one_line_exit_2(tmp_path, command):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    extra = ["--schemes", "bsp"] if command == "compare" else []
    for out in (blocker / "sub", Path("/proc/1/shoal-cannot-write-here")):
        result = shoal(command, *extra, *_sets("run.max_time_s=1"), "--out", str(out))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "cannot write there" in lines[0]
        assert "Traceback" not in result.stderr and not out.exists()


def test_a_rejected_run_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "new" / "run"
    result = shoal("train", *_sets("data.batch_size=100000"), "--out", str(out))
    assert result.returncode == 2 and not (tmp_path / "new").exists()


def test_usage_errors_are_one_line_and_no_arguments_print_the_help():
    bad = shoal("train", "--no-such-flag")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: No such option: --no-such-flag; see 'shoal train --help'"]
    bare = shoal()
    assert bare.returncode == 0 and "Commands:" in bare.stdout and "train" in bare.stdout


def test_ctrl_c_on_sim_writes_the_summary_and_the_end_event(tmp_path):
    import os
    import signal
    import time

    out = tmp_path / "r"
    cmd = SHOAL + ["train", "--out", str(out), "-q", *_sets("run.max_time_s=100000", "run.target_accuracy=0.9999")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # metrics.jsonl is flushed per event: wait for some training
            metrics = out / "metrics.jsonl"
            if metrics.exists() and sum('"eval"' in line for line in metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, proc.stderr.read()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["iterations"] > 0
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "end" and events[-1]["reason"] == "interrupted"


def test_print_config_shows_the_resolved_config_and_writes_nothing(tmp_path):
    from shoal.config import load_config

    result = shoal("train", *_sets("sync.scheme=gssp"), "--print-config", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    (tmp_path / "printed.toml").write_text(result.stdout)
    assert load_config(tmp_path / "printed.toml") == load_config(None, FAST + ["sync.scheme=gssp"])
    assert "[sync.gssp]" in result.stdout and not (tmp_path / "run").exists()


def test_dry_run_builds_everything_says_what_would_run_and_writes_nothing(tmp_path):
    result = shoal("train", *_sets("sync.scheme=localsgd", "sync.balance=steps", "cluster.profile=tiers"),
                   "--dry-run", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "model: mlp," in result.stdout and "4 workers, slowdowns 1, 2, 4, 8" in result.stdout
    assert "sync.balance = 'steps'" in result.stdout and "local models: yes" in result.stdout
    assert "plan: every tensor" in result.stdout and "after each worker's own local steps (8 x 4 a period" in \
        result.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, plan", [
    (["sync.scheme=localsgd"], "averaged every 8 local steps"),
    (["sync.scheme=localsgd", "sync.localsgd.warmup_steps=4"], "every 8 local steps after 4 steps that average"),
    (["sync.scheme=diloco", "sync.diloco.adaptive=true"], "every 8 local steps at first, then every "
                                                           "ceil(H x sqrt(L / L0)) as the training loss L falls"),
])
def test_the_dry_run_states_the_averaging_plan_the_policy_follows(overrides, plan):
    from shoal.config import load_config
    from shoal.runner import dry_run

    [line] = [line for line in dry_run(load_config(None, FAST + overrides)) if line.startswith("plan:")]
    assert plan in line, line
    bad = shoal("train", *_sets("model.hidden=[0]"), "--dry-run")
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


def test_shoal_schema_prints_the_schema_the_package_ships(tmp_path):
    from shoal.commands.schema import PACKAGED
    from shoal.config.files import json_schema

    assert PACKAGED.read_text() == json_schema(), "src/shoal/config/shoal.schema.json is stale: run make docs"
    printed = shoal("schema")
    assert printed.returncode == 0 and printed.stdout == json_schema()
    written = shoal("schema", "--out", str(tmp_path / "s" / "shoal.schema.json"))
    assert written.returncode == 0 and (tmp_path / "s" / "shoal.schema.json").read_text() == json_schema()
    assert shoal("schema", "--path").stdout.strip() == str(PACKAGED)
