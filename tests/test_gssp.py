"""GSSP: the pure policy, the own-delta exchange invariant, and end-to-end behaviour on sim."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.config import GSSPOptions, OptimizerConfig
from shoal.engine.replica import Replica
from shoal.runner import train
from shoal.sync.gssp import GSSP
from shoal.sync.policies import SSP, PacedSSP

from conftest import read_jsonl

#: the paper's rules: every refinement shoal's defaults turn on is off here, so each test turns on what it checks
PAPER = dict(split_ratio=1.0, regroup_cooldown_s=0.0, transient_factor=0.0, confirm_span=0.0, confirm_fraction=1.0,
             paced=False, group_momentum="server")


def gssp(workers: int, intra_group: str = "server", **options) -> GSSP:
    """A GSSP coordinator under the paper's rules with ``options`` changed."""
    return GSSP(workers, GSSPOptions(**{**PAPER, **options}), intra_group)

TIERS = "cluster.speeds=[1, 1, 1, 1, 8, 8, 8, 8]"


def _profile(policy: GSSP, times: list[float], rounds: int) -> None:
    for _ in range(rounds):
        for w, t in enumerate(times):
            policy.observe(w, t)


def test_one_group_until_profiled_then_natural_breaks():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2)
    assert p.servers == 1 and p.initial_split() is None
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=2)
    assert p.initial_split() == [[0, 1], [2, 3]]
    assert p.server_of == {0: 0, 1: 0, 2: 1, 3: 1}
    assert p.initial_split() is None  # only once


def test_limit_groups_caps_the_split_and_the_regroups():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2, confirm_span=0)
    p.limit_groups(2)
    _profile(p, [0.1, 0.4, 1.6, 6.4], rounds=2)
    assert p.initial_split() == [[0, 1], [2, 3]]  # four tiers, two servers
    assert p.max_groups == p.regrouper.max_groups == 2
    p.limit_groups(5)  # a limit never raises the count
    assert p.max_groups == 2


def _confirming(workers: int = 4, span: float = 15.0) -> GSSP:
    """Confirmation over 15 of the fastest worker's 0.1 s iterations: 4 iterations of a 4x worker, 2 of an 8x one."""
    return gssp(workers, staleness=1, exchange_every=2, profile_iterations=2, profile_window=10, split_ratio=1.5,
                transient_factor=2.0, confirm_span=span)


def test_waiting_for_the_profiles_reads_them_linearly_per_iteration(monkeypatch):
    """Asking for the split after every iteration while 300 workers are profiled stays linear in the workers per
    iteration (it was cubic over the profiling: a 1,000-worker cost run took 6 minutes in its first 2 s)."""
    from shoal.cluster.grouping import IterationProfiler

    reads = {"n": 0}
    profiled = IterationProfiler.profiled

    def counted(self, worker):
        reads["n"] += 1
        return profiled(self, worker)

    monkeypatch.setattr(IterationProfiler, "profiled", counted)
    n, rng = 300, random.Random(0)
    p = _confirming(n)
    iterations = 0
    while p.initial_split() is None:
        w = rng.randrange(n)
        p.observe(w, 0.1 if w % 10 else 0.4)
        iterations += 1
    assert iterations > 3 * n
    assert reads["n"] <= 3 * n * iterations


def test_a_slow_spell_at_the_start_does_not_split_the_cluster():
    """Worker 3 starts in a 4x spell that lasts 3 of its iterations: it looks slow when profiled, is excused
    meanwhile (nobody waits for it), and the split waits until a fast iteration shows the spell ended."""
    p = _confirming()
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=2)
    assert p.policy(0).excused == {3}
    assert p.initial_split() is None  # profiled, but slow-looking and not yet slow for 1.5 s in a row
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=1)
    _profile(p, [0.1, 0.1, 0.1, 0.1], rounds=1)  # the spell ends: readmitted at once
    assert p.policy(0).excused == set()
    assert p.initial_split() is None  # its low quantile of [0.4, 0.4, 0.4, 0.1] is still 0.28
    _profile(p, [0.1, 0.1, 0.1, 0.1], rounds=1)
    assert p.initial_split() == [[0, 1, 2, 3]]


def test_a_worker_slow_for_confirm_span_fastest_iterations_in_a_row_is_split_off():
    p = _confirming()
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=3)
    assert p.initial_split() is None  # slow for 1.2 s
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=1)
    assert p.initial_split() == [[0, 1, 2], [3]]  # 1.6 s >= 15 x 0.1 s


def test_confirmation_is_measured_in_time_so_a_far_slower_worker_confirms_in_fewer_iterations():
    p = _confirming()
    _profile(p, [0.1, 0.1, 0.1, 0.8], rounds=2)  # 8x: 1.6 s in 2 iterations (a 4x worker needs 4)
    assert p.initial_split() == [[0, 1, 2], [3]]


def test_a_burst_of_spells_with_fast_iterations_between_is_never_confirmed_and_the_window_ends_the_wait():
    p = _confirming(span=30)
    for i in range(9):  # slow 6 in 7: the low quantile says slow, but never 8 in a row (3.2 s >= 3.0 s)
        _profile(p, [0.1, 0.1, 0.1, 0.1 if i % 7 == 0 else 0.4], rounds=1)
        assert p.initial_split() is None
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=1)  # the 10th iteration fills the window: grouped as measured,
    assert p.initial_split() == [[0, 1, 2, 3]]  # as fast as the fastest of its last 3 s


def test_confirm_span_0_splits_on_the_profile_alone():
    p = _confirming(span=0)
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=2)
    assert p.initial_split() == [[0, 1, 2], [3]]


def test_when_as_many_as_confirm_fraction_look_slow_nobody_confirms_and_the_split_is_on_the_profiles():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2, profile_window=10, split_ratio=1.5,
             transient_factor=2.0, confirm_span=15, confirm_fraction=0.5)
    _profile(p, [0.1, 0.1, 0.4, 0.4], rounds=2)  # 2 of 4 look slow: spread speeds, not spells
    assert not p.confirming() and p.policy(0).excused == set()
    assert p.initial_split() == [[0, 1], [2, 3]]


def test_when_fewer_than_confirm_fraction_look_slow_they_confirm_and_nobody_is_excused_before_all_are_profiled():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2, profile_window=10, split_ratio=1.5,
             transient_factor=2.0, confirm_span=15, confirm_fraction=0.5)
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=1)
    assert not p.confirming() and p.policy(0).excused == set()  # not decided before every worker is profiled
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=1)  # 1 of 4 looks slow: it may be a spell
    assert p.confirming() and p.policy(0).excused == {3}
    assert p.initial_split() is None
    _profile(p, [0.1, 0.4, 0.4, 0.4], rounds=2)  # decided once: more slow-looking workers do not undo it
    assert p.confirming()


def test_restore_puts_back_the_groups_the_speeds_and_the_choice_to_confirm():
    def fresh() -> GSSP:
        return gssp(4, staleness=1, exchange_every=2, profile_iterations=2, profile_window=10, split_ratio=1.5,
                    transient_factor=2.0, confirm_span=15, confirm_fraction=0.5)

    p = fresh()
    p.restore([[0, 1, 2], [3]], [0.1, 0.1, 0.1, 0.4], confirming=True)
    assert p.grouped and p.groups == [[0, 1, 2], [3]] and p.server_of == {0: 0, 1: 0, 2: 0, 3: 1}
    assert p.confirming() and p.profiler.times() == pytest.approx([0.1, 0.1, 0.1, 0.4])
    assert p.initial_split() is None
    old = fresh()
    old.restore([[0, 1], [2, 3]], [0.1, 0.1, 0.4, 0.4])  # a checkpoint without the choice: decided again
    assert not old.confirming()  # 2 of 4 look slow


def test_a_paper_gssp_splits_on_the_profile_alone():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2, split_ratio=1.5, confirm_span=15)
    _profile(p, [0.1, 0.1, 0.1, 0.4], rounds=2)
    assert p.policy(0).excused == set() and p.initial_split() == [[0, 1, 2], [3]]


def test_a_burst_of_spells_after_the_split_does_not_move_a_worker():
    """Regrouping sees a worker as fast as the fastest of its iterations in the last confirm_span x 0.1 s."""
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=1, profile_window=10, regroup_patience=1,
             split_ratio=1.5, transient_factor=2.0, confirm_span=30)
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=4)  # workers 2 and 3 confirm their speed (3.2 s >= 3 s)
    assert p.initial_split() == [[0, 1], [2, 3]]
    for i in range(10):  # worker 0 slow 9 of 10 (its low quantile says 0.8), with a fast one 3 iterations ago
        _profile(p, [0.1 if i == 7 else 0.8, 0.1, 0.8, 0.8], rounds=1)
    assert p.check_regroup() == []
    _profile(p, [0.8, 0.1, 0.8, 0.8], rounds=2)  # now 4 in a row, 3.2 s: it moves
    assert [(m.worker, m.new) for m in p.check_regroup()] == [(0, 1)]


def test_slow_group_gates_only_its_own_members():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=1)
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=1)
    p.initial_split()
    fast = p.policy(0)
    for _ in range(10):  # the fast group runs on while the slow group has not pushed at all
        for w in (0, 1):
            assert fast.may_start(w)
            fast.on_push(w)
    assert p.policy(1).min_clock == 0


def test_exchange_every_k_local_updates():
    p = gssp(4, staleness=1, exchange_every=3, profile_iterations=1)
    assert not p.local_update(0)  # one server: nobody to exchange with
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=1)
    p.initial_split()
    assert [p.local_update(0) for _ in range(6)] == [False, False, True, False, False, True]


def test_regroup_moves_a_worker_that_slowed_down():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=1, profile_window=4, regroup_patience=1)
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=1)
    p.initial_split()
    _profile(p, [0.8, 0.1, 0.8, 0.8], rounds=4)
    moves = p.check_regroup()
    assert [(m.worker, m.old, m.new) for m in moves] == [(0, 0, 1)]
    assert p.groups == [[1], [0, 2, 3]]
    assert 0 in p.policy(1).clocks and 0 not in p.policy(0).clocks


def test_a_joiner_trains_in_the_fastest_group_until_profiled_then_moves_to_its_speed():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2, profile_window=4, regroup_patience=1)
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=2)
    p.initial_split()
    assert p.join(4) == 0 and p.groups == [[0, 1, 4], [2, 3]]  # unknown speed: the fastest group
    assert 4 in p.policy(0).clocks
    p.observe(4, 0.8)
    assert p.check_regroup() == []  # not profiled yet: nobody moves on a guess
    p.observe(4, 0.8)
    for w, t in enumerate([0.1, 0.1, 0.8, 0.8]):
        p.observe(w, t)
    assert [(m.worker, m.old, m.new) for m in p.check_regroup()] == [(4, 0, 1)]  # slow: to the slow group
    assert p.groups == [[0, 1], [2, 3, 4]]
    with pytest.raises(ValueError, match="next id"):
        p.join(7)


def test_a_joiner_that_starts_in_a_slow_spell_stays_in_the_fast_group():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=2, profile_window=10, regroup_patience=1,
             split_ratio=1.5, transient_factor=2.0, confirm_span=30)
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=4)
    assert p.initial_split() == [[0, 1], [2, 3]]
    p.join(4)
    for t in (0.8, 0.8, 0.8, 0.1, 0.1):  # a 3-iteration spell, then its own speed: never moved
        p.observe(4, t)
        _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=1)
        assert p.check_regroup() == []
    assert p.groups == [[0, 1, 4], [2, 3]]
    for _ in range(4):  # slow 4 in a row (3.2 s): confirmed, it moves
        p.observe(4, 0.8)
    assert [(m.worker, m.new) for m in p.check_regroup()] == [(4, 1)]


def test_the_split_waits_for_a_joiner_and_ignores_who_left():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=1)
    p.observe(0, 0.1), p.observe(1, 0.1), p.observe(2, 0.8)  # worker 3 leaves before it was profiled
    assert p.leave(3) == 0 and 3 not in p.policy(0).clocks
    assert p.join(4) == 0 and p.initial_split() is None  # the split waits for the joiner's profile
    p.observe(4, 0.8)
    assert p.initial_split() == [[0, 1], [2, 4]]
    assert p.leave(0) == 0 and p.groups == [[1], [2, 4]]


def test_converged_speeds_merge_into_one_server_and_leave_the_other_idle():
    p = gssp(4, staleness=1, exchange_every=2, profile_iterations=1, profile_window=4, regroup_patience=1,
             split_ratio=1.5, regroup_cooldown_s=5.0)
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=1)
    p.initial_split()
    _profile(p, [0.1, 0.1, 0.1, 0.1], rounds=4)  # the slow pair caught up
    moves = p.check_regroup(now=1.5)  # no cooldown after the split itself
    assert sorted((m.worker, m.old, m.new) for m in moves) == [(2, 1, 0), (3, 1, 0)]  # the majority server stays
    assert p.groups == [[0, 1, 2, 3], []] and p.idle_servers == [1]
    assert p.update_shares() == [1.0, 0.0]
    _profile(p, [0.1, 0.1, 0.8, 0.8], rounds=4)  # they slow down again: a split, but only 5 s after the merge
    assert p.check_regroup(now=6.4) == []
    assert sorted((m.worker, m.old, m.new) for m in p.check_regroup(now=6.5)) == [(2, 0, 1), (3, 0, 1)]


def test_update_shares_follow_group_size_and_slowest_member():
    p = gssp(6, staleness=1, exchange_every=2, profile_iterations=1, split_ratio=1.5)
    _profile(p, [0.1, 0.1, 0.1, 0.1, 0.4, 0.5], rounds=1)
    p.initial_split()
    assert p.groups == [[0, 1, 2, 3], [4, 5]]
    assert p.update_shares() == [pytest.approx(40 / 44), pytest.approx(4 / 44)]  # 4 / 0.1 vs 2 / 0.5 updates per s


def test_paced_groups_pace_members_by_their_slowest_and_share_updates_by_their_summed_rates():
    p = gssp(6, staleness=1, exchange_every=2, profile_iterations=1, split_ratio=1.5, paced=True)
    _profile(p, [0.1, 0.1, 0.1, 0.125, 0.4, 0.5], rounds=1)
    assert isinstance(p.policy(0), SSP) and not isinstance(p.policy(0), PacedSSP)  # profiling: plain SSP
    p.initial_split()
    assert p.groups == [[0, 1, 2, 3], [4, 5]]
    assert all(isinstance(p.policy(s), PacedSSP) for s in range(2))
    assert p.paces() == [{0: 0.8, 1: 0.8, 2: 0.8, 3: 1.0}, {4: 0.8, 5: 1.0}]
    assert p.policy(1).paces == {4: 0.8, 5: 1.0}  # set on the policies too
    rates = [3 / 0.1 + 1 / 0.125, 1 / 0.4 + 1 / 0.5]
    assert p.update_shares() == [pytest.approx(r / sum(rates)) for r in rates]


def test_unpaced_groups_and_allreduce_groups_run_plain_policies():
    for kwargs in ({}, {"paced": True, "intra_group": "allreduce"}):
        p = gssp(6, staleness=1, exchange_every=2, profile_iterations=1, split_ratio=1.5, **kwargs)
        _profile(p, [0.1, 0.1, 0.1, 0.125, 0.4, 0.5], rounds=1)
        p.initial_split()
        assert not any(isinstance(p.policy(s), PacedSSP) for s in range(2)) and p.paces() == [{}, {}]


@pytest.mark.parametrize("mode", ["server", "global", "busiest"])
def test_momentum_shares_per_mode(mode):
    p = gssp(6, staleness=1, exchange_every=2, profile_iterations=1, split_ratio=1.5, group_momentum=mode)
    _profile(p, [0.1, 0.1, 0.1, 0.1, 0.4, 0.5], rounds=1)
    assert p.momentum_shares() == ([None] if mode == "server" else [1.0])  # one group while profiling
    p.initial_split()
    shares = [pytest.approx(40 / 44), pytest.approx(4 / 44)]
    expected = {"server": [None, None], "global": shares, "busiest": [shares[0], shares[0]]}
    assert p.momentum_shares() == expected[mode]


def test_by_default_every_group_server_decays_its_momentum_as_the_busiest_one(fast_config, tmp_path, monkeypatch):
    """The sim backend hands every group server the busiest group's share (the 1x tier: 4 / 0.05 of 4 / 0.05 +
    4 / 0.4 updates per second), and the paper's mode hands none."""
    calls: list[tuple[int, float]] = []
    original = Replica.set_update_share

    def recording(self: Replica, share: float) -> None:
        calls.append((id(self), share))
        original(self, share)

    monkeypatch.setattr(Replica, "set_update_share", recording)
    run = ("sync.scheme=gssp", "cluster.workers=8", TIERS, "run.max_time_s=3", "run.stop_at_target=false")
    train(fast_config(*run), tmp_path / "d")
    after_split = [share for _, share in calls if share < 1.0]
    assert len({server for server, share in calls if share < 1.0}) == 2
    assert after_split and all(share == pytest.approx(8 / 9, rel=0.05) for share in after_split)
    calls.clear()
    train(fast_config(*run, "sync.gssp.group_momentum=server"), tmp_path / "s")
    assert calls == []


@pytest.mark.parametrize("share", [1.0, 0.5, 0.1])
def test_momentum_on_a_share_of_updates_moves_each_gradient_as_far(share):
    """A gradient's total displacement is lr / (1 - m) x g whatever the share; the share only shortens its tail."""
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)
    r = Replica(torch.zeros(3), torch.zeros(0), opt)
    r.set_update_share(share)
    g = torch.tensor([1.0, -2.0, 0.5])
    r.apply([g], 1.0)
    first = -r.params.detach().clone()
    for _ in range(400):
        r.apply([torch.zeros(3)], 1.0)
    assert torch.allclose(-r.params.detach(), 0.1 / (1 - 0.9) * g, rtol=1e-4)
    assert torch.allclose(first, 0.1 * (1 - 0.9 ** (1 / share)) / (1 - 0.9) * g)
    r.set_lr(0.05)  # a decay keeps the share's scale
    assert r.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * (1 - 0.9 ** (1 / share)) / 0.1)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(0, 10_000), st.booleans())
def test_replicas_agree_once_all_deltas_are_delivered(n_groups, seed, adam):
    """Whatever the interleaving of local steps, sends and deliveries, replicas end equal."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = OptimizerConfig(name="adam" if adam else "sgd", lr=0.05, momentum=0.9, weight_decay=0.01)
    start = Replica(torch.randn(50, generator=gen), torch.randn(6, generator=gen), opt, track_own=True)
    replicas = [start.clone(opt) for _ in range(n_groups)]
    in_flight: list[tuple[int, tuple[torch.Tensor, torch.Tensor]]] = []

    def send(i: int) -> None:
        delta = replicas[i].take_own_delta()
        in_flight.extend((j, delta) for j in range(n_groups) if j != i)

    for _ in range(60):
        action, i = rng.random(), rng.randrange(n_groups)
        if action < 0.5:
            replicas[i].apply([torch.randn(50, generator=gen)], weight=0.25)
            replicas[i].add_buffer_deltas([torch.randn(6, generator=gen)], weight=0.25)
        elif action < 0.7:
            send(i)
        elif in_flight:
            j, delta = in_flight.pop(rng.randrange(len(in_flight)))
            replicas[j].receive_delta(*delta)
    for i in range(n_groups):
        send(i)
    for j, delta in in_flight:
        replicas[j].receive_delta(*delta)
    for other in replicas[1:]:
        assert torch.allclose(other.params.detach(), replicas[0].params.detach(), atol=1e-5)
        assert torch.allclose(other.buffers, replicas[0].buffers, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_replacement_from_a_peers_shared_snapshot_agrees_with_the_others_in_the_end(seed):
    """A dead group's replica rebuilt from a peer (Replica.shared_snapshot): once every delta sent is
    delivered, it equals the others. The peer's own unsent delta reaches it once, with the next exchange."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)
    start = Replica(torch.randn(20, generator=gen), torch.randn(3, generator=gen), opt, track_own=True)
    replicas = [start.clone(opt) for _ in range(3)]
    in_flight: list[tuple[int, tuple[torch.Tensor, torch.Tensor]]] = []

    def step(i: int) -> None:
        replicas[i].apply([torch.randn(20, generator=gen)], weight=0.25)
        replicas[i].add_buffer_deltas([torch.randn(3, generator=gen)], weight=0.25)

    def send(i: int) -> None:
        delta = replicas[i].take_own_delta()
        in_flight.extend((j, delta) for j in range(3) if j != i)

    def play(rounds: int) -> None:
        for _ in range(rounds):
            action, i = rng.random(), rng.randrange(3)
            if action < 0.5:
                step(i)
            elif action < 0.7:
                send(i)
            elif in_flight:
                j, delta = in_flight.pop(rng.randrange(len(in_flight)))
                replicas[j].receive_delta(*delta)

    play(30)
    # replica 1 dies: its unsent updates are lost, copies addressed to it are dropped, the rest arrives
    for j, delta in [(j, d) for j, d in in_flight if j != 1]:
        replicas[j].receive_delta(*delta)
    in_flight.clear()
    step(2)  # the peer holds an own delta it has not sent yet
    replicas[1] = Replica(*replicas[2].shared_snapshot(), opt, track_own=True)
    play(30)
    for i in range(3):
        send(i)
    for j, delta in in_flight:
        replicas[j].receive_delta(*delta)
    for other in replicas[1:]:
        assert torch.allclose(other.params.detach(), replicas[0].params.detach(), atol=1e-5)
        assert torch.allclose(other.buffers, replicas[0].buffers, atol=1e-5)


def _gssp(fast_config, *extra: str):
    return fast_config("sync.scheme=gssp", "backend.mode=cost", "cluster.workers=8", TIERS,
                       "sync.gssp.profile_iterations=3", "run.max_time_s=30", *extra)


def test_gssp_frees_the_fast_workers_that_bsp_holds_back(fast_config, tmp_path):
    gssp = train(_gssp(fast_config), tmp_path / "g")
    bsp = train(_gssp(fast_config, "sync.scheme=bsp"), tmp_path / "b")
    assert gssp["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    fast_g, fast_b = gssp["per_worker"][0], bsp["per_worker"][0]
    assert fast_g["iterations"] > 6 * fast_b["iterations"]
    assert fast_g["wait_s"] < 0.05 * fast_g["compute_s"] < fast_b["wait_s"]
    # every push after the split is one group update (pushes in flight at the split: at most one per worker)
    assert gssp["exchanges"] > 0
    events = read_jsonl(tmp_path / "g" / "metrics.jsonl")
    split = next(e["t"] for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    before = sum(1 for e in events if e["event"] == "iteration" and e["t"] <= split)
    assert gssp["iterations"] - before - 8 <= sum(gssp["group_updates"]) <= gssp["iterations"] - before + 8


def test_with_confirm_span_the_slow_tier_confirms_its_speed_before_the_split(fast_config, tmp_path):
    gssp = train(_gssp(fast_config, "sync.gssp.confirm_span=96", "sync.gssp.confirm_fraction=1"), tmp_path / "g")
    assert gssp["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    events = read_jsonl(tmp_path / "g" / "metrics.jsonl")
    split = next(e["t"] for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    slow_before = [e for e in events if e["event"] == "iteration" and e["t"] <= split and e["worker"] >= 4]
    assert 4 * 10 <= len(slow_before) <= 4 * 13  # 96 fastest iterations: about 12 of the 8x tier's each
    fast_before = [e for e in events if e["event"] == "iteration" and e["t"] <= split and e["worker"] < 4]
    # nobody waited for them once all were profiled (8x as fast); their 3 profiling iterations were waited for
    assert len(fast_before) > 4 * 8 * (12 - 3) * 0.9


def test_when_half_the_workers_look_slow_the_split_is_taken_on_the_profiles_as_without_confirmation(
        fast_config, tmp_path):
    """Tiers of 1x and 8x: 4 of 8 look slow, so speeds are spread; the default run is the confirm_span = 0 one."""
    default = train(_gssp(fast_config), tmp_path / "d")
    plain = train(_gssp(fast_config, "sync.gssp.confirm_span=0"), tmp_path / "p")
    assert default["groups"] == plain["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for key in ("iterations", "final_accuracy", "group_updates", "exchanges"):
        assert default[key] == plain[key]


def test_sustained_slowdown_is_regrouped_within_bounded_iterations(fast_config, tmp_path):
    cfg = _gssp(fast_config, "cluster.speed_changes=[{worker = 0, at_s = 10.0, speed = 8.0}]")
    train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    regroups = [e for e in events if e["event"] == "groups" and e["reason"] == "regroup"]
    assert len(regroups) == 1 and [0, 0, 1] in regroups[0]["moves"]
    after = [e for e in events if e["event"] == "iteration" and e["worker"] == 0 and 10.0 <= e["t"] <= regroups[0]["t"]]
    # the 20th-percentile estimate over a 20-iteration window moves after 17 slow iterations; plus patience
    assert len(after) <= 25


def test_transient_stragglers_do_not_cause_regrouping(fast_config, tmp_path):
    cfg = _gssp(fast_config, "run.max_time_s=40", "cluster.stragglers.probability=0.05",
                "cluster.stragglers.slowdown=4", "cluster.stragglers.duration=3", "sync.gssp.profile_iterations=10")
    summary = train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert sum(1 for e in events if e["event"] == "iteration" and e["worker"] == 0) > 1000
    assert not [e for e in events if e["event"] == "groups" and e["reason"] == "regroup"]
    assert summary["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_by_default_a_uniform_cluster_with_slow_spells_keeps_one_group(fast_config, tmp_path, seed):
    """16 equal workers, 4x spells of 5 iterations: some worker is in a spell when profiled on most seeds;
    the few that look slow confirm their speed (confirm_span, on by default) and never do."""
    cfg = fast_config("sync.scheme=gssp", "backend.mode=cost", "cluster.workers=16", "cluster.profile=uniform",
                      "cluster.stragglers.probability=0.05", "cluster.stragglers.slowdown=4",
                      "cluster.stragglers.duration=5", "run.max_time_s=10", f"run.seed={seed}")
    summary = train(cfg, tmp_path / "r")
    assert summary["groups"] == [list(range(16))]


def test_gssp_trains_and_evaluates_the_mean_of_the_replicas(fast_config, tmp_path):
    cfg = fast_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.max_time_s=3",
                      "run.stop_at_target=false")
    summary = train(cfg, tmp_path / "r")
    assert summary["groups"] == [[0, 1], [2, 3]]
    assert summary["final_accuracy"] > 0.8
    kinds = [e["event"] for e in read_jsonl(tmp_path / "r" / "metrics.jsonl")]
    assert "exchange" in kinds


def test_staleness_counts_every_update_a_received_delta_holds(fast_config, tmp_path):
    """A group of one worker sees no staleness of its own: only its peers' deltas, exchange_every updates each."""
    cfg = _gssp(fast_config, "cluster.workers=4", "cluster.speeds=[1, 8, 8, 8]", "sync.gssp.exchange_every=4",
                "run.max_time_s=10")
    summary = train(cfg, tmp_path / "r")
    assert summary["groups"] == [[0], [1, 2, 3]]
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    split = next(e["t"] for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    seen = {e["staleness"] for e in events if e["event"] == "iteration" and e["worker"] == 0 and e["t"] > split + 1
            and e["staleness"] is not None}
    assert 4 in seen and all(s % 4 == 0 for s in seen)


def test_a_group_does_not_wait_for_its_transient_stragglers(fast_config, tmp_path):
    straggle = ("cluster.stragglers.probability=0.05", "cluster.stragglers.slowdown=4",
                "cluster.stragglers.duration=5", "run.max_time_s=20")
    excused = train(_gssp(fast_config, *straggle), tmp_path / "on")
    waited = train(_gssp(fast_config, *straggle, "sync.gssp.transient_factor=0"), tmp_path / "off")
    for summary in (excused, waited):  # a slow spell while profiling may split a third group, merged later
        assert [g for g in summary["groups"] if g] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    wait = lambda s: sum(p["wait_s"] for p in s["per_worker"])  # noqa: E731
    assert wait(excused) < 0.3 * wait(waited)
    assert excused["iterations"] > 1.2 * waited["iterations"]


def test_paced_groups_let_members_of_steadily_different_speeds_run_at_their_own(fast_config, tmp_path):
    """1x and 1.4x workers share a group (under split_ratio 1.5): plain SSP runs both at the 1.4x pace, paced
    SSP each at its own; the groups and the slow group's pace are the same either way."""
    mixed = ("cluster.speeds=[1, 1, 1.4, 1.4, 8, 8, 8, 8]", "run.max_time_s=20")
    paced = train(_gssp(fast_config, *mixed, "sync.gssp.paced=true"), tmp_path / "paced")
    plain = train(_gssp(fast_config, *mixed, "sync.gssp.paced=false"), tmp_path / "plain")
    for summary in (paced, plain):
        assert summary["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    its = lambda s, w: s["per_worker"][w]["iterations"]  # noqa: E731
    assert its(paced, 0) > 1.3 * its(paced, 2)  # each at its own speed
    assert its(plain, 0) < 1.05 * its(plain, 2)  # the 1x workers held to the 1.4x pace
    assert its(paced, 0) > 1.3 * its(plain, 0)
    assert its(paced, 4) == pytest.approx(its(plain, 4), rel=0.05)
    assert paced["per_worker"][0]["wait_s"] < 0.05 * plain["per_worker"][0]["wait_s"]


@pytest.mark.parametrize("before, after", [(0.5, 0.1), (0.1, 0.9), (1.0, 0.25)])
def test_a_share_change_keeps_what_the_velocity_still_moves(before, after):
    """Regrouping changes a server's share; the momentum already built must not be applied at the new step size."""
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)
    r = Replica(torch.zeros(3), torch.zeros(0), opt)
    r.set_update_share(before)
    g = torch.tensor([1.0, -2.0, 0.5])
    r.apply([g], 1.0)
    r.apply([torch.zeros(3)], 1.0)
    r.set_update_share(after)
    for _ in range(600):
        r.apply([torch.zeros(3)], 1.0)
    assert torch.allclose(-r.params.detach(), 0.1 / (1 - 0.9) * g, rtol=1e-4)


def test_a_global_exchange_clock_sends_in_proportion_to_each_groups_share_of_updates():
    """Shares from the profile: 3 workers at 0.1 s make 30 updates/s, one at 1.0 s makes 1 (of 31)."""
    p = gssp(4, staleness=1, exchange_every=4, profile_iterations=1, exchange_clock="global")
    _profile(p, [0.1, 0.1, 0.1, 1.0], rounds=1)
    assert p.initial_split() == [[0, 1, 2], [3]]
    assert p.exchange_periods() == [round(4 * 30 / 31 * 2), 1]  # the slow group sends every update of its own
    assert [p.local_update(1) for _ in range(2)] == [True, True]
    assert [p.local_update(0) for _ in range(8)] == [False] * 7 + [True]
    own = gssp(4, staleness=1, exchange_every=4, profile_iterations=1)
    _profile(own, [0.1, 0.1, 0.1, 1.0], rounds=1)
    own.initial_split()
    assert own.exchange_periods() == [4, 4]  # the paper's clock: own updates only
