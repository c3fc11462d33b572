"""The training strategy, built once from the config: *what* trains, for any backend.

A ``Strategy`` answers every question whose answer depends on the scheme,
the compressor or SIM: which sync policy a server runs, whether workers keep
their own model copies, which tensors are aggregated at which clock, how a
worker compresses, at which density, and whether the server takes an outer
step. The ``sim`` and ``ray`` backends receive it and only drive it: they
own time, processes and transport, and never compare a scheme's name.

It is frozen and holds no training state, so every process of a run (the
ray workers included) builds the same one from the same config; the
stateful objects it makes (a GSSP coordinator, schedules, codecs) belong to
whoever asked for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shoal.compress.codec import (BROADCAST_SALT, DELTA_SALT, GradientCodec, exchange_codec, server_optimizer,
                                  worker_codec)
from shoal.compress.gdtopk import GDTopKSchedule
from shoal.compress.similarity import SimilaritySchedule
from shoal.config import Config, OptimizerConfig
from shoal.engine.gradients import TensorSlot
from shoal.registry import COMPRESSORS, SCHEMES
from shoal.sync.balance import WorkBalancer
from shoal.sync.base import SchemeSpec, SyncPolicy, build_policy
from shoal.sync.gssp import GSSP
from shoal.sync.localsgd import LocalSGD, PeriodicSchedule

AggregationSchedule = SimilaritySchedule | PeriodicSchedule  # (FragmentSchedule is a PeriodicSchedule)


@dataclass(frozen=True)
class Strategy:
    """The scheme, schedules and codecs of one run's config over one model layout.

    ``layout`` is the slots the synchronisation moves: the model's tensors, or, for a scheme that cuts them
    (``SchemeSpec.sync_layout``), pieces of them. Backends slice the flat parameters by it, never by the
    engine's layout.
    """

    cfg: Config
    layout: tuple[TensorSlot, ...]

    @classmethod
    def from_config(cls, cfg: Config, layout: Sequence[TensorSlot]) -> "Strategy":
        """The strategy of ``cfg`` over the model's ``layout`` (cut where the scheme cuts tensors)."""
        cut = SCHEMES[cfg.sync.scheme].sync_layout
        return cls(cfg, tuple(cut(cfg.sync, layout) if cut is not None else layout))

    @property
    def slices(self) -> list[slice]:
        """Where each slot of ``layout`` lives in the flat parameters."""
        return [slice(s.offset, s.offset + s.numel) for s in self.layout]

    # -- synchronisation -----------------------------------------------------------

    @property
    def scheme(self) -> SchemeSpec:
        """The registered scheme of ``sync.scheme``."""
        return SCHEMES[self.cfg.sync.scheme]

    @property
    def grouped(self) -> bool:
        """Whether workers form groups with a server each (GSSP): ask ``coordinator`` for the groups."""
        return self.scheme.coordinator is not None

    def coordinator(self, workers: int) -> GSSP | None:
        """A fresh grouping coordinator for ``workers`` workers (GSSP), or None for an ungrouped scheme."""
        return self.scheme.coordinator(workers, self.cfg.sync) if self.grouped else None

    def policy(self, workers: Iterable[int]) -> SyncPolicy:
        """The policy of the one server of an ungrouped scheme, over ``workers``.

        With ``sync.balance = "steps"`` a worker's iteration is a whole period of its own local steps, so the
        policy gates every iteration, as local SGD with H = 1 does.
        """
        if self.balance == "steps":
            return LocalSGD(workers, 1)
        return build_policy(self.cfg.sync.scheme, workers, self.cfg.sync)

    @property
    def balance(self) -> str:
        """``sync.balance``: "none", "batch" (batch sizes to speed), "steps" (local steps to speed) or "deadline"
        (a bounded-time round)."""
        return self.cfg.sync.balance

    def balancer(self, workers: int) -> WorkBalancer | None:
        """A fresh balancer of batch sizes or local steps (``sync.balance``), or None when the work is uniform."""
        if self.balance == "none":
            return None
        per_worker = self.scheme.local_steps(self.cfg.sync) if self.balance == "steps" else self.cfg.data.batch_size
        return WorkBalancer.from_config(workers, per_worker, self.cfg.balance, self.balance)

    def compute_factor(self, units: int) -> float:
        """A worker's compute time a round relative to one unbalanced batch, when it does ``units`` units of work."""
        if self.balance == "batch":
            return units / self.cfg.data.batch_size
        return float(units) if self.balance == "steps" else 1.0

    # -- models and the server's step ----------------------------------------------

    @property
    def local_models(self) -> bool:
        """Whether every worker keeps its own model copy for local steps: SIM, local SGD and DiLoCo."""
        return self.cfg.compression.similarity.enabled or self.scheme.local_models

    @property
    def outer_step(self) -> tuple[float, float] | None:
        """The server's outer optimizer (lr, Nesterov momentum) on the mean change (DiLoCo), else None."""
        outer = self.scheme.outer
        return None if outer is None else outer(self.cfg.sync)

    @property
    def overlap(self) -> tuple[int, float]:
        """``(steps, mixing)``: a sync's result is taken ``steps`` local steps after it was sent, mixed into the
        local value with weight ``mixing`` on the local side (Streaming DiLoCo); ``(0, 0.0)``: at once, replaced."""
        steps, mixing = (0, 0.0) if self.scheme.overlap is None else self.scheme.overlap(self.cfg.sync)
        return (steps, mixing) if steps > 0 else (0, 0.0)

    @property
    def server_optimizer(self) -> OptimizerConfig:
        """What a server steps with: without momentum where the workers already apply it (DGC)."""
        return server_optimizer(self.cfg.compression, self.cfg.optimizer)

    def aggregation_schedule(self) -> AggregationSchedule | None:
        """A fresh plan of which tensors are aggregated at which clock: local SGD's fixed one, SIM's measured one, or None."""
        if self.scheme.schedule is not None:
            return self.scheme.schedule(self.cfg.sync, self.layout)
        if self.scheme.local_steps is not None:  # balanced steps: every iteration (a period) syncs
            if self.balance == "steps":
                return PeriodicSchedule(len(self.layout), 1)
            warmup = self.scheme.warmup_steps(self.cfg.sync) if self.scheme.warmup_steps else 0
            return PeriodicSchedule(len(self.layout), self.scheme.local_steps(self.cfg.sync), warmup)
        sim = self.cfg.compression.similarity
        if not sim.enabled:
            return None
        return SimilaritySchedule(
            [s.name for s in self.layout], [s.numel for s in self.layout], threshold=sim.threshold,
            max_period=sim.max_period, warmup_iterations=sim.warmup_iterations, min_numel=sim.min_numel,
            smoothing=sim.smoothing, rule=sim.rule, min_snr=sim.min_snr, base_period=sim.base_period,
        )

    # -- compression ------------------------------------------------------------------

    def codec(self, worker: int) -> GradientCodec | None:
        """``worker``'s gradient codec (with DGC's momentum correction where it applies), or None without one."""
        return worker_codec(self.cfg.compression, self.cfg.run.seed, worker, self.layout, 0, self.cfg.optimizer)

    def delta_codec(self, worker: int) -> GradientCodec | None:
        """The second codec of a worker with a local model: for its local changes, seeded apart.

        A scheme whose outer gradients have their own quantiser (Streaming DiLoCo's ``outer_quantization``)
        uses it, with error feedback; otherwise the changes travel with ``compression.method``.
        """
        compression = self.cfg.compression
        if self.scheme.outer_codec is not None and (method := self.scheme.outer_codec(self.cfg.sync)) != "none":
            compression = compression.model_copy(update={"method": method, "error_feedback": True})
        return worker_codec(compression, self.cfg.run.seed, worker, self.layout, DELTA_SALT, None)

    def broadcast_codec(self, server: int = 0) -> GradientCodec | None:
        """The codec a server sends its model changes back with, or None (dense float32 values).

        With quantised outer gradients (Streaming DiLoCo's ``outer_quantization``) the way back is quantised
        too, as in the paper's quantised all-reduce: the server sends each synchronised fragment's change in
        the same format, with error feedback at the server, and keeps exactly what the workers receive.
        """
        if self.scheme.outer_codec is None or (method := self.scheme.outer_codec(self.cfg.sync)) == "none":
            return None
        compression = self.cfg.compression.model_copy(update={"method": method, "error_feedback": True})
        return worker_codec(compression, self.cfg.run.seed, 2_000_000 + server, self.layout, BROADCAST_SALT, None)

    def exchange_codec(self, group: int) -> GradientCodec | None:
        """The codec a GSSP group server compresses its own delta with."""
        return exchange_codec(self.cfg.compression, self.cfg.run.seed, group, self.layout)

    @property
    def compressed(self) -> bool:
        """Whether workers compress their uploads at all."""
        return self.cfg.compression.method != "none"

    @property
    def scheduled_density(self) -> bool:
        """Whether the compressor's density follows the per-group schedule (GDTopK)."""
        return self.compressed and COMPRESSORS[self.cfg.compression.method].scheduled

    def density(self, epoch: float, worker: int, coordinator: GSSP | None = None) -> float:
        """``worker``'s upload density after ``epoch`` global epochs: fixed, or its group's scheduled one."""
        if not self.scheduled_density:
            return self.cfg.compression.density
        if coordinator is None or not coordinator.grouped:
            return self._schedule.group_density(epoch, [], [])
        return self.group_density(epoch, coordinator.server_of[worker], coordinator)

    def group_density(self, epoch: float, group: int, coordinator: GSSP | None) -> float:
        """GDTopK: group ``group``'s scheduled density (its endpoints: the fastest and the slowest group)."""
        if not self.scheduled_density or coordinator is None:
            return self.cfg.compression.density
        groups = coordinator.groups
        return self._schedule.group_density(epoch, coordinator.profiler.times(), groups[group], groups)

    @property
    def _schedule(self) -> GDTopKSchedule:
        return GDTopKSchedule.from_config(self.cfg.compression.gdtopk)
