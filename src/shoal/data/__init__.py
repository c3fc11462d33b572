"""Offline data sets, file-format loaders and per-worker sharding.

``load_dataset(spec, ...)`` gives a normalised, split ``Dataset``;
``shard_indices`` and ``BatchStream`` give each worker its own slice of it.
See ``shoal.data.sources`` for the accepted specs and file layouts.
"""

from shoal.data.sharding import BatchStream, class_histograms, parse_partition, partition_indices, shard_indices
from shoal.data.sources import Dataset, load_dataset

__all__ = ["BatchStream", "Dataset", "class_histograms", "load_dataset", "parse_partition", "partition_indices",
           "shard_indices"]
