"""SIM: the period rule on scripted similarities, the meter, frozen optimizer steps, and end-to-end runs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.backends.local_model import LocalModel
from shoal.backends.sim import SimBackend
from shoal.compress.similarity import SimilarityMeter, SimilaritySchedule
from shoal.config import OptimizerConfig
from shoal.engine.gradients import TensorSlot
from shoal.engine.metrics import RunRecorder
from shoal.engine.replica import Replica
from shoal.engine.setup import build_setup
from shoal.runner import train

from conftest import read_jsonl


def schedule(**kw) -> SimilaritySchedule:
    args = dict(threshold=0.5, max_period=4, warmup_iterations=0, min_numel=10, smoothing=1.0)
    args.update(kw)
    return SimilaritySchedule(["big", "small"], [100, 5], **args)


def drive(s: SimilaritySchedule, similarities: list[float], clocks: int) -> list[tuple[bool, ...]]:
    """Ask the plan clock by clock; feed the next scripted similarity at every aggregation of tensor 0."""
    plans, feed = [], iter(similarities)
    for c in range(clocks):
        plan = s.plan(c)
        plans.append(plan)
        for i, due in enumerate(plan):
            if due:
                s.observe(i, next(feed, 0.0) if i == 0 else 0.9, c)
    return plans


def test_period_grows_by_one_while_similar_and_collapses_when_not():
    s = schedule()
    plans = drive(s, [0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.9], clocks=20)
    big = [c for c, p in enumerate(plans) if p[0]]
    # tau after each observation: 2, 3, 4, 4, 4, 1, 2 (capped at 4, collapsed by 0.1): syncs at
    assert big == [0, 2, 5, 9, 13, 17, 18]
    assert s.tensors[0].tau == 2


def test_tensors_under_the_floor_and_the_warmup_are_always_aggregated():
    s = schedule(warmup_iterations=6)
    plans = drive(s, [0.99] * 50, clocks=12)
    assert all(p[1] for p in plans)  # "small" has 5 < min_numel values
    assert all(p[0] for p in plans[:6])  # warm-up
    assert not all(p[0] for p in plans[6:])  # similar after the warm-up: skipping starts


def test_plans_are_memoised_so_every_worker_sees_the_same_decision():
    s = schedule()
    s.tensors[0].tau = 3
    first = [s.plan(c) for c in range(6)]
    s.tensors[0].tau = 1  # a later change does not rewrite decisions already handed out
    assert [s.plan(c) for c in range(6)] == first


def test_smoothing_and_reset():
    s = schedule(smoothing=0.5)
    s.observe(0, 1.0, 0)
    s.observe(0, 0.0, 1)
    assert s.tensors[0].similarity == pytest.approx(0.5)
    assert s.tensors[0].tau == 3  # 1.0, then the average 0.5: both >= threshold, so two increments
    s.reset()
    assert s.tensors[0].tau == 1 and s.tensors[0].similarity is None


def test_bytes_saved_count_what_a_plan_does_not_carry():
    s = schedule()
    s.record_saved((False, True))
    s.record_saved((False, False))
    assert [t.bytes_saved for t in s.tensors] == [800, 20]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 10_000))
def test_meter_equals_the_mean_cosine_with_the_sum(workers, numel, seed):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(numel, generator=gen, dtype=torch.float64) for _ in range(workers)]
    meter = SimilarityMeter()
    for x in xs:
        meter.add(0, x)
    total = sum(xs)
    expected = sum(float(torch.dot(x, total) / (x.norm() * total.norm())) for x in xs) / workers
    assert meter.similarity(0) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_meter_noise_floor_is_one_over_sqrt_n():
    """Independent noise gives about 1/sqrt(N): why the default threshold sits above it."""
    gen = torch.Generator().manual_seed(0)
    meter = SimilarityMeter()
    for _ in range(8):
        meter.add(0, torch.randn(200_000, generator=gen))
    assert meter.similarity(0) == pytest.approx(1 / math.sqrt(8), abs=0.01)


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_frozen_ranges_keep_parameters_and_optimizer_state(name):
    opt = OptimizerConfig(name=name, lr=0.1, momentum=0.9)
    p0 = torch.arange(6, dtype=torch.float32)
    plain, frozen = Replica(p0, torch.zeros(0), opt), Replica(p0, torch.zeros(0), opt)
    g = torch.ones(6)
    for _ in range(3):
        plain.apply([g], 0.5)
        frozen.apply([g], 0.5, frozen=[slice(2, 4)])
    assert torch.equal(frozen.params.detach()[2:4], p0[2:4])
    keep = [0, 1, 4, 5]
    assert torch.allclose(frozen.params.detach()[keep], plain.params.detach()[keep])
    for state in frozen.optimizer.state[frozen.params].values():
        if isinstance(state, torch.Tensor) and state.shape == p0.shape:
            assert torch.all(state[2:4] == 0)


def test_averaging_local_changes_gives_the_mean_local_model():
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.0)
    layout = [TensorSlot("w", (4,), 0, 4)]
    p0 = torch.zeros(4)
    server = Replica(p0, torch.zeros(0), opt)
    workers = [LocalModel(p0, torch.zeros(0), opt, layout) for _ in range(2)]
    for step in range(3):
        for i, local in enumerate(workers):
            local.step(torch.full((4,), float(i + step)))
    server.add_delta([w.change() for w in workers], 0.5)
    assert torch.allclose(server.params.detach(), (workers[0].params + workers[1].params) / 2)


def _run(cfg):
    backend = SimBackend(build_setup(cfg), RunRecorder())
    return backend, backend.run()


SIM = ["compression.similarity.enabled=true", "compression.similarity.min_numel=0",
       "compression.similarity.warmup_iterations=2", "run.stop_at_target=false", "model.hidden=[64]"]


def test_sim_that_never_finds_similarity_is_exactly_bsp(fast_config):
    """threshold 1: tau stays 1, every tensor is aggregated as a gradient: identical to plain BSP."""
    base = ["run.max_iterations=40", "run.stop_at_target=false", "model.hidden=[64]"]
    dense_backend, dense = _run(fast_config(*base))
    sim_backend, sim = _run(fast_config(*base, "compression.similarity.enabled=true",
                                        "compression.similarity.rule=cosine", "compression.similarity.threshold=1.0"))
    assert torch.equal(dense_backend.servers[0].replica.params, sim_backend.servers[0].replica.params)
    assert (sim["bytes_up"], sim["bytes_down"]) == (dense["bytes_up"], dense["bytes_down"])


def test_sim_skips_similar_tensors_and_resynchronises(fast_config, tmp_path):
    cfg = fast_config(*SIM, "compression.similarity.rule=cosine", "compression.similarity.threshold=-1", "compression.similarity.max_period=3",
                      "run.max_iterations=80")
    dense = train(fast_config("run.max_iterations=80", "run.stop_at_target=false", "model.hidden=[64]"),
                  tmp_path / "dense")
    sim = train(cfg, tmp_path / "sim")
    events = [e for e in read_jsonl(tmp_path / "sim" / "metrics.jsonl") if e["event"] == "sim"]
    assert len(events) == 20  # one per BSP round
    assert max(max(e["tau"]) for e in events) == 3
    assert events[-1]["bytes_saved"][0] > 0
    # with every tensor at tau 3 after the ramp, well under the dense bytes
    assert sim["bytes_up"] < 0.6 * dense["bytes_up"] and sim["bytes_down"] < 0.6 * dense["bytes_down"]
    assert sim["final_accuracy"] > 0.8


def test_workers_take_the_server_value_at_an_aggregation(fast_config):
    cfg = fast_config(*SIM, "compression.similarity.rule=cosine", "compression.similarity.threshold=-1", "compression.similarity.max_period=4",
                      "cluster.workers=2", "run.max_iterations=30")
    backend, _ = _run(cfg)
    server, schedule = backend.servers[0], backend.servers[0].schedule
    last = max(schedule._plans)  # the clock the workers would start next
    fresh = schedule.plan(last - 1)
    params = server.replica.params.detach()
    for w, local in enumerate(backend.locals):
        pulled = local.params.clone()
        local.pull(params, fresh)
        for sl, take in zip(backend.slices, fresh):
            if take:
                assert torch.equal(local.params[sl], params[sl])
            else:  # skipped tensors keep the worker's own value
                assert torch.equal(local.params[sl], pulled[sl])


@pytest.mark.parametrize("scheme", ["ssp", "gssp"])
def test_sim_runs_with_stale_synchronous_schemes(fast_config, tmp_path, scheme):
    cfg = fast_config(*SIM, f"sync.scheme={scheme}", "compression.similarity.rule=cosine", "compression.similarity.threshold=0.0",
                      "cluster.speeds=[1,1,4,4]", "run.max_time_s=3")
    summary = train(cfg, tmp_path / scheme)
    events = [e for e in read_jsonl(tmp_path / scheme / "metrics.jsonl") if e["event"] == "sim"]
    assert events and max(max(e["tau"]) for e in events) > 1
    assert summary["final_accuracy"] > 0.8
    if scheme == "gssp":
        assert {e["group"] for e in events} == {0, 1}


def test_learning_rate_decay_resets_the_periods(fast_config, tmp_path):
    cfg = fast_config(*SIM, "compression.similarity.rule=cosine", "compression.similarity.threshold=-1", "run.max_iterations=200",
                      "optimizer.lr_decay_epochs=[0.5]", "optimizer.lr_decay_factor=0.5")
    train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    decay = [i for i, e in enumerate(events) if e["event"] == "lr_decay"]
    assert len(decay) == 1 and events[decay[0]]["lr"] == pytest.approx(0.05)
    before = [e for e in events[: decay[0]] if e["event"] == "sim"][-1]
    after = [e for e in events[decay[0]:] if e["event"] == "sim"][0]
    assert max(before["tau"]) > 2 and max(after["tau"]) <= 2


def test_optimizer_lr_at_follows_the_step_schedule():
    opt = OptimizerConfig(lr=1.0, lr_decay_epochs=[2, 5], lr_decay_factor=0.1)
    assert [opt.lr_at(e) for e in (0, 1.99, 2, 4, 5, 9)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


# -- the calibrated rule, the base period, bounded memory ------------------------------------


def test_snr_is_zero_at_the_noise_floor_and_grows_with_similarity():
    from shoal.compress.similarity import snr

    assert snr(1 / math.sqrt(8), 8) == pytest.approx(0.0, abs=1e-12)
    assert snr(0.1, 8) == 0.0 and snr(1.0, 8) == math.inf and snr(0.3, 1) == math.inf
    r = 1.0  # s^2 = (r + 1/n) / (r + 1)
    assert snr(math.sqrt((r + 1 / 8) / (r + 1)), 8) == pytest.approx(r)
    assert snr(0.6, 8) < snr(0.7, 8) < snr(0.8, 8)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 16), st.sampled_from([0.25, 1.0, 4.0]), st.integers(0, 1000))
def test_snr_of_the_meter_recovers_the_true_signal_to_noise_ratio(n, ratio, seed):
    from shoal.compress.similarity import snr

    gen = torch.Generator().manual_seed(seed)
    dim = 20_000
    mean = torch.randn(dim, generator=gen)
    mean *= math.sqrt(ratio) / mean.norm()
    meter = SimilarityMeter()
    for _ in range(n):
        noise = torch.randn(dim, generator=gen)
        meter.add(0, mean + noise / noise.norm())
    assert snr(meter.similarity(0), n) == pytest.approx(ratio, rel=0.15, abs=0.05)


def test_base_period_without_similarity_is_local_sgds_plan():
    from shoal.sync.localsgd import PeriodicSchedule

    s = schedule(rule="snr", min_snr=1.0, base_period=3, max_period=6)  # tensor "small" is under min_numel
    periodic = PeriodicSchedule(2, 3)
    for c in range(30):
        plan = s.plan(c)
        assert plan == periodic.plan(c)
        for i, due in enumerate(plan):
            if due:
                s.observe(i, 1 / math.sqrt(8), c, count=8)  # noise only


def test_snr_rule_lengthens_the_period_only_above_min_snr():
    s = schedule(rule="snr", min_snr=1.0, max_period=4)
    high = math.sqrt((2.0 + 1 / 8) / (2.0 + 1))  # r = 2
    low = math.sqrt((0.5 + 1 / 8) / (0.5 + 1))  # r = 0.5
    s.observe(0, high, 0, count=8)
    assert s.tensors[0].tau == 2
    s.observe(0, low, 1, count=8)
    assert s.tensors[0].tau == 1


def test_open_meters_are_bounded_when_clocks_run_apart():
    """ASP: the fastest worker is hundreds of clocks ahead of the slowest; only max_open_clocks meters stay."""
    s = schedule(max_open_clocks=16)
    meters = {}
    for clock in range(500):  # fast workers reach clock 500 while the slowest is still at clock 0
        for w in range(3):
            meters.setdefault(clock, SimilarityMeter()).add(0, torch.randn(100) + 1)
        s.finish_clocks(meters, min_clock=0)
        assert len(meters) <= 16
    assert not s.wants(100) and s.wants(499)  # the slowest's late update for clock 100 is not measured
    assert s.tensors[0].measured is not None
