"""A worker's own copy of the model, for local steps between aggregations (SIM, local SGD, DiLoCo).

Backend-neutral (plain torch): the sim backend keeps one per worker, the ray
backend one inside each worker actor. Whether workers keep one, and which
schedule says when to aggregate, is the Strategy's to say (shoal/strategy.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.compress.codec import GradientCodec
from shoal.config import OptimizerConfig
from shoal.engine.gradients import TensorSlot
from shoal.engine.replica import Replica


class LocalModel:
    """Local parameters + optimizer, and each tensor's value at its last pull (the base).

    Every iteration the worker steps all tensors with its own gradient, so its
    optimizer state (momentum) stays warm; tensors that the server aggregates
    are overwritten by the server's value at the next pull, tensors being
    skipped keep the local step. What it sends at an aggregation is its
    change since the base.
    """

    def __init__(self, params: torch.Tensor, buffers: torch.Tensor, opt: OptimizerConfig,
                 layout: Sequence[TensorSlot]) -> None:
        self.replica = Replica(params, buffers, opt)
        self.base = params.detach().clone()
        self.slices = [slice(s.offset, s.offset + s.numel) for s in layout]
        self.numels = [s.numel for s in layout]

    @property
    def params(self) -> torch.Tensor:
        return self.replica.params.detach()

    def pull(self, server_params: torch.Tensor, take: Sequence[bool], mixing: float = 0.0) -> int:
        """Take the server's value of the tensors marked in ``take``; return how many values came.

        ``mixing`` (Streaming DiLoCo's overlap): the local value becomes
        ``mixing * local + (1 - mixing) * server``, keeping part of the local
        steps taken while the server's value was on its way; the base (what
        the next change is measured from) is the server's value either way.
        """
        values = 0
        for sl, numel, fresh in zip(self.slices, self.numels, take):
            if fresh:
                if mixing:
                    self.params[sl] = torch.lerp(server_params[sl], self.params[sl], mixing)
                else:
                    self.params[sl] = server_params[sl]
                self.base[sl] = server_params[sl]
                values += numel
        return values

    def step(self, grad: torch.Tensor, lr: float | None = None) -> None:
        """One local optimizer step with the worker's own (unweighted) gradient; at ``lr`` when given (the rate
        when the gradient's computation started, which a decay may have changed since), else the current."""
        now = self.replica.lr
        if lr is None or lr == now:
            self.replica.apply([grad], 1.0)
            return
        self.replica.set_lr(lr)
        self.replica.apply([grad], 1.0)
        self.replica.set_lr(now)

    def change(self) -> torch.Tensor:
        """The local change of every tensor since its base."""
        return self.params - self.base

    def set_lr(self, lr: float) -> None:
        self.replica.set_lr(lr)


def pull_bytes(values: int, buffer_values: int, fresh: Sequence[bool], broadcast: GradientCodec | None,
               changed: bool) -> int:
    """What a pull of the ``fresh`` tensors (``values`` values) and ``buffer_values`` buffer values moves: float32,
    or, where the server broadcasts quantised changes and these tensors moved by a sync since the worker's last
    pull (``changed``), the codec's bytes for them (Streaming DiLoCo's ``outer_quantization``)."""
    if broadcast is not None and changed and any(fresh):
        return broadcast.nominal_bytes(1.0, fresh) + 4 * buffer_values
    return 4 * (values + buffer_values)
