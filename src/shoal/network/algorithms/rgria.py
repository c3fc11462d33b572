"""`rgria`: the paper's R-GRIA, faithfully: LP relaxation of GRIA, then randomized rounding.

GRIA (nodes j range over the programmable switches plus the PS alpha):

    max lambda
    sum_j x[n,j] = 1                   each worker picks one aggregation node
    r[n,j] <= T x[n,j]                 it sends only to the node it picked
    lambda <= sum_j r[n,j]             every worker reaches lambda
    r[n,s] <= y_s                      a switch's output covers each input stream
    sum_n r[n,s] <= C_s                switch capacity
    sum_n r[n,alpha] + sum_s y_s <= B  PS ingress

Relaxing x to [0, 1] gives an LP solved by HiGHS; its value is an upper bound
on the integral optimum. Each worker is then rounded to one node at random with
probability proportional to its fractional rates r[n, .]. The rounded plan
claims the LP rate; the evaluator shows what it breaks and what it honestly
allows.
"""

from __future__ import annotations

import highspy
import numpy as np
import scipy.sparse as sp

from shoal.network.algorithms._highs import new_highs
from shoal.network.algorithms.budget import NO_LIMIT, Deadline, TimeLimit
from shoal.network.evaluator import Plan
from shoal.network.instance import Instance, rng_for
from shoal.network.routing import Routes
from shoal.registry import PLANNERS


def solve_relaxation(n: int, caps: list[float], ps_gbps: float, worker_gbps: float, deadline: Deadline = NO_LIMIT) -> tuple[float, np.ndarray]:
    """(LP value, fractional rates r of shape (n, |S| + 1), last column the PS).

    With x relaxed, "r <= T x, sum_j x = 1, 0 <= x <= 1" admits some x exactly
    when sum_j r[n,j] <= T (take x = r/T plus an equal share of the rest), so
    x is projected out: the same LP, half the columns, and HiGHS' interior
    point (with crossover to a vertex) solves it in a fraction of a second.
    """
    s, j = len(caps), len(caps) + 1
    r0, y0 = 1, 1 + n * j  # column 0 is lambda
    inf = highspy.kHighsInf
    nn, jj = np.meshgrid(np.arange(n), np.arange(j), indexing="ij")
    ri = (r0 + nn * j + jj).ravel()
    ns, ss = np.meshgrid(np.arange(n), np.arange(s), indexing="ij")
    rs, ys, m = (r0 + ns * j + ss).ravel(), (y0 + ss).ravel(), n * s
    blocks = [  # (row index within block, column, coefficient, row lower, row upper)
        (nn.ravel(), ri, np.ones(n * j), np.full(n, -inf), np.full(n, worker_gbps)),  # sum_j r <= T
        (np.r_[np.arange(n), nn.ravel()], np.r_[np.zeros(n, dtype=int), ri], np.r_[np.ones(n), -np.ones(n * j)], np.full(n, -inf), np.zeros(n)),  # lambda <= sum_j r
        (np.r_[np.arange(m), np.arange(m)], np.r_[rs, ys], np.r_[np.ones(m), -np.ones(m)], np.full(m, -inf), np.zeros(m)),  # r[n,s] <= y_s
        (ss.ravel(), rs, np.ones(m), np.full(s, -inf), np.asarray(caps, dtype=float)),  # sum_n r[n,s] <= C_s
        (np.zeros(n + s, dtype=int), np.r_[r0 + np.arange(n) * j + s, y0 + np.arange(s)], np.ones(n + s), np.array([-inf]), np.array([ps_gbps])),  # PS ingress
    ]
    offsets = np.cumsum([0] + [len(b[3]) for b in blocks])
    rows = np.concatenate([b[0] + off for b, off in zip(blocks, offsets)])
    cols = np.concatenate([b[1] for b in blocks])
    vals = np.concatenate([b[2] for b in blocks])
    ncol, nrow = y0 + s, int(offsets[-1])
    a = sp.csc_matrix((vals, (rows, cols)), shape=(nrow, ncol))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, nrow
    lp.col_cost_ = np.eye(1, ncol, 0).ravel()
    lp.col_lower_, lp.col_upper_ = np.zeros(ncol), np.full(ncol, inf)
    lp.row_lower_ = np.concatenate([b[3] for b in blocks])
    lp.row_upper_ = np.concatenate([b[4] for b in blocks])
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    deadline.check()
    h = new_highs(max(deadline.remaining(), 1e-3) if deadline.limit_s < float("inf") else None)
    h.setOptionValue("solver", "ipm")
    h.passModel(lp)
    h.run()
    if h.getModelStatus() == highspy.HighsModelStatus.kTimeLimit:
        raise TimeLimit(f"the LP relaxation ({ncol:,} columns) was not solved within {deadline.limit_s:g} s")
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"R-GRIA relaxation not solved: {h.modelStatusToString(h.getModelStatus())}")
    sol = np.asarray(h.getSolution().col_value)
    return float(sol[0]), np.clip(sol[r0 : r0 + n * j].reshape(n, j), 0.0, None)


def round_rates(rates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pick one column per row with probability proportional to the row's rates."""
    totals = rates.sum(axis=1, keepdims=True)
    probs = np.where(totals > 0, rates / np.where(totals > 0, totals, 1), 0.0)
    probs[totals.ravel() <= 0, -1] = 1.0  # no fractional rate at all: send to the PS
    cum = np.cumsum(probs, axis=1)
    draws = rng.random(len(rates))[:, None] * cum[:, -1:]
    return np.minimum((draws >= cum).sum(axis=1), rates.shape[1] - 1)


@PLANNERS.register("rgria", "the paper's R-GRIA: LP relaxation plus randomized rounding, reported honestly")
def plan_rgria(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT) -> tuple[Plan, float | None, dict[str, object]]:
    """LP + one randomized rounding (seeded); claims the LP rate, as the paper's analysis does."""
    sw = list(inst.programmable)
    value, rates = solve_relaxation(len(inst.workers), [inst.capacity(s) for s in sw], inst.ps_gbps, inst.worker_gbps, deadline)
    picks = round_rates(rates, rng_for(seed, "rgria"))
    nodes = sw + [inst.ps]
    assignment = {w: nodes[i] for w, i in zip(inst.workers, picks)}
    return Plan(assignment, claimed_rate_gbps=value), value, {"lp_rate_gbps": value}
