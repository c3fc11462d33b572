"""Real gradients on flat parameter vectors, and evaluation.

One torch module is reused for every worker: a computation loads the
parameters (and batch-norm buffers) the worker pulled, so each gradient is
computed on exactly the values that worker saw at its start time. The
module may live on a GPU (the simulator's backend.device): flat vectors
and batches come in on any device, and what comes out is on the CPU, where
the simulator keeps its replicas.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from shoal.engine.task import DEFAULT_TASK, Evaluation, Task


@dataclass(frozen=True)
class TensorSlot:
    """Where one parameter tensor lives in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


EVAL_BATCH_CPU = 64
EVAL_BATCH_DEVICE = 1024


def worker_seed(run_seed: int, worker: int, step: int) -> int:
    """The seed of one worker's randomness (dropout masks) at one of its steps: a function of the run's seed,
    the worker and its step alone, so in the loop a worker's masks do not depend on which workers computed
    before it (the event order). A batched call draws all its workers' masks from one stream seeded by
    theirs (engine/batched.py): a mask per worker, reproducible, but not the loop's."""
    return mix_seeds(run_seed, worker, step)


def mix_seeds(*parts: int) -> int:
    """One 63-bit seed from several integers, in order (a polynomial hash: different tuples, different seeds)."""
    combined = 0
    for part in parts:
        combined = (combined * 1_000_003 + part) % (2**63 - 1)
    return combined


@contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Torch's random numbers come from ``seed`` inside, and the global stream is left as it was; nothing
    changes where ``seed`` is None."""
    if seed is None:
        yield
        return
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.default_generator.manual_seed(seed)  # not torch.manual_seed: it visits every backend (100 us a call)
        if cuda:
            torch.cuda.manual_seed(seed)
        yield


class GradientEngine:
    """Computes gradients and accuracy for flat parameter vectors on one module."""

    def __init__(self, model: nn.Module, task: Task = DEFAULT_TASK) -> None:
        self.model = model
        self.task = task
        self._params = list(model.parameters())
        self._buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.layout = self._layout(model)
        self.num_params = sum(p.numel() for p in self._params)
        self.num_buffer_values = sum(b.numel() for b in self._buffers)
        self.evaluated: tuple[torch.Tensor, torch.Tensor] | None = None  # the state of the latest evaluation
        self._last_evaluation: LastEvaluation | None = None  # see evaluate
        self.evaluations_skipped = 0  # evaluations answered from the last one (the state had not changed)

    def to(self, device: torch.device) -> GradientEngine:
        """Move the module to ``device``; its buffers become new tensors there, so the engine takes them anew."""
        self.model.to(device)
        self._params = list(self.model.parameters())
        self._buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        return self

    @property
    def device(self) -> torch.device:
        """Where the module computes (its parameters' device)."""
        return self._params[0].device if self._params else torch.device("cpu")

    @staticmethod
    def _layout(model: nn.Module) -> list[TensorSlot]:
        slots, offset = [], 0
        for name, p in model.named_parameters():
            slots.append(TensorSlot(name, tuple(p.shape), offset, p.numel()))
            offset += p.numel()
        return slots

    def initial_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's current parameters and float buffers, flattened."""
        return parameters_to_vector(self._params).detach().cpu().clone(), self._flat_buffers().cpu()

    def _flat_buffers(self) -> torch.Tensor:
        if not self._buffers:
            return torch.zeros(0)
        return torch.cat([b.detach().reshape(-1) for b in self._buffers]).clone()

    def add_to_state(self, params_delta: torch.Tensor, buffers_delta: torch.Tensor) -> None:
        """Add flat deltas to the module's parameters and float buffers in place (their tensors stay the same
        objects, on their device: DDP keeps references to them)."""
        with torch.no_grad():
            for tensor, delta in zip([*self._params, *self._buffers], self._split(params_delta, buffers_delta)):
                tensor.add_(delta.view_as(tensor).to(tensor.device))

    def _split(self, params: torch.Tensor, buffers: torch.Tensor) -> list[torch.Tensor]:
        sizes_p = [p.numel() for p in self._params]
        sizes_b = [b.numel() for b in self._buffers]
        return [*torch.split(params, sizes_p), *(torch.split(buffers, sizes_b) if sizes_b else ())]

    def _load(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        with torch.no_grad():
            vector_to_parameters(params.to(self.device), self._params)
            offset = 0
            for b in self._buffers:
                b.copy_(buffers[offset : offset + b.numel()].view_as(b))  # copy_ crosses devices itself
                offset += b.numel()

    def gradient(
        self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
        seed: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Gradient of the batch loss at ``params``; also the change of the buffers and the loss (on the CPU).
        ``seed``: the random numbers of this computation (dropout) come from it, not the global stream."""
        self._load(params, buffers)
        self.model.train()
        for p in self._params:
            p.grad = None
        device = self.device
        with seeded(seed, device):
            loss = self.task.loss(self.model(x.to(device)), y.to(device))
            loss.backward()
        loss = loss.detach()
        grad = torch.cat([p.grad.reshape(-1) for p in self._params]).cpu()
        buffer_delta = (self._flat_buffers() - buffers.to(device)).cpu() if self._buffers else buffers.cpu()
        return grad, buffer_delta, loss.item()

    @torch.no_grad()
    def evaluate(
        self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch: int | None = None,
        as_model: bool = True,
    ) -> Evaluation:
        """The task's metric, mean loss and accuracy on (x, y); the state is kept as the run's model unless
        ``as_model`` is false (an earlier state, evaluated to refine a time to target). ``batch``:
        examples per forward pass; by default small on the CPU, where a batch that stays in cache is faster
        (benchmarks/results/eval_batch.md: on one core 64 against 1024 evaluates the ResNet 2.3x and the
        transformer 1.5x faster), and large on a GPU. The metric depends on it only at float rounding.

        A state equal to the last one evaluated, on the same examples, gets the last answer without a forward
        pass: between two syncs of local SGD or DiLoCo the evaluated model does not move, and a forward pass of
        the same values gives the same numbers (so a run's records are bit for bit what they were). The test
        examples are recognised as the same objects (nobody changes a test set); the state by value."""
        batch = batch or (EVAL_BATCH_CPU if self.device.type == "cpu" else EVAL_BATCH_DEVICE)
        if as_model:
            self.evaluated = (params, buffers)
        last = self._last_evaluation
        if last is not None and last.answers(params, buffers, x, y, batch):
            self.evaluations_skipped += 1  # the model has not moved since (local SGD and DiLoCo between syncs)
            return last.result
        self._load(params, buffers)
        self.model.eval()
        outputs, targets = [], []
        for start in range(0, len(y), batch):
            outputs.append(self.model(x[start : start + batch].to(self.device)).cpu())
            targets.append(y[start : start + batch])
        evaluation = self.task.judge(outputs, targets)
        # copies: a caller may change its own tensors in place afterwards
        self._last_evaluation = LastEvaluation(params.clone(), buffers.clone(), x, y, batch, evaluation)
        return evaluation

    def state_dict(self, params: torch.Tensor, buffers: torch.Tensor) -> dict[str, torch.Tensor]:
        """The module's own state-dict (its keys, shapes, dtypes) holding these flat parameters and buffers."""
        self._load(params, buffers)
        return {k: v.detach().cpu().clone().contiguous() for k, v in self.model.state_dict().items()}

    def measure_compute_s(self, x: torch.Tensor, y: torch.Tensor, repeats: int = 5) -> float:
        """Median wall seconds of one forward+backward pass on this machine."""
        params, buffers = self.initial_state()
        self.gradient(params, buffers, x, y)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.gradient(params, buffers, x, y)
            times.append(time.perf_counter() - start)
        self._load(params, buffers)
        return sorted(times)[len(times) // 2]


class LastEvaluation(NamedTuple):
    """The state, examples and batch of the latest evaluation, and its result."""

    params: torch.Tensor
    buffers: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    batch: int
    result: Evaluation

    def answers(self, params: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                batch: int) -> bool:
        """Whether ``result`` is this evaluation's too: the same examples (objects), batch and state (values)."""
        return x is self.x and y is self.y and batch == self.batch and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
            for a, b in ((params, self.params), (buffers, self.buffers)))
