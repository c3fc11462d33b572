"""What travels between the `ray` backend's actors: packed tensors, emulated links, status words."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import ray

STOP, MOVED, OK = "stop", "moved", "ok"


def quiet_readonly_numpy() -> None:
    # Arrays from the object store are read-only views; they are only ever read here.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def as_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array))


def pack(vector: torch.Tensor, mask: tuple[bool, ...], slices: list[slice]) -> np.ndarray:
    """SIM: only the tensors marked in ``mask``, concatenated (what travels instead of the full vector)."""
    parts = [vector[sl] for sl, take in zip(slices, mask) if take]
    return (torch.cat(parts) if parts else vector[:0]).detach().cpu().numpy()


def unpack(values: np.ndarray, mask: tuple[bool, ...], slices: list[slice], size: int) -> torch.Tensor:
    """The inverse of ``pack``: a full-length vector, zero in the tensors not marked."""
    flat = as_tensor(values)
    out = torch.zeros(size, dtype=flat.dtype)
    at = 0
    for sl, take in zip(slices, mask):
        if take:
            n = sl.stop - sl.start
            out[sl] = flat[at : at + n]
            at += n
    return out


@dataclass(frozen=True)
class Link:
    """What a transfer should take when emulated: latency + bytes / bandwidth."""

    latency_s: float
    bps: float
    emulate: bool

    def seconds(self, nbytes: float) -> float:
        """Nothing to send (a local step of local SGD) costs nothing, as in the sim's cost model."""
        return self.latency_s + 8.0 * nbytes / self.bps if self.emulate and nbytes else 0.0


def actor_threads(cpus: float) -> int:
    """Torch intra-op threads of an actor: the whole CPUs it reserved, at least one."""
    return max(1, int(cpus))


def actor_device(gpus: float) -> "torch.device":
    """CUDA when the actor reserved a GPU; an error, not a silent CPU fallback, when its torch has none."""
    import torch

    if gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"backend.gpus_per_worker = {gpus:g}, but torch in this worker has no CUDA device "
                           f"(torch {torch.__version__}); use 0 or a CUDA build of torch")
    return torch.device("cuda")


def first_line(err: BaseException) -> str:
    """The line of a Ray error that says what happened (its traceback dropped), at most 300 characters."""
    text = str(err).strip()
    for line in text.splitlines():
        if "Error" in line or "error" in line or "died" in line:
            return line.strip()[:300]
    return (text.splitlines()[0] if text else type(err).__name__)[:300]


def answered(pending: dict[Any, Any]) -> list[Any]:
    """The object references (keys of ``pending``) whose calls have answered, without waiting."""
    if not pending:
        return []
    return ray.wait(list(pending), num_returns=len(pending), timeout=0)[0]
