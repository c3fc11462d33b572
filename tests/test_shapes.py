"""The BN image workload: the shapes stand-in (deterministic, balanced, shape-only labels) and ResNet-18's width."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.data import load_dataset
from shoal.data.shapes import CLASSES, render, shapes
from shoal.errors import ConfigError
from shoal.models import build_model


def test_the_same_seed_gives_the_same_images_and_another_seed_others():
    a, b, c = shapes(3, 300), shapes(3, 300), shapes(4, 300)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)
    assert a.x.shape == (300, 3, 32, 32) and a.num_classes == len(CLASSES) == 10
    assert np.bincount(a.y).tolist() == [30] * 10 and 0 <= a.x.min() and a.x.max() <= 255


def test_the_class_is_in_the_shape_not_in_the_colours():
    """Per class, the mean colour is the same as the data's: colour carries no label."""
    raw = shapes(0, 4000)
    means = np.array([raw.x[raw.y == k].mean(axis=(0, 2, 3)) for k in range(10)])
    assert np.abs(means - raw.x.mean(axis=(0, 2, 3))).max() < 12  # of 255


def test_each_class_draws_its_own_mask():
    rng = np.random.default_rng(0)
    images = render(np.arange(10), rng)
    assert len({img.tobytes() for img in images}) == 10


def test_shapes_loads_as_a_normalised_image_set_and_resnet18_takes_a_width():
    ds = load_dataset("shapes", seed=0, test_fraction=0.2, synthetic_samples=500)
    assert ds.input_shape == (3, 32, 32) and len(ds.y_test) == 100
    assert abs(float(ds.x_train.mean())) < 0.05 and abs(float(ds.x_train.std()) - 1) < 0.05
    narrow = build_model("resnet18", (3, 32, 32), 10, options={"width": 16})
    assert 600_000 < sum(p.numel() for p in narrow.parameters()) < 800_000
    assert narrow(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ConfigError, match="model.options.width"):
        build_model("resnet18", (3, 32, 32), 10, options={"width": 0})


def test_channels_last_computes_the_same_network_in_another_layout():
    """The same weights give the same outputs and gradients (to float32 rounding: another order of additions);
    the parameters and gradients keep their layout, so the engine's flat vectors are unchanged; a bad value is one
    line."""
    torch.manual_seed(0)
    plain = build_model("resnet18", (3, 32, 32), 10, options={"width": 4})
    nhwc = build_model("resnet18", (3, 32, 32), 10, options={"width": 4, "channels_last": True})
    nhwc.load_state_dict(plain.state_dict())
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    for model in (plain, nhwc):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert torch.allclose(nhwc(x), plain(x), rtol=1e-4, atol=1e-5)
    for a, b in zip(plain.parameters(), nhwc.parameters()):
        assert b.is_contiguous() and b.grad.is_contiguous() and torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-5)
    with pytest.raises(ConfigError, match="model.options.channels_last: true or false"):
        build_model("resnet18", (3, 32, 32), 10, options={"channels_last": "yes"})


def test_a_channels_last_run_reruns_bit_for_bit_and_loads_back(tmp_path):
    import shoal

    sets = ["model.name=resnet18", "data.name=shapes", "data.synthetic_samples=400", "cluster.workers=2",
            "model.options={width = 2, channels_last = true}", "run.max_iterations=16", "run.stop_at_target=false",
            "run.eval_every_iterations=8", "cluster.compute_s=0.01"]
    first = shoal.train(None, overrides=sets, out=tmp_path / "a", progress=False)
    again = shoal.train(None, overrides=sets, out=tmp_path / "b", progress=False)
    assert first.metrics("eval") == again.metrics("eval") and first.summary["iterations"] == 16
    model = shoal.load_model(tmp_path / "a")
    assert model.channels_last and all(torch.equal(a, b) for a, b in zip(model.parameters(), first.model.parameters()))
