"""Worker speed profiles and transient stragglers.

A speed is a slowdown factor: 1.0 is the fastest worker, 4.0 takes four times
as long per batch. Profiles are drawn once from the run seed so a config
always describes the same cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.config import ClusterConfig, StragglerConfig


@dataclass(frozen=True)
class ClusterProfile:
    """Static description of the workers: per-worker speed and link, server bandwidth."""

    speeds: tuple[float, ...]
    compute_s: float
    link_bps: float
    server_bps: float
    latency_s: float

    @property
    def workers(self) -> int:
        return len(self.speeds)

    def compute_time(self, worker: int, straggle: float = 1.0) -> float:
        """Seconds one batch takes on ``worker`` (fastest worker: ``compute_s``)."""
        return self.compute_s * self.speeds[worker] * straggle


def profile_speeds(cfg: ClusterConfig, seed: int) -> tuple[float, ...]:
    """Per-worker slowdown factors: explicit, uniform, tiered or lognormal."""
    n = cfg.workers
    if cfg.speeds is not None:
        return tuple(float(s) for s in cfg.speeds)
    if cfg.profile == "uniform":
        return (1.0,) * n
    if cfg.profile == "tiers":
        # Workers split into len(tiers) contiguous blocks as evenly as possible.
        blocks = np.array_split(np.arange(n), len(cfg.tiers))
        speeds = np.empty(n)
        for tier, block in zip(cfg.tiers, blocks):
            speeds[block] = tier
        return tuple(float(s) for s in speeds / speeds.min())
    rng = np.random.default_rng([seed, 0x5EED])
    draws = rng.lognormal(0.0, cfg.lognormal_sigma, size=n)
    return tuple(float(s) for s in np.sort(draws / draws.min()))


def build_profile(cfg: ClusterConfig, seed: int, compute_s: float | None = None) -> ClusterProfile:
    """The cluster profile of a config; ``compute_s`` replaces a 0 (measured) value."""
    return ClusterProfile(
        speeds=profile_speeds(cfg, seed),
        compute_s=cfg.compute_s if compute_s is None else compute_s,
        link_bps=cfg.link_gbps * 1e9,
        server_bps=cfg.server_gbps * 1e9,
        latency_s=cfg.latency_ms / 1e3,
    )


class StragglerModel:
    """Transient slowdowns: each iteration a worker may start a slow spell.

    A spell multiplies compute time by ``slowdown`` for ``duration`` of that
    worker's iterations. Each worker has its own seeded stream, so the draws do
    not depend on the interleaving of workers.
    """

    def __init__(self, cfg: StragglerConfig, workers: int, seed: int) -> None:
        self._cfg = cfg
        self._rngs = [np.random.default_rng([seed, 0x57A6, w]) for w in range(workers)]
        self._left = [0] * workers

    def factor(self, worker: int) -> float:
        """Compute-time factor of ``worker``'s next iteration (draws once per call)."""
        if self._cfg.probability <= 0:
            return 1.0
        if self._left[worker] == 0 and self._rngs[worker].random() < self._cfg.probability:
            self._left[worker] = self._cfg.duration
        if self._left[worker] > 0:
            self._left[worker] -= 1
            return self._cfg.slowdown
        return 1.0

    def add_worker(self, seed: int) -> int:
        """A stream for one more worker (a joiner, the next id); returns its id."""
        worker = len(self._rngs)
        self._rngs.append(np.random.default_rng([seed, 0x57A6, worker]))
        self._left.append(0)
        return worker

    def state(self, worker: int) -> dict[str, Any]:
        """``worker``'s generator and the rest of its spell (JSON-able), for checkpoints."""
        return {"rng": self._rngs[worker].bit_generator.state, "left": self._left[worker]}

    def restore(self, worker: int, state: dict[str, Any]) -> None:
        self._rngs[worker].bit_generator.state = state["rng"]
        self._left[worker] = int(state["left"])
