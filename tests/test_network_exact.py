"""`exact` against brute force over every assignment, on hundreds of tiny instances.

The brute force knows nothing of the algorithm: it enumerates all
(|S| + 1)^N assignments and scores each with the paper's formula
lambda = min(T, C_s / k_s over used switches, B / (d + a)).
"""

from __future__ import annotations

import itertools
import math

import highspy
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shoal.network.algorithms import solve
from shoal.network.algorithms._highs import new_highs
from shoal.network.algorithms.exact import optimum
from shoal.network.instance import build_instance
from shoal.network.topology import topology_from_dict


def brute_force(n: int, caps: list[float], ps_gbps: float, worker_gbps: float) -> float:
    s = len(caps)
    assign = np.array(list(itertools.product(range(s + 1), repeat=n)))  # column value s = the PS
    rate = np.full(len(assign), float(worker_gbps))
    used = np.zeros(len(assign))
    for j, c in enumerate(caps):
        k = (assign == j).sum(axis=1)
        with np.errstate(divide="ignore"):
            rate = np.where(k > 0, np.minimum(rate, c / np.maximum(k, 1)), rate)
        used += k > 0
    direct = (assign == s).sum(axis=1)
    rate = np.minimum(rate, ps_gbps / (direct + used))
    return float(rate.max())


def random_case(rng: np.random.Generator) -> tuple[int, list[float], float, float]:
    n = int(rng.integers(1, 7))
    s = int(rng.integers(0, 4))
    # integers make ties (C_s / k == B / m) common, which is where rounding bugs hide
    caps = [float(rng.integers(0, 400)) if rng.random() < 0.7 else float(rng.uniform(0, 400)) for _ in range(s)]
    ps_gbps = float(rng.integers(1, 200))
    worker_gbps = float(rng.choice([10, 25, 50, 100, 1000]))
    return n, caps, ps_gbps, worker_gbps


def test_exact_matches_brute_force_on_500_seeded_instances() -> None:
    rng = np.random.default_rng(2023)
    for _ in range(500):
        n, caps, b, t = random_case(rng)
        got, counts = optimum(n, caps, b, t)
        want = brute_force(n, caps, b, t)
        assert got == pytest.approx(want, rel=1e-12), (n, caps, b, t)
        assert sum(counts) <= n and all(k == 0 or c / k >= got * (1 - 1e-9) for c, k in zip(caps, counts))


@settings(max_examples=200, deadline=None)
@example(n=2, caps=[11.0, 2.2250738585072014e-308], ps_gbps=10.0, worker_gbps=5.0)  # once overflowed floor()
@given(
    n=st.integers(1, 6),
    caps=st.lists(st.one_of(st.integers(0, 300).map(float), st.floats(0, 300)), max_size=3),
    ps_gbps=st.one_of(st.integers(1, 150).map(float), st.floats(0.5, 150)),
    worker_gbps=st.sampled_from([5.0, 40.0, 100.0, math.inf]),
)
def test_exact_matches_brute_force_property(n: int, caps: list[float], ps_gbps: float, worker_gbps: float) -> None:
    t = 1e6 if math.isinf(worker_gbps) else worker_gbps
    assert optimum(n, caps, ps_gbps, t)[0] == pytest.approx(brute_force(n, caps, ps_gbps, t), rel=1e-12)


def star(n: int, caps: list[float]) -> dict:
    """Workers and PS on one unconstrained fabric: the paper's link-free model."""
    sw = [{"name": "core"}] + [{"name": f"p{j}", "programmable": True, "capacity_gbps": c} for j, c in enumerate(caps)]
    links = [{"a": "ps", "b": "core"}] + [{"a": f"w{i}", "b": "core"} for i in range(n)] + [{"a": f"p{j}", "b": "core"} for j in range(len(caps))]
    return {"hosts": ["ps"] + [f"w{i}" for i in range(n)], "switches": sw, "links": links, "ps": "ps"}


def test_exact_planner_end_to_end_equals_brute_force() -> None:
    rng = np.random.default_rng(5)
    for _ in range(60):
        n, caps, b, t = random_case(rng)
        inst = build_instance(topology_from_dict(star(n, caps)), programmable="file", capacity=None, ps_gbps=b, worker_gbps=t)
        res = solve(inst, "exact")
        want = brute_force(n, caps, b, t)
        assert res.evaluation.min_rate_gbps == pytest.approx(want, rel=1e-12)
        assert res.evaluation.violations == ()  # links unconstrained: its claim holds
        assert res.bound_gbps == pytest.approx(want, rel=1e-12)


def gria_milp(n: int, caps: list[float], ps_gbps: float, worker_gbps: float) -> float:
    """The paper's GRIA, verbatim, as a MILP: an independent check of the closed form."""
    h = new_highs()
    lam = h.addVariable(lb=0, ub=highspy.kHighsInf)
    nodes = list(range(len(caps) + 1))  # last = PS
    x = {(i, j): h.addBinary() for i in range(n) for j in nodes}
    r = {(i, j): h.addVariable(lb=0, ub=highspy.kHighsInf) for i in range(n) for j in nodes}
    y = {j: h.addVariable(lb=0, ub=highspy.kHighsInf) for j in nodes[:-1]}
    for i in range(n):
        h.addConstr(sum(x[i, j] for j in nodes) == 1)
        h.addConstr(lam - sum(r[i, j] for j in nodes) <= 0)
        for j in nodes:
            h.addConstr(r[i, j] - worker_gbps * x[i, j] <= 0)
        for j in nodes[:-1]:
            h.addConstr(r[i, j] - y[j] <= 0)
    for j, c in enumerate(caps):
        h.addConstr(sum(r[i, j] for i in range(n)) <= c)
    h.addConstr(sum(r[i, nodes[-1]] for i in range(n)) + sum(y.values()) <= ps_gbps)
    h.maximize(lam)
    return float(h.getInfo().objective_function_value)


def test_closed_form_equals_the_papers_milp() -> None:
    rng = np.random.default_rng(11)
    for _ in range(25):
        n, caps, b, t = random_case(rng)
        assert optimum(n, caps, b, t)[0] == pytest.approx(gria_milp(n, caps, b, t), rel=1e-6)
