"""The sync policies as pure state machines: gating and merging on scripted pushes."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.sync import ASP, BSP, SSP, make_policy
from shoal.sync.policies import PacedSSP


def test_bsp_releases_one_update_per_round_and_gates_until_it():
    p = BSP(range(3))
    assert all(p.may_start(w) for w in range(3))
    assert p.on_push(0) == ()
    assert not p.may_start(0)  # pushed round 1, others have not
    assert p.on_push(2) == ()
    assert p.on_push(1) == (0, 1, 2)
    assert all(p.may_start(w) for w in range(3))
    assert p.min_clock == 1


def test_asp_never_waits_and_applies_each_push():
    p = ASP(range(2))
    for _ in range(5):
        assert p.on_push(0) == (0,)
    assert p.may_start(0) and p.start_threshold(0) is None
    assert p.clocks == {0: 5, 1: 0}


def test_ssp_bound_s():
    p = SSP(range(2), staleness=2)
    for clock in range(1, 4):
        assert p.may_start(0)
        p.on_push(0)
        assert p.clocks[0] == clock
    assert not p.may_start(0)  # clock 3 > min 0 + 2
    p.on_push(1)
    assert p.may_start(0)  # 3 <= 1 + 2


def test_ssp_with_zero_staleness_gates_like_bsp():
    p = SSP(range(2), staleness=0)
    p.on_push(0)
    assert not p.may_start(0)
    p.on_push(1)
    assert p.may_start(0)


def test_removing_a_worker_releases_the_round_it_held_back():
    p = BSP(range(3))
    p.on_push(0)
    p.on_push(1)
    assert p.remove(2) == (0, 1)
    assert p.may_start(0)


def test_added_worker_joins_at_the_slowest_clock():
    p = SSP(range(2), staleness=1)
    p.on_push(0)
    p.on_push(1)
    p.add(7)
    assert p.clocks[7] == 1 and p.min_clock == 1


def test_make_policy_rejects_unknown_scheme():
    with pytest.raises(ValueError):
        make_policy("nope", range(2))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 4), st.integers(0, 10_000))
def test_ssp_never_lets_a_worker_run_more_than_s_ahead(n, s, seed):
    """Drive random eligible workers; the clock spread never exceeds s + 1."""
    rng = random.Random(seed)
    p = SSP(range(n), staleness=s)
    for _ in range(200):
        eligible = [w for w in range(n) if p.may_start(w)]
        assert eligible, "SSP deadlocked"
        p.on_push(rng.choice(eligible))
        assert max(p.clocks.values()) - p.min_clock <= s + 1
        assert p.min_clock == min(p.clocks.values())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000))
def test_bsp_merges_every_push_exactly_once(n, seed):
    rng = random.Random(seed)
    p = BSP(range(n))
    merged = []
    for _ in range(100):
        eligible = [w for w in range(n) if p.may_start(w)]
        merged.extend(p.on_push(rng.choice(eligible)))
    assert sorted(merged) == sorted(w for w in range(n) for _ in range(p.min_clock))


def test_an_excused_straggler_gates_nobody_and_rejoins_at_the_slowest_clock():
    p = SSP(range(3), staleness=1)
    for _ in range(2):
        p.on_push(0)
        p.on_push(1)
    assert p.min_clock == 0 and not p.may_start(0)  # worker 2 (clock 0) holds 0 and 1 back
    assert p.excuse(2) and p.min_clock == 2 and p.may_start(0)
    p.on_push(2)  # its push still counts
    assert p.clocks[2] == 1 and p.min_clock == 2
    assert p.readmit(2) and p.clocks[2] == 2 and p.min_clock == 2  # the lost clock is skipped
    assert not p.readmit(2)


def test_the_last_counted_worker_is_never_excused_and_removal_readmits():
    p = SSP(range(2), staleness=1)
    assert p.excuse(0) and not p.excuse(1)
    p.on_push(1)
    p.remove(1)  # the last counted worker leaves: the excused one is counted again
    assert p.excused == set() and p.min_clock == p.clocks[0] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "excuse", "readmit", "remove", "add"]), st.integers(0, 4)),
                max_size=60))
def test_slowest_clock_is_the_minimum_over_counted_workers(ops):
    p = SSP(range(5), staleness=2)
    for op, w in ops:
        if op == "add":
            if w not in p.clocks:
                p.add(w)
        elif w not in p.clocks or (op == "remove" and len(p.clocks) == 1):
            continue
        elif op == "push":
            p.on_push(w)
        else:
            getattr(p, op)(w)
        counted = [c for v, c in p.clocks.items() if v not in p.excused]
        assert counted and p.min_clock == min(counted)


def test_paced_ssp_lets_a_steadily_faster_worker_run_at_its_own_speed():
    """Worker 0 takes half as long as worker 1: at pace 0.5 it never waits; plain SSP throttles it to 1's rate."""
    paced, plain = PacedSSP(range(2), staleness=1), SSP(range(2), staleness=1)
    paced.set_paces({0: 0.5, 1: 1.0})
    for _ in range(50):  # in each unit of time: two pushes of 0, one of 1
        for _ in range(2):
            assert paced.may_start(0)
            paced.on_push(0)
        paced.on_push(1)
    assert paced.clocks == {0: 100, 1: 50} and paced.progress == 50.0
    waited = 0
    for _ in range(50):
        for _ in range(2):
            if plain.may_start(0):
                plain.on_push(0)
            else:
                waited += 1
        plain.on_push(1)
    assert waited == 49 and plain.clocks[0] == 51  # throttled to worker 1's pace


def test_paced_ssp_holds_the_group_back_for_a_worker_slower_than_its_pace():
    p = PacedSSP(range(2), staleness=2)
    p.set_paces({0: 0.5})
    for _ in range(4):
        p.on_push(0)
    assert p.may_start(0) and p.progress == 0.0  # progress 2.0 <= 0 + 2
    p.on_push(0)
    assert not p.may_start(0) and p.start_threshold(0) == 0.5  # 2.5 > 0 + 2: waits for worker 1
    p.on_push(1)
    assert p.progress == 1.0 and p.may_start(0)


def test_paced_ssp_with_every_pace_one_is_ssp():
    rng = random.Random(7)
    paced, plain = PacedSSP(range(4), staleness=2), SSP(range(4), staleness=2)
    for _ in range(400):
        w = rng.randrange(4)
        assert paced.may_start(w) == plain.may_start(w)
        if plain.may_start(w):
            paced.on_push(w)
            plain.on_push(w)
        assert paced.progress == plain.min_clock


def test_paced_ssp_rejects_a_pace_outside_zero_one():
    with pytest.raises(ValueError, match="pace"):
        PacedSSP(range(2), staleness=1).set_paces({0: 1.5})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "excuse", "readmit", "remove", "add", "pace"]), st.integers(0, 4),
                          st.floats(0.05, 1.0)), max_size=60))
def test_paced_progress_is_the_minimum_over_counted_workers(ops):
    p = PacedSSP(range(5), staleness=2)
    for op, w, pace in ops:
        if op == "add":
            if w not in p.clocks:
                before = p.progress
                p.add(w)
                assert p.progressed[w] == before  # a joiner gates nobody
        elif w not in p.clocks or (op == "remove" and len(p.clocks) == 1):
            continue
        elif op == "push":
            p.on_push(w)
        elif op == "pace":
            p.set_paces({w: pace})
        else:
            getattr(p, op)(w)
        counted = [v for u, v in p.progressed.items() if u not in p.excused]
        assert counted and p.progress == min(counted)
        assert set(p.progressed) == set(p.clocks) == set(p.paces)
