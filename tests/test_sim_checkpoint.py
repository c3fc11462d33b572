"""Simulator checkpoints: a run stopped and resumed from its last checkpoint equals the uninterrupted run, bit for
bit, with the compressors whose state matters (top-k's error feedback, DGC's velocity, PowerSGD's warm start)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from conftest import FAST
from shoal.backends import checkpoint
from shoal.config import load_config
from shoal.runner import train

BASE = FAST + ["cluster.speeds=[1, 1, 2, 3]", "run.stop_at_target=false", "cluster.stragglers.probability=0.1",
               "backend.sim_checkpoint_every_s=0.5"]


def _events_after(path, t):
    return [e for e in map(json.loads, path.read_text().splitlines()) if e.get("t", -1) > t]


#: Adam after a warm-up, before a decay: the replica's rate comes back from the checkpoint, not from the config
SCHEDULED = ['optimizer.name="adam"', "optimizer.lr=0.01", "optimizer.warmup_epochs=0.5",
             "optimizer.lr_decay_epochs=[20]"]


@pytest.mark.parametrize("method, extra", [("topk", []), ("dgc", []), ("powersgd", []), ("topk", SCHEDULED)])
def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(tmp_path, method, extra):
    settings = BASE + [f"compression.method={method}", *extra]
    whole = train(load_config(None, settings + ["run.max_time_s=2"]), tmp_path / "whole")
    train(load_config(None, settings + ["run.max_time_s=1.3"]), tmp_path / "cut")  # stops after its checkpoint
    folder, state = checkpoint.latest(tmp_path / "cut" / "checkpoint")
    codecs = load_file(folder / "codecs.safetensors")
    assert any(".memory." in k or ".compressor.q." in k for k in codecs)  # the state a resume must not lose
    assert state["t"] < 1.3 and set(state["order"]) == {0, 1, 2, 3}
    resumed = train(load_config(None, settings + ["run.max_time_s=2"]), tmp_path / "cut", resume=tmp_path / "cut")
    for key in whole:
        if key != "wall_s":
            assert resumed[key] == whole[key], key
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    events = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    at = next(i for i, e in enumerate(events) if e["event"] == "resume")
    after = [e for e in events[at + 1:] if e.get("t", -1) > state["t"]]
    assert after == _events_after(tmp_path / "whole" / "metrics.jsonl", state["t"])  # same events, same times
    assert any(e["event"] == "iteration" for e in after) and any(e["event"] == "eval" for e in after)


@pytest.mark.slow
def test_resume_from_the_cli_and_what_it_refuses(tmp_path):
    sets = [a for o in BASE + ["compression.method=topk", "run.max_time_s=1"] for a in ("--set", o)]
    shoal = [sys.executable, "-m", "shoal", "train", "-q"]
    first = subprocess.run([*shoal, *sets, "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    longer = [*sets, "--set", "run.max_time_s=1.5"]
    done = subprocess.run([*shoal, *longer, "--resume", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["elapsed_s"] == pytest.approx(1.5)
    refused = [
        ([*sets, "--set", "run.max_time_s=0.2"], "past run.max_time_s"),
        ([*longer, "--set", "cluster.workers=3", "--set", "cluster.speeds=[1, 1, 2]"], "config asks bsp with 3"),
    ]
    for args, message in refused:
        bad = subprocess.run([*shoal, *args, "--resume", str(tmp_path / "run")], capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.toml").write_text((tmp_path / "run" / "config.toml").read_text())
    nothing = subprocess.run([*shoal, *sets, "--resume", str(empty)], capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 2 and "no checkpoint found" in nothing.stderr
