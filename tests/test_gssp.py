"""GSSP's pure policy: profiling, natural-breaks grouping, confirmation of slow workers, gating, joiners,
regrouping, pacing, update shares and the exchange clock. The replicas it coordinates: test_gssp_replicas.py;
whole runs on sim: test_gssp_sim.py."""

from __future__ import annotations

import random

import pytest

from shoal.config import GSSPOptions
from shoal.sync.gssp import GSSP
from shoal.sync.policies import SSP, PacedSSP

#: the paper's rules: every refinement shoal's defaults turn on is off here, so each test turns on what it checks
PAPER = dict(split_ratio=1.0, regroup_cooldown_s=0.0, transient_factor=0.0, confirm_span=0.0, confirm_fraction=1.0,
             paced=False, group_momentum="server")


def gssp(workers: int, intra_group: str = "server", **options) -> GSSP:
    """A GSSP coordinator under the paper's rules with ``options`` changed."""
    return GSSP(workers, GSSPOptions(**{**PAPER, **options}), intra_group)


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
