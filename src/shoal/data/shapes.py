"""``shapes``: an offline, CIFAR-shaped stand-in for CIFAR-10, generated deterministically from the seed.

What it is: 10 classes of filled and outlined shapes (disk, square, triangle,
plus, ring, diamond, bar, hollow square, two dots, L) on 32x32 RGB images.
Every nuisance a convolutional network must learn to ignore is random per
image: position, size (radius 5..11 pixels), rotation (+-25 degrees, so a
plus stays distinct from an X), the foreground and background colours, a
linear background gradient, a distractor blob and pixel noise. The class is
in the shape alone, so a linear model on pixels does poorly while a small
ConvNet with batch norm learns it (docs/workloads.md has the measured
linear-probe accuracy, the ResNet's curve and its iterations to target).

What it is not: natural images. It has no textures, no object categories
and no label noise, and its difficulty curve differs from CIFAR-10's;
results on it say how schemes compare on a BN image workload of known
difficulty, not what CIFAR-10 accuracy they would reach. With the CIFAR-10
python batches on disk, ``data.name = "cifar10:PATH"`` trains on the real
thing.

Size: ``data.synthetic_samples`` images (default 4,000; the BN workload uses
25,000: 20,000 to train and 5,000 to test with ``data.test_fraction = 0.2``).
"""

from __future__ import annotations

import numpy as np

from shoal.data.formats import Raw
from shoal.errors import ConfigError

SIDE = 32
CLASSES = ("disk", "square", "triangle", "plus", "ring", "diamond", "bar", "hollow square", "two dots", "L")
_PURPOSE = 5
_CHUNK = 2048


def shapes(seed: int, samples: int) -> Raw:
    """``samples`` images and labels, the same for the same seed (generated in chunks: memory stays small)."""
    if samples < 2:
        raise ConfigError(f"synthetic_samples must be at least 2, got {samples}")
    rng = np.random.default_rng([seed % 2**64, _PURPOSE])
    y = rng.permutation(np.arange(samples) % len(CLASSES))
    x = np.empty((samples, 3, SIDE, SIDE), dtype=np.float32)
    for start in range(0, samples, _CHUNK):
        x[start:start + _CHUNK] = render(y[start:start + _CHUNK], rng)
    return Raw(x, y.astype(np.int64), num_classes=len(CLASSES))


def render(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images (n, 3, 32, 32) of the given classes with every nuisance drawn from ``rng``."""
    n = len(labels)
    r = rng.uniform(5.0, 11.0, n)[:, None, None]
    cx, cy = (rng.uniform(r[:, 0, 0] + 1, SIDE - r[:, 0, 0] - 1)[:, None, None] for _ in range(2))
    theta = rng.uniform(-25, 25, n)[:, None, None] * np.pi / 180
    grid = np.arange(SIDE, dtype=np.float64)
    gy, gx = np.meshgrid(grid, grid, indexing="ij")
    dx, dy = gx[None] - cx, gy[None] - cy
    u = (np.cos(theta) * dx + np.sin(theta) * dy) / r  # shape coordinates: the shape spans about [-1, 1]
    v = (-np.sin(theta) * dx + np.cos(theta) * dy) / r
    mask = np.zeros((n, SIDE, SIDE), dtype=bool)
    for k, draw in enumerate(_SHAPES):
        rows = labels == k
        if rows.any():
            mask[rows] = draw(u[rows], v[rows])
    background = rng.uniform(0, 1, (n, 3, 1, 1))
    foreground = np.clip(background + rng.choice([-1, 1], (n, 3, 1, 1)) * rng.uniform(0.25, 0.6, (n, 3, 1, 1)), 0, 1)
    slope = rng.normal(0, 0.01, (n, 3, 2))
    image = background + slope[..., 0, None, None] * (gx - SIDE / 2) + slope[..., 1, None, None] * (gy - SIDE / 2)
    image = np.where(mask[:, None], foreground, image)
    blob = _blob(n, gx, gy, rng)
    image = image + blob[:, None] * rng.uniform(-0.3, 0.3, (n, 3, 1, 1))
    image += rng.normal(0, 0.12, image.shape)
    return np.clip(image * 255, 0, 255).astype(np.float32)


def _blob(n: int, gx: np.ndarray, gy: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A soft Gaussian distractor at a random place: clutter that belongs to no class."""
    bx, by = rng.uniform(0, SIDE, (2, n, 1, 1))
    width = rng.uniform(2, 5, (n, 1, 1))
    return np.exp(-((gx[None] - bx) ** 2 + (gy[None] - by) ** 2) / (2 * width**2))


_SHAPES = (
    lambda u, v: u**2 + v**2 < 0.8,                                                   # disk
    lambda u, v: np.maximum(abs(u), abs(v)) < 0.75,                                   # square
    lambda u, v: (v < 0.6) & (v > 1.7 * abs(u) - 0.9),                                # triangle
    lambda u, v: ((abs(u) < 0.28) & (abs(v) < 0.95)) | ((abs(v) < 0.28) & (abs(u) < 0.95)),  # plus
    lambda u, v: (u**2 + v**2 < 0.95) & (u**2 + v**2 > 0.4),                          # ring
    lambda u, v: abs(u) + abs(v) < 0.95,                                              # diamond
    lambda u, v: (abs(v) < 0.25) & (abs(u) < 0.95),                                   # bar
    lambda u, v: (np.maximum(abs(u), abs(v)) < 0.85) & (np.maximum(abs(u), abs(v)) > 0.55),  # hollow square
    lambda u, v: ((u - 0.5) ** 2 + v**2 < 0.14) | ((u + 0.5) ** 2 + v**2 < 0.14),     # two dots
    lambda u, v: ((abs(u + 0.55) < 0.25) & (abs(v) < 0.9)) | ((abs(v - 0.65) < 0.25) & (abs(u) < 0.8)),  # L
)
