"""Gradients on demand: the simulator asks for a worker's gradient when it starts computing and takes it when
its compute time has passed; batched, everything asked for by then is computed in one call.

In virtual time a worker's gradient is needed only at the end of its compute
time, and every worker that started meanwhile has asked for its own. So the
first result taken computes all pending requests at once
(engine/batched.py); the others are then ready when their own ends come.
In the loop (``batched`` off) a request is computed when it is made, as
the simulator always did. What a gradient feeds (the encoder's error
feedback, a local optimizer step, the loss) happens when its worker takes
it, from values recorded at the request (backends/sim/backend.py), so
batching changes no order but that of the gradient kernels themselves.

A model that vmap cannot take falls back to the loop for the rest of the
run, once, with the reason in ``fallback`` (summary.json: ``batching``),
told to ``on_fallback`` when it happens (the run's log line).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shoal.engine.batched import BatchedGradients, Request, Result
from shoal.engine.gradients import GradientEngine


class LazyGradients:
    """Pending gradient requests per worker, computed together when the first is taken (or at once: loop)."""

    def __init__(self, engine: GradientEngine, batched: bool, limit: int = 64,
                 on_fallback: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.batcher = BatchedGradients(engine, limit) if batched else None
        self.fallback: str | None = None  # why a batched run went back to the loop
        self.on_fallback = on_fallback  # told the reason once, when it happens (the run's log line)
        self._pending: dict[int, Request] = {}
        self._ready: dict[int, Result] = {}

    def request(self, worker: int, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor,
                y: torch.Tensor, *, mutable: bool = False, seed: int | None = None) -> Callable[[], Result]:
        """Ask for ``worker``'s gradient at these values; the returned call gives it (gradient, buffer change,
        loss). ``mutable``: ``params`` may change before then (a local model's, unlike a replica snapshot), so a
        pending request keeps a copy. ``seed``: its random numbers' (engine/gradients.py: worker_seed)."""
        if self.batcher is None:
            result = self.engine.gradient(params, buffers, x, y, seed)
            return lambda: result
        self._ready.pop(worker, None)
        self._pending[worker] = Request(params.clone() if mutable else params, buffers, x, y, seed)
        return lambda: self._take(worker)

    def drop(self, worker: int) -> None:
        """``worker`` will not take its gradient (it left): forget the request."""
        self._pending.pop(worker, None)
        self._ready.pop(worker, None)

    def _take(self, worker: int) -> Result:
        if worker not in self._ready:
            self._compute_pending()
        return self._ready.pop(worker)

    def _compute_pending(self) -> None:
        workers, requests = list(self._pending), list(self._pending.values())
        self._pending.clear()
        if self.batcher is not None:
            try:
                self._ready.update(zip(workers, self.batcher.compute(requests)))
                return
            except Exception as err:  # noqa: BLE001 - vmap's refusals are of many types; the loop always works
                self.fallback = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                self.batcher = None
                if self.on_fallback is not None:
                    self.on_fallback(self.fallback)
        self._ready.update((w, self.engine.gradient(r.params, r.buffers, r.x, r.y, r.seed))
                           for w, r in zip(workers, requests))

    def summary(self) -> dict[str, object]:
        """How the run's gradients were computed, for summary.json."""
        out: dict[str, object] = {"device": str(self.engine.device), "batched": self.batcher is not None}
        if self.batcher is not None:
            out.update(calls=self.batcher.calls, largest_call=self.batcher.largest)
        if self.fallback is not None:
            out["fallback"] = self.fallback
        return out
