"""Model registry: every model runs forward and backward on every built-in input shape."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from shoal.config import ConfigError, ModelConfig
from shoal.models import MODELS, build_model, parameter_count

SHAPES = {"mnist5k": (1, 28, 28), "digits": (1, 8, 8), "synthetic": (3, 32, 32)}


def test_config_accepts_exactly_the_registered_models() -> None:
    assert {"lenet5", "mlp", "resnet18", "vgg11"} <= set(MODELS)
    for name in MODELS:
        assert ModelConfig(name=name).name == name
    with pytest.raises(ValueError, match="unknown model 'lenet6' \\(did you mean 'lenet5'\\?\\); use one of " + ", ".join(MODELS.names())):
        ModelConfig(name="lenet6")


IMAGE_MODELS = sorted(name for name in MODELS if not getattr(MODELS[name], "token_input", False))


def test_only_the_transformer_reads_tokens() -> None:
    assert set(MODELS) - set(IMAGE_MODELS) == {"transformer"}  # its own tests: tests/test_stdlib_lm.py


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_forward_and_backward(name: str, shape: tuple[int, int, int]) -> None:
    """ResNet-18 is costly on CPU: batch of 2, and backward only on the 8x8 digits shape."""
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    model.train()
    heavy = name == "resnet18"
    batch = 2 if heavy else 4
    x, y = torch.randn(batch, *shape), torch.arange(batch) % 10
    out = model(x)
    assert out.shape == (batch, 10)
    if heavy and shape != SHAPES["digits"]:
        return
    nn.functional.cross_entropy(out, y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    model.eval()
    with torch.no_grad():
        assert model(x[:1]).shape == (1, 10)  # batch norm in eval mode takes a single sample


def _mlp_count(inputs: int, widths: list[int], classes: int) -> int:
    sizes = [inputs, *widths, classes]
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def test_parameter_counts_are_sane() -> None:
    # classic LeNet-5 on MNIST (first conv padded, 16x5x5 = 400 features): 61,706 parameters
    assert parameter_count(build_model("lenet5", (1, 28, 28), 10)) == 61_706
    assert parameter_count(build_model("lenet5", (3, 32, 32), 10)) == 62_006
    assert parameter_count(build_model("mlp", (1, 28, 28), 10)) == _mlp_count(784, [256, 128], 10)
    # CIFAR ResNet-18: the well-known 11.17M
    assert parameter_count(build_model("resnet18", (3, 32, 32), 10)) == 11_173_962
    # VGG-11 at quarter width: ~0.58M, far below the 9.2M of full width
    assert 500_000 < parameter_count(build_model("vgg11", (3, 32, 32), 10)) < 700_000


def test_parameter_count_independent_of_image_size_for_conv_nets() -> None:
    for name in ("resnet18", "vgg11"):
        counts = {parameter_count(build_model(name, (1, side, side), 10)) for side in (8, 28)}
        assert len(counts) == 1


@pytest.mark.parametrize("hidden", [[32], [64, 32, 16], [7, 7]])
def test_mlp_honours_hidden_widths(hidden: list[int]) -> None:
    model = build_model("mlp", (1, 8, 8), 5, hidden=hidden)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [*hidden, 5]
    assert linears[0].in_features == 64
    assert parameter_count(model) == _mlp_count(64, hidden, 5)


def test_hidden_is_ignored_by_conv_nets() -> None:
    torch.manual_seed(1)
    a = build_model("lenet5", (1, 8, 8), 10, hidden=[3])
    torch.manual_seed(1)
    b = build_model("lenet5", (1, 8, 8), 10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_initial_weights_follow_the_global_seed() -> None:
    def weights(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return list(build_model("vgg11", (1, 8, 8), 10).parameters())

    assert all(torch.equal(p, q) for p, q in zip(weights(3), weights(3)))
    assert not all(torch.equal(p, q) for p, q in zip(weights(3), weights(4)))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "alexnet"}, "unknown model 'alexnet'"),
        ({"input_shape": (1, 2, 2)}, "input shape"),
        ({"input_shape": (28, 28)}, "input shape"),
        ({"num_classes": 1}, "at least 2 classes"),
        ({"name": "mlp", "hidden": [0]}, "positive widths"),
        ({"name": "mlp", "hidden": []}, "positive widths"),
    ],
)
def test_bad_input_raises_config_error(kwargs: dict, fragment: str) -> None:
    args = {"name": "lenet5", "input_shape": (1, 8, 8), "num_classes": 10, **kwargs}
    hidden = args.pop("hidden", None)
    with pytest.raises(ConfigError, match=fragment):
        build_model(args["name"], args["input_shape"], args["num_classes"], hidden=hidden)


def test_every_declared_model_data_set_and_format_imports_and_naming_them_needs_no_torch():
    import subprocess
    import sys

    from shoal.registry import DATA_FORMATS, DATASETS

    for registry in (MODELS, DATASETS, DATA_FORMATS):
        for name in registry:
            assert callable(registry[name]), name  # each declared import path resolves
    check = ("import sys\nfrom shoal.config import load_config\n"
             "load_config(None, ['model.name=resnet18', 'data.name=digits'])\n"
             "from shoal.registry import MODELS\nassert 'resnet18' in MODELS.names()\n"
             "assert 'torch' not in sys.modules, 'validating a config imported torch'\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name, shape", [("resnet18", (3, 16, 16)), ("transformer", (16,))])
def test_evaluation_in_small_batches_on_the_cpu_gives_the_large_batches_metric(name: str, shape: tuple[int, ...]):
    """Evaluation runs 64 examples a pass on the CPU (cache-sized, faster than 1024: benchmarks/eval_batch.py):
    the metric is the one-pass metric to float rounding."""
    from shoal.engine.gradients import EVAL_BATCH_CPU, GradientEngine

    torch.manual_seed(0)
    classes = 32 if name == "transformer" else 10
    options = {"layers": 1, "width": 16, "heads": 2} if name == "transformer" else {"width": 4}
    engine = GradientEngine(build_model(name, shape, classes, options=options))
    params, buffers = engine.initial_state()
    n = 3 * EVAL_BATCH_CPU + 5  # several passes and a short last one
    x = torch.randint(0, classes, (n, *shape)) if name == "transformer" else torch.randn(n, *shape)
    y = torch.randint(0, classes, (n, *shape) if name == "transformer" else (n,))
    small, whole = engine.evaluate(params, buffers, x, y), engine.evaluate(params, buffers, x, y, batch=n)
    assert small.value == pytest.approx(whole.value, rel=1e-5) and small.loss == pytest.approx(whole.loss, rel=1e-5)
    assert small.accuracy == whole.accuracy
