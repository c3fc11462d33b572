"""What is trained and how it is judged: the loss, and the metric that evaluations report.

Built-ins: cross-entropy (class logits (N, C) with labels (N,), or sequence
logits (N, T, C) with labels (N, T)), mean squared error; metrics accuracy
(argmax over the last dimension), loss, perplexity (exp of the mean
cross-entropy per target) and bits_per_byte (the mean cross-entropy in bits,
for byte-level language models). Any of them may be a user's function
(``python:FILE.py:FUNCTION``, see shoal.plugins).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.nn import functional as F

from shoal.config import TaskConfig
from shoal.errors import ConfigError
from shoal.plugins import is_plugin, load_function, user_frame

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Evaluation(NamedTuple):
    """One evaluation: the configured metric's value, the mean loss, and accuracy where it applies."""

    value: float
    loss: float
    accuracy: float | None


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; sequence logits (N, T, C) are flattened to (N T, C)."""
    if output.dim() > 2:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target.to(output.dtype).reshape(output.shape))


def cross_entropy_per_sample(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each sample's cross-entropy (N,), the mean over its positions for sequence logits: every sample has as many
    targets, so the mean of these is ``cross_entropy``. The batched simulator weights them to pad a batch."""
    losses = F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction="none")
    return losses.reshape(output.shape[0], -1).mean(dim=1)


def mse_per_sample(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each sample's mean squared error (N,); their mean is ``mse``."""
    errors = F.mse_loss(output, target.to(output.dtype).reshape(output.shape), reduction="none")
    return errors.reshape(output.shape[0], -1).mean(dim=1)


@dataclass
class Task:
    """The loss and the metric of a run (with its direction)."""

    loss: Loss
    metric: str = "accuracy"
    metric_fn: Callable[[torch.Tensor, torch.Tensor], float] | None = None
    higher_is_better: bool = True
    #: each sample's loss, whose mean is ``loss`` (built-in losses; None for a user's, which returns only the mean)
    per_sample: Loss | None = None

    @classmethod
    def from_config(cls, task: TaskConfig) -> "Task":
        per_sample = None
        if is_plugin(task.loss):
            loss = _checked_loss(load_function(task.loss, "task.loss"), task.loss)
        elif task.loss == "cross_entropy":
            loss, per_sample = cross_entropy, cross_entropy_per_sample
        else:
            loss, per_sample = mse, mse_per_sample
        metric_fn = load_function(task.metric, "task.metric") if is_plugin(task.metric) else None
        if task.metric in ("perplexity", "bits_per_byte") and task.loss != "cross_entropy":
            raise ConfigError(f"task.metric: {task.metric} is computed from the cross-entropy; it needs "
                              "task.loss = \"cross_entropy\"")
        return cls(loss, task.metric, metric_fn, task.higher, per_sample)

    def judge(self, outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> Evaluation:
        """The metric, mean loss and accuracy over batches of outputs (weighted by their number of targets)."""
        counts = [t.numel() for t in targets]
        total = sum(counts)
        loss = sum(float(self.loss(o, t)) * n for o, t, n in zip(outputs, targets, counts)) / total
        accuracy = None
        if all(_class_logits(o, t) for o, t in zip(outputs, targets)):
            accuracy = sum(int((o.argmax(-1) == t).sum()) for o, t in zip(outputs, targets)) / total
        if self.metric_fn is not None:
            value = self._plugin_metric(torch.cat(outputs), torch.cat(targets))
        elif self.metric == "accuracy":
            if accuracy is None:
                raise ConfigError("task.metric: accuracy needs class logits; use loss, or task.loss = \"cross_entropy\"")
            value = accuracy
        elif self.metric == "perplexity":
            value = math.exp(min(loss, 700.0))
        elif self.metric == "bits_per_byte":  # mean cross-entropy in bits per predicted symbol (a byte, for text)
            value = loss / math.log(2)
        else:
            value = loss
        return Evaluation(value, loss, accuracy)

    def _plugin_metric(self, output: torch.Tensor, target: torch.Tensor) -> float:
        try:
            value = float(self.metric_fn(output, target))  # type: ignore[misc]
        except Exception as err:  # noqa: BLE001 - the user's code
            where = user_frame(err)
            raise ConfigError(f"task.metric raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                              f"{f' ({where})' if where else ''}") from None
        return value


def _class_logits(output: torch.Tensor, target: torch.Tensor) -> bool:
    """Integer targets with one more output dimension (the classes): accuracy is defined."""
    return not target.is_floating_point() and output.dim() == target.dim() + 1


def _checked_loss(fn: Callable[..., torch.Tensor], spec: str) -> Loss:
    """A user's loss, with one clear error when it does not return a scalar tensor."""
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = fn(output, target)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ConfigError(f"task.loss {spec!r}: must return a scalar tensor, got {type(value).__name__}")
        return value.reshape(())

    return loss


DEFAULT_TASK = Task(cross_entropy, per_sample=cross_entropy_per_sample)
