"""shoal: data-parallel training on heterogeneous clusters.

``shoal.train(config, out=..., overrides=[...])`` runs one training and
returns a ``Result`` (summary, trained model, run folder);
``shoal.compare(...)`` runs a comparison; ``shoal.load_model(run_dir)``
rebuilds a trained module; ``shoal.Config`` is the configuration schema.
Heavy parts (torch) load on first use, so ``import shoal`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Comparison", "Config", "ConfigError", "Result", "__version__", "compare", "load_config", "load_model",
           "train"]

_LAZY = {
    "Config": "shoal.config", "ConfigError": "shoal.errors", "load_config": "shoal.config",
    "Result": "shoal.api", "Comparison": "shoal.api", "train": "shoal.api", "compare": "shoal.api", "load_model": "shoal.engine.export",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")


def __dir__() -> list[str]:
    """``dir(shoal)`` lists the lazily loaded names too."""
    return sorted(set(__all__) | {"__doc__", "__name__", "__version__"})
