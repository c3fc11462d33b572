"""The server optimizers under the 1/N update weighting: AdamW's decoupled weight decay beside Adam's L2 penalty,
gradient clipping, and the learning rate's warm-up."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import FAST
from shoal.api import train
from shoal.cli import app
from shoal.config import OptimizerConfig, load_config
from shoal.engine.replica import Replica, torch_optimizer
from shoal.runner import train as run

pytestmark = pytest.mark.timeout(120)


def test_a_full_adamw_step_is_torchs_adamw_on_the_mean_gradient():
    """A BSP round (N gradients at weight 1/N) steps exactly as torch's AdamW on their mean."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(20, generator=gen)
    replica = Replica(start, torch.zeros(0), OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.1))
    reference = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.AdamW([reference], lr=0.01, weight_decay=0.1)
    for _ in range(5):
        grads = [torch.randn(20, generator=gen) for _ in range(4)]
        replica.apply(grads, weight=0.25)
        reference.grad = torch.stack(grads).sum(0) / 4
        optimizer.step()
    assert torch.equal(replica.params.detach(), reference.detach())


@pytest.mark.parametrize("weight", [1.0, 0.25])
def test_adamw_shrinks_the_parameters_in_proportion_and_adam_passes_the_decay_through_its_normalisation(weight):
    """On a zero gradient AdamW's step is the decay alone, p x (1 - lr x share x wd); Adam's L2 penalty is a
    gradient, which Adam normalises: its first step moves every parameter by lr x share, whatever its size."""
    start = torch.tensor([1.0, -2.0, 8.0])
    lr, wd = 0.01, 0.5
    decoupled = Replica(start, torch.zeros(0), OptimizerConfig(name="adamw", lr=lr, weight_decay=wd))
    coupled = Replica(start, torch.zeros(0), OptimizerConfig(name="adam", lr=lr, weight_decay=wd))
    for replica in (decoupled, coupled):
        replica.apply([torch.zeros(3)], weight)
    assert torch.allclose(decoupled.params.detach(), start * (1 - lr * weight * wd), rtol=0, atol=1e-7)
    assert torch.allclose(coupled.params.detach(), start - lr * weight * start.sign(), rtol=0, atol=1e-6)


def test_n_steps_of_one_nth_decay_about_as_one_full_step():
    """An asynchronous scheme's N steps at weight 1/N decay as far as BSP's one step, to second order."""
    opt = OptimizerConfig(name="adamw", lr=0.05, weight_decay=0.2)
    start = torch.tensor([1.0, -3.0])
    full, split = Replica(start, torch.zeros(0), opt), Replica(start, torch.zeros(0), opt)
    full.apply([torch.zeros(2)] * 8, 1 / 8)
    for _ in range(8):
        split.apply([torch.zeros(2)], 1 / 8)
    assert torch.allclose(split.params.detach(), full.params.detach(), rtol=(0.05 * 0.2) ** 2)


def test_torch_optimizer_builds_what_the_config_names():
    """The one factory the replica and the ray all-reduce ranks share."""
    params = [torch.nn.Parameter(torch.zeros(2))]
    built = {name: torch_optimizer(OptimizerConfig(name=name, lr=0.1, weight_decay=0.3), params, 0.3)
             for name in ("sgd", "adam", "adamw")}
    assert [type(o).__name__ for o in built.values()] == ["SGD", "Adam", "AdamW"]
    assert all(o.param_groups[0]["weight_decay"] == 0.3 and o.param_groups[0]["lr"] == 0.1 for o in built.values())
    betas = OptimizerConfig(name="adamw", betas=(0.9, 0.95))
    assert torch_optimizer(betas, params, 0.0).param_groups[0]["betas"] == (0.9, 0.95)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_a_clipped_bsp_round_is_torchs_clip_grad_norm_on_the_mean_then_the_step(name):
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(30, generator=gen)
    opt = OptimizerConfig(name=name, lr=0.05, momentum=0.9, weight_decay=0.01, clip_norm=0.5)
    replica = Replica(start, torch.zeros(0), opt)
    reference = torch.nn.Parameter(start.clone())
    optimizer = (torch.optim.SGD([reference], lr=0.05, momentum=0.9, weight_decay=0.01) if name == "sgd"
                 else torch.optim.AdamW([reference], lr=0.05, weight_decay=0.01))
    for scale in (0.01, 3.0, 10.0):  # a round under the norm, then two over it
        grads = [scale * torch.randn(30, generator=gen) for _ in range(4)]
        replica.apply(grads, weight=0.25)
        reference.grad = torch.stack(grads).sum(0) / 4
        torch.nn.utils.clip_grad_norm_([reference], 0.5)
        optimizer.step()
        assert torch.allclose(replica.params.detach(), reference.detach(), rtol=1e-6, atol=1e-7)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.floats(0.1, 20.0), st.floats(0.05, 2.0), st.integers(0, 10_000))
def test_no_clipped_step_moves_further_than_its_share_of_the_norm(count, scale, clip, seed):
    """Plain SGD at lr 1: a step of ``count`` gradients at weight 1/8 moves by their clipped mean times its share,
    so never more than clip x share; a mean already under the norm moves exactly as without clipping."""
    gen = torch.Generator().manual_seed(seed)
    grads = [scale * torch.randn(10, generator=gen) for _ in range(count)]
    moved = {}
    for clip_norm in (clip, None):
        replica = Replica(torch.zeros(10), torch.zeros(0), OptimizerConfig(lr=1.0, momentum=0.0, clip_norm=clip_norm))
        replica.apply(grads, weight=1 / 8)
        moved[clip_norm] = -replica.params.detach()
    share, mean = count / 8, torch.stack(grads).mean(0)
    assert float(moved[clip].norm()) <= clip * share * (1 + 1e-5)
    if float(mean.norm()) <= clip:
        assert torch.equal(moved[clip], moved[None])
    else:
        assert torch.allclose(moved[clip], moved[None] * clip / (float(mean.norm()) + 1e-6), rtol=1e-5)


@pytest.mark.parametrize("scheme", ["bsp", "asp", "localsgd"])
def test_adamw_with_clipping_trains_from_the_python_api(tmp_path, scheme):
    result = train(None, out=tmp_path / scheme, progress=False,
                   overrides=FAST + [f"sync.scheme={scheme}", 'optimizer.name="adamw"', "optimizer.lr=0.01",
                                     "optimizer.weight_decay=0.01", "optimizer.clip_norm=1.0"])
    assert result.summary["time_to_target_s"] is not None, result.summary


def test_adamw_from_the_cli_and_a_wrong_name_is_one_line(tmp_path):
    sets = [a for o in FAST + ['optimizer.name="adamw"', "optimizer.lr=0.01", "optimizer.weight_decay=0.01",
                               "optimizer.betas=[0.9, 0.95]"] for a in ("--set", o)]
    result = CliRunner().invoke(app, ["train", "-q", *sets, "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    written = tomllib.loads((tmp_path / "r" / "config.toml").read_text())["optimizer"]
    assert written["name"] == "adamw" and written["betas"] == [0.9, 0.95]
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["final_accuracy"] > 0.9
    wrong = CliRunner().invoke(app, ["train", "--set", 'optimizer.name="adamx"', "--out", str(tmp_path / "w")])
    assert wrong.exit_code == 2 and "optimizer.name" in wrong.output and "adamw" in wrong.output
    assert not (tmp_path / "w").exists()
    beta = CliRunner().invoke(app, ["train", "--set", "optimizer.betas=[0.9, 1.0]", "--out", str(tmp_path / "b")])
    assert beta.exit_code == 2 and "optimizer.betas" in beta.output and not (tmp_path / "b").exists()


def test_the_warmup_rises_in_32_equal_stairs_then_the_decay_schedule_follows():
    opt = OptimizerConfig(lr=0.32, warmup_epochs=2.0, lr_decay_epochs=[5.0], lr_decay_factor=0.5)
    assert [opt.lr_at(e) for e in (0.0, 0.0624, 0.0625, 1.0, 1.9375, 4.99, 5.0)] == pytest.approx(
        [0.01, 0.01, 0.02, 0.17, 0.32, 0.32, 0.16])
    assert [opt.decays_at(e) for e in (0.0, 1.99, 5.0)] == [0, 0, 1] and opt.scheduled
    assert not OptimizerConfig().scheduled and OptimizerConfig(lr=0.3).lr_at(0.0) == 0.3
    assert Replica(torch.zeros(2), torch.zeros(0), opt).optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_a_warmup_that_never_ends_trains_exactly_as_its_first_stair(tmp_path):
    """The first stair is lr / 32 on every server and local model from the first step."""
    sets = FAST + ["sync.scheme=localsgd", "run.stop_at_target=false", "run.max_time_s=0.6"]
    stair = run(load_config(None, sets + ["optimizer.lr=0.1", "optimizer.warmup_epochs=1000"]), tmp_path / "a")
    constant = run(load_config(None, sets + [f"optimizer.lr={0.1 / 32}"]), tmp_path / "b")
    assert stair["final_accuracy"] == constant["final_accuracy"] and stair["iterations"] == constant["iterations"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_the_cosine_descends_in_64_stairs_to_its_floor_after_the_warmup():
    opt = OptimizerConfig(lr=1.0, warmup_epochs=1.0, cosine_epochs=4.0, lr_decay_factor=0.1)
    assert [opt.lr_at(e) for e in (0.99, 1.0, 1.0624, 3.0, 4.99, 5.0, 50.0)] == pytest.approx(
        [1.0, 1.0, 1.0, 0.55, 0.1 + 0.9 * (1 + math.cos(math.pi * 63 / 64)) / 2, 0.1, 0.1])
    assert opt.decays_at(50.0) == 0 and opt.change_event(0.5, False) == "lr_warmup"
    assert opt.change_event(2.0, False) == "lr_cosine" and opt.change_event(2.0, True) == "lr_decay"


def _restarts_and_events(tmp_path, monkeypatch, *schedule: str) -> tuple[list[int], list[dict]]:
    """A BSP+SIM run with ``schedule``: how often SIM restarted its periods, and the run's events."""
    from shoal.compress.similarity import SimilaritySchedule

    restarts: list[int] = []
    reset = SimilaritySchedule.reset
    monkeypatch.setattr(SimilaritySchedule, "reset", lambda self: restarts.append(1) or reset(self))
    sets = FAST + ["compression.similarity.enabled=true", "run.stop_at_target=false", "run.max_time_s=1.5", *schedule]
    run(load_config(None, sets), tmp_path / "r")
    return restarts, [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]


def test_sim_follows_the_stairs_and_restarts_its_periods_only_at_a_decay(tmp_path, monkeypatch):
    restarts, events = _restarts_and_events(tmp_path, monkeypatch, "optimizer.warmup_epochs=1",
                                            "optimizer.lr_decay_epochs=[3]", "optimizer.lr_decay_factor=0.5")
    stairs = [e["lr"] for e in events if e["event"] == "lr_warmup"]
    assert stairs == pytest.approx([0.1 * k / 32 for k in range(2, 33)])  # the first stair is the start
    assert [e["lr"] for e in events if e["event"] == "lr_decay"] == pytest.approx([0.05]) and len(restarts) == 1


def test_sim_climbs_then_descends_the_cosine_without_restarting_its_periods(tmp_path, monkeypatch):
    restarts, events = _restarts_and_events(tmp_path, monkeypatch, "optimizer.warmup_epochs=0.5",
                                            "optimizer.cosine_epochs=1", "optimizer.lr_decay_factor=0.5")
    warmup, cosine = ([e["lr"] for e in events if e["event"] == kind] for kind in ("lr_warmup", "lr_cosine"))
    assert warmup == sorted(warmup) and warmup[-1] == pytest.approx(0.1) and not restarts  # an iteration may skip one
    assert cosine == sorted(cosine, reverse=True) and 20 < len(cosine) <= 64 and cosine[-1] == pytest.approx(0.05)


def test_a_worker_that_joins_after_the_warmup_steps_its_local_model_at_the_rate_then():
    from shoal.backends.sim import SimBackend
    from shoal.engine.metrics import RunRecorder
    from shoal.engine.setup import build_setup

    cfg = load_config(None, FAST + ["sync.scheme=localsgd", "optimizer.warmup_epochs=0.2", "run.stop_at_target=false",
                                    "run.max_time_s=0.8", "cluster.membership=[{at_s=0.5, add=1}]"])
    backend = SimBackend(build_setup(cfg), RunRecorder())
    backend.run()
    assert len(backend.locals) == 5 and {local.replica.lr for local in backend.locals} == {0.1}


@pytest.mark.parametrize("overrides, line", [
    ([], "optimizer: sgd, lr 0.1, momentum 0.9; a constant rate"),
    (["optimizer.lr_decay_epochs=[3, 6]", "optimizer.weight_decay=0.01"],
     "optimizer: sgd, lr 0.1, momentum 0.9, weight decay 0.01 (L2); x0.1 at epochs 3, 6"),
    (['optimizer.name="adamw"', "optimizer.lr=0.0032", "optimizer.weight_decay=0.1", "optimizer.betas=[0.9, 0.95]",
      "optimizer.clip_norm=1", "optimizer.warmup_epochs=0.02", "optimizer.cosine_epochs=0.5"],
     "optimizer: adamw, lr 0.0032 (betas 0.9, 0.95), weight decay 0.1 (decoupled), gradients clipped to norm 1; "
     "warm-up over 0.02 epochs from 0.0001, then a cosine over 0.5 epochs to 0.00032"),
])
def test_the_dry_run_states_the_optimizer_and_its_schedule(overrides, line):
    from shoal.runner import dry_run

    assert line in dry_run(load_config(None, FAST + overrides))
