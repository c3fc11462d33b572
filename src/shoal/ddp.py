"""shoal's compressors as PyTorch DDP communication hooks, for users of plain DDP, Lightning or Accelerate.

    import shoal.ddp
    model = torch.nn.parallel.DistributedDataParallel(net)
    state = shoal.ddp.register(model, method="topk", density=0.01)   # error feedback included
    ...train as usual...
    state.bytes_sent, state.bytes_dense                              # what went over the wire, and dense
    torch.save(state.state_dict(), "hook.pt"); state.load_state_dict(torch.load("hook.pt"))

Each bucket's gradients are compressed per parameter tensor exactly as a
shoal worker compresses its upload (``compress.codec.GradientCodec``: the
same compressor, error feedback or DGC's momentum correction, keyed by the
parameter's name), every rank's payload is all-gathered (only the compressed
tensors travel), and each rank decompresses all of them and averages: the
bucket becomes the mean of the ranks' reconstructed gradients, as a shoal
server would apply. The hook is ``(state, bucket) -> Future`` as
``register_comm_hook`` expects; it runs synchronously inside the hook (no
overlap of the gather with the backward pass).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from shoal.compress import Compressor, Payload
from shoal.compress.base import Memory, MomentumMemory, NoMemory, ResidualMemory
from shoal.config import CompressionConfig
from shoal.errors import ConfigError
from shoal.registry import COMPRESSORS


@dataclass
class HookState:
    """A rank's compressor, its error-feedback memory, the parameter names and the byte counters."""

    compressor: Compressor
    memory: Memory
    density: float
    names: dict[int, str]  # id(parameter) -> its name in the module
    group: Any = None  # the process group (None: the default one)
    bytes_sent: int = 0  # this rank's compressed payloads
    bytes_dense: int = 0  # what the same gradients weigh dense (float32)
    buckets: int = 0
    _unnamed: dict[int, str] = field(default_factory=dict)

    def name_of(self, bucket: int, i: int, param: torch.Tensor) -> str:
        return self.names.get(id(param)) or self._unnamed.setdefault(id(param), f"bucket{bucket}.{i}")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The compressor's and the memory's state and the counters, a flat dict of tensors (safetensors-ready)."""
        counters = torch.tensor([self.bytes_sent, self.bytes_dense, self.buckets], dtype=torch.int64)
        return ({f"compressor.{k}": v for k, v in self.compressor.state_dict().items()}
                | {f"memory.{k}": v for k, v in self.memory.state_dict().items()} | {"counters": counters})

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore ``state_dict``'s result: the next buckets compress exactly as the saved state would have."""
        self.compressor.load_state_dict({k.removeprefix("compressor."): v for k, v in state.items()
                                         if k.startswith("compressor.")})
        self.memory.load_state_dict({k.removeprefix("memory."): v for k, v in state.items() if k.startswith("memory.")})
        if "counters" in state:
            self.bytes_sent, self.bytes_dense, self.buckets = (int(x) for x in state["counters"].tolist())


def make_state(named_parameters: Iterable[tuple[str, torch.Tensor]], method: str = "topk", density: float = 0.01, *,
               seed: int = 0, rank: int | None = None, momentum: float = 0.0, error_feedback: bool = True,
               group: Any = None, **options: Any) -> HookState:
    """A hook state for ``method`` (a registered compressor, or a python: one) over these parameters.

    ``seed`` and the rank seed the compressor as a shoal worker's (worker = rank); ``momentum`` > 0 with
    ``dgc`` applies DGC's momentum correction (then step the optimizer without momentum); ``options`` are the
    [compression] keys (e.g. ``rank=4`` for powersgd).
    """
    if method not in COMPRESSORS:
        raise ConfigError(f"method {method!r}: unknown compressor; use one of {', '.join(COMPRESSORS.names())}")
    worker = dist.get_rank(group) if rank is None else rank
    config = CompressionConfig(method=method, density=density, error_feedback=error_feedback, **options)
    compressor = COMPRESSORS[method].from_config(config, (seed * 1_000_003 + worker) % 2**31)
    if method == "dgc" and momentum > 0 and error_feedback and config.momentum_correction:
        memory: Memory = MomentumMemory(momentum)
    elif error_feedback and not compressor.unbiased:
        memory = ResidualMemory()
    else:
        memory = NoMemory()
    return HookState(compressor, memory, density, {id(p): n for n, p in named_parameters}, group)


def compress_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``register_comm_hook``'s hook: the bucket's mean over the ranks of their compressed gradients."""
    world = dist.get_world_size(state.group)
    buffer = bucket.buffer()
    out = torch.zeros_like(buffer)
    for i, (grad, param) in enumerate(zip(bucket.gradients(), bucket.parameters())):
        offset = (grad.data_ptr() - buffer.data_ptr()) // buffer.element_size()  # its view into the bucket
        name, flat = state.name_of(bucket.index(), i, param), grad.detach().reshape(-1).float()
        compensated = state.memory.compensate(name, flat)
        payload = state.compressor.compress_named(compensated, state.density, name, tuple(param.shape))
        state.memory.update(name, compensated, state.compressor.decompress(payload).reshape(-1))
        state.bytes_sent += payload.nbytes
        state.bytes_dense += 4 * flat.numel()
        total = sum(state.compressor.decompress(p).reshape(-1) for p in _gather(payload, world, state.group))
        out[offset:offset + flat.numel()] = (total / world).to(out.dtype)
    state.buckets += 1
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(out)
    return future


# DDP checks a hook's annotations as objects; this module's are strings (``from __future__ import annotations``)
compress_hook.__annotations__.update(bucket=dist.GradBucket, state=HookState,
                                     **{"return": torch.futures.Future[torch.Tensor]})


def _gather(payload: Payload, world: int, group: Any) -> list[Payload]:
    """Every rank's payload. A vector's length may differ between ranks (DGC keeps what passes a sampled
    threshold): lengths travel first and vectors are padded to the longest. A plain int (randk's seed) travels
    as a one-element tensor."""
    gathered: list[list[Any]] = [[] for _ in range(world)]
    for item in payload.tensors:
        tensor = item if isinstance(item, torch.Tensor) else torch.tensor([int(item)], dtype=torch.int64)
        for r, t in enumerate(_all_gather(tensor.contiguous(), world, group)):
            gathered[r].append(t if isinstance(item, torch.Tensor) else type(item)(t.item()))
    return [Payload(tuple(items), payload.ctx) for items in gathered]


def _all_gather(tensor: torch.Tensor, world: int, group: Any) -> list[torch.Tensor]:
    """``tensor`` from every rank; vectors of different lengths come back at their own length."""
    if tensor.dim() != 1:
        outs = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(outs, tensor, group=group)
        return outs
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([tensor.numel()], dtype=torch.int64), group=group)
    longest = int(max(n.item() for n in lengths))
    padded = torch.zeros(longest, dtype=tensor.dtype)
    padded[:tensor.numel()] = tensor
    outs = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(outs, padded, group=group)
    return [out[:int(n.item())] for out, n in zip(outs, lengths)]


def register(model: torch.nn.parallel.DistributedDataParallel, method: str = "topk", density: float = 0.01,
             **kwargs: Any) -> HookState:
    """Compress ``model``'s gradient communication with a shoal compressor; returns the hook's state (its byte
    counters, and ``state_dict`` / ``load_state_dict`` for checkpoints). ``kwargs`` go to ``make_state``."""
    state = make_state(model.module.named_parameters(), method, density, **kwargs)
    model.register_comm_hook(state, compress_hook)
    return state
