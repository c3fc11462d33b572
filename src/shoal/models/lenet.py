"""LeNet-5 (conv5-pool-conv5-pool-fc120-fc84-fc), adapted to any input of at least 4x4.

Modern variant: ReLU and max pooling instead of tanh and average
subsampling, because it trains much faster with plain SGD. The classic net
expects 32x32 inputs; smaller inputs are padded inside the convolutions:
the first conv pads by 2 when the input is under 32 pixels (the usual
trick for 28x28 MNIST, which then gives the classic 16x5x5 = 400 features),
the second pads by 2 when its input is too small for a valid 5x5 conv and
a pool. The flattened size comes from a dummy forward, so nothing is
hard-coded.
"""

from __future__ import annotations

import torch
from torch import nn


def _pad_for(size: int, threshold: int) -> int:
    return 2 if size < threshold else 0


class LeNet5(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        small = min(height, width)
        pad1 = _pad_for(small, 32)
        after1 = (small + 2 * pad1 - 4) // 2
        pad2 = _pad_for(after1, 6)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5, padding=pad1),
            nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(6, 16, 5, padding=pad2),
            nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.features(torch.zeros(1, *input_shape)).shape[1]
        self.classifier = nn.Sequential(
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def lenet5(input_shape: tuple[int, int, int], num_classes: int, *, hidden: list[int] | None = None) -> nn.Module:
    """Registry entry; ``hidden`` belongs to the mlp and is ignored here."""
    return LeNet5(input_shape, num_classes)
