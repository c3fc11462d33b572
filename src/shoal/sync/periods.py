"""When local SGD and DiLoCo average: fixed periods, post-local SGD's warm-up, or AdaComm's adaptive periods.

Pure: the policy asks it whether a step ends with an averaging and how far
a worker may run ahead; the aggregation schedule asks the same through the
policy (``PeriodicSchedule.follow``), so the two never disagree.
"""

from __future__ import annotations

import math


class Periods:
    """The steps that end with an averaging (step t, 1-based, is a *boundary* when it does).

    - ``warmup_steps``: every one of the first steps is a boundary (post-local
      SGD, Lin et al., 2020).
    - Fixed (``adaptive = False``): then every ``local_steps``-th step.
    - Adaptive (AdaComm, Wang & Joshi, 2019): the first period is
      ``local_steps``; every later one is ``ceil(local_steps * sqrt(L / L0))``
      (at least 1, at most ``local_steps``), with ``L`` the workers' mean
      training loss over the period just ended and ``L0`` that of the first
      period, so periods shrink as the loss falls. A period is decided when
      its previous one closes (``close``), before any worker starts it.
    """

    def __init__(self, local_steps: int, warmup_steps: int = 0, adaptive: bool = False) -> None:
        if local_steps < 1 or warmup_steps < 0:
            raise ValueError("local_steps must be >= 1 and warmup_steps >= 0")
        self.local_steps = local_steps
        self.warmup_steps = warmup_steps
        self.adaptive = adaptive
        self.boundaries = [warmup_steps + local_steps]  # adaptive: the boundaries after the warm-up, decided so far
        self.first_loss: float | None = None
        self._losses: list[float] = []

    def is_sync(self, clock: int) -> bool:
        """Whether local step ``clock`` (0-based) ends with an averaging."""
        step = clock + 1
        if step <= self.warmup_steps:
            return True
        if not self.adaptive:
            return (step - self.warmup_steps) % self.local_steps == 0
        return step in self.boundaries

    def last_boundary(self, steps_done: int) -> int:
        """The last boundary at or before ``steps_done`` (0 for none): how far everyone must have come before a
        worker that did ``steps_done`` steps goes on."""
        if steps_done <= self.warmup_steps:
            return steps_done
        if not self.adaptive:
            return self.warmup_steps + (steps_done - self.warmup_steps) // self.local_steps * self.local_steps
        return max([self.warmup_steps] + [b for b in self.boundaries if b <= steps_done])

    def observe(self, loss: float | None) -> None:
        """A worker's training loss on one step of the current period."""
        if self.adaptive and loss is not None and math.isfinite(loss):
            self._losses.append(loss)

    def close(self, step: int) -> None:
        """The averaging at boundary ``step`` is done: decide the next period (adaptive, after the warm-up)."""
        if not self.adaptive or step < self.boundaries[-1]:
            return
        mean = sum(self._losses) / len(self._losses) if self._losses else None
        self._losses = []
        if self.first_loss is None:
            self.first_loss = mean
        ratio = mean / self.first_loss if mean is not None and self.first_loss else 1.0
        period = min(self.local_steps, max(1, math.ceil(self.local_steps * math.sqrt(max(ratio, 0.0)))))
        self.boundaries.append(self.boundaries[-1] + period)

    def periods(self) -> list[int]:
        """The adaptive periods decided so far (the first is ``local_steps``)."""
        return [b - a for a, b in zip([self.warmup_steps] + self.boundaries, self.boundaries)]
