"""Small VGG-11 with batch norm: the VGG-11 layout at a quarter of the usual channel widths.

Widths 16-32-64-64-128-128-128-128 instead of 64..512 keep it about 16x
cheaper, so CPU runs stay reasonable while the depth and shape of VGG (and
its very different layer-size profile from ResNet) are kept. A max pool is
only kept while the feature map is still at least 2x2, and an adaptive
average pool feeds the classifier, so 8x8 to 32x32 inputs all work.
"""

from __future__ import annotations

import torch
from torch import nn


# VGG-11 ("A"): numbers are conv widths at full scale, "M" is a 2x2 max pool.
VGG11_LAYOUT: list[int | str] = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


class VGG(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, width_scale: float = 0.25) -> None:
        super().__init__()
        channels, height, width = input_shape
        size = min(height, width)
        layers: list[nn.Module] = []
        for item in VGG11_LAYOUT:
            if item == "M":
                if size >= 2:
                    layers.append(nn.MaxPool2d(2))
                    size //= 2
                continue
            out = max(1, round(int(item) * width_scale))
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.features(x))
        return self.classifier(torch.flatten(out, 1))


def vgg11(input_shape: tuple[int, int, int], num_classes: int, *, hidden: list[int] | None = None) -> nn.Module:
    """Registry entry; ``hidden`` belongs to the mlp and is ignored here."""
    return VGG(input_shape, num_classes)
