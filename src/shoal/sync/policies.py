"""BSP, ASP and SSP as gating and merge rules."""

from __future__ import annotations

from collections.abc import Iterable

from shoal.sync.base import SyncPolicy


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
    """The policy object for a scheme name (localsgd and diloco share one: they differ in the server's merge)."""
    if scheme == "bsp":
        return BSP(workers)
    if scheme == "asp":
        return ASP(workers)
    if scheme == "ssp":
        return SSP(workers, staleness)
    if scheme in ("localsgd", "diloco"):
        from shoal.sync.localsgd import LocalSGD

        return LocalSGD(workers, local_steps)
    raise ValueError(f"unknown sync scheme {scheme!r}")
