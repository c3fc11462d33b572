"""Per-worker data: disjoint shards of the training set and an endless batch stream per worker.

Each worker reads only its own shard, as in real data-parallel training, and
everything is drawn from seeded generators keyed by (seed, worker, epoch), so
a run is reproducible whatever order the backend happens to call workers in.
"""

from __future__ import annotations

import math

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


def parse_partition(text: str) -> tuple[str, float]:
    """``iid`` -> ("iid", 0); ``dirichlet:ALPHA`` -> ("dirichlet", ALPHA); ``classes:K`` -> ("classes", K);
    ``by_source`` -> ("by_source", 0)."""
    kind, sep, raw = text.partition(":")
    if kind in ("iid", "by_source") and not sep:
        return kind, 0.0
    if kind in ("dirichlet", "classes") and sep:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if kind == "dirichlet" and math.isfinite(value) and value > 0:
            return kind, value
        if kind == "classes" and value.is_integer() and value >= 1:
            return kind, value
        need = "a finite number > 0" if kind == "dirichlet" else "a whole number >= 1"
        raise ValueError(f"{text!r}: {kind}: needs {need}")
    raise ValueError(f"unknown partition {text!r}; use iid, dirichlet:ALPHA, classes:K or by_source")


def partition_indices(labels: np.ndarray, workers: int, seed: int, partition: str = "iid",
                      sources: np.ndarray | None = None) -> list[np.ndarray]:
    """Disjoint per-worker shards of the training set under ``partition`` (see ``parse_partition``).

    ``dirichlet:ALPHA`` draws each class's split over workers from Dirichlet(ALPHA) (Hsu et al., 2019),
    redrawing (up to 100 times) until every worker holds at least min(10, n / workers) samples.
    ``classes:K`` gives worker w the classes (w*K + j) mod C for j < K and splits each class evenly over
    the workers that hold it. ``by_source`` deals whole sources (``sources[i]`` is sample i's) out to workers
    (``source_shards``). All are seeded; ``iid`` is ``shard_indices``.
    """
    kind, value = parse_partition(partition)
    if kind == "iid":
        return shard_indices(len(labels), workers, seed)
    if kind == "by_source":
        if sources is None:
            raise ValueError("by_source needs a data set that records each sample's source (stdlib); use iid")
        return source_shards(sources, workers, seed)
    rng = np.random.default_rng([seed % 2**64, _SHARD_PURPOSE, 1])
    classes = np.unique(labels)
    by_class = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    if kind == "classes":
        return _class_shards(by_class, workers, int(value), partition)
    return _dirichlet_shards(by_class, workers, value, rng, len(labels), partition)


def source_shards(sources: np.ndarray, workers: int, seed: int) -> list[np.ndarray]:
    """Each worker gets a disjoint set of whole sources: largest first to the worker holding the fewest samples
    (a seeded shuffle breaks ties between equal sizes), so shards are as even as whole sources allow."""
    sources = np.asarray(sources)
    names, counts = np.unique(sources, return_counts=True)
    if len(names) < workers:
        raise ValueError(f"by_source: the data has {len(names)} sources for {workers} workers")
    order = np.random.default_rng([seed % 2**64, _SHARD_PURPOSE, 2]).permutation(len(names))
    order = order[np.argsort(-counts[order], kind="stable")]
    held = np.zeros(workers, dtype=np.int64)
    owner = np.empty(len(names), dtype=np.int64)
    for i in order:
        w = int(np.argmin(held))
        owner[i] = w
        held[w] += counts[i]
    worker_of = owner[np.searchsorted(names, sources)]
    return [np.flatnonzero(worker_of == w).astype(np.int64) for w in range(workers)]


def _class_shards(by_class: dict, workers: int, k: int, partition: str) -> list[np.ndarray]:
    classes = sorted(by_class)
    if k > len(classes):
        raise ValueError(f"{partition!r}: the data has only {len(classes)} classes")
    holders: dict = {c: [] for c in classes}
    for w in range(workers):
        for j in range(k):
            holders[classes[(w * k + j) % len(classes)]].append(w)
    if any(not h for h in holders.values()):
        covered = sum(1 for h in holders.values() if h)
        raise ValueError(f"{partition!r} with {workers} workers covers only {covered} of {len(classes)} classes")
    parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
    for c, owners in holders.items():
        for w, piece in zip(owners, np.array_split(by_class[c], len(owners))):
            parts[w].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def _dirichlet_shards(by_class: dict, workers: int, alpha: float, rng: np.random.Generator, n: int,
                      partition: str) -> list[np.ndarray]:
    floor = min(10, n // workers)
    for _ in range(100):
        parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
        for idx in by_class.values():
            shares = rng.dirichlet(np.full(workers, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for w, piece in enumerate(np.split(idx, cuts)):
                parts[w].append(piece)
        shards = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(len(s) for s in shards) >= floor:
            return shards
    raise ValueError(f"{partition!r}: 100 draws each left a worker with fewer than {floor} samples; raise ALPHA")


def class_histograms(labels: np.ndarray, shards: list[np.ndarray], num_classes: int) -> list[list[int]]:
    """Samples of each class per worker (summary.json's per-worker class histogram)."""
    return [np.bincount(labels[s], minlength=num_classes).astype(int).tolist() for s in shards]


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

    def next(self, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) batch of ``size`` samples (default ``batch_size``; at most the shard); starts a new,
        reshuffled epoch once this one runs out (sync.balance gives each worker its own size)."""
        size = self.batch_size if size is None else min(size, len(self.shard))
        if self._pos + size > len(self._order):
            self.epoch += 1
            self._order = self._shuffle()
            self._pos = 0
        idx = self._order[self._pos : self._pos + size]
        self._pos += size
        if self._pos + self.batch_size > len(self._order):
            self.epoch += 1
            self._order = self._shuffle()
            self._pos = 0
        return self.dataset.x_train[idx], self.dataset.y_train[idx]

    def position(self) -> dict[str, int]:
        """Where the stream stands: local epochs done and the offset into this epoch's order."""
        return {"epoch": self.epoch, "offset": self._pos}

    def seek(self, epoch: int, offset: int) -> None:
        """Continue from ``position()``: the batches that follow are those the saved stream would have drawn."""
        if epoch < 0 or not 0 <= offset <= len(self.shard):
            raise ValueError(f"worker {self.worker}: no stream position epoch {epoch}, offset {offset}")
        self.epoch, self._pos = epoch, offset
        self._order = self._shuffle()

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()
