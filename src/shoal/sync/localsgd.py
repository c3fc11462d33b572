"""Local SGD and DiLoCo: workers step their own models; every H steps the models are averaged.

Both are baselines any heterogeneity or similarity scheme must beat: local
SGD (Stich, 2019; Lin et al., 2020, "post-local SGD") averages the workers'
models every ``H = sync.localsgd.local_steps`` (``sync.diloco.local_steps``) local steps, after an optional
warm-up of ``warmup_steps`` steps that average every step (post-local SGD); DiLoCo (Douillard et al.,
2023) treats the averaged change as a pseudo-gradient for an outer Nesterov
SGD step (``sync.diloco.outer_lr``, ``sync.diloco.outer_momentum``). They differ only in
the server's merge (``Replica.add_delta`` with or without an outer
optimizer), so one policy and one schedule serve both.

The data path is SIM's (``backends/local_model.py``): a worker steps every
tensor locally and, at a sync clock, sends its change since its last pull;
``PeriodicSchedule`` is the plan that says "everything at every H-th clock,
nothing in between". With ``H = 1`` every tensor is fresh and planned at
every clock, so workers send gradients and the server steps its optimizer:
exactly BSP.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from shoal.sync.base import SchemeSpec, SyncPolicy, register_scheme
from shoal.sync.periods import Periods
from shoal.sync.policies import BSP

if TYPE_CHECKING:
    import torch


class LocalSGD(BSP):
    """Gate only at sync points: a worker at clock c waits until everyone reached H * floor(c / H).

    Clocks count local steps. Between two syncs a fast worker runs its H
    steps without waiting; the pushes of the sync clock (the H-th step of a
    period) form one update once every worker has sent its own, as a BSP
    round does (the round bookkeeping is BSP's).
    """

    name = "localsgd"

    def __init__(self, workers: Iterable[int], local_steps: int, warmup_steps: int = 0, adaptive: bool = False) -> None:
        super().__init__(workers)
        self.periods = Periods(local_steps, warmup_steps, adaptive)
        self.local_steps = local_steps

    def start_threshold(self, worker: int) -> int | None:
        return self.periods.last_boundary(self.clocks[worker])

    def is_sync(self, clock: int) -> bool:
        """Whether the push that ends local step ``clock`` (0-based) carries a model change."""
        return self.periods.is_sync(clock)

    def observe(self, worker: int, loss: float | None) -> None:
        self.periods.observe(loss)

    def _merge(self, worker: int) -> tuple[int, ...]:
        clock = self.clocks[worker] - 1
        if not self.is_sync(clock):
            return ()
        batch = super()._merge(worker)
        if batch:  # the averaging is done: an adaptive rule decides the next period now
            self.periods.close(clock + 1)
        return batch


class AsynchronousOuter(SyncPolicy):
    """DiLoCo without the barrier (``sync.diloco.asynchronous``): nobody waits for a slower worker.

    A worker that finished its H inner steps sends its change and waits only
    for the outer step that takes it, which the backend runs at the end of
    the moment it arrived (``flush``): on every change that arrived at that
    moment, each discounted by its staleness, ``1 / (1 + s)`` with ``s`` the
    outer steps since the worker pulled its base (as HeLoCo and asynchronous
    local SGD discount late changes), and weighted 1/N as every update is.
    With equal speeds every change arrives at the same moment with s = 0, so
    each outer step is synchronous DiLoCo's exactly.
    """

    name = "diloco-async"
    flushes = True

    def __init__(self, workers: Iterable[int], local_steps: int, warmup_steps: int = 0) -> None:
        super().__init__(workers)
        self.periods = Periods(local_steps, warmup_steps)
        self.local_steps = local_steps
        self.updates = 0  # outer steps so far: the progress a worker with a buffered change waits on
        self.buffered: list[int] = []

    @property
    def progress(self) -> int:
        return self.updates

    def start_threshold(self, worker: int) -> int | None:
        return self.updates + 1 if worker in self.buffered else None

    def is_sync(self, clock: int) -> bool:
        return self.periods.is_sync(clock)

    def _merge(self, worker: int) -> tuple[int, ...]:
        if self.is_sync(self.clocks[worker] - 1):
            self.buffered.append(worker)
        return ()

    def flush(self) -> tuple[int, ...]:
        batch, self.buffered = tuple(self.buffered), []
        self.updates += bool(batch)
        return batch

    def discount(self, staleness: int) -> float:
        return 1.0 / (1.0 + max(0, staleness))

    def _release_after_remove(self) -> tuple[int, ...]:
        self.buffered = [w for w in self.buffered if w in self.clocks]
        return ()


class PeriodicSchedule:
    """The aggregation plan of local SGD / DiLoCo: every tensor at every H-th clock, none in between.

    It answers the same questions as SIM's ``SimilaritySchedule`` (so the
    backends drive both the same way) but measures nothing: ``periodic`` is
    True, and batch-norm buffers travel only with a sync.
    """

    periodic = True

    def __init__(self, num_tensors: int, local_steps: int, warmup_steps: int = 0) -> None:
        self.num_tensors = num_tensors
        self.local_steps = local_steps
        self.warmup_steps = warmup_steps
        self.periods = Periods(local_steps, warmup_steps)

    def follow(self, policy: SyncPolicy) -> None:
        """Take the averaging steps from the server's policy (adaptive periods are decided there, as rounds
        close), so the plan and the gate never disagree."""
        periods = getattr(policy, "periods", None)
        if isinstance(periods, Periods):
            self.periods = periods

    def plan(self, clock: int) -> tuple[bool, ...]:
        return (clock < 0 or self.periods.is_sync(clock),) * self.num_tensors

    def describe(self, numels: Sequence[int]) -> str:
        """The plan in one line (``shoal train --dry-run``), over the slots' sizes."""
        warmup = f" after {self.warmup_steps} steps that average every step" if self.warmup_steps else ""
        every = "every step" if self.local_steps == 1 else f"every {self.local_steps} local steps"
        if self.periods.adaptive:  # followed from the policy (AdaComm): the periods shrink as the loss falls
            every += (" at first, then every ceil(H x sqrt(L / L0)) as the training loss L falls below the first "
                      "period's L0 (AdaComm)")
        return f"every tensor ({sum(numels):,} values) averaged {every}{warmup}"

    def on_round(self, clock: int, changes: Sequence[torch.Tensor], slices: Sequence[slice]) -> None:
        """The averaging of ``clock`` closed with these workers' changes (a plan that adapts to them may look)."""

    def fresh(self, clock: int) -> tuple[bool, ...]:
        """The tensors a worker takes from the server before step ``clock``: those aggregated at the previous clock."""
        return self.plan(clock - 1)

    def record_saved(self, plan: Iterable[bool], nbytes_per_value: int = 4) -> None:
        """Nothing to account: skipping is the scheme itself, not a saving."""

    def finish_clocks(self, meters: dict, min_clock: int) -> list[int]:
        meters.clear()
        return []

    def reset(self) -> None:
        """Periods do not change at a learning-rate decay."""

    def restarted(self, keep_bytes: bool = True) -> "PeriodicSchedule":
        return PeriodicSchedule(self.num_tensors, self.local_steps, self.warmup_steps)

    def clone(self) -> "PeriodicSchedule":
        return self.restarted()

    def state(self) -> dict[str, list]:
        return {}


def _localsgd_policy(workers: Iterable[int], sync) -> SyncPolicy:  # noqa: ANN001 (the [sync] section)
    opts = sync.localsgd
    return LocalSGD(workers, opts.local_steps, opts.warmup_steps, opts.adaptive)


register_scheme(SchemeSpec("localsgd", policy=_localsgd_policy, warmup_steps=lambda sync: sync.localsgd.warmup_steps,
                           local_steps=lambda sync: sync.localsgd.local_steps, color="#9467bd",
                           balance=("batch", "steps"), grid=(("sync.localsgd.local_steps", (2, 8, 32)),)),
                "local SGD: workers step their own models and average them every sync.localsgd.local_steps")


def _diloco_policy(workers: Iterable[int], sync) -> SyncPolicy:  # noqa: ANN001 (the [sync] section)
    opts = sync.diloco
    if opts.asynchronous:
        return AsynchronousOuter(workers, opts.local_steps, opts.warmup_steps)
    return LocalSGD(workers, opts.local_steps, opts.warmup_steps, opts.adaptive)


register_scheme(SchemeSpec("diloco", policy=_diloco_policy,
                           warmup_steps=lambda sync: sync.diloco.warmup_steps,
                           local_steps=lambda sync: sync.diloco.local_steps,
                           outer=lambda sync: (sync.diloco.outer_lr, sync.diloco.outer_momentum), color="#8c564b",
                           balance=("batch", "steps"),
                           grid=(("sync.diloco.outer_lr", (0.4, 0.7, 1.0)),)),
                "DiLoCo: local steps, then an outer Nesterov step on the averaged change")
