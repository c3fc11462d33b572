"""Quantizers: FP16 (half precision) and QSGD (stochastic levels, unbiased)."""

from __future__ import annotations

import math

import torch

from shoal.compress.base import Compressor, Payload
from shoal.registry import COMPRESSORS

FP16_MAX = float(torch.finfo(torch.float16).max)


@COMPRESSORS.register("fp16", "every value as float16 (2 bytes)")
class FP16(Compressor):
    """Every value as float16: ``nbytes = 2 * numel``; ``density`` is ignored.

    Values beyond the float16 range are clamped to +-65504 (not sent as inf);
    the receiver widens back to float32. Round-to-nearest is deterministic, so
    the only bias is the rounding error (relative 2^-11, more for subnormals).
    """

    name = "fp16"
    unbiased = False

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1).to(torch.float32).clamp(-FP16_MAX, FP16_MAX)
        return Payload((flat.to(torch.float16),), tensor.shape)

    def decompress(self, payload: Payload) -> torch.Tensor:
        (half,) = payload.tensors
        return half.to(torch.float32).view(payload.ctx)

    def nominal_bytes(self, numel: int, density: float) -> int:
        return 2 * numel


def level_bits(levels: int) -> int:
    """Bits of one QSGD symbol: sign and level together take ``2 * levels + 1`` values."""
    return math.ceil(math.log2(2 * levels + 1))


def pack_bits(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack non-negative integers below ``2**bits`` into bytes, most significant bit first."""
    if bits == 8:
        return symbols.to(torch.uint8)
    shifts = torch.arange(bits - 1, -1, -1, dtype=torch.int32)
    stream = ((symbols.to(torch.int32).unsqueeze(1) >> shifts) & 1).to(torch.uint8).reshape(-1)
    pad = (-stream.numel()) % 8
    if pad:
        stream = torch.cat((stream, stream.new_zeros(pad)))
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.int32)
    return (stream.view(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, count: int, bits: int) -> torch.Tensor:
    """The ``count`` integers that :func:`pack_bits` packed (int64)."""
    if bits == 8:
        return packed[:count].to(torch.int64)
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8)
    stream = ((packed.unsqueeze(1) >> shifts) & 1).reshape(-1)[: count * bits]
    weights = torch.ones(bits, dtype=torch.int64) << torch.arange(bits - 1, -1, -1)
    return (stream.view(count, bits).to(torch.int64) * weights).sum(dim=1)


@COMPRESSORS.register("qsgd", "QSGD: stochastic rounding to 127 levels per 512-value bucket, unbiased")
class QSGD(Compressor):
    """QSGD (Alistarh et al., NeurIPS 2017): stochastic rounding to ``levels`` levels per bucket norm.

    The tensor is cut into buckets of ``bucket_size`` values (``None`` or 0:
    one bucket, one norm for the whole tensor). For a value ``v`` in a bucket
    of 2-norm ``n``: ``level = floor(|v| / n * s + u)`` with ``u ~ U[0, 1)``
    from a seeded generator, and the receiver takes ``n * sign(v) * level / s``;
    E[level] = |v| / n * s, so the estimate is unbiased. Variance is at most
    ``min(d / s^2, sqrt(d) / s) * |x|^2`` for buckets of ``d`` values.

    Defaults: ``levels = 127``, ``bucket_size = 512``. Sign and level form one
    symbol ``sign * level + s`` in ``[0, 2s]``; with s = 127 that is exactly
    255 symbols, one byte per value (4x less than float32), and the variance
    bound is 512 / 127^2 = 0.03, below 1, so error feedback stays contractive
    (with fewer levels or one norm per large tensor it would not be, and
    error feedback would amplify the noise). Bucket size 512 follows the QSGD
    paper's experiments.

    Wire format: ``norms`` float32[ceil(numel / d)] and ``symbols`` uint8,
    ``ceil(numel * b / 8)`` bytes holding ``b = ceil(log2(2s + 1))`` bits per
    value, most significant bit first (no padding between values). So
    ``nbytes = 4 * ceil(numel / d) + ceil(numel * b / 8)``. ``density`` is
    ignored.
    """

    name = "qsgd"
    unbiased = True

    def __init__(self, levels: int = 127, bucket_size: int | None = 512, seed: int = 0) -> None:
        if not 1 <= levels <= 2**15:
            raise ValueError(f"qsgd levels must be in [1, 32768], got {levels}")
        if bucket_size is not None and bucket_size < 0:
            raise ValueError(f"qsgd bucket_size must be positive (or 0/None for one bucket), got {bucket_size}")
        self.levels = levels
        self.bucket_size = bucket_size or None
        self.bits = level_bits(levels)
        self.generator = torch.Generator().manual_seed(seed)

    def _bucket(self, numel: int) -> int:
        return max(1, numel if self.bucket_size is None else min(self.bucket_size, numel))

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        flat = tensor.reshape(-1).to(torch.float32)
        numel = flat.numel()
        d = self._bucket(numel)
        buckets = math.ceil(numel / d)
        padded = torch.zeros(buckets * d, dtype=torch.float32)
        padded[:numel] = flat
        padded = padded.view(buckets, d)
        norms = torch.linalg.vector_norm(padded, dim=1)
        safe = torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(1)
        scaled = (padded.abs() / safe * self.levels).reshape(-1)[:numel]
        noise = torch.rand(numel, generator=self.generator)
        level = torch.floor_(scaled.add_(noise)).clamp_(0, self.levels)
        symbols = torch.copysign(level, flat).add_(self.levels).to(torch.int32)
        return Payload((norms, pack_bits(symbols, self.bits)), tensor.shape)

    def decompress(self, payload: Payload) -> torch.Tensor:
        norms, packed = payload.tensors
        numel = math.prod(payload.ctx)
        d = self._bucket(numel)
        signed = (unpack_bits(packed, numel, self.bits) - self.levels).to(torch.float32)
        scale = (norms / self.levels).repeat_interleave(d)[:numel]
        return (signed * scale).view(payload.ctx)

    def nominal_bytes(self, numel: int, density: float) -> int:
        return 4 * math.ceil(numel / self._bucket(numel)) + math.ceil(numel * self.bits / 8)


#: values sharing one scale in the block-scaled formats (int8, fp4), as the OCP microscaling formats do
BLOCK = 32


def block_view(tensor: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, int]:
    """The flat values zero-padded into rows of ``block``, and how many values there were."""
    flat = tensor.reshape(-1).to(torch.float32)
    numel = flat.numel()
    rows = max(1, math.ceil(numel / block))
    padded = torch.zeros(rows * block, dtype=torch.float32)
    padded[:numel] = flat
    return padded.view(rows, block), numel


class BlockScaled(Compressor):
    """Round every value to a small grid scaled per block of 32 values (deterministic, so biased).

    Each block's scale is its largest magnitude over the grid's largest
    point, sent as float32; a value travels as the index of its nearest
    grid point with its sign. Error feedback carries the rounding error into
    the next message (``compression.error_feedback``).
    """

    unbiased = False
    #: the non-negative grid points, ascending, starting at 0
    grid: torch.Tensor
    #: bits of one value's code (sign included)
    bits: int

    def _codes(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        blocks, numel = block_view(tensor)
        top = float(self.grid[-1])
        scales = blocks.abs().amax(dim=1) / top
        safe = torch.where(scales > 0, scales, torch.ones_like(scales)).unsqueeze(1)
        scaled = (blocks.abs() / safe).reshape(-1)[:numel]
        index = torch.bucketize(scaled, (self.grid[1:] + self.grid[:-1]) / 2)  # the nearest grid point
        negative = blocks.reshape(-1)[:numel] < 0
        return scales, index + negative.to(torch.int64) * len(self.grid), numel

    def _values(self, scales: torch.Tensor, codes: torch.Tensor, numel: int) -> torch.Tensor:
        size = len(self.grid)
        magnitude = self.grid[codes % size]
        signed = torch.where(codes >= size, -magnitude, magnitude)
        return signed * scales.repeat_interleave(BLOCK)[:numel]

    def nominal_bytes(self, numel: int, density: float) -> int:
        return 4 * max(1, math.ceil(numel / BLOCK)) + math.ceil(numel * self.bits / 8)


@COMPRESSORS.register("int8", "8-bit integers with a float32 scale per 32-value block (1.125 bytes a value)")
class Int8(BlockScaled):
    """Symmetric int8: ``round(v / s)`` in [-127, 127] with ``s`` = the block's largest magnitude / 127.

    A value's error is at most ``s / 2`` (1/254 of its block's largest
    magnitude). Wire: float32 scales and one int8 a value.
    """

    name = "int8"
    grid = torch.arange(128, dtype=torch.float32)
    bits = 8

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        scales, codes, _ = self._codes(tensor)
        size = len(self.grid)
        signed = torch.where(codes >= size, -(codes - size), codes)
        return Payload((scales, signed.to(torch.int8)), tensor.shape)

    def decompress(self, payload: Payload) -> torch.Tensor:
        scales, values = payload.tensors
        numel = values.numel()
        return (values.to(torch.float32) * scales.repeat_interleave(BLOCK)[:numel]).view(payload.ctx)


@COMPRESSORS.register("fp4", "4-bit floats (E2M1) with a float32 scale per 32-value block (0.625 bytes a value)")
class FP4(BlockScaled):
    """FP4 E2M1, as in the OCP MXFP4 format: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} times the block's scale.

    ``s`` = the block's largest magnitude / 6, and a value rounds to the
    nearest point, so its error is at most half the gap it falls in: s / 4
    below 2s, s / 2 below 4s, s up to 6s. Wire: float32 scales and 4 bits
    a value (sign, then the point's index), two values a byte.
    """

    name = "fp4"
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    bits = 4

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        scales, codes, _ = self._codes(tensor)
        return Payload((scales, pack_bits(codes, self.bits)), tensor.shape)

    def decompress(self, payload: Payload) -> torch.Tensor:
        scales, packed = payload.tensors
        numel = math.prod(payload.ctx)
        return self._values(scales, unpack_bits(packed, numel, self.bits), numel).view(payload.ctx)
