"""`exact`: the integral optimum of the paper's link-free model (GRIA).

For a fixed assignment, lambda = min(T, C_s / k_s over used switches,
B / (d + a)). So the optimum is one of the values T, C_s / k, B / m, and
feasibility is monotone in lambda: at rate lambda switch s can take
m_s = floor(C_s / lambda) workers for the price of one PS stream, and the best
use of the PS's floor(B / lambda) streams is to fill the largest switches
first. Binary search over the sorted candidates is therefore exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shoal.network.algorithms.budget import NO_LIMIT, Deadline
from shoal.network.evaluator import TOL, Plan
from shoal.network.instance import Instance
from shoal.network.routing import Routes
from shoal.registry import PLANNERS


MANY = 1 << 40  # "unlimited" stream slots


def slots(capacity: float, rate: float) -> int:
    """How many streams at ``rate`` fit in ``capacity`` (with float tolerance)."""
    ratio = capacity / rate * (1 + TOL)
    return MANY if not ratio < MANY else int(math.floor(ratio))


def fill(n: int, caps: Sequence[float], ps_gbps: float, worker_gbps: float, rate: float) -> list[int] | None:
    """Workers per switch (in ``caps`` order) that reach ``rate``, or None if impossible.

    Greedy: sort switches by how many workers they can take at this rate and
    use the prefix that minimises the PS streams d + a.
    """
    if rate > worker_gbps * (1 + TOL):
        return None
    room = [min(slots(c, rate), n) for c in caps]
    order = sorted(range(len(caps)), key=lambda i: -room[i])
    best_j, best_cost, left = 0, n, n
    for j, i in enumerate(order, start=1):
        if room[i] < 2 or left == 0:
            break
        left -= min(room[i], left)
        if j + left < best_cost:
            best_j, best_cost = j, j + left
    if best_cost > slots(ps_gbps, rate):
        return None
    counts = [0] * len(caps)
    left = n
    for i in order[:best_j]:
        counts[i] = min(room[i], left)
        left -= counts[i]
    return counts


def candidates(n: int, caps: Sequence[float], ps_gbps: float, worker_gbps: float) -> np.ndarray:
    """Every value the optimum can take, ascending."""
    ks = np.arange(1, n + 1, dtype=float)
    parts = [np.array([worker_gbps]), ps_gbps / ks] + [c / ks for c in caps if c > 0]
    return np.unique(np.concatenate(parts))


def optimum(n: int, caps: Sequence[float], ps_gbps: float, worker_gbps: float) -> tuple[float, list[int]]:
    """(optimal rate, workers per switch) of the link-free model."""
    cand = candidates(n, caps, ps_gbps, worker_gbps)
    lo, hi = 0, len(cand) - 1  # cand[0] = min(B / n, ...) is always feasible (everyone direct)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fill(n, caps, ps_gbps, worker_gbps, float(cand[mid])) is not None:
            lo = mid
        else:
            hi = mid - 1
    counts = fill(n, caps, ps_gbps, worker_gbps, float(cand[lo]))
    assert counts is not None
    return float(cand[lo]), counts


def assign_nearest(inst: Instance, routes: Routes, counts: dict[str, int]) -> dict[str, str]:
    """Give each switch its count of workers, nearest first (any split is optimal without links)."""
    free = list(inst.workers)
    assignment: dict[str, str] = {}
    for s in sorted(counts, key=lambda s: -counts[s]):
        dist = routes.dist_to(s)
        free.sort(key=lambda w: (dist.get(w, math.inf), w))
        for w in free[: counts[s]]:
            assignment[w] = s
        free = free[counts[s] :]
    assignment.update({w: inst.ps for w in free})
    return assignment


@PLANNERS.register("exact", "the integral optimum of the paper's model (binary search on the rate, greedy filling)")
def plan_exact(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT) -> tuple[Plan, float | None, dict[str, object]]:
    """The paper-model optimum; it claims that rate (links may make it infeasible: see violations)."""
    sw = list(inst.programmable)
    rate, counts = optimum(len(inst.workers), [inst.capacity(s) for s in sw], inst.ps_gbps, inst.worker_gbps)
    used = {s: c for s, c in zip(sw, counts) if c > 0}
    return Plan(assign_nearest(inst, routes, used), claimed_rate_gbps=rate), rate, {"model_rate_gbps": rate}
