"""The loaders for files users bring: MNIST IDX (plain and gzip), CIFAR-10 python batches (pickles read with
only the globals they need) and numpy archives, each with the malformed inputs it must refuse in one line."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.config import ConfigError
from shoal.data import load_dataset

# ---------------------------------------------------------------- IDX


def _idx_bytes(arr: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _write(path: Path, payload: bytes, gz: bool) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)
    return path


def _images(n: int, side: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, side, side), dtype=np.uint8)


def _write_idx_dir(folder: Path, n: int, gz: bool, test: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, y = _images(n), np.arange(n, dtype=np.uint8) % 3
    _write(folder / "train-images-idx3-ubyte", _idx_bytes(x), gz)
    _write(folder / "train-labels-idx1-ubyte", _idx_bytes(y), gz)
    if test:
        _write(folder / "t10k-images-idx3-ubyte", _idx_bytes(_images(test, seed=1)), gz)
        _write(folder / "t10k-labels-idx1-ubyte", _idx_bytes(np.arange(test, dtype=np.uint8) % 3), gz)
    return x, y


@pytest.mark.parametrize("gz", [False, True])
def test_idx_directory_is_split(tmp_path: Path, gz: bool) -> None:
    x, y = _write_idx_dir(tmp_path, 20, gz)
    data = load_dataset(f"idx:{tmp_path}", seed=0, test_fraction=0.25)
    assert data.input_shape == (1, 6, 6)
    assert data.num_classes == 3
    assert len(data.y_train) == 15 and len(data.y_test) == 5
    assert sorted(torch.cat([data.y_train, data.y_test]).tolist()) == sorted(y.tolist())


@pytest.mark.parametrize("gz", [False, True])
def test_idx_directory_uses_shipped_test_set(tmp_path: Path, gz: bool) -> None:
    _write_idx_dir(tmp_path, 20, gz, test=7)
    data = load_dataset(f"idx:{tmp_path}", seed=0, test_fraction=0.5)
    assert len(data.y_train) == 20 and len(data.y_test) == 7


def test_idx_single_images_file(tmp_path: Path) -> None:
    x, y = _images(12), np.arange(12, dtype=np.uint8) % 4
    images = _write(tmp_path / "fashion-images-idx3-ubyte", _idx_bytes(x), gz=True)
    _write(tmp_path / "fashion-labels-idx1-ubyte", _idx_bytes(y), gz=True)
    data = load_dataset(f"idx:{images}", seed=0, test_fraction=0.25)
    assert (len(data.y_train), len(data.y_test), data.num_classes) == (9, 3, 4)


def test_idx_pixels_survive_normalisation(tmp_path: Path) -> None:
    x, _ = _write_idx_dir(tmp_path, 10, gz=False, test=2)
    data = load_dataset(f"idx:{tmp_path}", seed=0, test_fraction=0.2)
    flat = x.astype(np.float64)
    expected = (flat - flat.mean()) / flat.std()
    assert np.allclose(data.x_train[:, 0].numpy(), expected, atol=1e-4)


def _expect_error(spec: str, *fragments: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_dataset(spec, seed=0, test_fraction=0.2)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


@pytest.mark.parametrize("gz", [False, True])
def test_idx_bad_magic(tmp_path: Path, gz: bool) -> None:
    _write_idx_dir(tmp_path, 8, gz)
    labels = _idx_bytes(np.zeros(8))
    _write(tmp_path / "train-labels-idx1-ubyte", b"\x08\x00" + labels[2:], gz)
    _expect_error(f"idx:{tmp_path}", "bad magic number", "train-labels-idx1-ubyte")


def test_idx_images_with_labels_magic(tmp_path: Path) -> None:
    _write_idx_dir(tmp_path, 8, gz=False)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(_idx_bytes(np.zeros(8)))  # a 1-d file
    _expect_error(f"idx:{tmp_path}", "bad magic number", "train-images-idx3-ubyte")


@pytest.mark.parametrize("gz", [False, True])
def test_idx_truncated(tmp_path: Path, gz: bool) -> None:
    x, _ = _write_idx_dir(tmp_path, 8, gz)
    _write(tmp_path / "train-images-idx3-ubyte", _idx_bytes(x)[:-5], gz)
    _expect_error(f"idx:{tmp_path}", "truncated", "train-images-idx3-ubyte")


def test_idx_truncated_header(tmp_path: Path) -> None:
    _write_idx_dir(tmp_path, 8, gz=False)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03\x00\x00")
    _expect_error(f"idx:{tmp_path}", "truncated IDX header")


def test_idx_corrupt_gzip(tmp_path: Path) -> None:
    _write_idx_dir(tmp_path, 8, gz=True)
    gz_file = tmp_path / "train-images-idx3-ubyte.gz"
    gz_file.write_bytes(gz_file.read_bytes()[:20])
    _expect_error(f"idx:{tmp_path}", "cannot read", "train-images-idx3-ubyte.gz")


def test_idx_count_mismatch(tmp_path: Path) -> None:
    _write_idx_dir(tmp_path, 8, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(7)))
    _expect_error(f"idx:{tmp_path}", "8 images", "7 labels")


def test_idx_empty(tmp_path: Path) -> None:
    _write_idx_dir(tmp_path, 0, gz=False)
    _expect_error(f"idx:{tmp_path}", "empty")


def test_idx_missing_files(tmp_path: Path) -> None:
    _expect_error(f"idx:{tmp_path}", "train-images-idx3-ubyte", str(tmp_path))
    _write_idx_dir(tmp_path, 8, gz=False)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(_idx_bytes(_images(2)))
    _expect_error(f"idx:{tmp_path}", "only one of the t10k")
    lone = tmp_path / "lonely-images-idx3-ubyte"
    lone.write_bytes(_idx_bytes(_images(2)))
    _expect_error(f"idx:{lone}", "lonely-labels-idx1-ubyte not found")


# ---------------------------------------------------------------- CIFAR-10


def _cifar_batch(n: int, seed: int = 0) -> dict[bytes, object]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    return {b"batch_label": b"training batch", b"labels": [int(v) for v in rng.integers(0, 10, n)], b"data": data}


def _dump(path: Path, obj: object, protocol: int = 2) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batches_with_test_batch(tmp_path: Path, protocol: int) -> None:
    _dump(tmp_path / "data_batch_1", _cifar_batch(6, 1), protocol)
    _dump(tmp_path / "data_batch_2", _cifar_batch(4, 2), protocol)
    _dump(tmp_path / "test_batch", _cifar_batch(3, 3), protocol)
    data = load_dataset(f"cifar10:{tmp_path}", seed=0, test_fraction=0.5)
    assert data.input_shape == (3, 32, 32) and data.num_classes == 10
    assert len(data.y_train) == 10 and len(data.y_test) == 3
    expected = _cifar_batch(6, 1)[b"labels"] + _cifar_batch(4, 2)[b"labels"]
    assert data.y_train.tolist() == expected


def test_cifar_without_test_batch_is_split(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    _dump(folder / "data_batch_1", _cifar_batch(10), 4)
    data = load_dataset(f"cifar10:{tmp_path}", seed=0, test_fraction=0.2)
    assert len(data.y_train) == 8 and len(data.y_test) == 2


def test_cifar_python2_pickle_as_shipped(tmp_path: Path) -> None:
    """The real files are Python 2 pickles: numpy.core globals and byte strings (BINSTRING)."""
    pixels = (np.arange(2 * 3072) % 256).astype(np.uint8).tobytes()
    payload = (
        b"\x80\x02}q\x01(U\x04dataq\x02cnumpy.core.multiarray\n_reconstruct\nq\x03cnumpy\nndarray\nq\x04"
        b"K\x00\x85U\x01b\x87Rq\x05(K\x01K\x02M\x00\x0c\x86cnumpy\ndtype\nq\x06U\x02u1K\x00K\x01\x87Rq\x07"
        b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89T" + struct.pack("<I", len(pixels)) + pixels
        + b"tbU\x06labelsq\x08]q\t(K\x03K\x07eu."
    )
    (tmp_path / "data_batch_1").write_bytes(payload)
    (tmp_path / "test_batch").write_bytes(payload)
    data = load_dataset(f"cifar10:{tmp_path}", seed=0, test_fraction=0.2)
    assert data.y_train.tolist() == [3, 7] and data.y_test.tolist() == [3, 7]
    assert data.input_shape == (3, 32, 32)


class _Evil:
    """Pickles as a call to os.system: loading it unrestricted would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


class _EvalEvil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return eval, ("1 + 1",)


@pytest.mark.parametrize("protocol", [2, 4])
def test_cifar_refuses_forbidden_globals(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    batch = _cifar_batch(2)
    batch[b"data"] = _Evil(marker)
    _dump(tmp_path / "data_batch_1", batch, protocol)
    message = _expect_error(f"cifar10:{tmp_path}", "refusing to load global", "system", "data_batch_1")
    assert "posix" in message or "nt" in message
    assert not marker.exists()
    batch[b"data"] = _EvalEvil()
    _dump(tmp_path / "data_batch_1", batch, protocol)
    _expect_error(f"cifar10:{tmp_path}", "refusing to load global", "builtin", "eval")


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda b: b.update({b"labels": b[b"labels"][:-1]}), "5 images but 4 labels"),
        (lambda b: b.update({b"data": b[b"data"][:, :100]}), "shape (n, 3072)"),
        (lambda b: b.update({b"data": b[b"data"].astype(np.float32)}), "uint8"),
        (lambda b: b.pop(b"labels"), "missing"),
        (lambda b: b.update({b"labels": [0, 1, 2, 3, 12]}), "labels must lie in 0..9"),
        (lambda b: b.update({b"labels": ["a", "b", "c", "d", "e"]}), "list of integers"),
    ],
)
def test_cifar_malformed_batches(tmp_path: Path, mutate, fragment: str) -> None:
    batch = _cifar_batch(5)
    mutate(batch)
    _dump(tmp_path / "data_batch_1", batch)
    _expect_error(f"cifar10:{tmp_path}", fragment, "data_batch_1")


def test_cifar_truncated_and_not_a_dict(tmp_path: Path) -> None:
    payload = pickle.dumps(_cifar_batch(5), protocol=2)
    (tmp_path / "data_batch_1").write_bytes(payload[: len(payload) // 2])
    _expect_error(f"cifar10:{tmp_path}", "not a valid CIFAR-10 batch", "data_batch_1")
    _dump(tmp_path / "data_batch_1", [1, 2, 3])
    _expect_error(f"cifar10:{tmp_path}", "expected a dict")


def test_cifar_missing_batches(tmp_path: Path) -> None:
    _dump(tmp_path / "test_batch", _cifar_batch(3))
    _expect_error(f"cifar10:{tmp_path}", "no data_batch_1")
    file = tmp_path / "test_batch"
    _expect_error(f"cifar10:{file}", "expected a directory")


# ---------------------------------------------------------------- npz


def test_npz_x_y_is_split(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.random.default_rng(0).random((10, 5, 5)), y=np.arange(10) % 2)
    data = load_dataset(f"npz:{path}", seed=0, test_fraction=0.3)
    assert data.input_shape == (1, 5, 5) and data.num_classes == 2
    assert (len(data.y_train), len(data.y_test)) == (7, 3)


def test_npz_shipped_test_set_and_channels_last(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez_compressed(
        path,
        x_train=rng.integers(0, 256, (8, 6, 6, 3), dtype=np.uint8),
        y_train=np.arange(8) % 4,
        x_test=rng.integers(0, 256, (3, 6, 6, 3), dtype=np.uint8),
        y_test=np.array([0, 1, 2]),
    )
    data = load_dataset(f"npz:{path}", seed=0, test_fraction=0.5)
    assert data.input_shape == (3, 6, 6)
    assert (len(data.y_train), len(data.y_test), data.num_classes) == (8, 3, 4)


def test_npz_flat_square_images(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((4, 16)), y=np.array([0, 1, 0, 1]))
    assert load_dataset(f"npz:{path}", seed=0, test_fraction=0.25).input_shape == (1, 4, 4)


@pytest.mark.parametrize(
    ("arrays", "fragment"),
    [
        ({"x": np.zeros((4, 5, 5)), "y": np.zeros(3, dtype=int)}, "4 images but 3 labels"),
        ({"images": np.zeros((4, 5, 5)), "y": np.zeros(4, dtype=int)}, "needs arrays x and y"),
        ({"x": np.zeros((4, 15)), "y": np.zeros(4, dtype=int)}, "not square"),
        ({"x": np.zeros((4, 5, 5)), "y": np.full(4, 0.5)}, "must be integers"),
        ({"x": np.zeros((4, 5, 5)), "y": np.array([0, -1, 0, 1])}, "non-negative"),
        ({"x": np.zeros((0, 5, 5)), "y": np.zeros(0, dtype=int)}, "empty"),
        ({"x_train": np.zeros((4, 5, 5)), "y_train": np.zeros(4, dtype=int), "x_test": np.zeros((2, 5, 5))}, "only one of"),
        (
            {"x_train": np.zeros((4, 5, 5)), "y_train": np.zeros(4, dtype=int), "x_test": np.zeros((2, 4, 4)), "y_test": np.zeros(2, dtype=int)},
            "test images have shape",
        ),
    ],
)
def test_npz_malformed(tmp_path: Path, arrays: dict[str, np.ndarray], fragment: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    _expect_error(f"npz:{path}", fragment, str(path))


def test_npz_refuses_pickled_objects(tmp_path: Path) -> None:
    path = tmp_path / "objects.npz"
    np.savez(path, x=np.array([{"a": 1}, None], dtype=object), y=np.zeros(2, dtype=int))
    _expect_error(f"npz:{path}", "not a readable .npz archive", "pickle")


def test_npz_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "junk.npz"
    path.write_bytes(b"PK\x03\x04 definitely not a zip")
    _expect_error(f"npz:{path}", "not a readable .npz archive")
