"""A user's own model for shoal: any function that returns a torch.nn.Module.

    shoal train --config examples/mnist_bsp.toml --set model.name=python:examples/plugins/small_cnn.py:build

shoal calls ``build(input_shape=(C, H, W), num_classes=K, **model.options)``.
"""

from __future__ import annotations

from torch import nn


def build(input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> nn.Module:
    channels, height, width_px = input_shape
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Linear(2 * width * 4, num_classes),
    )
