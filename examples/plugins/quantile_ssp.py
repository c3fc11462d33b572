"""A user's own synchronisation scheme for shoal: SSP bounded by a quantile of the clocks, not the slowest.

    shoal train --config examples/mnist_tiers.toml \
        --set sync.scheme=python:examples/plugins/quantile_ssp.py:QuantileSSP \
        --set 'sync.options={staleness = 3, quantile = 0.5}'

SSP lets a worker run at most s iterations ahead of the *slowest* worker, so
one straggler throttles everyone. Here the bound is taken against the
q-quantile of the workers' clocks (q = 0.5: the median worker): the
slowest workers hold back nobody, the pack stays within s iterations of its
q-quantile, and a gradient is at most about s x N updates stale in the
worst case. q = 0 is SSP exactly.

A scheme is a ``shoal.sync.SyncPolicy`` subclass built as
``QuantileSSP(workers, **sync.options)``. It is a pure state machine: the
backends (the simulator and ray) ask ``start_threshold(worker)`` before each
iteration and start the worker once ``progress`` reaches it (None: at
once); after each gradient arrives they call ``_merge(worker)``, which
returns the workers whose buffered gradients form one update now (empty:
keep buffering; a worker has at most one buffered gradient, so a policy that
buffers must gate a worker until its gradient is released, as BSP does).
Every gradient is applied with weight 1/N, as in every scheme.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from shoal.sync import SyncPolicy


class QuantileSSP(SyncPolicy):
    """Start a worker at clock c only while c <= (q-quantile of the counted clocks) + staleness."""

    name = "quantile-ssp"
    color = "#17becf"  # its colour in reports (optional)

    def __init__(self, workers: Iterable[int], staleness: int = 3, quantile: float = 0.5) -> None:
        super().__init__(workers)
        if staleness < 0 or not 0.0 <= quantile <= 1.0:
            raise ValueError(f"need staleness >= 0 and 0 <= quantile <= 1, not {staleness} and {quantile}")
        self.staleness, self.quantile = staleness, quantile

    @property
    def progress(self) -> float:
        """The q-quantile of the clocks of the workers that count (transient stragglers excused by GSSP do not)."""
        clocks = sorted(c for w, c in self.clocks.items() if w not in self.excused)
        return clocks[min(len(clocks) - 1, math.floor(self.quantile * len(clocks)))] if clocks else 0

    def start_threshold(self, worker: int) -> int:
        return self.clocks[worker] - self.staleness

    def _merge(self, worker: int) -> tuple[int, ...]:
        return (worker,)  # every gradient is applied as it arrives
