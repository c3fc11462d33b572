"""The built-in models: lenet5, mlp, resnet18 (CIFAR-style), a small vgg11 and a byte-level transformer,
declared by import path in shoal.catalog (``shoal.registry.MODELS``), so their names are known without
importing torch.

Every factory takes ``(input_shape, num_classes, *, hidden=None, **options)``
(``model.options``: its other keyword-only parameters) and sizes itself to
the input, so every image model runs on every image data set; the
transformer reads token windows. Initial weights come from torch's global
RNG: the caller seeds it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from shoal.errors import ConfigError
from shoal.plugins import check_options
from shoal.models.lenet import lenet5
from shoal.models.mlp import mlp
from shoal.models.resnet import resnet18
from shoal.models.vgg import vgg11
from shoal.registry import MODELS

MIN_SIDE = 4  # smallest input side every model handles


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, *, hidden: list[int] | None = None,
    options: dict[str, Any] | None = None,
) -> nn.Module:
    """Build ``name`` for inputs of ``input_shape`` ((C, H, W) for images; the mlp takes any shape, the transformer
    token windows (T,)) with its keyword ``options``; bad input raises ConfigError."""
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model {name!r}; use one of {', '.join(MODELS)}")
    factory = MODELS[name]
    check_options(factory, options or {}, "model.options", fixed=("hidden",))
    shape = tuple(int(s) for s in input_shape)
    if getattr(factory, "token_input", False):  # it checks its own (T,) input
        pass
    elif getattr(factory, "any_input_shape", False) and shape and min(shape) >= 1:  # it flattens the input
        pass
    elif len(shape) != 3 or shape[0] < 1 or min(shape[1:]) < MIN_SIDE:
        raise ConfigError(f"model {name}: input shape {tuple(input_shape)} must be (C, H, W) with H, W >= {MIN_SIDE}")
    if num_classes < 2:
        raise ConfigError(f"model {name}: needs at least 2 classes, got {num_classes}")
    if hidden is not None and (not hidden or any(w <= 0 for w in hidden)):
        raise ConfigError(f"model.hidden: must be a non-empty list of positive widths, got {hidden}")
    return factory(shape, num_classes, hidden=hidden, **(options or {}))


def build_module(name: str, input_shape: tuple[int, ...], num_classes: int, *, hidden: list[int] | None = None,
                 options: dict[str, Any] | None = None) -> nn.Module:
    """A built-in model by name, or a user's ``python:`` factory called as
    ``FUNCTION(input_shape=..., num_classes=..., **options)``; bad input raises ConfigError."""
    from shoal.plugins import call, is_plugin, load_function

    if not is_plugin(name):
        return build_model(name, tuple(input_shape), num_classes, hidden=hidden, options=options)
    factory = load_function(name, "model.name")
    model = call(factory, "model.name", name, input_shape=tuple(input_shape), num_classes=num_classes,
                 **(options or {}))
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.name {name!r}: returned {type(model).__name__}, not a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"model.name {name!r}: the module has no trainable parameters")
    return model


def parameter_count(model: nn.Module) -> int:
    """Trainable parameters: what a worker sends per full gradient."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["MODELS", "build_model", "build_module", "lenet5", "mlp", "parameter_count", "resnet18", "vgg11"]
