"""A user's own compressor for shoal: 8-bit quantisation with one scale per tensor.

    shoal train --config examples/mnist_bsp.toml \
        --set compression.method=python:examples/plugins/int8_quantizer.py:Int8Quantizer \
        --set compression.options={levels=127}

A compressor is a ``shoal.compress.Compressor`` subclass: ``compress`` turns
one tensor into a ``Payload`` (the tensors that travel; their bytes are
counted exactly) and ``decompress`` turns it back. shoal builds one instance
per worker as ``Int8Quantizer(**compression.options)`` and wraps it in the
same codec as the built-ins: error feedback (``unbiased = False``: what the
rounding dropped is added to the next gradient), byte accounting, the
simulator's transfer times and the ray backend's messages.
"""

from __future__ import annotations

import torch

from shoal.compress import Compressor, Payload


class Int8Quantizer(Compressor):
    """Round ``x / scale`` to integers in [-levels, levels], scale = max |x| / levels: 4x less than float32."""

    name = "int8"
    unbiased = False  # deterministic rounding is biased: keep what it dropped (error feedback)

    def __init__(self, levels: int = 127) -> None:
        if not 1 <= levels <= 127:
            raise ValueError(f"levels must be in 1..127 (int8), not {levels}")
        self.levels = levels

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1).float()
        scale = flat.abs().max().clamp_min(1e-30) / self.levels if flat.numel() else torch.ones(())
        values = torch.round(flat / scale).to(torch.int8)
        return Payload((values, scale.reshape(1)), tuple(tensor.shape))

    def decompress(self, payload: Payload) -> torch.Tensor:
        values, scale = payload.tensors
        return (values.float() * scale).reshape(payload.ctx)

    def nominal_bytes(self, numel: int, density: float) -> int:
        return numel + 4  # one byte per value and one float32 scale (cost mode)
