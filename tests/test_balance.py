"""Work sized to speed (sync.balance): the split, the balancer, and balanced rounds end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.backends.local_model import LocalModel
from shoal.backends.sim import SimBackend
from shoal.config import ConfigError, load_config
from shoal.engine.metrics import RunRecorder
from shoal.engine.replica import Replica
from shoal.engine.setup import build_setup
from shoal.sync.balance import WorkBalancer, proportional_split

from conftest import FAST, ROOT

# -- the split (pure) -----------------------------------------------------------------------------


def test_the_split_follows_the_rates_exactly_when_they_divide():
    assert proportional_split(512, [1] * 4 + [0.5] * 4 + [0.25] * 4 + [0.125] * 4, 4) == (
        [68] * 4 + [34] * 4 + [17] * 4 + [9] * 4)
    assert proportional_split(7, [1, 1, 1]) == [3, 2, 2]  # the leftover goes to the first of equal remainders
    assert proportional_split(10, [1, 100], 1, 9) == [1, 9]  # pinned at both bounds


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=24), st.integers(1, 64), st.data())
def test_sizes_are_integers_that_sum_to_the_total_within_the_bounds(rates, per_worker, data):
    n = len(rates)
    low = data.draw(st.integers(1, per_worker))
    high = data.draw(st.integers(per_worker, 4 * per_worker) | st.none())
    sizes = proportional_split(n * per_worker, rates, low, high)
    assert all(isinstance(b, int) for b in sizes)
    assert sum(sizes) == n * per_worker
    assert all(low <= b <= (high or n * per_worker) for b in sizes)
    faster = [(rates[i], sizes[i]) for i in range(n)]
    for (ri, bi) in faster:  # a faster worker never gets fewer samples (beyond the rounding of one)
        assert all(bj <= bi + 1 for rj, bj in faster if rj <= ri)


def test_an_impossible_split_is_refused():
    with pytest.raises(ValueError, match="cannot split"):
        proportional_split(10, [1, 1], 6)
    with pytest.raises(ValueError, match="cannot split"):
        proportional_split(10, [1, 1], 1, 4)


# -- the balancer (pure) ----------------------------------------------------------------------------


def feed(balancer: WorkBalancer, seconds_per_sample: list[float], rounds: int) -> None:
    for _ in range(rounds):
        for w, t in enumerate(seconds_per_sample):
            balancer.observe(w, t * balancer.size(w), balancer.size(w))
        balancer.rebalance(range(len(seconds_per_sample)))


def test_the_balancer_waits_for_its_profile_then_sizes_to_speed():
    balancer = WorkBalancer(2, 32, warmup=3, window=10)
    feed(balancer, [1.0, 3.0], 2)
    assert balancer.sizes == [32, 32]  # not profiled yet
    feed(balancer, [1.0, 3.0], 1)
    assert balancer.sizes == [48, 16]
    assert balancer.scale(0, [0, 1]) == 1.5 and balancer.scale(1, [0, 1]) == 0.5


def test_the_balancer_tracks_a_sustained_change_and_ignores_a_transient_one():
    balancer = WorkBalancer(2, 32, warmup=3, window=10)
    feed(balancer, [1.0, 1.0], 10)
    assert balancer.sizes == [32, 32]
    feed(balancer, [1.0, 4.0], 3)  # a slow spell of 3 iterations in a window of 10: a straggler, not a slow worker
    assert balancer.sizes == [32, 32]
    feed(balancer, [1.0, 1.0], 10)
    feed(balancer, [1.0, 4.0], 10)  # sustained: it moves the low quantile once it fills four fifths of the window
    assert balancer.sizes == [51, 13]


def test_the_balancer_keeps_sizes_that_would_barely_help():
    balancer = WorkBalancer(2, 32, warmup=1, window=5, tolerance=0.1)
    feed(balancer, [1.0, 1.05], 5)  # a 5% difference: the round would get under 10% faster
    assert balancer.sizes == [32, 32]


def test_sizes_of_a_changed_group_are_reset_to_sum_to_its_global_batch():
    balancer = WorkBalancer(3, 10, warmup=1, window=5)
    feed(balancer, [1.0, 1.0, 2.0], 2)
    assert sum(balancer.sizes) == 30
    assert balancer.rebalance([0, 2])  # a regroup: the pair must share 20
    assert balancer.size(0) + balancer.size(2) == 20


# -- balanced rounds on the sim backend ----------------------------------------------------------------


def run_sim(*overrides: str) -> tuple[SimBackend, list[dict]]:
    cfg = load_config(None, FAST + ["run.stop_at_target=false", *overrides])
    events: list[dict] = []
    recorder = RunRecorder(listener=lambda kind, fields: events.append({"event": kind, **fields}))
    backend = SimBackend(build_setup(cfg), recorder)
    backend.run()
    return backend, events


def test_a_balanced_bsp_round_is_one_step_on_the_concatenated_global_batch():
    """Two rounds of 2 workers at speeds 1 and 3: the second round's sizes are 48 and 16, and each round's
    update equals one step of one worker on the two batches concatenated."""
    common = ["cluster.workers=2", "cluster.speeds=[1,3]", "sync.balance=batch", "balance.profile_iterations=1",
              "run.max_iterations=4", "optimizer.momentum=0.9"]
    backend, events = run_sim(*common)
    sizes = [[e["batch"] for e in events if e["event"] == "iteration"][i:i + 2] for i in (0, 2)]
    assert sorted(sizes[0]) == [32, 32] and sorted(sizes[1]) == [16, 48]
    setup = build_setup(load_config(None, FAST + ["run.stop_at_target=false", *common]))
    params, buffers = setup.engine.initial_state()
    single = Replica(params, buffers, setup.cfg.optimizer)
    by_worker = {e["worker"]: [] for e in events if e["event"] == "iteration"}
    for e in events:
        if e["event"] == "iteration":
            by_worker[e["worker"]].append(e["batch"])
    for r in range(2):
        batches = [setup.streams[w].next(by_worker[w][r]) for w in (0, 1)]
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        grad, _, _ = setup.engine.gradient(*single.snapshot(), x, y)
        single.apply([grad], 1.0)
    assert torch.allclose(backend.model_state()[0], single.snapshot()[0], atol=1e-6)


def test_balanced_local_steps_are_averaged_weighted_by_steps_in_closed_form():
    """Local SGD, H = 4, two workers at speeds 1 and 3: the second period's steps are 6 and 2, and the server
    moves by sum(H_w * change_w) / sum(H_w), each change replayed from the same batches."""
    common = ["cluster.workers=2", "cluster.speeds=[1,3]", "sync.scheme=localsgd", "sync.localsgd.local_steps=4",
              "sync.balance=steps", "balance.profile_iterations=1", "run.max_iterations=16", "optimizer.momentum=0"]
    backend, events = run_sim(*common)
    periods = [(e["worker"], e["steps"]) for e in events if e["event"] == "iteration"]
    assert sorted(periods) == [(0, 4), (0, 6), (1, 2), (1, 4)] and backend.recorder.iterations == 16
    setup = build_setup(load_config(None, FAST + ["run.stop_at_target=false", *common]))
    params, buffers = setup.engine.initial_state()
    locals_ = [LocalModel(params, buffers, setup.cfg.optimizer, setup.engine.layout) for _ in range(2)]
    for steps in ([4, 4], [6, 2]):
        changes = []
        for w, local in enumerate(locals_):
            local.pull(params, [True] * len(setup.engine.layout))
            for _ in range(steps[w]):
                x, y = setup.streams[w].next()
                local.step(setup.engine.gradient(local.params, buffers, x, y)[0])
            changes.append(local.change())
        params = params + sum(h * c for h, c in zip(steps, changes)) / sum(steps)
    assert torch.allclose(backend.model_state()[0], params, atol=1e-6)


def test_balanced_local_steps_let_nobody_wait_at_the_averaging():
    plain, _ = run_sim("cluster.workers=8", "cluster.profile=tiers", "sync.scheme=localsgd", "run.max_time_s=20")
    steps, events = run_sim("cluster.workers=8", "cluster.profile=tiers", "sync.scheme=localsgd", "sync.balance=steps",
                            "run.max_time_s=20")
    resized = [e for e in events if e["event"] == "balance"]
    assert resized and all(sum(e["sizes"].values()) == 8 * 8 for e in resized)
    waited = sum(s.wait_s for s in steps.stats) / sum(s.wait_s + s.compute_s for s in steps.stats)
    plain_waited = sum(s.wait_s for s in plain.stats) / sum(s.wait_s + s.compute_s for s in plain.stats)
    assert waited < 0.5 * plain_waited, (waited, plain_waited)


def test_a_bounded_time_round_never_computes_past_its_deadline_and_weighs_what_was_done():
    """Tiers 1/1/2/2/4/4/8/8 x 0.01 s: once profiled, the deadline is 3x the fastest batch time (the median);
    the 4x and 8x workers hand in the whole micro-batches they finished, nobody computes longer."""
    backend, events = run_sim("cluster.workers=8", "cluster.speeds=[1,1,2,2,4,4,8,8]", "sync.balance=deadline",
                              "balance.micro_batch=4", "balance.profile_iterations=2")
    rounds = [e for e in events if e["event"] == "iteration"]
    late = rounds[8 * 3:]  # after two profiled rounds (and the round in flight)
    assert late and all(e["compute_s"] <= 0.03 + 1e-12 for e in late)
    done = {e["worker"]: e["batch"] for e in late}
    assert done == {0: 32, 1: 32, 2: 32, 3: 32, 4: 24, 5: 24, 6: 12, 7: 12}
    assert backend.recorder.evals[-1]["accuracy"] > 0.5


def test_a_bounded_time_round_compresses_what_it_sends():
    backend, events = run_sim("cluster.workers=8", "cluster.speeds=[1,1,2,2,4,4,8,8]", "sync.balance=deadline",
                              "compression.method=topk", "compression.density=0.1", "run.max_iterations=200")
    assert any(e["batch"] < 32 for e in events if e["event"] == "iteration")
    assert backend.recorder.bytes_up < 0.3 * 200 * 4 * backend.setup.engine.num_params


def test_weighing_by_samples_makes_a_round_the_mean_over_its_samples():
    from shoal.backends.sim.server import Push, weighed_by_samples

    grads = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([5.0, 5.0])]
    pushes = [Push(g, None, 0, samples=s) for g, s in zip(grads, (30, 10, 0))]
    weighed = weighed_by_samples(pushes)
    assert torch.allclose(sum(weighed) / 3, torch.tensor([0.75, 0.25]))  # the 1/N sum: 30 and 10 samples, 0 ignored
    assert weighed_by_samples([Push(grads[0], None, 0, samples=0)]) == []


def test_a_deadline_cuts_a_slow_batch_at_its_last_whole_micro_batch():
    from shoal.backends.work import deadline_cut

    assert deadline_cut(0.01, 0.02, 32, 8) == (32, 0.01)  # in time: the whole batch, its own time
    assert deadline_cut(0.06, 0.02, 32, 8) == (8, 0.02)  # 8 samples take 0.015 s, 16 would take 0.03 s
    assert deadline_cut(0.5, 0.02, 32, 8) == (0, 0.02)  # not one micro-batch by the deadline


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-4, 10.0), st.floats(1e-4, 10.0), st.integers(1, 256), st.integers(1, 256))
def test_a_deadline_cut_never_computes_past_the_deadline(batch_s, deadline, batch_size, micro):
    from shoal.backends.work import deadline_cut

    micro = min(micro, batch_size)
    samples, seconds = deadline_cut(batch_s, deadline, batch_size, micro)
    assert seconds <= deadline and 0 <= samples <= batch_size
    assert samples == batch_size or samples % micro == 0
    assert samples * batch_s / batch_size <= deadline * (1 + 1e-9)  # the samples it hands in were done in time


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 64), min_size=1, max_size=8).filter(any))
def test_sample_weights_make_the_rounds_1_over_n_sum_the_mean_over_its_samples(samples):
    from shoal.backends.work import sample_weights

    grads = torch.randn(len(samples), 3, generator=torch.Generator().manual_seed(len(samples)))
    weights = sample_weights(samples)
    assert weights is not None
    mean = sum(w * g for w, g in zip(weights, grads)) / len(samples)
    exact = sum(s * g for s, g in zip(samples, grads)) / sum(samples)
    assert torch.allclose(mean, exact, atol=1e-5)
    assert sample_weights([None, None]) is None and sample_weights([0, 0]) == []


@pytest.mark.parametrize("scheme", [["sync.scheme=bsp"], ["sync.scheme=bsp", "sync.intra_group=allreduce"],
                                    ["sync.scheme=gssp"], ["sync.scheme=localsgd"], ["sync.scheme=diloco"]])
def test_every_balanced_round_sums_to_its_global_batch(scheme):
    backend, events = run_sim(*scheme, "cluster.workers=8", "cluster.profile=tiers", "sync.balance=batch",
                              "run.max_time_s=3")
    resized = [e for e in events if e["event"] == "balance"]
    assert resized, "the tiered cluster was never balanced"
    groups = {g: len(members) for g, members in enumerate(backend._groups())}
    for e in resized:
        assert sum(e["sizes"].values()) == 32 * len(e["sizes"])
    assert len(groups) >= 1
    fast, slow = backend.balancer.size(0), backend.balancer.size(7)
    assert fast > slow, (fast, slow)


def test_a_balanced_tiered_bsp_round_takes_less_virtual_time():
    plain, _ = run_sim("cluster.workers=8", "cluster.profile=tiers")
    balanced, _ = run_sim("cluster.workers=8", "cluster.profile=tiers", "sync.balance=batch")
    assert balanced.recorder.iterations > 2 * plain.recorder.iterations  # 8x-slow workers no longer set the pace


@pytest.mark.parametrize("overrides, message", [
    (["sync.scheme=asp", "sync.balance=batch"], "sync.balance: 'batch' sizes the work of synchronous rounds"),
    (["sync.balance=batch", "balance.min_batch=64"], "balance: data.batch_size = 32 must lie within min_batch and max_batch"),
    (["sync.balance=batch", "network.aggregation=ina"], "sync.balance: sizes are planned over a fixed set"),
    (["sync.balance=steps"], "sync.balance: 'steps' sizes the work of synchronous rounds \\(diloco, localsgd\\)"),
    (["sync.balance=deadline", "sync.scheme=gssp"], "sync.balance: 'deadline'"),
    (["sync.balance=deadline", "compression.similarity.enabled=true"], "a deadline round sends whole gradients"),
    (["sync.balance=deadline", "balance.micro_batch=64"], "balance.micro_batch = 64 is larger than data.batch_size"),
    (["sync.scheme=localsgd", "sync.balance=steps", "balance.max_steps=4"], "sync.localsgd.local_steps = 8 must lie"),
])
def test_bad_balance_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, FAST + overrides)


@pytest.mark.timeout(120)
def test_shoal_train_records_each_workers_batch(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "train", *sum((["--set", o] for o in FAST), []), "--set", "sync.balance=batch",
         "--set", "cluster.profile=tiers", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=110)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    batches = {e["worker"]: e["batch"] for e in lines if e["event"] == "iteration"}
    assert batches[0] > batches[3] and sum(batches.values()) == 4 * 32


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_compare_takes_balance_as_a_modifier_and_the_report_draws_each_workers_batch(tmp_path):
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "compare", "--schemes", "bsp,bsp+balance", *sum((["-s", o] for o in FAST), []),
         "-s", "cluster.profile=tiers", "-o", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=170)
    assert proc.returncode == 0, proc.stderr
    rows = {r["scheme"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert set(rows) == {"bsp", "bsp+balance"}
    page = (out / "report.html").read_text()
    assert "each worker&#39;s batch size over time in bsp+balance" in page or \
        "each worker's batch size over time in bsp+balance" in page
    assert (out / "batches-bsp_balance.png").exists() and not (out / "batches-bsp.png").exists()


def test_the_report_draws_balanced_local_steps_as_steps_from_h(tmp_path):
    """A "steps" run's resizes are local steps: the panel starts each worker at the scheme's H, not at
    data.batch_size, and says so on its axis."""
    from shoal.report.html import _balanced_unit
    from shoal.report.worker_plots import plot_batch_sizes

    config = tmp_path / "config.toml"
    config.write_text('[data]\nbatch_size = 32\n[sync]\nscheme = "diloco"\nbalance = "steps"\n'
                      '[sync.diloco]\nlocal_steps = 8\n')
    assert _balanced_unit(config) == ("steps", 8)
    config.write_text('[data]\nbatch_size = 24\n[sync]\nscheme = "bsp"\nbalance = "batch"\n')
    assert _balanced_unit(config) == ("batch", 24)
    assert _balanced_unit(tmp_path / "absent.toml") == ("batch", 32)
    resizes = [{"t": 1.0, "sizes": {"0": 13, "1": 3}}]
    path = plot_batch_sizes("diloco+balance-steps", resizes, [1.0, 4.0], 8, 2.0, tmp_path / "steps.png",
                            "virtual seconds", "steps")
    assert path.is_file() and path.stat().st_size > 1000


def test_the_report_draws_the_batches_of_runs_that_logged_no_iterations(tmp_path):
    """No iteration events means no timeline window; the batch-size plots (balance events) still render."""
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "compare", "--schemes", "bsp+balance", *sum((["-s", o] for o in FAST), []),
         "-s", "cluster.profile=tiers", "-s", "backend.log_iterations=false", "-o", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=170)
    assert proc.returncode == 0, proc.stderr
    page = (out / "report.html").read_text()
    assert "batches-bsp_balance.png" in page and "Window:" not in page
