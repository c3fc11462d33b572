"""Scaled signSGD with error feedback (EF-SignSGD; Karimireddy et al., ICML 2019).

Each tensor travels as one bit per value (its sign, packed eight to a byte)
and one float32 scale, the mean magnitude ``|x|_1 / d``, so the receiver
takes ``scale * sign(x)``: ``nbytes = 4 + ceil(d / 8)``, 32x less than
float32. The estimate is biased, so the codec's error feedback keeps what
the sign dropped and adds it to the next gradient, which is what makes
signSGD converge like SGD. ``density`` is ignored.
"""

from __future__ import annotations

import math

import torch

from shoal.compress.base import Compressor, Payload
from shoal.registry import COMPRESSORS

_BIT_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


@COMPRESSORS.register("signsgd", "scaled signSGD: one bit per value and one scale per tensor, error feedback")
class SignSGD(Compressor):
    """Signs as bits plus the mean magnitude; zeros count as positive."""

    name = "signsgd"
    unbiased = False

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1).float()
        numel = flat.numel()
        scale = flat.abs().mean() if numel else torch.zeros(())
        bits = torch.zeros(math.ceil(numel / 8) * 8, dtype=torch.uint8)
        bits[:numel] = (flat >= 0).to(torch.uint8)
        packed = (bits.view(-1, 8) * _BIT_WEIGHTS).sum(dim=1).to(torch.uint8)
        return Payload((packed, scale.reshape(1)), (tuple(tensor.shape), numel))

    def decompress(self, payload: Payload) -> torch.Tensor:
        packed, scale = payload.tensors
        shape, numel = payload.ctx
        bits = (packed.unsqueeze(1) & _BIT_WEIGHTS).ne(0).reshape(-1)[:numel]
        return (bits.float() * 2 - 1).mul_(scale).reshape(shape)

    def nominal_bytes(self, numel: int, density: float) -> int:
        return 4 + math.ceil(numel / 8)
