"""Batch norm that counts only some of a batch's samples, so that the batched simulator can pad unequal batches.

A padded batch (engine/batched.py) holds each worker's samples and then
zeros up to the largest batch of the call. The loss weights the padding 0,
but batch norm would still take it into its batch statistics and shift
every real sample's output. ``masked_copy`` gives a copy of the model whose
``nn.BatchNorm1d/2d/3d`` layers compute their mean and variance over the
samples weighted 1 only, and update the running statistics with those, as
torch's layer does with the real batch alone (to float rounding: the sums
run in another order). Parameter and buffer names are the original's, so
``torch.func.functional_call`` takes the same state dict.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

STANDARD = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class SampleWeights:
    """What the masked layers read: the current call's per-sample weights (1: a real sample, 0: padding)."""

    weights: torch.Tensor | None = None


def can_mask(model: nn.Module) -> bool:
    """Whether every layer that mixes a batch's samples is one ``masked_copy`` replaces: torch's own batch norm
    (exactly, not a subclass with its own forward), tracking running statistics with a fixed momentum."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if type(module) not in STANDARD or not module.track_running_stats or module.momentum is None:
                return False
    return True


def masked_copy(model: nn.Module, weights: SampleWeights) -> nn.Module:
    """A deep copy of ``model`` with every batch-norm layer replaced by one that reads ``weights``; ``model``
    itself when it has none (nothing to mask, nothing to copy)."""
    if not any(type(m) in STANDARD for m in model.modules()):
        return model
    copied = copy.deepcopy(model)
    for name, module in list(copied.named_modules()):
        if type(module) in STANDARD:
            parent_name, _, child = name.rpartition(".")
            setattr(copied.get_submodule(parent_name) if parent_name else copied, child,
                    MaskedBatchNorm(module, weights))
    return copied


class MaskedBatchNorm(nn.Module):
    """Training-mode batch norm over the samples ``weights`` marks 1 (the batched path never evaluates)."""

    def __init__(self, layer: nn.modules.batchnorm._BatchNorm, weights: SampleWeights) -> None:
        super().__init__()
        self.eps, self.momentum, self.sample_weights = layer.eps, float(layer.momentum or 0.0), weights
        self.weight, self.bias = layer.weight, layer.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            self.register_buffer(name, getattr(layer, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.sample_weights.weights
        assert w is not None, "a masked batch norm runs inside a padded call, which sets the weights"
        per_channel = [1, -1] + [1] * (x.dim() - 2)  # broadcast a (C,) statistic over (N, C, ...)
        dims = [0] + list(range(2, x.dim()))
        w = w.reshape([-1] + [1] * (x.dim() - 1))
        count = w.sum() * (x[0, 0].numel())  # values per channel in the real samples
        mean = (x * w).sum(dims) / count
        centered = x - mean.reshape(per_channel)
        var = (centered.square() * w).sum(dims) / count
        y = centered * torch.rsqrt(var + self.eps).reshape(per_channel)
        if self.weight is not None:
            y = y * self.weight.reshape(per_channel) + self.bias.reshape(per_channel)
        m = self.momentum
        self.running_mean.mul_(1 - m).add_(m * mean.detach())
        self.running_var.mul_(1 - m).add_(m * (var * count / (count - 1)).detach())  # unbiased, as torch's
        self.num_batches_tracked.add_(1)
        return y
