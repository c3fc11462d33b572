"""PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019): rank-r compression by one power iteration.

Each parameter tensor is viewed as a matrix M (first dimension x the rest).
With a Q (m x r) kept from the previous step (warm start), one power
iteration gives P = orth(M Q) and Q' = M^T P, and M is approximated by
P Q'^T: (n + m) r values travel instead of n m. Q' is kept for the next step,
which is what makes one iteration per step enough. The approximation is
biased, so the codec adds error feedback, as the paper does. Tensors where
the factors would not be smaller (biases, small matrices) travel as they are.

shoal's data path compresses each worker's upload on its own (the paper
all-reduces P and Q across workers, which needs the workers to share Q); the
rank, the warm start and the error feedback are the paper's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from shoal.compress.base import Compressor, Payload
from shoal.registry import COMPRESSORS


@COMPRESSORS.register("powersgd", "PowerSGD: warm-started rank-r factors of each matrix (compression.rank)")
class PowerSGD(Compressor):
    """Rank-``rank`` approximation with a warm-started power iteration, per named tensor."""

    name = "powersgd"
    unbiased = False

    def __init__(self, rank: int = 4, seed: int = 0) -> None:
        if rank < 1:
            raise ValueError("rank must be >= 1")
        self.rank = rank
        self.generator = torch.Generator().manual_seed(seed)
        self.q: dict[str, torch.Tensor] = {}

    @classmethod
    def from_config(cls, compression: Any, seed: int) -> "PowerSGD":
        return cls(rank=compression.rank, seed=seed)

    @staticmethod
    def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
        return (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (1, math.prod(shape))

    def _compressible(self, n: int, m: int) -> bool:
        r = min(self.rank, n, m)
        return n > 1 and m > 1 and (n + m) * r < n * m

    def compress_named(self, tensor: torch.Tensor, density: float, name: str, shape: tuple[int, ...]) -> Payload:
        n, m = self.matrix_shape(shape)
        if not self._compressible(n, m):
            return self.compress(tensor, density)
        matrix = tensor.reshape(n, m)
        r = min(self.rank, n, m)
        q = self.q.get(name)
        if q is None or q.shape != (m, r):
            q = torch.randn(m, r, generator=self.generator, dtype=tensor.dtype)
        p, _ = torch.linalg.qr(matrix @ q)
        q = matrix.T @ p
        self.q[name] = q
        return Payload((p.contiguous(), q.contiguous()), ("lowrank", n, m))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator and each tensor's warm-start Q (losing Q restarts the power iteration from noise)."""
        return super().state_dict() | {f"q.{name}": q for name, q in self.q.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.q = {name.removeprefix("q."): q.clone() for name, q in state.items() if name.startswith("q.")}

    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        """A tensor without a useful matrix view: sent as it is."""
        return Payload((tensor.reshape(-1).clone(),), ("raw", tensor.numel()))

    def decompress(self, payload: Payload) -> torch.Tensor:
        if payload.ctx[0] == "raw":
            return payload.tensors[0]
        p, q = payload.tensors
        return (p @ q.T).reshape(-1)

    def nominal_named_bytes(self, shape: tuple[int, ...], density: float) -> int:
        n, m = self.matrix_shape(shape)
        if not self._compressible(n, m):
            return 4 * n * m
        return 4 * (n + m) * min(self.rank, n, m)
