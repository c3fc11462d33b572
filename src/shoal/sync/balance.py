"""Work sized to speed (``sync.balance``): per-worker batch sizes or local steps, pure.

Heterogeneity remedies that report large wins on mixed hardware (Cannikin,
OmniLearn, Poplar, HexiScale) do not let slow workers fall behind as GSSP
does: they give each worker work in proportion to its speed, so that a
synchronous round ends for everyone at once. ``WorkBalancer`` does that for
any unit of work: samples of a batch (``sync.balance = "batch"``), or local
steps between two averagings (``"steps"``: local SGD, DiLoCo, as DyLU and
asynchronous local-SGD size them). It profiles every worker's seconds per
unit with GSSP's own profiler (a low quantile of a recent window, which a
transient slow spell does not move) and splits each group's units a round
into integers in proportion to the measured speeds, within the bounds of
``[balance]``. It resizes only when the predicted round time drops
by more than ``balance.tolerance`` (hysteresis: noise does not resize), and
only when asked (``rebalance``): the backends ask at the end of a round, so
every member of a round computes with sizes that sum to the global batch.

A worker's gradient is the mean over its own batch (its change, the sum of
its own steps); ``scale`` is what it is multiplied by so that the usual
``1/N`` sum of a round is weighted by samples (by steps):
``size * N / sum(sizes)``. No clocks here: the ``sim`` and
``ray`` backends drive the same object.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from shoal.cluster.grouping import IterationProfiler


def proportional_split(total: int, rates: Sequence[float], low: int = 1, high: int | None = None) -> list[int]:
    """Integers in ``[low, high]`` proportional to ``rates`` that sum to exactly ``total``.

    The real-valued shares are ``clamp(lam * rate, low, high)`` with the one
    ``lam`` that makes them sum to ``total`` (water-filling: a worker whose
    share falls outside the bounds sits at the bound, the others split the
    rest in proportion); each size is its share rounded down, and the
    samples left over go to the largest remainders.
    """
    n = len(rates)
    high = total if high is None else high
    if n == 0 or low < 0 or high < low or not n * low <= total <= n * high:
        raise ValueError(f"cannot split {total} over {n} workers within [{low}, {high}] each")
    if any(not math.isfinite(r) or r <= 0 for r in rates):
        raise ValueError(f"rates must be positive and finite, got {list(rates)}")
    share = _water_fill(float(total), rates, low, high)
    sizes = [min(high, max(low, math.floor(s + 1e-9))) for s in share]
    by_remainder = sorted(range(n), key=lambda i: (sizes[i] - share[i], i))
    while (extra := total - sum(sizes)) != 0:  # at most one pass in practice: floors are within n of the total
        step = 1 if extra > 0 else -1
        order = by_remainder if step > 0 else by_remainder[::-1]
        room = [i for i in order if low <= sizes[i] + step <= high]
        for i in room[:abs(extra)]:
            sizes[i] += step
    return sizes


def _water_fill(total: float, rates: Sequence[float], low: int, high: int) -> list[float]:
    """Shares ``clamp(lam * rate, low, high)`` summing to ``total`` (bisection on ``lam``, then exact on the free set)."""
    def shares(lam: float) -> list[float]:
        return [min(high, max(low, lam * r)) for r in rates]

    lo_lam, hi_lam = 0.0, high / min(rates)  # at hi_lam every share is high
    for _ in range(200):
        mid = (lo_lam + hi_lam) / 2
        lo_lam, hi_lam = (mid, hi_lam) if sum(shares(mid)) < total else (lo_lam, mid)
    out = shares(hi_lam)
    free = [i for i, s in enumerate(out) if low < s < high]
    if free:  # solve lam exactly on the workers within their bounds
        left = total - sum(s for i, s in enumerate(out) if i not in free)
        weight = sum(rates[i] for i in free)
        for i in free:
            out[i] = left * rates[i] / weight
    return out


class WorkBalancer:
    """Each worker's units of work a round: its group's total split in proportion to its measured speed.

    ``per_worker`` is what every worker would do unbalanced (``data.batch_size``
    samples, or H local steps): a group of ``m`` workers shares
    ``m * per_worker`` units a round, each worker between ``low`` and
    ``high``. Until every member of a group is profiled (``warmup``
    iterations each) its members do ``per_worker``.
    """

    def __init__(self, workers: int, per_worker: int, *, low: int = 1, high: int | None = None,
                 tolerance: float = 0.05, warmup: int = 3, window: int = 20, quantile: float = 0.2) -> None:
        if not low <= per_worker <= (high or per_worker):
            raise ValueError(f"the unbalanced amount {per_worker} must lie within [{low}, {high}]")
        self.per_worker, self.low, self.high = per_worker, low, high
        self.tolerance = tolerance
        self.profiler = IterationProfiler(workers, warmup=warmup, window=window, quantile=quantile)
        self.sizes: list[int] = [per_worker] * workers

    @classmethod
    def from_config(cls, workers: int, per_worker: int, options: Any, unit: str) -> "WorkBalancer":
        """From the ``[balance]`` section, for ``unit`` "batch" or "deadline" (samples) or "steps" (local steps)."""
        low, high = (options.min_steps, options.max_steps) if unit == "steps" else (options.min_batch, options.max_batch)
        return cls(workers, per_worker, low=low, high=high, tolerance=options.tolerance,
                   warmup=options.profile_iterations, window=options.profile_window)

    def observe(self, worker: int, compute_s: float, units: int) -> None:
        """One iteration of ``worker``: ``compute_s`` seconds of compute on ``units`` units of work."""
        self.profiler.observe(worker, compute_s / max(1, units))

    def add(self) -> int:
        """One more worker (a joiner) at the configured size until the next rebalance; returns its id."""
        self.sizes.append(self.per_worker)
        return self.profiler.add()

    def size(self, worker: int) -> int:
        return self.sizes[worker]

    def scale(self, worker: int, members: Sequence[int]) -> float:
        """What ``worker``'s mean gradient is multiplied by so that a round's 1/N sum is the global batch's mean."""
        total = sum(self.sizes[w] for w in members)
        return self.sizes[worker] * len(members) / total if total else 1.0

    def round_s(self, members: Iterable[int], sizes: Sequence[int] | None = None) -> float:
        """The predicted compute time of a round: its slowest member's (seconds per unit x units)."""
        members = list(members)
        sizes = [self.sizes[w] for w in members] if sizes is None else sizes
        return max(self.profiler.time(w) * b for w, b in zip(members, sizes))

    def deadline(self, members: Iterable[int], factor: float) -> float:
        """sync.balance = "deadline": ``factor`` times the median member's profiled time for a plain batch
        (``per_worker`` units); infinite until every member is profiled."""
        members = list(members)
        if not members or not all(self.profiler.profiled(w) for w in members):
            return math.inf
        return factor * float(np.median([self.profiler.time(w) for w in members])) * self.per_worker

    def proposal(self, members: Sequence[int]) -> list[int]:
        """The sizes the current profiles ask for (members' order)."""
        rates = [1.0 / max(self.profiler.time(w), 1e-12) for w in members]
        return proportional_split(len(members) * self.per_worker, rates, self.low, self.high)

    def rebalance(self, members: Iterable[int]) -> bool:
        """Resize ``members`` (one group) if every one is profiled and the round gets ``tolerance`` faster.

        Sizes that no longer sum to the group's global batch (the group
        changed) are reset: to the proposal once all are profiled, else to
        ``per_worker``. Returns whether any size changed.
        """
        members = sorted(members)
        if not members:
            return False
        current = [self.sizes[w] for w in members]
        profiled = all(self.profiler.profiled(w) for w in members)
        if not profiled:
            new = current if sum(current) == len(members) * self.per_worker else [self.per_worker] * len(members)
        else:
            new = self.proposal(members)
            keep = sum(current) == len(members) * self.per_worker
            if keep and self.round_s(members, new) >= (1 - self.tolerance) * self.round_s(members, current):
                new = current
        for w, b in zip(members, new):
            self.sizes[w] = b
        return new != current
