"""How a ray worker gets its shard: loaded by the worker itself (default), or shipped from the driver.

``backend.data_loading = "workers"``: the driver sends each worker only its
shard's indices and a digest of the shard; the worker loads the data set
itself (built-in sets from their packages, files from its own disk, plug-ins
from their shipped folders) and takes those rows, so no training data
crosses the network from the driver. The digest proves the worker's copy is
the driver's: a node with another version of the files fails the run with
one line instead of training on different data. ``"driver"``: the driver
``ray.put``s every shard (for data that exists only where the driver runs).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import torch

from shoal.config import Config
from shoal.errors import ConfigError
from shoal.data import Dataset, load_dataset


@dataclass(frozen=True)
class ShardRef:
    """A worker's shard by reference: its rows of the training set, and what they must hash to."""

    indices: np.ndarray
    digest: str


def shard_digest(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> str:
    """A digest of a shard's samples and labels (shape, dtype and bytes)."""
    h = hashlib.sha1()
    for part in (x, y):
        a = np.ascontiguousarray(part.numpy() if isinstance(part, torch.Tensor) else part)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def shard_ref(dataset: Dataset, indices: np.ndarray) -> ShardRef:
    idx = torch.as_tensor(indices)
    return ShardRef(np.asarray(indices, dtype=np.int64), shard_digest(dataset.x_train[idx], dataset.y_train[idx]))


_loaded: dict[str, Dataset] = {}  # per process: a kept actor serving another run of the same data loads nothing


def _training_set(cfg: Config) -> Dataset:
    """The data set loaded exactly as the driver loads it (``engine.setup.build_setup``)."""
    d = cfg.data
    key = json.dumps([d.name, cfg.run.seed, d.test_fraction, d.synthetic_samples, d.options], sort_keys=True,
                     default=str)
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = load_dataset(d.name, seed=cfg.run.seed, test_fraction=d.test_fraction,
                                    synthetic_samples=d.synthetic_samples, options=d.options)
    return _loaded[key]


def load_shard(cfg: Config, worker: int, ref: ShardRef) -> tuple[torch.Tensor, torch.Tensor]:
    """Load the data set in this process and take ``ref``'s rows; ConfigError when they are not the driver's."""
    d = cfg.data
    dataset = _training_set(cfg)
    idx = torch.as_tensor(ref.indices)
    if len(ref.indices) and int(ref.indices.max()) >= len(dataset.y_train):
        raise ConfigError(f"data.name {d.name!r}: worker {worker} loaded {len(dataset.y_train)} training samples, "
                          f"fewer than the driver; make the same data available on every node, or set "
                          f"backend.data_loading = \"driver\"")
    x, y = dataset.x_train[idx], dataset.y_train[idx]
    if shard_digest(x, y) != ref.digest:
        raise ConfigError(f"data.name {d.name!r}: worker {worker} loaded other data than the driver (its shard's "
                          f"digest differs); make the same data available on every node, or set "
                          f"backend.data_loading = \"driver\"")
    return x, y
