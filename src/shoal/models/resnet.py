"""CIFAR-style ResNet-18: 3x3 stem conv, no max pool, BasicBlocks [2, 2, 2, 2] of widths 64..512.

Adaptive average pooling at the end makes the same network work on 8x8
digits, 28x28 MNIST and 32x32 CIFAR-shaped inputs (spatial size just
bottoms out at 1x1 on tiny inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._C._functorch import is_functorch_wrapped_tensor

from shoal.errors import ConfigError


class BasicBlock(nn.Module):
    """Two 3x3 convs with batch norm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...] = (64, 128, 256, 512),
                 channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        blocks: list[nn.Module] = []
        in_planes = widths[0]
        for stage, planes in enumerate(widths):
            for i in range(2):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NHWC activations: faster CPU convolutions. Not under torch.func (the batched simulator's vmap), which
        # has no NHWC: it computes the same network in the default layout.
        if self.channels_last and x.dim() == 4 and not is_functorch_wrapped_tensor(x):
            x = x.contiguous(memory_format=torch.channels_last)
        out = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(out, 1))


def resnet18(input_shape: tuple[int, int, int], num_classes: int, *, hidden: list[int] | None = None,
             width: int = 64, channels_last: bool = False) -> nn.Module:
    """Registry entry; ``hidden`` belongs to the mlp and is ignored here. ``width`` (model.options) is the first
    stage's width, doubled per stage: 64 is the standard ResNet-18 (11.2 M parameters, about 1.3 s per gradient of
    32 CIFAR images on one CPU core); 16 keeps every layer, block and batch norm at 1/16 of the work (0.7 M).
    ``channels_last`` computes on NHWC activations (the parameters keep their layout): the same network, whose
    CPU convolutions are faster (benchmarks/conv_layout.py), in another order of float additions."""
    if not isinstance(width, int) or width < 1:
        raise ConfigError(f"model.options.width: a whole number >= 1, got {width!r}")
    if not isinstance(channels_last, bool):
        raise ConfigError(f"model.options.channels_last: true or false, got {channels_last!r}")
    return ResNet18(input_shape[0], num_classes, tuple(width * 2**i for i in range(4)), channels_last)
