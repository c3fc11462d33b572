"""K-batch synchronous SGD: every update is the first k gradients to arrive, from k different workers.

Between asynchronous (ASP) and bulk-synchronous (BSP) training: the server
buffers gradients until k workers have each sent one, then applies them as
one update (each with weight 1/N, as in every scheme). A worker whose
gradient is buffered waits for that update, then pulls the new parameters;
a worker that was not part of it never waits. So k = N is BSP exactly
(everyone waits for the slowest), k = 1 is ASP exactly, and in between the
slowest N - k workers hold nobody back: their gradients join the next
update, one update stale (Dutta et al., "Slow and stale gradients can win
the race", AISTATS 2018, call this K-batch sync SGD).
"""

from __future__ import annotations

from collections.abc import Iterable

from shoal.sync.base import SchemeSpec, SyncPolicy, register_scheme


class KBatch(SyncPolicy):
    """Apply the buffered gradients once k distinct workers have one buffered; those k wait for it."""

    name = "kbatch"

    def __init__(self, workers: Iterable[int], k: int | None = None) -> None:
        super().__init__(workers)
        if k is not None and k < 1:
            raise ValueError(f"k must be at least 1, not {k}")
        self.k = k if k is not None else (len(self.clocks) + 1) // 2
        self.updates = 0  # updates applied so far: the progress a buffered worker waits on
        self._buffered: list[int] = []

    @property
    def progress(self) -> int:
        return self.updates

    def start_threshold(self, worker: int) -> int | None:
        """A worker with a buffered gradient starts once the next update is out; the others at once."""
        return self.updates + 1 if worker in self._buffered else None

    def _merge(self, worker: int) -> tuple[int, ...]:
        self._buffered.append(worker)
        return self._release()

    def _release_after_remove(self) -> tuple[int, ...]:
        self._buffered = [w for w in self._buffered if w in self.clocks]
        return self._release()  # with fewer workers, k may already be met

    def _release(self) -> tuple[int, ...]:
        if not self._buffered or len(self._buffered) < min(self.k, len(self.clocks)):
            return ()
        batch, self._buffered = tuple(self._buffered), []
        self.updates += 1
        return batch


register_scheme(SchemeSpec("kbatch", policy=lambda workers, sync: KBatch(workers, sync.kbatch.k), color="#17becf"),
                "K-batch sync: each update is the first sync.kbatch.k gradients to arrive (k = workers: BSP; 1: ASP)")
