"""Per-worker data: disjoint shards of the training set and an endless batch stream per worker.

Each worker reads only its own shard, as in real data-parallel training, and
everything is drawn from seeded generators keyed by (seed, worker, epoch), so
a run is reproducible whatever order the backend happens to call workers in.
"""

from __future__ import annotations

import numpy as np
import torch

from shoal.data.sources import Dataset

_SHARD_PURPOSE = 3
_STREAM_PURPOSE = 4


def shard_indices(n_train: int, workers: int, seed: int) -> list[np.ndarray]:
    """Split a seeded permutation of range(n_train) into ``workers`` disjoint shards.

    Sizes differ by at most one. With more workers than samples some shards
    are empty (cost-only simulations never read data); BatchStream refuses those.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if n_train < 0:
        raise ValueError(f"n_train must be non-negative, got {n_train}")
    perm = np.random.default_rng([seed % 2**64, _SHARD_PURPOSE]).permutation(n_train)
    return [shard.astype(np.int64) for shard in np.array_split(perm, workers)]


class BatchStream:
    """Endless batches for one worker from its own shard, reshuffled every local epoch (seeded by seed, worker, epoch).

    When the shard holds at least ``batch_size`` samples the last partial
    batch of an epoch is dropped, so every batch has the same size (steady
    per-iteration cost, and batch norm never sees a tiny batch). A shard
    smaller than one batch yields the whole shard, reshuffled, each time.
    """

    def __init__(self, dataset: Dataset, shard: np.ndarray, batch_size: int, seed: int, worker: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if len(shard) == 0:
            raise ValueError(f"worker {worker} has an empty shard (more workers than training samples)")
        self.dataset = dataset
        self.shard = np.asarray(shard, dtype=np.int64)
        self.batch_size = min(batch_size, len(self.shard))
        self.seed = seed
        self.worker = worker
        self.epoch = 0  # local epochs completed
        self._order = self._shuffle()
        self._pos = 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.shard) // self.batch_size

    def _shuffle(self) -> torch.Tensor:
        rng = np.random.default_rng([self.seed % 2**64, _STREAM_PURPOSE, self.worker, self.epoch])
        return torch.from_numpy(rng.permutation(self.shard))

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) batch; starts a new, reshuffled epoch once this one runs out."""
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        if self._pos + self.batch_size > len(self._order):
            self.epoch += 1
            self._order = self._shuffle()
            self._pos = 0
        return self.dataset.x_train[idx], self.dataset.y_train[idx]

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()
