"""SIM: similarity-aware aggregation, as a pure per-tensor schedule.

For every parameter tensor the server measures how similar the workers'
updates are (the mean cosine between each worker's update and their sum,
computed from what the server received anyway, so it costs no traffic),
smooths it, and sets an aggregation period tau: tau grows by one at each
aggregation while the tensor counts as similar (up to ``max_period``) and
collapses to ``base_period`` when it does not. "Similar" is calibrated
against the noise floor: independent updates of n workers already have a
mean cosine of 1/sqrt(n) with their sum, so rule "snr" turns the cosine s
into the signal-to-noise ratio it implies, r = (s^2 - 1/n) / (1 - s^2)
(|mean update|^2 over a worker's noise^2), and asks for r >= ``min_snr``;
rule "cosine" compares s with a fixed ``threshold`` (the first version). Between
aggregations workers step the tensor locally; at an aggregation they send
their accumulated change and take the server's value (see docs/sim.md).

The object only decides *which tensors are aggregated at which clock*; the
backend moves the data. Decisions are memoised per clock, so every worker
of a group that reaches clock c sees the same plan, whenever it asks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class TensorSchedule:
    """The SIM state of one parameter tensor."""

    name: str
    numel: int
    tau: int = 1
    last_sync: int = -1
    similarity: float | None = None  # smoothed
    measured: float | None = None  # the latest raw measurement
    count: int = 0  # updates the latest measurement was over
    bytes_saved: int = 0


class SimilaritySchedule:
    """Per-tensor aggregation periods driven by measured similarity.

    ``plan(c)`` says which tensors are aggregated at clock ``c``;
    ``observe(i, s, c, n)`` feeds the similarity measured over ``n`` updates
    for tensor ``i`` at the aggregation at clock ``c``. Rule: no skipping
    before ``warmup_iterations`` or for tensors under ``min_numel``; otherwise
    after each observation tau += 1 (capped) if the tensor is similar (see
    the module docstring), else tau = ``base_period``. With a base period H
    and nothing similar, the plan is local SGD's: every tensor every H clocks.
    """

    periodic = False  # SIM measures and decides; sync.localsgd.PeriodicSchedule is the fixed plan

    def __init__(
        self,
        names: Sequence[str],
        numels: Sequence[int],
        *,
        threshold: float,
        max_period: int,
        warmup_iterations: int,
        min_numel: int,
        smoothing: float = 0.5,
        rule: str = "cosine",
        min_snr: float = 1.0,
        base_period: int = 1,
        max_open_clocks: int = 16,
    ) -> None:
        if len(names) != len(numels):
            raise ValueError("names and numels differ in length")
        if not 1 <= base_period <= max_period or not 0 < smoothing <= 1 or rule not in ("cosine", "snr"):
            raise ValueError("need 1 <= base_period <= max_period, smoothing in (0, 1], rule cosine or snr")
        self.tensors = [TensorSchedule(n, k, tau=base_period) for n, k in zip(names, numels)]
        self.rule, self.min_snr, self.base_period = rule, min_snr, base_period
        self.max_open_clocks = max_open_clocks
        self.measured_below = 0  # clocks under this were measured already; late updates for them are not
        self.threshold = threshold
        self.max_period = max_period
        self.warmup = warmup_iterations
        self.min_numel = min_numel
        self.smoothing = smoothing
        self._plans: dict[int, tuple[bool, ...]] = {}

    def clone(self) -> "SimilaritySchedule":
        """An independent copy (a GSSP group server starts from the profiling server's state)."""
        return copy.deepcopy(self)

    def restarted(self, keep_bytes: bool = True) -> "SimilaritySchedule":
        """A copy for a server whose clocks start again at 0 (a GSSP split); tau and similarity are kept.

        Only one of the copies should keep the bytes saved so far, or totals count them twice.
        """
        fresh = self.clone()
        fresh._plans.clear()
        fresh.measured_below = 0
        for t in fresh.tensors:
            t.last_sync = -1
            t.bytes_saved = t.bytes_saved if keep_bytes else 0
        return fresh

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def plan(self, clock: int) -> tuple[bool, ...]:
        """Which tensors are aggregated at ``clock`` (decided on first ask, then fixed)."""
        if clock < 0:
            return (True,) * len(self.tensors)
        if clock not in self._plans:
            self._plans[clock] = tuple(self._decide(t, clock) for t in self.tensors)
        return self._plans[clock]

    def fresh(self, clock: int) -> tuple[bool, ...]:
        """The tensors a worker takes from the server before step ``clock``: those aggregated at the previous clock."""
        return self.plan(clock - 1)

    def _decide(self, t: TensorSchedule, clock: int) -> bool:
        if clock < self.warmup:
            due = True
        elif t.numel < self.min_numel:  # never skipped beyond the base period
            due = (clock + 1) % self.base_period == 0
        elif t.last_sync < 0:  # the first clock after the warm-up (or a restart) starts the period
            due = (clock + 1) % t.tau == 0  # local SGD's sync clocks
        else:
            due = clock - t.last_sync >= t.tau
        if due:
            t.last_sync = max(t.last_sync, clock)
        return due

    def observe(self, index: int, similarity: float, clock: int, count: int = 2) -> None:
        """The similarity measured over ``count`` updates for tensor ``index`` at its aggregation at ``clock``."""
        t = self.tensors[index]
        t.measured = similarity
        t.similarity = similarity if t.similarity is None else (
            self.smoothing * similarity + (1 - self.smoothing) * t.similarity
        )
        t.count = count
        if clock < self.warmup or t.numel < self.min_numel or not self._similar(t.similarity, count):
            t.tau = self.base_period
        else:
            t.tau = min(t.tau + 1, self.max_period)

    def _similar(self, similarity: float, count: int) -> bool:
        if self.rule == "cosine":
            return similarity >= self.threshold
        return snr(similarity, count) >= self.min_snr

    def wants(self, clock: int) -> bool:
        """Whether an update for ``clock`` is still measured (False once that clock's meter was finished)."""
        return clock >= self.measured_below

    def finish_clocks(self, meters: dict[int, "SimilarityMeter"], min_clock: int) -> list[int]:
        """Feed the measurements of every clock all members have passed (below ``min_clock``); return those clocks.

        Without a staleness bound (ASP) the fastest worker runs unboundedly
        ahead of the slowest, so at most ``max_open_clocks`` meters stay
        open: the oldest are finished with the updates they have (memory
        stays flat however long the run). A clock measured over fewer than
        two updates says nothing and is dropped.
        """
        open_clocks = sorted(meters)
        done = [c for c in open_clocks if c < min_clock]
        done += open_clocks[len(done): max(len(done), len(open_clocks) - self.max_open_clocks)]
        for clock in done:
            meter = meters.pop(clock)
            for i, count in meter.count.items():
                if count >= 2 and (similarity := meter.similarity(i)) is not None:
                    self.observe(i, similarity, clock, count)
        if done:
            self.measured_below = max(self.measured_below, done[-1] + 1)
        self.forget_before(min_clock - 1)
        return done

    def reset(self) -> None:
        """Back to aggregating every tensor every base period (e.g. at a learning-rate decay)."""
        for t in self.tensors:
            t.tau = self.base_period
            t.similarity = None

    def forget_before(self, clock: int) -> None:
        """Drop memoised plans no worker can ask for again."""
        for c in [c for c in self._plans if c < clock]:
            del self._plans[c]

    def record_saved(self, plan: Sequence[bool], nbytes_per_value: int = 4) -> None:
        """Account the bytes a transfer did not carry because of ``plan``."""
        for t, sent in zip(self.tensors, plan):
            if not sent:
                t.bytes_saved += nbytes_per_value * t.numel

    def state(self) -> dict[str, list]:
        """A record for metrics.jsonl: names, tau, smoothed and raw similarity, bytes saved."""
        return {
            "names": self.names,
            "tau": [t.tau for t in self.tensors],
            "similarity": [None if t.similarity is None else round(t.similarity, 5) for t in self.tensors],
            "measured": [None if t.measured is None else round(t.measured, 5) for t in self.tensors],
            "snr": [None if t.similarity is None else round(min(snr(t.similarity, t.count), 1e6), 5)
                    for t in self.tensors],
            "bytes_saved": [t.bytes_saved for t in self.tensors],
        }


def snr(similarity: float, count: int) -> float:
    """The signal-to-noise ratio |mean|^2 / noise^2 that a mean cosine ``similarity`` of ``count`` updates with
    their sum implies: s^2 = (r + 1/n) / (r + 1) solved for r (0 at the noise floor 1/sqrt(n), inf at s = 1)."""
    if count <= 1 or similarity >= 1.0:
        return float("inf")
    s2 = max(similarity, 0.0) ** 2
    return max(0.0, (s2 - 1.0 / count) / (1.0 - s2))


class SimilarityMeter:
    """Mean cosine between each worker's update and the sum, per tensor, for one clock.

    Uses sum_i cos(x_i, S) = <sum_i x_i/|x_i|, S> / |S| with S = sum_i x_i,
    so only two running vectors per tensor are kept, whatever the worker count.
    """

    def __init__(self) -> None:
        self.total: dict[int, torch.Tensor] = {}
        self.unit: dict[int, torch.Tensor] = {}
        self.count: dict[int, int] = {}

    def add(self, index: int, update: torch.Tensor) -> None:
        norm = float(update.norm())
        if index not in self.total:
            self.total[index] = torch.zeros_like(update)
            self.unit[index] = torch.zeros_like(update)
            self.count[index] = 0
        self.total[index] += update
        if norm > 0:
            self.unit[index] += update / norm
        self.count[index] += 1

    def similarity(self, index: int) -> float | None:
        """The mean cosine, or None when nothing (non-zero) was added."""
        total = self.total.get(index)
        if total is None:
            return None
        norm = float(total.norm())
        if norm == 0:
            return None
        return float(torch.dot(self.unit[index], total)) / (norm * self.count[index])


def similarity_summary(states: list[dict[str, list]]) -> dict[str, object]:
    """The summary.json fields of SIM: each group server's final state and the bytes saved in all."""
    states = [s for s in states if s]
    if not states:
        return {}
    return {"similarity": states, "bytes_saved_sim": sum(sum(st["bytes_saved"]) for st in states)}
