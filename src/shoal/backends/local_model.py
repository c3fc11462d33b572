"""A worker's own copy of the model, for local steps between aggregations (SIM, local SGD, DiLoCo).

Backend-neutral (plain torch): the sim backend keeps one per worker, the ray
backend one inside each worker actor. The helpers at the end decide, from a
config, whether workers keep one and which schedule says when to aggregate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.compress.similarity import SimilaritySchedule
from shoal.config import LOCAL_SCHEMES, Config, OptimizerConfig
from shoal.engine.gradients import TensorSlot
from shoal.engine.replica import Replica
from shoal.sync.localsgd import PeriodicSchedule


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

    def pull(self, server_params: torch.Tensor, take: Sequence[bool]) -> int:
        """Take the server's value of the tensors marked in ``take``; return how many values came."""
        values = 0
        for sl, numel, fresh in zip(self.slices, self.numels, take):
            if fresh:
                self.params[sl] = server_params[sl]
                self.base[sl] = server_params[sl]
                values += numel
        return values

    def step(self, grad: torch.Tensor) -> None:
        """One local optimizer step with the worker's own (unweighted) gradient."""
        self.replica.apply([grad], 1.0)

    def change(self) -> torch.Tensor:
        """The local change of every tensor since its base."""
        return self.params - self.base

    def set_lr(self, lr: float) -> None:
        self.replica.set_lr(lr)


def uses_local_models(cfg: Config) -> bool:
    """Whether every worker keeps its own model copy: SIM, local SGD and DiLoCo."""
    return cfg.compression.similarity.enabled or cfg.sync.scheme in LOCAL_SCHEMES


def outer_step(cfg: Config) -> tuple[float, float] | None:
    """DiLoCo's outer optimizer (lr, Nesterov momentum) for the server replica; None for every other scheme."""
    return (cfg.sync.outer_lr, cfg.sync.outer_momentum) if cfg.sync.scheme == "diloco" else None


def aggregation_schedule(cfg: Config, layout: Sequence[TensorSlot]) -> SimilaritySchedule | PeriodicSchedule | None:
    """Which tensors are aggregated at which clock: SIM's measured schedule, local SGD's fixed one, or None."""
    if cfg.sync.scheme in LOCAL_SCHEMES:
        return PeriodicSchedule(len(layout), cfg.sync.local_steps)
    sim = cfg.compression.similarity
    if not sim.enabled:
        return None
    return SimilaritySchedule(
        [s.name for s in layout], [s.numel for s in layout], threshold=sim.threshold, max_period=sim.max_period,
        warmup_iterations=sim.warmup_iterations, min_numel=sim.min_numel, smoothing=sim.smoothing,
        rule=sim.rule, min_snr=sim.min_snr, base_period=sim.base_period,
    )
