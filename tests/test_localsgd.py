"""Local SGD and DiLoCo baselines, the update rule per optimizer, and the target's patience."""

from __future__ import annotations

import pytest
import torch

from shoal.backends.sim import SimBackend
from shoal.config import ConfigError, OptimizerConfig, load_config
from shoal.engine.metrics import RunRecorder
from shoal.engine.replica import Replica
from shoal.engine.setup import build_setup
from shoal.sync import LocalSGD, PeriodicSchedule
from shoal.sync.localsgd import AsynchronousOuter
from shoal.sync.periods import Periods

from conftest import FAST


def run_sim(*overrides: str) -> tuple[SimBackend, dict]:
    cfg = load_config(None, FAST + ["run.stop_at_target=false", *overrides])
    backend = SimBackend(build_setup(cfg), RunRecorder())
    return backend, backend.run()


# -- the policy and the schedule (pure) ---------------------------------------------------


def test_localsgd_gates_only_at_sync_points_and_merges_the_sync_pushes():
    policy = LocalSGD(range(2), local_steps=3)
    for step in range(3):  # worker 0 runs a whole period without waiting; only its 3rd push is a sync push
        assert policy.may_start(0)
        assert policy.on_push(0) == ()
    assert not policy.may_start(0)  # clock 3: waits until everyone reached clock 3
    assert policy.on_push(1) == () and policy.on_push(1) == ()
    assert not policy.may_start(0)
    assert policy.on_push(1) == (0, 1)  # the last sync push releases one update of both
    assert policy.may_start(0) and policy.may_start(1)


def test_periodic_schedule_plans_everything_every_h_clocks():
    schedule = PeriodicSchedule(num_tensors=2, local_steps=4)
    assert [schedule.plan(c)[0] for c in range(-1, 9)] == [True, False, False, False, True,
                                                           False, False, False, True, False]
    assert schedule.plan(3) == (True, True) and schedule.state() == {}


def test_post_local_sgd_averages_every_step_of_its_warm_up_then_every_h():
    policy = LocalSGD(range(2), local_steps=4, warmup_steps=3)
    assert [policy.is_sync(c) for c in range(12)] == [True, True, True, False, False, False, True,
                                                      False, False, False, True, False]
    thresholds = []
    for _ in range(12):
        thresholds.append(policy.start_threshold(0))
        policy.on_push(0)
    assert thresholds == [0, 1, 2, 3, 3, 3, 3, 7, 7, 7, 7, 11]
    schedule = PeriodicSchedule(num_tensors=1, local_steps=4, warmup_steps=3)
    assert [schedule.plan(c)[0] for c in range(12)] == [policy.is_sync(c) for c in range(12)]


def test_asynchronous_outer_steps_wait_for_nobody_but_their_own_step():
    policy = AsynchronousOuter(range(2), local_steps=2)
    for _ in range(2):
        assert policy.may_start(0)
        policy.on_push(0)
    assert policy.buffered == [0] and not policy.may_start(0)  # waits for the outer step that takes its change
    assert policy.may_start(1) and policy.on_push(1) == ()
    assert policy.flush() == (0,) and policy.may_start(0) and policy.updates == 1
    assert policy.flush() == () and policy.updates == 1  # an empty moment is no outer step
    assert [policy.discount(s) for s in (0, 1, 3)] == [1.0, 0.5, 0.25]


def test_adaptive_periods_shrink_with_the_square_root_of_the_loss():
    """H = 16: the first period is 16 steps; losses 4 then 1 then 0.25 give periods 16, ceil(16 * 0.5) = 8,
    ceil(16 * 0.25) = 4; a loss above the first keeps 16."""
    periods = Periods(16, adaptive=True)
    for loss, boundary in ((4.0, 16), (1.0, 32), (0.25, 40), (9.0, 44)):
        periods.observe(loss)
        periods.observe(loss)
        periods.close(boundary)
    assert periods.periods() == [16, 16, 8, 4, 16]
    assert [c for c in range(60) if periods.is_sync(c)] == [15, 31, 39, 43, 59]
    assert periods.last_boundary(42) == 40 and periods.last_boundary(15) == 0
    fixed = Periods(4, warmup_steps=3)
    assert [fixed.last_boundary(k) for k in range(12)] == [0, 1, 2, 3, 3, 3, 3, 7, 7, 7, 7, 11]


def test_the_policy_decides_the_next_adaptive_period_when_the_round_closes():
    policy = LocalSGD(range(2), local_steps=4, adaptive=True)
    for clock in range(4):
        for w, loss in ((0, 2.0), (1, 2.0)):
            policy.observe(w, loss if clock < 3 else 2.0)
            policy.on_push(w)
    assert policy.periods.boundaries == [4, 8]  # first period at the first loss: the next is 4 again
    for clock in range(4):
        for w in (0, 1):
            policy.observe(w, 0.5)
            policy.on_push(w)
    assert policy.periods.boundaries == [4, 8, 10]  # mean loss 0.5 of 2.0: ceil(4 * 0.5) = 2


# -- end to end on the sim backend ------------------------------------------------------------


@pytest.mark.parametrize("optimizer", [("optimizer.momentum=0",), ("optimizer.momentum=0.9",)])
def test_localsgd_with_one_local_step_equals_bsp(optimizer):
    rounds = ["run.max_iterations=12"]  # 3 rounds of 4 workers
    bsp, _ = run_sim("sync.scheme=bsp", *rounds, *optimizer)
    local, summary = run_sim("sync.scheme=localsgd", "sync.localsgd.local_steps=1", *rounds, *optimizer)
    assert summary["iterations"] == 12
    assert torch.equal(bsp.model_state()[0], local.model_state()[0])


@pytest.mark.parametrize("scheme", ["localsgd", "diloco"])
def test_a_warm_up_longer_than_the_run_is_bsp(scheme):
    rounds = ["run.max_iterations=12", "optimizer.momentum=0.9"]
    bsp, _ = run_sim("sync.scheme=bsp", *rounds)
    warm, _ = run_sim(f"sync.scheme={scheme}", f"sync.{scheme}.local_steps=4", f"sync.{scheme}.warmup_steps=100",
                      *rounds)
    assert torch.equal(bsp.model_state()[0], warm.model_state()[0])


def test_post_local_sgd_sends_every_step_then_every_h():
    """4 workers, warm-up 5 steps then H = 4 over 13 steps: 5 + 2 syncs of a whole model each, nothing else."""
    backend, summary = run_sim("sync.scheme=localsgd", "sync.localsgd.local_steps=4",
                               "sync.localsgd.warmup_steps=5", "run.max_iterations=52")
    assert summary["bytes_up"] == 4 * 7 * 4 * backend.setup.engine.num_params


@pytest.mark.parametrize("iterations", [60, 61])
def test_asynchronous_diloco_at_equal_speeds_is_synchronous_diloco(iterations):
    """Every change arrives in the same moment with staleness 0, so each outer step is DiLoCo's (also when the
    run stops in the middle of the moment a round arrives in)."""
    common = ["cluster.workers=3", "cluster.speeds=[1,1,1]", f"run.max_iterations={iterations}", "sync.scheme=diloco",
              "sync.diloco.local_steps=4", "optimizer.momentum=0.9"]
    synchronous, _ = run_sim(*common)
    asynchronous, _ = run_sim(*common, "sync.diloco.asynchronous=true")
    assert torch.equal(synchronous.model_state()[0], asynchronous.model_state()[0])


def test_asynchronous_diloco_lets_a_fast_worker_run_ahead_and_discounts_late_changes():
    common = ["cluster.workers=2", "cluster.speeds=[1,4]", "run.max_time_s=2", "sync.scheme=diloco",
              "sync.diloco.local_steps=4"]
    synchronous, _ = run_sim(*common)
    asynchronous, summary = run_sim(*common, "sync.diloco.asynchronous=true")
    fast, slow = asynchronous.stats
    assert fast.wait_s == 0 and slow.wait_s == 0 and synchronous.stats[0].wait_s > 1.0
    assert fast.iterations >= 3.5 * slow.iterations
    assert summary["final_accuracy"] > 0.5


def test_adaptive_local_sgd_averages_more_often_as_the_loss_falls():
    backend, summary = run_sim("sync.scheme=localsgd", "sync.localsgd.local_steps=16", "sync.localsgd.adaptive=true",
                               "run.max_time_s=3")
    periods = backend.servers[0].policy.periods.periods()
    assert periods[:2] == [16, 16] and max(periods[-10:]) <= 4, periods  # the loss fell: periods of a few steps
    fixed, fixed_summary = run_sim("sync.scheme=localsgd", "sync.localsgd.local_steps=16", "run.max_time_s=3")
    assert summary["bytes_up"] > fixed_summary["bytes_up"]  # the shorter periods sent more
    assert summary["final_accuracy"] > 0.5


def test_diloco_with_outer_lr_1_and_no_momentum_equals_localsgd():
    common = ["sync.localsgd.local_steps=4", "sync.diloco.local_steps=4", "run.max_iterations=48"]
    local, _ = run_sim("sync.scheme=localsgd", *common)
    diloco, _ = run_sim("sync.scheme=diloco", "sync.diloco.outer_lr=1", "sync.diloco.outer_momentum=0", *common)
    assert torch.allclose(local.model_state()[0], diloco.model_state()[0], atol=1e-6)
    outer, _ = run_sim("sync.scheme=diloco", *common)  # the default outer step (0.7, Nesterov 0.9) differs
    assert not torch.allclose(local.model_state()[0], outer.model_state()[0], atol=1e-4)


def test_localsgd_sends_only_at_syncs_and_the_server_holds_the_mean_model():
    backend, summary = run_sim("sync.scheme=localsgd", "sync.localsgd.local_steps=5", "run.max_iterations=20")
    params = backend.setup.engine.num_params
    assert summary["iterations"] == 20
    assert summary["bytes_up"] == 4 * 4 * params  # one sync per worker, a full model change each
    assert summary["bytes_down"] == 4 * 4 * params  # the first pull, then one after the sync
    mean = torch.stack([m.params for m in backend.locals]).mean(0)
    assert torch.allclose(backend.model_state()[0], mean, atol=1e-6)


def test_localsgd_and_diloco_train():
    for scheme in ("localsgd", "diloco"):
        _, summary = run_sim(f"sync.scheme={scheme}", "run.max_time_s=3")
        assert summary["final_accuracy"] > 0.85, scheme


def test_local_schemes_refuse_sim_and_cost_mode():
    with pytest.raises(ConfigError, match="already averages periodically"):
        load_config(None, ["sync.scheme=localsgd", "compression.similarity.enabled=true"])
    with pytest.raises(ConfigError, match="needs backend.mode"):
        load_config(None, ["sync.scheme=diloco", "backend.mode=cost"])


def test_diloco_outer_step_is_nesterov_on_the_averaged_pseudo_gradient():
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.0)
    replica = Replica(torch.zeros(3), torch.zeros(0), opt, outer=(0.7, 0.9))
    change = torch.tensor([1.0, -2.0, 0.5])
    buf = torch.zeros(3)
    expected = torch.zeros(3)
    for _ in range(3):
        replica.add_delta([change, change], 0.5)  # the mean change of two workers
        g = -change
        buf = 0.9 * buf + g
        expected = expected - 0.7 * (g + 0.9 * buf)
        assert torch.allclose(replica.params.detach(), expected, atol=1e-6)


# -- the same total update per sample, for every optimizer -----------------------------------


@pytest.mark.parametrize("name,momentum", [("sgd", 0.0), ("sgd", 0.9), ("adam", 0.0)])
def test_bsp_and_asp_move_the_same_distance_per_round(name, momentum):
    """N workers, the same gradient: one step on N gradients (BSP) vs N steps of one (ASP) per round.

    Measured once the optimizer state is warm (rounds 40-60): momentum builds up over 1/(1-mu) *steps*,
    i.e. over 10 rounds under BSP but 10/N rounds under ASP, so only the transient differs.
    """
    n, warm, rounds = 8, 40, 60
    opt = OptimizerConfig(name=name, lr=0.01, momentum=momentum)
    g = torch.linspace(-1, 1, 16)
    bsp = Replica(torch.zeros(16), torch.zeros(0), opt)
    asp = Replica(torch.zeros(16), torch.zeros(0), opt)
    marks = {}
    for r in range(rounds):
        if r == warm:
            marks = {"bsp": bsp.params.detach().clone(), "asp": asp.params.detach().clone()}
        bsp.apply([g] * n, 1 / n)
        for _ in range(n):
            asp.apply([g], 1 / n)
    moved_bsp = float((bsp.params.detach() - marks["bsp"]).norm())
    moved_asp = float((asp.params.detach() - marks["asp"]).norm())
    assert moved_bsp > 0
    assert moved_asp / moved_bsp == pytest.approx(1.0, rel=0.03)


# -- the target's patience ---------------------------------------------------------------------


def test_target_needs_patience_evaluations_in_a_row_and_reports_the_first():
    accuracies = [0.96, 0.90, 0.96, 0.97, 0.96, 0.99]
    for patience, expected in [(1, 0.0), (2, 2.0), (3, 2.0), (4, 2.0), (5, None)]:
        recorder = RunRecorder()
        reached = [recorder.evaluation(float(t), a, 0.0, 0.95, patience) for t, a in enumerate(accuracies)]
        assert recorder.time_to_target_s == expected
        assert sum(reached) == (expected is not None)


def test_asynchronous_outer_steps_refuse_balanced_work():
    with pytest.raises(ConfigError, match="asynchronous outer steps wait for nobody"):
        load_config(None, FAST + ["sync.scheme=diloco", "sync.diloco.asynchronous=true", "sync.balance=batch"])
