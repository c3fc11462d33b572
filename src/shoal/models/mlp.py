"""Multi-layer perceptron: flatten, then Linear + ReLU per hidden width, then the output layer.

The cheapest model, for fast experiments where the scheme matters more
than the architecture.
"""

from __future__ import annotations

import math

from torch import nn


DEFAULT_HIDDEN = [256, 128]


def mlp(input_shape: tuple[int, ...], num_classes: int, *, hidden: list[int] | None = None) -> nn.Module:
    widths = list(DEFAULT_HIDDEN if hidden is None else hidden)
    layers: list[nn.Module] = [nn.Flatten()]
    previous = math.prod(input_shape)
    for width in widths:
        layers += [nn.Linear(previous, width), nn.ReLU()]
        previous = width
    layers.append(nn.Linear(previous, num_classes))
    return nn.Sequential(*layers)


mlp.any_input_shape = True  # it flattens: any sample shape will do
