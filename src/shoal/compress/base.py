"""The compressor and memory protocols."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from shoal.plugins import load_class
from shoal.registry import COMPRESSORS


@dataclass(frozen=True)
class Payload:
    """What travels for one tensor: ``tensors`` are sent; ``ctx`` is known to both sides (shape)."""

    tensors: tuple[torch.Tensor, ...]
    ctx: Any

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


class Compressor(ABC):
    """Compress one tensor into a payload with an exact byte size, and back."""

    name: str = "base"
    #: whether E[decompress(compress(x))] == x (then error feedback is optional)
    unbiased: bool = True
    #: whether a per-group schedule sets ``density`` (GDTopK) instead of ``compression.density``
    scheduled: bool = False

    @classmethod
    def from_config(cls, compression: Any, seed: int) -> "Compressor":
        """One worker's instance from the ``[compression]`` section; ``seed`` is that worker's own.

        The default passes ``compression.options`` (a plug-in's own
        keyword arguments; empty for the built-ins); a compressor with
        randomness or options of its own overrides this.
        """
        return cls(**getattr(compression, "options", {}))

    @abstractmethod
    def compress(self, tensor: torch.Tensor, density: float) -> Payload:
        """Encode ``tensor``; ``density`` is the fraction of values a sparsifier keeps."""

    @abstractmethod
    def decompress(self, payload: Payload) -> torch.Tensor:
        """The dense tensor the receiver reconstructs."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a resumed run needs to go on exactly as this one would: the random generator's state, if any
        (compressors with per-tensor state, PowerSGD, add theirs). Tensors only, so it saves as safetensors."""
        generator = getattr(self, "generator", None)
        return {"generator": generator.get_state()} if isinstance(generator, torch.Generator) else {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what ``state_dict`` returned."""
        if "generator" in state:
            self.generator.set_state(state["generator"])

    def nominal_bytes(self, numel: int, density: float) -> int:
        """Payload size for a tensor of ``numel`` values without looking at values (cost mode)."""
        return self.compress(torch.zeros(numel), density).nbytes

    def compress_named(self, tensor: torch.Tensor, density: float, name: str, shape: tuple[int, ...]) -> Payload:
        """Encode the flat values of the parameter tensor ``name`` of ``shape`` (as GRACE's ``compress(tensor,
        name)``): compressors with per-tensor state or a matrix view (PowerSGD) override this."""
        return self.compress(tensor, density)

    def nominal_named_bytes(self, shape: tuple[int, ...], density: float) -> int:
        """Payload size for the parameter tensor of ``shape`` (cost mode)."""
        return self.nominal_bytes(math.prod(shape), density)


class Memory(ABC):
    """Error feedback state, one residual per tensor key."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every per-tensor state tensor, under ``<kind>.<tensor key>`` (none for ``NoMemory``)."""
        return {f"{kind}.{key}": value for kind, table in self._tables().items() for key, value in table.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        tables = self._tables()
        for name, value in state.items():
            kind, _, key = name.partition(".")
            tables[kind][key] = value.clone()

    def _tables(self) -> dict[str, dict[str, torch.Tensor]]:
        """The per-tensor tables that make up the state, by kind."""
        return {}

    @abstractmethod
    def compensate(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor to compress: the gradient plus what was not sent before."""

    @abstractmethod
    def update(self, key: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        """Remember what was not sent: compensated - sent."""


class NoMemory(Memory):
    """No error feedback: what is dropped is lost."""

    def compensate(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def update(self, key: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        return None


class ResidualMemory(Memory):
    """Error feedback: the residual is added to the next gradient, so no gradient mass is lost."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def compensate(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        residual = self.residuals.get(key)
        return tensor if residual is None else tensor + residual

    def update(self, key: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        self.residuals[key] = compensated - sent

    def _tables(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"residual": self.residuals}


class MomentumMemory(Memory):
    """DGC's momentum correction with momentum factor masking (Lin et al., ICLR 2018).

    Sparsifying a gradient and letting the server apply momentum loses the
    momentum of everything not sent. DGC moves momentum to the worker: per
    tensor it keeps a velocity u = m * u + g and an accumulation v = v + u,
    sends the top of v, and clears both u and v where values were sent (the
    masking keeps stale momentum from pushing a value that just went out).
    The server then steps plain SGD on what arrives.
    """

    def __init__(self, momentum: float) -> None:
        self.momentum = momentum
        self.velocities: dict[str, torch.Tensor] = {}
        self.accumulations: dict[str, torch.Tensor] = {}

    def compensate(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        velocity = self.velocities.get(key)
        velocity = tensor.clone() if velocity is None else velocity.mul_(self.momentum).add_(tensor)
        self.velocities[key] = velocity
        accumulation = self.accumulations.get(key)
        return velocity.clone() if accumulation is None else accumulation + velocity

    def update(self, key: str, compensated: torch.Tensor, sent: torch.Tensor) -> None:
        unsent = sent == 0
        self.accumulations[key] = compensated * unsent
        self.velocities[key].mul_(unsent)

    def _tables(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"velocity": self.velocities, "accumulation": self.accumulations}


def load_plugin(spec: str) -> type[Compressor]:
    """A user's compressor class from ``python:FILE.py:CLASS``, checked against the protocol."""
    return load_class(spec, Compressor, "compress(tensor, density) -> Payload and decompress(payload) -> Tensor")


COMPRESSORS.accept_plugins(load_plugin)
