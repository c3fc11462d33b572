"""Times to target finer than the evaluation period (run.eval_refine).

Evaluating every K iterations quantises a time to target to K: a run that
reaches the target just after an evaluation is charged almost a whole
period, and ten seeds of two schemes tie on the same few ticks. Evaluating
N times as often costs N times the evaluations, over the whole run. The
refiner instead keeps a copy of the evaluated model N - 1 times per period
(a copy of the parameters: no forward pass) and evaluates copies only once,
when the run reaches its target: the copies kept just before the first
evaluation of the streak that reached it, latest first, until one misses.
The time to target is then the earliest copy from which every evaluation,
kept or regular, reached the target, so patience keeps its meaning. Copies
are taken beside the training and never touch it, so a refined run trains
exactly as an unrefined one (tests/test_eval_refine.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from shoal.engine.metrics import RunRecorder
from shoal.engine.task import Evaluation


@dataclass(frozen=True)
class Kept:
    """The evaluated model at one moment between two evaluations, and the run's counters then."""

    t: float
    iterations: int
    bytes: int
    params: torch.Tensor
    buffers: torch.Tensor

    def point(self) -> dict[str, Any]:
        """Where it was kept (a checkpoint saves this beside the tensors)."""
        return {"t": self.t, "iterations": self.iterations, "bytes": self.bytes}


class TargetRefiner:
    """The copies of one run: those since the last evaluation, and those before the current streak of hits."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.since_eval: list[Kept] = []  # kept since the last regular evaluation
        self.before_streak: list[Kept] = []  # kept in the period that ended at the streak's first evaluation

    def keep(self, t: float, recorder: RunRecorder, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Copy the model that an evaluation now would judge."""
        params, buffers = state
        self.since_eval.append(Kept(t, recorder.iterations, int(recorder.bytes_up + recorder.bytes_down),
                                    params.detach().clone(), buffers.detach().clone()))

    def evaluated(self, recorder: RunRecorder) -> None:
        """After a regular evaluation: its period's copies become the candidates if it started a streak of hits,
        and are dropped otherwise (a streak that goes on keeps the copies from before its first evaluation)."""
        streak = recorder.streak_length
        if streak == 1:
            self.before_streak = self.since_eval
        elif streak == 0:
            self.before_streak = []
        self.since_eval = []

    def refine(self, recorder: RunRecorder, evaluate: Callable[[Kept], Evaluation], target: float) -> int:
        """The run has just reached ``target``: evaluate the candidates latest first until one misses, record
        each evaluation, and move the time to target to the earliest hit. Returns the evaluations made."""
        made = 0
        for kept in reversed(self.before_streak):
            ev = evaluate(kept)
            made += 1
            if not recorder.refined_evaluation(kept.point(), ev, target):
                break
        self.before_streak = []
        return made


def sub_ticks(start: float, period: float, factor: int) -> list[float]:
    """The times inside (start, start + period) at which a copy is kept, when evaluating by time."""
    return [start + period * j / factor for j in range(1, factor)]
