"""Profiling and natural-breaks grouping: exact small cases and degenerate inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.cluster.grouping import (
    IterationProfiler,
    Regrouper,
    choose_groups,
    goodness_of_variance_fit,
    jenks_groups,
)


def test_four_tiers_give_four_groups():
    times = [0.05] * 4 + [0.1] * 4 + [0.2] * 4 + [0.4] * 4
    assert choose_groups(times, "auto", 0.95, 8) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert choose_groups(times, 2, 0.95, 8) == [list(range(8)), list(range(8, 16))]


def test_equal_speeds_give_one_group():
    assert choose_groups([0.1] * 6, "auto", 0.95, 8) == [list(range(6))]
    assert choose_groups([0.1] * 6, 3, 0.95, 8) == [list(range(6))]


def test_more_groups_than_distinct_speeds():
    assert choose_groups([1.0, 1.0, 2.0], 5, 0.95, 8) == [[0, 1], [2]]


def test_single_worker():
    assert choose_groups([0.3], "auto", 0.95, 8) == [[0]]
    assert choose_groups([0.3], 4, 0.95, 8) == [[0]]


def test_goodness_of_variance_fit():
    values = [1.0, 1.0, 5.0, 5.0]
    assert goodness_of_variance_fit(values, [[0, 1], [2, 3]]) == pytest.approx(1.0)
    assert goodness_of_variance_fit(values, [[0, 1, 2, 3]]) == pytest.approx(0.0)
    assert goodness_of_variance_fit([2.0, 2.0], [[0, 1]]) == 1.0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.01, 10), min_size=1, max_size=20), st.integers(1, 6))
def test_groups_partition_workers_and_are_contiguous_in_speed(times, k):
    groups = choose_groups(times, k, 0.95, 8)
    members = sorted(w for g in groups for w in g)
    assert members == list(range(len(times)))
    assert 1 <= len(groups) <= k
    # natural breaks never interleave: every group's times lie in a range no other group touches
    ranges = sorted((min(times[w] for w in g), max(times[w] for w in g)) for g in groups)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


def test_jenks_groups_order_fastest_first():
    groups = jenks_groups(np.log([8.0, 1.0, 8.0, 1.0]), 2)
    assert groups == [[1, 3], [0, 2]]


def test_profiler_low_quantile_ignores_a_slow_spell():
    p = IterationProfiler(1, warmup=3, window=20, quantile=0.2)
    for t in [0.1] * 15 + [0.4] * 5:
        p.observe(0, t)
    assert p.times()[0] == pytest.approx(0.1)
    for _ in range(17):
        p.observe(0, 0.4)
    assert p.times()[0] == pytest.approx(0.4)


def test_regrouper_needs_a_clear_and_persistent_improvement():
    current = [[0, 1], [2, 3]]
    drifted = [0.1, 0.4, 0.4, 0.4]  # worker 1 became slow
    r = Regrouper("auto", threshold=0.95, margin=0.15, patience=3)
    assert r.propose(drifted, current) is None
    assert r.propose(drifted, current) is None
    assert r.propose(drifted, current) == [[0], [1, 2, 3]]
    # an unchanged cluster never proposes anything
    assert all(r.propose([0.1, 0.1, 0.4, 0.4], current) is None for _ in range(10))


def test_a_streak_is_broken_by_one_good_check():
    current = [[0, 1], [2, 3]]
    r = Regrouper(2, patience=2)
    assert r.propose([0.1, 0.4, 0.4, 0.4], current) is None
    assert r.propose([0.1, 0.1, 0.4, 0.4], current) is None
    assert r.propose([0.1, 0.4, 0.4, 0.4], current) is None


def test_split_ratio_floor_keeps_near_equal_speeds_together():
    noisy = [0.100, 0.101, 0.103, 0.104, 0.110, 0.112, 0.118, 0.120]  # one speed plus noise (20% spread)
    assert len(choose_groups(noisy, "auto", 0.95, 8, split_ratio=1.0)) > 1  # goodness of fit is scale-free
    assert choose_groups(noisy, "auto", 0.95, 8, split_ratio=1.5) == [list(range(8))]
    tiers = [0.05] * 4 + [0.1] * 4 + [0.2] * 4 + [0.4] * 4  # 2x apart: the floor does not merge them
    assert len(choose_groups(tiers, "auto", 0.95, 8, split_ratio=1.5)) == 4
    assert len(choose_groups(noisy, 3, 0.95, 8, split_ratio=1.5)) == 3  # an explicit count is obeyed


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.01, 10), min_size=1, max_size=24), st.floats(1.0, 4.0))
def test_auto_groups_respect_the_split_ratio(times, ratio):
    groups = choose_groups(times, "auto", 0.95, 8, split_ratio=ratio)
    assert sorted(w for g in groups for w in g) == list(range(len(times)))
    medians = sorted(float(np.median(np.log(np.asarray(times)[g]))) for g in groups)
    assert all(b - a >= np.log(ratio) - 1e-12 for a, b in zip(medians, medians[1:]))


def test_converged_speeds_merge_groups_after_patience():
    r = Regrouper("auto", threshold=0.95, patience=2, split_ratio=1.5)
    same = [0.1, 0.1, 0.11, 0.11]
    assert r.propose(same, [[0, 1], [2, 3]]) is None
    assert r.propose(same, [[0, 1], [2, 3]]) == [[0, 1, 2, 3]]


def test_cooldown_is_hysteresis_in_time():
    r = Regrouper("auto", threshold=0.95, patience=1, split_ratio=1.5, cooldown_s=10.0, last_change_s=5.0)
    drifted = [0.1, 0.4, 0.4, 0.4]
    assert r.propose(drifted, [[0, 1], [2, 3]], now=14.0) is None  # 9 s after the last grouping
    assert r.propose(drifted, [[0, 1], [2, 3]], now=15.0) == [[0], [1, 2, 3]]
    assert r.propose([0.1, 0.1, 0.4, 0.4], [[0], [1, 2, 3]], now=16.0) is None  # and again 10 s later at the earliest
