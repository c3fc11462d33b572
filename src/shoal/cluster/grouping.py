"""Profiling worker speed and grouping workers of similar speed (GSSP).

Iteration times (compute + communication) are measured from the run itself,
as a running low quantile over each worker's recent iterations. Groups are Jenks natural breaks
(jenkspy), 1-D optimal clustering as the GSSP paper cites, over the
*logarithm* of those times: inside an SSP group the fast wait in proportion
to the speed ratio, so 1x vs 2x differs as much as 4x vs 8x.
Everything here is pure: no clocks, only numbers in and groups out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import jenkspy
import numpy as np

Groups = list[list[int]]


class IterationProfiler:
    """Per-worker iteration time: a low quantile of its last ``window`` iterations.

    Transient stragglers only ever make iterations slower, so a low quantile
    (default: the 20th percentile) ignores slow spells that cover less than
    four fifths of the window, while a sustained change moves it once it
    fills that much. Grouping may start after ``warmup`` iterations per
    worker (quantile of what has been seen so far). Each worker's estimate is
    updated when it observes, so reading all of them costs no quantiles.
    """

    def __init__(self, workers: int, warmup: int = 3, window: int = 20, quantile: float = 0.2) -> None:
        if warmup < 1 or window < 1 or not 0 <= quantile <= 1:
            raise ValueError("warmup and window must be >= 1, quantile in [0, 1]")
        self.warmup, self.window, self.quantile = warmup, window, quantile
        self.count = [0] * workers
        self._recent: list[deque[float]] = [deque(maxlen=window) for _ in range(workers)]
        self._estimate = [0.0] * workers

    def observe(self, worker: int, seconds: float) -> None:
        self.count[worker] += 1
        self._recent[worker].append(seconds)
        self._estimate[worker] = float(np.quantile(self._recent[worker], self.quantile))

    def recent_span(self, worker: int, seconds: float) -> tuple[float, float]:
        """The fastest of ``worker``'s latest iterations that together last ``seconds``, and how long they last.

        Looks back at most over the window; so the second number is under
        ``seconds`` while the worker has not run that long (or that long within
        its window). At least the latest iteration counts.
        """
        fastest, lasted = float("inf"), 0.0
        for t in reversed(self._recent[worker]):
            fastest, lasted = min(fastest, t), lasted + t
            if lasted >= seconds:
                break
        return fastest, lasted

    def add(self) -> int:
        """Profile one more worker (a joiner); returns its id."""
        self.count.append(0)
        self._recent.append(deque(maxlen=self.window))
        self._estimate.append(0.0)
        return len(self.count) - 1

    def profiled(self, worker: int) -> bool:
        return self.count[worker] >= self.warmup

    def times(self) -> list[float]:
        return list(self._estimate)

    def time(self, worker: int) -> float:
        """One worker's estimate (``times()`` copies all of them)."""
        return self._estimate[worker]


def goodness_of_variance_fit(values: Sequence[float], groups: Groups) -> float:
    """GVF = 1 - (within-group squared deviations) / (total squared deviations); 1 = perfect."""
    x = np.asarray(values, dtype=float)
    total = float(((x - x.mean()) ** 2).sum())
    if total <= 1e-12 * max(1.0, float(np.abs(x).max())) ** 2:
        return 1.0
    within = sum(float(((x[g] - x[g].mean()) ** 2).sum()) for g in groups if g)
    return 1.0 - within / total


def jenks_groups(values: Sequence[float], n_groups: int) -> Groups:
    """Workers split into at most ``n_groups`` natural-breaks groups, fastest group first.

    Asking for more groups than there are distinct values gives one group per
    distinct value; equal values always share a group.
    """
    if n_groups < 1:
        raise ValueError("n_groups must be >= 1")
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return []
    distinct = np.unique(x)
    k = min(n_groups, len(distinct))
    if k == 1:
        return [list(range(len(x)))]
    if k == len(distinct):
        return [np.flatnonzero(x == v).tolist() for v in distinct]
    breaks = jenkspy.jenks_breaks(x.tolist(), n_classes=k)
    labels = np.searchsorted(np.asarray(breaks[1:-1]), x, side="left")
    groups = [np.flatnonzero(labels == g).tolist() for g in range(k)]
    return [g for g in groups if g]


def auto_groups(values: Sequence[float], threshold: float = 0.9, max_groups: int = 8) -> Groups:
    """The fewest natural-breaks groups whose goodness of variance fit reaches ``threshold``."""
    best: Groups = [list(range(len(values)))]
    for k in range(1, max(1, min(max_groups, len(values))) + 1):
        best = jenks_groups(values, k)
        if goodness_of_variance_fit(values, best) >= threshold:
            return best
    return best


def log_times(times: Sequence[float]) -> np.ndarray:
    """The scale grouping works on (ratios of iteration times)."""
    return np.log(np.maximum(np.asarray(times, dtype=float), 1e-12))


def group_medians(values: Sequence[float] | np.ndarray, groups: Groups) -> list[float]:
    x = np.asarray(values, dtype=float)
    return [float(np.median(x[g])) for g in groups]


def closest_neighbours(values: Sequence[float] | np.ndarray, groups: Groups) -> tuple[int, float] | None:
    """(i, gap): of the groups in order of their medians, neighbours i and i + 1 are the closest, ``gap`` apart."""
    if len(groups) < 2:
        return None
    medians = sorted(group_medians(values, groups))
    gaps = [b - a for a, b in zip(medians, medians[1:])]
    i = int(np.argmin(gaps))
    return i, gaps[i]


def merge_close(values: Sequence[float] | np.ndarray, groups: Groups, min_gap: float) -> Groups:
    """Merge adjacent groups (fastest first) while two neighbours' medians differ by less than ``min_gap``."""
    groups = sorted((list(g) for g in groups if g), key=lambda g: float(np.median(np.asarray(values)[g])))
    while (pair := closest_neighbours(values, groups)) is not None and pair[1] < min_gap:
        i = pair[0]
        groups[i: i + 2] = [sorted(groups[i] + groups[i + 1])]
    return groups


def choose_groups(times: Sequence[float], groups: int | str, threshold: float, max_groups: int,
                  split_ratio: float = 1.0) -> Groups:
    """Groups of iteration ``times`` for a ``[sync] groups`` setting: an integer count or "auto".

    With "auto", neighbouring groups whose median iteration times differ by
    less than a factor ``split_ratio`` are merged: goodness of fit is
    scale-free, so without a floor it splits workers whose speeds differ by
    noise alone.
    """
    values = log_times(times)
    if groups == "auto":
        return merge_close(values, auto_groups(values, threshold, max_groups), float(np.log(split_ratio)))
    return jenks_groups(values, int(groups))


def group_of(groups: Groups) -> dict[int, int]:
    return {w: g for g, members in enumerate(groups) for w in members}


def canonical(groups: Groups) -> Groups:
    """Groups as sorted lists, in order of their smallest member (for comparing)."""
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


@dataclass
class Regrouper:
    """Decides when observed speeds have drifted enough to regroup.

    A regroup is due when the best grouping differs from the current one and
    either fits the current iteration times better by at least ``margin`` (in
    GVF) or the current grouping has neighbours closer than ``split_ratio``
    (speeds converged: they merge). It happens only if that holds at
    ``patience`` consecutive checks and ``cooldown_s`` after the previous
    regroup (hysteresis in time; the first regroup after the profiled split
    may come at once, since a split on a few profiled iterations is the one
    most likely to need a correction). Profiles are running low quantiles, so a
    transient straggler hardly moves them; patience and cooldown absorb the
    rest.
    """

    groups_setting: int | str
    threshold: float = 0.9
    max_groups: int = 8
    margin: float = 0.05
    patience: int = 3
    split_ratio: float = 1.0
    cooldown_s: float = 0.0
    last_change_s: float = float("-inf")
    _streak: int = field(default=0, init=False)

    def propose(self, times: Sequence[float], current: Groups, now: float = float("inf")) -> Groups | None:
        """New groups if a regroup is due at time ``now`` (given iteration ``times``), else None."""
        candidate = choose_groups(times, self.groups_setting, self.threshold, self.max_groups, self.split_ratio)
        if canonical(candidate) == canonical(current) or not self._worth_it(times, candidate, current):
            self._streak = 0
            return None
        self._streak += 1
        if self._streak < self.patience or now - self.last_change_s < self.cooldown_s:
            return None
        self._streak = 0
        self.last_change_s = now
        return candidate

    def _worth_it(self, times: Sequence[float], candidate: Groups, current: Groups) -> bool:
        values = log_times(times)
        if self.groups_setting == "auto" and (pair := closest_neighbours(values, current)) is not None:
            if pair[1] < float(np.log(self.split_ratio)):
                return True
        return goodness_of_variance_fit(values, candidate) - goodness_of_variance_fit(values, current) >= self.margin
