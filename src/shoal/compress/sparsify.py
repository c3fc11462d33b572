"""Top-k: keep the largest-magnitude values, send values and their indices."""

from __future__ import annotations

import math

import torch

from shoal.compress.base import Compressor, Payload


def keep_count(numel: int, density: float) -> int:
    """How many values a sparsifier keeps: at least one, at most all."""
    return max(1, min(numel, math.ceil(density * numel)))


def scatter(values: torch.Tensor, indices: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    dense = torch.zeros(math.prod(shape), dtype=values.dtype)
    dense[indices.long()] = values
    return dense.view(shape)


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
