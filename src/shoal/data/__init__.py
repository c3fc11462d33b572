"""Offline data sets, file-format loaders and per-worker sharding.

``load_dataset(spec, ...)`` gives a normalised, split ``Dataset``;
``shard_indices`` and ``BatchStream`` give each worker its own slice of it.
See ``shoal.data.sources`` for the accepted specs and file layouts.
"""

from shoal.data.sharding import BatchStream, shard_indices
from shoal.data.sources import Dataset, load_dataset

__all__ = ["BatchStream", "Dataset", "load_dataset", "shard_indices"]
