"""TensorBoard scalars of a run (``run.tensorboard = true``), written with tensorboardX into OUT/tensorboard.

Per evaluation: the test accuracy (or the task's metric), the loss, the
bytes moved so far, the learning rate in force, and each group's
iterations per second since the last evaluation. The step is the run's
iteration count; the wall time of each point is the run's own clock
(virtual seconds on sim), so TensorBoard's "relative" axis reads as the
run's time.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from typing import Any

from shoal.config.sections import RATE_EVENTS
from shoal.errors import ConfigError

INSTALL = "pip install 'shoal[tensorboard]' (tensorboardX)"


def check_available() -> None:
    """Refuse, before anything is written, a run that asks for scalars without the package."""
    if importlib.util.find_spec("tensorboardX") is None:
        raise ConfigError(f"run.tensorboard = true: tensorboardX is not installed; {INSTALL}")


class TensorBoardScalars:
    """A RunRecorder listener: counts iterations per group, writes scalars at every evaluation."""

    def __init__(self, folder: Path) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(folder))
        self._iterations: Counter[int] = Counter()
        self._last_t = 0.0
        self._lr: float | None = None  # from the start event, then each decay or stair

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "iteration":
            self._iterations[int(fields.get("group") or 0)] += 1
        elif kind == "eval":
            self._evaluation(fields)
        elif (kind == "start" or kind in RATE_EVENTS) and fields.get("lr") is not None:
            self._lr = float(fields["lr"])

    def _evaluation(self, fields: dict[str, Any]) -> None:
        step, t = int(fields.get("iterations") or 0), float(fields["t"])
        scalars = {"accuracy": fields.get("accuracy"), "loss": fields.get("loss"), "bytes": fields.get("bytes"),
                   "learning_rate": self._lr}
        if fields.get("metric"):
            scalars[str(fields["metric"])] = fields.get("value")
        elapsed = t - self._last_t
        if elapsed > 0:
            scalars.update({f"iterations_per_s/group{g}": n / elapsed for g, n in sorted(self._iterations.items())})
            self._iterations.clear()
            self._last_t = t
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, float(value), step, walltime=t)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
