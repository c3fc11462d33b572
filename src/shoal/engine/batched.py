"""Many workers' gradients in one call: torch.func's vmap over the gradient of a functional call.

The simulator computes one forward/backward per worker; on a GPU that loop
leaves the device idle, so the batched path stacks the pending workers'
flat parameters ([N, P], or one [P] shared by all when they hold the same
version) and their mini-batches, and computes every gradient, loss and
batch-norm buffer change at once. Inside the vmapped function the flat
vector is cut into views shaped like the module's parameters; each float
buffer is cloned from its slice (a view of one flat tensor would lose the
in-place running-statistics update) and integer buffers
(``num_batches_tracked``) are made fresh inside the call, because vmap
cannot write into the module's own. Requests of different batch sizes
(balanced batches: each worker's in proportion to its speed) share a call
padded to the largest, each sample weighted 1 (or 0 where padded) in the
mean of the task's per-sample losses, so the gradient is the unpadded
mean's; batch norm computes its statistics over the real samples only
(engine/masked_norm.py). Not where the loss is the user's (only its mean
is known) or a batch-norm layer is not torch's own: there each batch size
gets its own calls.
``limit`` caps the workers per call, and a call that runs out of device
memory is retried in halves (the limit stays halved for the rest of the run).

A result equals the loop's to float rounding, not bitwise: a vmapped
kernel sums in another order (tests/test_batched.py: float64 within 1e-10).
Dropout draws a mask per worker (vmap's ``randomness="different"``) from one
stream seeded by the call's requests, so a rerun repeats it; the loop seeds
each worker's masks on their own, so the two paths draw different masks
(equal in distribution, not in value).
Models that vmap cannot take (``.item()`` or data-dependent control flow in
forward, in-place writes to captured tensors, some RNN kernels) raise on
the first call; ``BatchedGradients`` then says why and the caller falls back
to the loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from shoal.engine.gradients import GradientEngine, mix_seeds, seeded
from shoal.engine.masked_norm import SampleWeights, can_mask, masked_copy


@dataclass
class Request:
    """One worker's pending gradient: the values it computes on and its mini-batch."""

    params: torch.Tensor
    buffers: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    seed: int | None = None  # its random numbers' (dropout's) seed: engine/gradients.py's worker_seed


Result = tuple[torch.Tensor, torch.Tensor, float]  # gradient, buffer change, loss: GradientEngine.gradient's


def call_seed(requests: list[Request]) -> int | None:
    """One seed for a vmapped call, from its requests' own: vmap draws every worker's random numbers from one
    stream (``randomness="different"``: a mask per worker), so the call's seed is what a rerun must repeat."""
    seeds = [r.seed for r in requests]
    if all(s is None for s in seeds):
        return None
    return mix_seeds(*(0 if s is None else s for s in seeds))


class BatchedGradients:
    """Computes a list of requests in as few vmapped calls as their batch shapes and ``limit`` allow."""

    def __init__(self, engine: GradientEngine, limit: int = 64) -> None:
        self.engine = engine
        self.limit = limit
        model = engine.model
        self._param_names = [s.name for s in engine.layout]
        self._param_shapes = [s.shape for s in engine.layout]
        self._param_sizes = [s.numel for s in engine.layout]
        named = dict(model.named_buffers())
        self._float_buffers = [(n, tuple(b.shape)) for n, b in named.items() if b.is_floating_point()]
        self._int_buffers = [(n, b.dtype, tuple(b.shape)) for n, b in named.items() if not b.is_floating_point()]
        # pad unequal batches where the loss is known per sample and batch norm (if any) can leave the padding out
        self._weights = SampleWeights()
        self.pads = engine.task.per_sample is not None and can_mask(model)
        self._padded_model = masked_copy(model, self._weights) if self.pads else model
        self.calls = 0  # vmapped calls made
        self.largest = 0  # the most requests one call computed

    def compute(self, requests: list[Request]) -> list[Result]:
        """Every request's gradient, buffer change and loss, in the order given."""
        results: list[Result | None] = [None] * len(requests)
        by_shape: dict[tuple[Any, ...], list[int]] = {}
        first = 1 if self.pads else 0  # padding: the batch dimension may differ within a call
        for i, r in enumerate(requests):
            key = (tuple(r.x.shape[first:]), tuple(r.y.shape[first:]), r.x.dtype, r.y.dtype)
            by_shape.setdefault(key, []).append(i)
        for indices in by_shape.values():
            indices.sort(key=lambda i: -len(requests[i].x))  # similar sizes share a call: less padding (stable)
            start = 0
            while start < len(indices):
                chunk = indices[start : start + self.limit]
                try:
                    computed = self._call([requests[i] for i in chunk])
                except torch.OutOfMemoryError:
                    if len(chunk) == 1:
                        raise
                    self.limit = len(chunk) // 2  # the device's memory is the bound: halve the calls from now on
                    if self.engine.device.type == "cuda":
                        torch.cuda.empty_cache()
                    continue
                for i, result in zip(chunk, computed):
                    results[i] = result
                start += len(chunk)
        return [r for r in results if r is not None]

    def _call(self, requests: list[Request]) -> list[Result]:
        from torch.func import grad_and_value, vmap

        first, device = requests[0], self.engine.device
        shared = all(r.params is first.params for r in requests)  # one version: pass it once, not stacked
        params = (first.params if shared else torch.stack([r.params for r in requests])).to(device)
        buffers = torch.stack([r.buffers for r in requests]).to(device)
        sizes = [len(r.x) for r in requests]
        largest = max(sizes)
        x = torch.stack([_padded(r.x, largest) for r in requests]).to(device)
        y = torch.stack([_padded(r.y, largest) for r in requests]).to(device)
        inputs: tuple[torch.Tensor, ...] = (params, buffers, x, y)
        loss = self._loss
        self.engine.model.train()
        if len(set(sizes)) > 1:  # equal batches keep the unweighted mean: the same kernels as without padding
            weights = torch.tensor([[1.0] * n + [0.0] * (largest - n) for n in sizes], dtype=params.dtype)
            inputs, loss = inputs + (weights.to(device),), self._weighted_loss
            self._padded_model.train()
        step = vmap(grad_and_value(loss, has_aux=True), in_dims=(None if shared else 0,) + (0,) * (len(inputs) - 1),
                    randomness="different")
        with warnings.catch_warnings(), seeded(call_seed(requests), device):
            # CPU attention has no batching rule: vmap loops it, and says so each call
            warnings.filterwarnings("ignore", message="There is a performance drop", category=UserWarning)
            grads, (losses, buffer_deltas) = step(*inputs)
        self.calls += 1
        self.largest = max(self.largest, len(requests))
        grads, buffer_deltas, losses = grads.detach().cpu(), buffer_deltas.detach().cpu(), losses.detach().cpu()
        return [(grads[i], buffer_deltas[i], float(losses[i])) for i in range(len(requests))]

    def _loss(self, flat: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor,
              y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One worker's loss at ``flat`` (vmapped: no worker dimension here), with its buffer change as aux."""
        return self._forward(self.engine.model, flat, buffers, x, lambda output: self.engine.task.loss(output, y))

    def _weighted_loss(self, flat: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                       weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``_loss`` of a padded batch: the mean of the per-sample losses over the samples weighted 1 (batch norm,
        if any, computes its statistics over those samples only: engine/masked_norm.py)."""
        per_sample = self.engine.task.per_sample
        assert per_sample is not None, "padded only where the task has per-sample losses"
        self._weights.weights = weights  # this worker's, read by the masked batch norm during the call below
        return self._forward(self._padded_model, flat, buffers, x,
                             lambda output: (per_sample(output, y) * weights).sum() / weights.sum())

    def _forward(self, model: torch.nn.Module, flat: torch.Tensor, buffers: torch.Tensor, x: torch.Tensor,
                 loss_of: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``model`` on ``x`` at ``flat`` and ``buffers``: ``loss_of(output)``, and the buffer change as aux."""
        from torch.func import functional_call

        params = {name: piece.view(shape) for name, piece, shape in
                  zip(self._param_names, torch.split(flat, self._param_sizes), self._param_shapes)}
        sizes = [int(torch.Size(shape).numel()) for _, shape in self._float_buffers]
        pieces = torch.split(buffers, sizes) if sizes else ()
        state = {name: piece.view(shape).clone() for (name, shape), piece in zip(self._float_buffers, pieces)}
        state.update({name: torch.zeros(shape, dtype=dtype, device=flat.device)
                      for name, dtype, shape in self._int_buffers})
        loss = loss_of(functional_call(model, {**params, **state}, (x,)))
        after = torch.cat([state[name].reshape(-1) for name, _ in self._float_buffers]) if sizes else buffers
        return loss, (after.detach() - buffers if sizes else buffers)


def _padded(t: torch.Tensor, size: int) -> torch.Tensor:
    """``t`` with zeros appended along its first (sample) dimension up to ``size`` (weighted 0 where used)."""
    if len(t) == size:
        return t
    return torch.cat([t, t.new_zeros((size - len(t), *t.shape[1:]))])
