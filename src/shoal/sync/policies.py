"""BSP, ASP and SSP as gating and merge rules."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from shoal.config import DiLoCoOptions, LocalSGDOptions, SSPOptions, SyncConfig
from shoal.registry import SCHEMES
from shoal.sync.base import SchemeSpec, SyncPolicy, build_policy, register_scheme


class ASP(SyncPolicy):
    """Asynchronous: never wait, apply every gradient as it arrives."""

    name = "asp"

    def start_threshold(self, worker: int) -> int | None:
        return None

    def _merge(self, worker: int) -> tuple[int, ...]:
        return (worker,)


class SSP(SyncPolicy):
    """Stale-synchronous: a worker at clock c starts only while c <= slowest clock + s.

    Gradients are applied as they arrive, so a fast worker runs at most
    ``staleness`` iterations ahead of the slowest one.
    """

    name = "ssp"

    def __init__(self, workers: Iterable[int], staleness: int) -> None:
        if staleness < 0:
            raise ValueError("staleness must be >= 0")
        super().__init__(workers)
        self.staleness = staleness

    def start_threshold(self, worker: int) -> int | None:
        return self.clocks[worker] - self.staleness

    def _merge(self, worker: int) -> tuple[int, ...]:
        return (worker,)


class PacedSSP(SSP):
    """SSP whose clocks run at each worker's expected pace, so steady speed differences make nobody wait.

    A worker's ``pace`` is its expected iteration time over its group's
    slowest member's (1 for the slowest); each push advances its progress by
    its pace, and a worker starts only while its progress is at most
    ``staleness`` ahead of the slowest counted progress. Workers running at
    their expected speeds therefore never wait for each other (plain SSP
    throttles a group to n / slowest iterations per second); one slower than
    expected holds the rest back after ``staleness`` of the slowest member's
    iterations, as in SSP. With every pace 1 it is SSP exactly.
    """

    name = "paced-ssp"

    def __init__(self, workers: Iterable[int], staleness: int) -> None:
        super().__init__(workers, staleness)
        self.paces: dict[int, float] = {w: 1.0 for w in self.clocks}
        self.progressed: dict[int, float] = {w: 0.0 for w in self.clocks}
        self._heap: list[tuple[float, int]] = [(0.0, w) for w in sorted(self.clocks)]

    def set_paces(self, paces: Mapping[int, float]) -> None:
        """New expected paces (in (0, 1]) for the workers named; progress made so far is kept."""
        for worker, pace in paces.items():
            if worker in self.paces:
                if not 0.0 < pace <= 1.0:
                    raise ValueError(f"a pace is in (0, 1], not {pace}")
                self.paces[worker] = pace

    @property
    def progress(self) -> float:
        """The slowest counted worker's progress (stale heap entries are dropped lazily)."""
        heap = self._heap  # an excused worker's entries are dropped too; readmit pushes a fresh one
        while heap:
            value, worker = heap[0]
            if self.progressed.get(worker) == value and worker not in self.excused:
                return value
            heapq.heappop(heap)
        counted = [p for w, p in self.progressed.items() if w not in self.excused]
        return min(counted, default=0.0)

    def start_threshold(self, worker: int) -> float | None:
        return self.progressed[worker] - self.staleness

    def _count(self, worker: int, value: float) -> None:
        self.progressed[worker] = value
        if worker not in self.excused:
            heapq.heappush(self._heap, (value, worker))

    def _tick(self, worker: int) -> None:
        super()._tick(worker)
        self._count(worker, self.progressed[worker] + self.paces[worker])

    def readmit(self, worker: int) -> bool:
        slowest = self.progress
        if not super().readmit(worker):
            return False
        self._count(worker, max(self.progressed[worker], slowest))  # skipped, not waited for, as in SSP
        return True

    def add(self, worker: int, clock: int | None = None) -> None:
        slowest = self.progress if self.progressed else 0.0
        super().add(worker, clock)
        self.paces[worker] = 1.0
        self._count(worker, slowest)

    def remove(self, worker: int) -> tuple[int, ...]:
        released = super().remove(worker)
        self.paces.pop(worker, None)
        self.progressed.pop(worker, None)
        return released


class BSP(SyncPolicy):
    """Bulk-synchronous: every worker pushes once per round, then one averaged update."""

    name = "bsp"

    def __init__(self, workers: Iterable[int]) -> None:
        super().__init__(workers)
        self._pending: set[int] = set()

    def start_threshold(self, worker: int) -> int | None:
        return self.clocks[worker]

    def _merge(self, worker: int) -> tuple[int, ...]:
        self._pending.add(worker)
        return self._release_if_complete()

    def _release_after_remove(self) -> tuple[int, ...]:
        self._pending &= set(self.clocks)
        return self._release_if_complete()

    def _release_if_complete(self) -> tuple[int, ...]:
        if not self._pending or len(self._pending) < len(self.clocks):
            return ()
        batch = tuple(sorted(self._pending))
        self._pending.clear()
        return batch


def make_policy(scheme: str, workers: Iterable[int], staleness: int = 3, local_steps: int = 1) -> SyncPolicy:
    """The policy of a registered scheme from plain arguments (tests and tools; backends get theirs from the Strategy)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown sync scheme {scheme!r}")
    sync = SyncConfig(scheme=scheme, ssp=SSPOptions(staleness=staleness), localsgd=LocalSGDOptions(local_steps=local_steps),
                      diloco=DiLoCoOptions(local_steps=local_steps))
    return build_policy(scheme, workers, sync)


register_scheme(SchemeSpec("bsp", policy=lambda workers, sync: BSP(workers), allreduce=True, ina=True, color="#1f77b4",
                           balance=("batch", "deadline")),
                "bulk-synchronous: every round waits for every worker, then applies the mean gradient")
register_scheme(SchemeSpec("asp", policy=lambda workers, sync: ASP(workers), color="#ff7f0e"),
                "asynchronous: nobody waits, every gradient is applied as it arrives")
register_scheme(SchemeSpec("ssp", policy=lambda workers, sync: SSP(workers, sync.ssp.staleness), color="#2ca02c",
                           grid=(("sync.ssp.staleness", (1, 3, 8)),)),
                "stale-synchronous: at most sync.ssp.staleness iterations ahead of the slowest worker")
