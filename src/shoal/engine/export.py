"""The trained model comes out: ``model.safetensors`` plus ``model.json`` (how to rebuild the module).

A run with a ``python:`` model records the factory's file path (or module
path) and options, and keeps a copy of the factory's file beside the weights
(``model_source.py``), so a run folder moved to another machine still loads;
``load_model(run_dir, factory=...)`` takes any other factory.

Every run writes the model it evaluated last (for GSSP the mean of the group
replicas), under the module's own state-dict keys, so it loads into the
user's module with ``load_state_dict``. Nothing is pickled: ``model.json``
names the factory and its arguments, and ``load_model`` calls it again.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from shoal.config import Config
from shoal.errors import ConfigError
from shoal.engine.setup import RunSetup

MODEL_FILE = "model.safetensors"
FACTORY_FILE = "model.json"
SOURCE_FILE = "model_source.py"  # a copy of a python: model's factory file


def save_model(setup: RunSetup, out: Path) -> bool:
    """Write the last evaluated model into ``out``; False when nothing was evaluated (cost mode)."""
    state = setup.engine.evaluated
    if state is None:
        return False
    params, buffers = state
    tensors = setup.engine.state_dict(params, buffers)
    tmp = out / (MODEL_FILE + ".tmp")
    save_file(tensors, str(tmp))
    os.chmod(tmp, (out / "config.toml").stat().st_mode & 0o777)  # as readable as the run's other files
    tmp.replace(out / MODEL_FILE)
    record = factory_record(setup.cfg, setup)
    source = plugin_file(setup.cfg.model.name)
    (out / SOURCE_FILE).unlink(missing_ok=True)  # an earlier run's copy (--overwrite) must not outlive it
    if source is not None and source.is_file():
        shutil.copyfile(source, out / SOURCE_FILE)
        record["source"] = SOURCE_FILE
    (out / FACTORY_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return True


def plugin_file(name: str) -> Path | None:
    """The file of a ``python:FILE.py:FUNCTION`` model (None for a built-in or a module path)."""
    from shoal.plugins import is_plugin, split_spec

    if not is_plugin(name):
        return None
    target, _ = split_spec(name)
    return Path(target) if target.endswith(".py") else None


def factory_record(cfg: Config, setup: RunSetup) -> dict[str, Any]:
    """What ``load_model`` needs to build the same module again (``hidden`` only where the built-in mlp reads it)."""
    ds = setup.dataset
    record = {"name": cfg.model.name, "options": cfg.model.options, "input_shape": list(ds.input_shape),
              "num_classes": ds.num_classes, "format": "shoal-model/1"}
    if not cfg.model.name.startswith("python:"):
        record["hidden"] = cfg.model.hidden
    return record


def load_model(run_dir: str | Path, factory: Callable[..., torch.nn.Module] | None = None) -> torch.nn.Module:
    """The trained module of a run folder: rebuilt through the recorded factory, weights from safetensors.

    A ``python:`` factory's file is taken from where it was, or else from
    the copy the run kept (``model_source.py``); ``factory`` (called as
    ``factory(input_shape=..., num_classes=..., **options)``) overrides both.
    """
    from shoal.models import build_module

    run_dir = Path(run_dir)
    weights, record_path = run_dir / MODEL_FILE, run_dir / FACTORY_FILE
    for path in (weights, record_path):
        if not path.is_file():
            raise ConfigError(f"{path}: not found; is {run_dir} a shoal run folder (written by this version)?")
    try:
        record = json.loads(record_path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{record_path}: not valid JSON: {err}") from None
    torch.manual_seed(0)  # the factory's initial weights are overwritten; seeding keeps it deterministic anyway
    shape, classes, options = tuple(record["input_shape"]), record["num_classes"], record.get("options") or {}
    if factory is not None:
        model = factory(input_shape=shape, num_classes=classes, **options)
    else:
        model = build_module(_factory_name(record, run_dir), shape, classes, hidden=record.get("hidden"),
                             options=options)
    try:
        model.load_state_dict(load_file(str(weights)))
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"{weights}: does not fit the recorded model: {str(err).splitlines()[0]}") from None
    return model.eval()


def _factory_name(record: dict[str, Any], run_dir: Path) -> str:
    """The recorded factory, or its copy in the run folder once the original file is gone (a moved run)."""
    name, kept = record["name"], record.get("source")
    original = plugin_file(name)
    if original is None or original.is_file() or not kept or not (run_dir / kept).is_file():
        return name
    return f"python:{(run_dir / kept).resolve()}:{name.rpartition(':')[2]}"
