"""`run.tensorboard = true`: TensorBoard scalars beside metrics.jsonl, read back from the event file itself."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import FAST
from shoal.config import ConfigError, load_config
from shoal.runner import train


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of the TFRecord event files in ``folder``: tag -> [(step, wall time, value)]."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):  # a record: u64 length, u32 crc of it, the event, u32 crc of the event
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, event.wall_time, value.simple_value))
    return out


def test_scalars_match_the_evaluations_of_the_run(tmp_path: Path) -> None:
    cfg = load_config(None, FAST + ["sync.scheme=gssp", "cluster.workers=4", "run.tensorboard=true",
                                    "optimizer.warmup_epochs=2"])
    train(cfg, tmp_path / "r")
    scalars = read_scalars(tmp_path / "r" / "tensorboard")
    evals = [e for e in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) if e["event"] == "eval"]
    assert [v for _, _, v in scalars["accuracy"]] == pytest.approx([e["accuracy"] for e in evals])
    assert [step for step, _, _ in scalars["accuracy"]] == [e["iterations"] for e in evals]
    assert [t for _, t, _ in scalars["accuracy"]] == pytest.approx([e["t"] for e in evals])  # the run's own clock
    assert [v for _, _, v in scalars["bytes"]] == pytest.approx([e["bytes"] for e in evals], rel=1e-6)
    assert "loss" in scalars
    events = [e for e in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())]
    in_force = [next(e["lr"] for e in reversed(events[:events.index(ev)]) if "lr" in e) for ev in evals]
    assert [v for _, _, v in scalars["learning_rate"]] == pytest.approx(in_force) and in_force[0] == 0.1 / 32
    rates = [tag for tag in scalars if tag.startswith("iterations_per_s/group")]
    assert rates and all(v >= 0 for tag in rates for _, _, v in scalars[tag])
    previous = dict(zip([e["t"] for e in evals[1:]], [e["t"] for e in evals]))  # each evaluation's window starts at the one before
    counted = sum(v * (t - previous.get(t, 0.0)) for tag in rates for _, t, v in scalars[tag])
    assert counted == pytest.approx(evals[-1]["iterations"], rel=1e-6)  # rate x window adds up to the iterations run


def test_without_the_package_the_run_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboardX" else real(name, *a))  # as if not installed
    cfg = load_config(None, FAST + ["run.tensorboard=true"])
    with pytest.raises(ConfigError, match=r"run.tensorboard = true: tensorboardX is not installed; pip install 'shoal\[tensorboard\]'"):
        train(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
