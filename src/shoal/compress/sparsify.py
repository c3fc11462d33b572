"""Top-k: keep the largest-magnitude values, send values and their indices."""

from __future__ import annotations

import math
from typing import Any

import torch

from shoal.compress.base import Compressor, Payload
from shoal.registry import COMPRESSORS


def keep_count(numel: int, density: float) -> int:
    """How many values a sparsifier keeps: at least one, at most all."""
    return max(1, min(numel, math.ceil(density * numel)))


def scatter(values: torch.Tensor, indices: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    dense = torch.zeros(math.prod(shape), dtype=values.dtype)
    dense[indices.long()] = values
    return dense.view(shape)


@COMPRESSORS.register("topk", "top-k: the largest magnitudes (values + indices), error feedback")
class TopK(Compressor):
    """Values (float32) and indices (int32) of the k largest magnitudes."""

    name = "topk"
    unbiased = False

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1)
        k = keep_count(flat.numel(), density)
        indices = torch.topk(flat.abs(), k, sorted=False).indices
        return Payload((flat[indices].to(torch.float32), indices.to(torch.int32)), tensor.shape)

    def decompress(self, payload: Payload) -> torch.Tensor:
        values, indices = payload.tensors
        return scatter(values, indices, payload.ctx)

    def nominal_bytes(self, numel: int, density: float) -> int:
        return 8 * keep_count(numel, density)


def _seed_from(generator: torch.Generator) -> torch.Tensor:
    """A fresh non-negative int32 seed drawn from ``generator`` (one element)."""
    return torch.randint(0, 2**31 - 1, (1,), generator=generator, dtype=torch.int64).to(torch.int32)


def random_indices(numel: int, k: int, seed: int) -> torch.Tensor:
    """``k`` distinct indices in ``[0, numel)``, a uniform random subset, determined by ``seed``.

    Sender and receiver call this with the same arguments and get the same
    indices (same torch build). Dense case: a permutation prefix. Sparse case
    (``k`` well below ``numel``): i.i.d. draws until ``k`` distinct values are
    seen, then a random ``k`` of them. The process is invariant under
    relabelling the indices, so the distinct set is a uniform subset given its
    size, and a random ``k``-subset of it is a uniform ``k``-subset; it costs
    O(k log k) instead of O(numel).
    """
    gen = torch.Generator().manual_seed(int(seed))
    if 4 * k > numel:
        return torch.randperm(numel, generator=gen)[:k]
    distinct = torch.unique(torch.randint(0, numel, (k + k // 8 + 8,), generator=gen))
    while distinct.numel() < k:
        more = torch.randint(0, numel, (2 * (k - distinct.numel()) + 8,), generator=gen)
        distinct = torch.unique(torch.cat((distinct, more)))
    if distinct.numel() > k:
        distinct = distinct[torch.randperm(distinct.numel(), generator=gen)[:k]]
    return distinct


@COMPRESSORS.register("randk", "random-k, scaled to stay unbiased")
class RandK(Compressor):
    """k uniformly random values (float32) plus the 4-byte seed that names their positions.

    Wire format: ``values`` float32[k] (the original, unscaled values) and
    ``seed`` int32[1]; the receiver regenerates the indices from the seed with
    :func:`random_indices` (``k`` is the number of values), so no indices
    travel: ``nbytes = 4 * k + 4``. With ``scale=True`` (default) the receiver
    multiplies by ``numel / k``, so the estimate is unbiased; with
    ``scale=False`` it is the plain (biased, contractive) random-k that error
    feedback needs to stay bounded: scaled random-k has variance
    ``(numel / k - 1) * |x|^2``, which error feedback amplifies step by step.
    Seeds come from a ``torch.Generator`` seeded by ``seed``, so runs repeat.
    """

    name = "randk"
    unbiased = True

    def __init__(self, seed: int = 0, scale: bool = True) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.scale = scale
        self.unbiased = scale

    @classmethod
    def from_config(cls, compression: Any, seed: int) -> "RandK":
        return cls(seed=seed)

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1)
        k = keep_count(flat.numel(), density)
        seed = _seed_from(self.generator)
        indices = random_indices(flat.numel(), k, int(seed))
        return Payload((flat[indices].to(torch.float32), seed), tensor.shape)

    def decompress(self, payload: Payload) -> torch.Tensor:
        values, seed = payload.tensors
        numel, k = math.prod(payload.ctx), values.numel()
        indices = random_indices(numel, k, int(seed))
        if self.scale:
            values = values * (numel / k)
        return scatter(values, indices, payload.ctx)

    def nominal_bytes(self, numel: int, density: float) -> int:
        return 4 * keep_count(numel, density) + 4


@COMPRESSORS.register("dgc", "deep gradient compression: sampled top-k threshold, momentum correction")
class DGC(TopK):
    """Deep Gradient Compression's top-k by a sampled threshold (Lin et al., ICLR 2018).

    The threshold is the top-``density`` quantile of |values| at
    ``num_samples`` positions drawn uniformly (with replacement, seeded), where
    ``num_samples`` is the larger of ``sample_ratio * numel``, ``min_samples``
    and enough samples for ``min_top`` of them to lie above the threshold (so
    the estimate is not a single order statistic at low density). Every value
    whose magnitude reaches the threshold is selected. If that selects more
    than ``1.3 * k``, DGC's hierarchical step runs an exact top-k among the
    selected, so the count is at most ``1.3 * k``; it can fall below ``k`` when
    the sample over-estimates the threshold (error feedback keeps the rest).
    Tensors no larger than the sample get the exact top-k.

    Wire format (as top-k): ``values`` float32[c] and ``indices`` int32[c] for
    the ``c`` values actually selected: ``nbytes = 8 * c``. ``nominal_bytes``
    is ``8 * k``, the count DGC aims for.
    """

    name = "dgc"
    unbiased = False

    def __init__(
        self, seed: int = 0, sample_ratio: float = 0.01, min_samples: int = 1000, min_top: int = 32,
        overshoot: float = 1.3,
    ) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.sample_ratio = sample_ratio
        self.min_samples = min_samples
        self.min_top = min_top
        self.overshoot = overshoot

    @classmethod
    def from_config(cls, compression: Any, seed: int) -> "DGC":
        return cls(seed=seed)

    def num_samples(self, numel: int, density: float) -> int:
        wanted = max(math.ceil(self.sample_ratio * numel), self.min_samples, math.ceil(self.min_top / density))
        return min(numel, wanted)

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1)
        numel = flat.numel()
        k = keep_count(numel, density)
        magnitude = flat.abs()
        m = self.num_samples(numel, density)
        if m >= numel or k == numel:
            indices = torch.topk(magnitude, k, sorted=False).indices
        else:
            sample = magnitude[torch.randint(0, numel, (m,), generator=self.generator)]
            k_sample = keep_count(m, density)
            threshold = torch.topk(sample, k_sample, sorted=False).values.min()
            indices = torch.nonzero(magnitude >= threshold).reshape(-1)
            if indices.numel() > self.overshoot * k:
                indices = indices[torch.topk(magnitude[indices], k, sorted=False).indices]
        return Payload((flat[indices].to(torch.float32), indices.to(torch.int32)), tensor.shape)

