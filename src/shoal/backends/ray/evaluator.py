"""The evaluation actor: tests model states off the driver loop, so a long evaluation never stalls it.

The driver sends the group servers' (or rank 0's) state references; the
actor averages the replicas (GSSP evaluates the mean of its groups) and
returns the task's ``Evaluation``. One evaluation is in flight at a time;
the driver records it at the time the states were taken. The final
evaluation runs on the driver, whose engine keeps the evaluated state as
the run's model (``model.safetensors``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from shoal.backends.ray.wire import actor_threads, quiet_readonly_numpy
from shoal.config import Config
from shoal.engine.setup import build_engine
from shoal.engine.task import Evaluation


def mean_state(states: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The replica, or the mean of several (flat parameters, flat buffers)."""
    params = [torch.from_numpy(np.array(p)) for p, _ in states]
    buffers = [torch.from_numpy(np.array(b)) for _, b in states]
    if len(states) == 1:
        return params[0], buffers[0]
    return torch.stack(params).mean(0), torch.stack(buffers).mean(0)


class Evaluator:
    """Holds the model and the test set; evaluates the states it is sent."""

    def __init__(self, cfg: Config, x_test: np.ndarray, y_test: np.ndarray, num_classes: int,
                 input_shape: tuple[int, ...]) -> None:
        quiet_readonly_numpy()
        torch.set_num_threads(actor_threads(cfg.backend.cpus_per_server))
        self.engine = build_engine(cfg, input_shape, num_classes)
        self.x, self.y = torch.from_numpy(np.array(x_test)), torch.from_numpy(np.array(y_test))

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": "cpu"}

    def reinit(self, *args: Any) -> None:
        """Serve a new run from this process (ActorPool)."""
        self.__init__(*args)  # type: ignore[misc]

    def evaluate(self, *states: tuple[np.ndarray, np.ndarray]) -> Evaluation:
        params, buffers = mean_state(list(states))
        return self.engine.evaluate(params, buffers, self.x, self.y)
