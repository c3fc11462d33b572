"""A worker's gradient codec: compensate, compress, and account, tensor by tensor."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.compress.base import Compressor, Memory, MomentumMemory, NoMemory, ResidualMemory
from shoal.config import CompressionConfig, OptimizerConfig
from shoal.engine.gradients import TensorSlot
from shoal.registry import COMPRESSORS


def make_compressor(method: str, seed: int = 0, rank: int = 4) -> Compressor | None:
    """The compressor registered as ``method`` (None for "none"), with ``seed`` for random ones."""
    if method == "none":
        return None
    return COMPRESSORS[method].from_config(CompressionConfig(rank=rank), seed)


class GradientCodec:
    """Encodes one worker's flat gradient per parameter tensor, with optional error feedback.

    ``encode`` returns what the server reconstructs (a dense flat tensor) and
    the exact number of payload bytes that travelled.
    """

    def __init__(self, compressor: Compressor, layout: Sequence[TensorSlot], error_feedback: bool,
                 memory: Memory | None = None) -> None:
        self.compressor = compressor
        self.layout = list(layout)
        self.memory: Memory = memory or (ResidualMemory() if error_feedback else NoMemory())

    def encode(self, grad: torch.Tensor, density: float, send: Sequence[bool] | None = None) -> tuple[torch.Tensor, int]:
        """Compress every tensor, or only those ``send`` marks (the rest are zero and cost nothing)."""
        received = torch.zeros_like(grad) if send is not None else torch.empty_like(grad)
        nbytes = 0
        for i, slot in enumerate(self.layout):
            if send is not None and not send[i]:
                continue
            piece = grad[slot.offset : slot.offset + slot.numel]
            compensated = self.memory.compensate(slot.name, piece)
            payload = self.compressor.compress_named(compensated, density, slot.name, slot.shape)
            sent = self.compressor.decompress(payload).reshape(-1)
            self.memory.update(slot.name, compensated, sent)
            received[slot.offset : slot.offset + slot.numel] = sent
            nbytes += payload.nbytes
        return received, nbytes

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The compressor's and the error feedback's state, as one flat dict of tensors (for safetensors):
        a codec restored from it encodes exactly what this one would have, bit for bit."""
        return ({f"compressor.{k}": v for k, v in self.compressor.state_dict().items()}
                | {f"memory.{k}": v for k, v in self.memory.state_dict().items()})

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore ``state_dict``'s result into a codec built from the same config."""
        self.compressor.load_state_dict({k.removeprefix("compressor."): v for k, v in state.items()
                                         if k.startswith("compressor.")})
        self.memory.load_state_dict({k.removeprefix("memory."): v for k, v in state.items() if k.startswith("memory.")})

    def nominal_bytes(self, density: float, send: Sequence[bool] | None = None) -> int:
        """Payload bytes of one push without a gradient (cost mode), of every tensor or those ``send`` marks."""
        return sum(self.compressor.nominal_named_bytes(slot.shape, density) for i, slot in enumerate(self.layout)
                   if send is None or send[i])


#: seed offset of the second codec a SIM worker keeps for its local changes
DELTA_SALT = 7919


def momentum_corrected(compression: CompressionConfig, opt: OptimizerConfig) -> bool:
    """DGC with SGD momentum: the workers apply the momentum (``MomentumMemory``), the server plain SGD."""
    return (compression.method == "dgc" and compression.momentum_correction and compression.error_feedback
            and opt.name == "sgd" and opt.momentum > 0)


def server_optimizer(compression: CompressionConfig, opt: OptimizerConfig) -> OptimizerConfig:
    """The optimizer a server steps with: without momentum where the workers already apply it (DGC)."""
    return opt.model_copy(update={"momentum": 0.0}) if momentum_corrected(compression, opt) else opt


def worker_codec(compression: CompressionConfig, seed: int, worker: int, layout: Sequence[TensorSlot],
                 salt: int = 0, opt: OptimizerConfig | None = None) -> GradientCodec | None:
    """The codec of one worker (None without a compressor); both backends build theirs here.

    Error feedback accumulates what a compressor dropped; for an unbiased
    compressor that is its variance, which feedback amplifies (measured: the
    residual of scaled randk grows without bound), so only biased ones use it.
    Given the optimizer of a gradient codec, DGC also gets its momentum
    correction (``momentum_corrected``).
    """
    if compression.method == "none":
        return None
    compressor = COMPRESSORS[compression.method].from_config(compression, (seed * 1_000_003 + worker + salt) % 2**31)
    memory = MomentumMemory(opt.momentum) if opt is not None and momentum_corrected(compression, opt) else None
    return GradientCodec(compressor, layout, compression.error_feedback and not compressor.unbiased, memory)


#: seed offset of the codec a server broadcasts quantised model changes with (Streaming DiLoCo)
BROADCAST_SALT = 15_485_863


#: seed offset of the codec a GSSP group server keeps for its own-delta exchange
EXCHANGE_SALT = 104_729


def exchange_codec(compression: CompressionConfig, seed: int, group: int,
                   layout: Sequence[TensorSlot]) -> GradientCodec | None:
    """The codec a GSSP group server compresses its own delta with (error feedback at the sender)."""
    return worker_codec(compression, seed, 1_000_000 + group, layout, salt=EXCHANGE_SALT)
