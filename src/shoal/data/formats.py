"""Readers for the standard on-disk formats: MNIST IDX, the CIFAR-10 python batches, numpy archives.

Each returns a ``Raw`` (numpy arrays, the shipped test set if the files
have one); ``shoal.data.sources`` splits and normalises it. Every problem
with a file raises ``ConfigError`` with one line naming the file and what is
wrong. The layouts each accepts are listed in ``shoal.data.sources``.
"""

from __future__ import annotations

import gzip
import math
import pickle
import re
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from shoal.errors import ConfigError

CIFAR_CLASSES = 10


class Raw(NamedTuple):
    """What a loader returns before splitting and normalising: numpy arrays."""

    x: np.ndarray  # (N, C, H, W), any real dtype
    y: np.ndarray  # (N,), integer
    x_test: np.ndarray | None = None  # shipped test set, if the source has one
    y_test: np.ndarray | None = None
    num_classes: int | None = None  # None: max label + 1
    normalisation: tuple[float, float] | None = None  # (mean, std) of raw values; None: measured per channel


# ---------------------------------------------------------------- IDX

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when the file starts with the gzip magic (whatever its name)."""
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return data
    except (OSError, EOFError, zlib.error) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """One IDX array; the magic number, dimension count and byte count are all checked."""
    data = _read_bytes(path)
    if len(data) < 4:
        raise ConfigError(f"{path}: truncated IDX header ({len(data)} bytes)")
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES or data[3] != ndim:
        raise ConfigError(
            f"{path}: bad magic number 0x{int.from_bytes(data[:4], 'big'):08x} "
            f"(expected 0x0000XX{ndim:02x} with a known type code XX, e.g. 0x{0x800 + ndim:08x})"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ConfigError(f"{path}: truncated IDX header ({len(data)} bytes, need {header})")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = math.prod(dims) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        problem = "truncated" if found < expected else "has trailing bytes"
        raise ConfigError(f"{path}: {problem}: header {dims} needs {expected} data bytes, file has {found}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


def _find_idx(folder: Path, stem: str) -> Path | None:
    """The file for ``stem`` in ``folder``, plain or gzipped, dash or dot spelling."""
    for name in (stem, stem.replace("-idx", ".idx")):
        for suffix in ("", ".gz"):
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    return None


def _idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    x = read_idx(images, 3)
    y = read_idx(labels, 1)
    if len(x) != len(y):
        raise ConfigError(f"{images}: {len(x)} images but {labels.name} has {len(y)} labels")
    return x[:, None].astype(x.dtype.newbyteorder("=")), y.astype(np.int64)


def load_idx(path: Path) -> Raw:
    """MNIST-style IDX: a directory (train + optional t10k files) or a single images file."""
    if path.is_dir():
        train_x, train_y = _find_idx(path, "train-images-idx3-ubyte"), _find_idx(path, "train-labels-idx1-ubyte")
        if train_x is None or train_y is None:
            raise ConfigError(f"{path}: needs train-images-idx3-ubyte and train-labels-idx1-ubyte (optionally .gz)")
        x, y = _idx_pair(train_x, train_y)
        test_x, test_y = _find_idx(path, "t10k-images-idx3-ubyte"), _find_idx(path, "t10k-labels-idx1-ubyte")
        if (test_x is None) != (test_y is None):
            raise ConfigError(f"{path}: has only one of the t10k images/labels files")
        if test_x is None or test_y is None:
            return Raw(x, y)
        return Raw(x, y, *_idx_pair(test_x, test_y))
    labels = path.with_name(path.name.replace("images", "labels").replace("idx3", "idx1"))
    if labels == path:
        raise ConfigError(f"{path}: cannot derive the labels file name (expected 'images' in the name)")
    if not labels.is_file():
        raise ConfigError(f"{path}: labels file {labels.name} not found beside it")
    return Raw(*_idx_pair(path, labels))


# ---------------------------------------------------------------- CIFAR-10


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """How protocol-2 pickles made by Python 3 spell bytes; only latin-1 is honoured."""
    if encoding.replace("-", "").lower() != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError("_codecs.encode is only allowed with latin-1")
    return text.encode("latin-1")


def _numpy_core() -> Any:
    return getattr(np, "_core", None) or np.core


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """The only callables a CIFAR pickle may name: plain types and numpy array rebuilding."""
    core = _numpy_core()
    allowed: dict[tuple[str, str], Any] = {}
    for module in ("builtins", "__builtin__"):
        for name, obj in (("dict", dict), ("list", list), ("bytes", bytes), ("str", str), ("int", int)):
            allowed[(module, name)] = obj
    for prefix in ("numpy.core", "numpy._core"):
        allowed[(f"{prefix}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        allowed[(f"{prefix}.multiarray", "scalar")] = core.multiarray.scalar
        allowed[(f"{prefix}.numeric", "_frombuffer")] = core.numeric._frombuffer
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    allowed[("_codecs", "encode")] = _latin1_encode
    return allowed


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global outside a short allow-list, so loading never runs code."""

    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name} (only plain data and numpy arrays are allowed)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


def safe_unpickle(path: Path) -> Any:
    """Read one pickle file through SafeUnpickler (bytes keys kept, as in the CIFAR files)."""
    try:
        with path.open("rb") as handle:
            return SafeUnpickler(handle, encoding="bytes").load()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None
    except Exception as err:  # malformed pickles fail in many ways; all are bad input
        raise ConfigError(f"{path}: not a valid CIFAR-10 batch: {type(err).__name__}: {err}") from None


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file: a dict with b"data" uint8 (n, 3072) and b"labels" (n ints)."""
    batch = safe_unpickle(path)
    if not isinstance(batch, dict):
        raise ConfigError(f"{path}: expected a dict, got {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ConfigError(f"{path}: missing the 'data' or 'labels' entry")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", type(data).__name__)
        raise ConfigError(f"{path}: 'data' must be a uint8 array of shape (n, 3072), got {shape}")
    try:
        y = np.asarray(labels)
    except Exception:  # ragged or odd objects
        raise ConfigError(f"{path}: 'labels' is not a list of integers") from None
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise ConfigError(f"{path}: 'labels' must be a list of integers")
    if len(y) != len(data):
        raise ConfigError(f"{path}: {len(data)} images but {len(y)} labels")
    if len(y) and (y.min() < 0 or y.max() >= CIFAR_CLASSES):
        raise ConfigError(f"{path}: labels must lie in 0..{CIFAR_CLASSES - 1}")
    return data.reshape(-1, 3, 32, 32), y.astype(np.int64)


def load_cifar10(path: Path) -> Raw:
    """The CIFAR-10 python batches; ``test_batch`` becomes the test set when present."""
    if (path / "cifar-10-batches-py").is_dir():
        path = path / "cifar-10-batches-py"
    if not path.is_dir():
        raise ConfigError(f"{path}: expected a directory of CIFAR-10 python batches")
    batches = sorted(
        (p for p in path.iterdir() if re.fullmatch(r"data_batch_\d+", p.name)),
        key=lambda p: int(p.name.rsplit("_", 1)[1]),
    )
    if not batches:
        raise ConfigError(f"{path}: no data_batch_1 .. data_batch_5 files")
    parts = [_cifar_batch(p) for p in batches]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    test = path / "test_batch"
    if not test.is_file():
        return Raw(x, y, num_classes=CIFAR_CLASSES)
    return Raw(x, y, *_cifar_batch(test), num_classes=CIFAR_CLASSES)


# ---------------------------------------------------------------- npz


def _as_nchw(x: np.ndarray, what: str) -> np.ndarray:
    """Accept the common image layouts and return (N, C, H, W)."""
    if x.ndim == 2:
        side = math.isqrt(x.shape[1])
        if side * side != x.shape[1] or side == 0:
            raise ConfigError(f"{what}: flat images of {x.shape[1]} values are not square")
        return x.reshape(-1, 1, side, side)
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4:
        channels_last = x.shape[-1] <= 4 and x.shape[1] > 4
        return x.transpose(0, 3, 1, 2) if channels_last else x
    raise ConfigError(f"{what}: images must have 2, 3 or 4 dimensions, got shape {x.shape}")


def load_npz(path: Path) -> Raw:
    """A numpy archive with x/y or x_train/y_train[/x_test/y_test]; pickled objects are refused."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zlib.error) as err:
        raise ConfigError(f"{path}: not a readable .npz archive: {err}") from None
    except Exception as err:  # zipfile.BadZipFile and friends
        raise ConfigError(f"{path}: not a readable .npz archive: {type(err).__name__}: {err}") from None
    if "x" in arrays and "y" in arrays:
        return Raw(_as_nchw(arrays["x"], f"{path}: x"), arrays["y"])
    if "x_train" not in arrays or "y_train" not in arrays:
        raise ConfigError(f"{path}: needs arrays x and y, or x_train and y_train (has {sorted(arrays)})")
    x, y = _as_nchw(arrays["x_train"], f"{path}: x_train"), arrays["y_train"]
    has_test = ("x_test" in arrays, "y_test" in arrays)
    if has_test == (False, False):
        return Raw(x, y)
    if has_test != (True, True):
        raise ConfigError(f"{path}: has only one of x_test and y_test")
    return Raw(x, y, _as_nchw(arrays["x_test"], f"{path}: x_test"), arrays["y_test"])
