"""The trained model comes out: ``model.safetensors`` plus ``model.json`` (how to rebuild the module).

A run with a ``python:`` model records the factory's absolute file path (or
module path) and options, so ``load_model`` needs that file where it was.

Every run writes the model it evaluated last (for GSSP the mean of the group
replicas), under the module's own state-dict keys, so it loads into the
user's module with ``load_state_dict``. Nothing is pickled: ``model.json``
names the factory and its arguments, and ``load_model`` calls it again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from shoal.config import Config
from shoal.errors import ConfigError
from shoal.engine.setup import RunSetup

MODEL_FILE = "model.safetensors"
FACTORY_FILE = "model.json"


def save_model(setup: RunSetup, out: Path) -> bool:
    """Write the last evaluated model into ``out``; False when nothing was evaluated (cost mode)."""
    state = setup.engine.evaluated
    if state is None:
        return False
    params, buffers = state
    tensors = setup.engine.state_dict(params, buffers)
    tmp = out / (MODEL_FILE + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(out / MODEL_FILE)
    (out / FACTORY_FILE).write_text(json.dumps(factory_record(setup.cfg, setup), indent=2) + "\n")
    return True


def factory_record(cfg: Config, setup: RunSetup) -> dict[str, Any]:
    """What ``load_model`` needs to build the same module again."""
    ds = setup.dataset
    return {"name": cfg.model.name, "hidden": cfg.model.hidden, "options": cfg.model.options,
            "input_shape": list(ds.input_shape), "num_classes": ds.num_classes, "format": "shoal-model/1"}


def load_model(run_dir: str | Path) -> torch.nn.Module:
    """The trained module of a run folder: rebuilt through the recorded factory, weights from safetensors."""
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
    model = build_module(record["name"], tuple(record["input_shape"]), record["num_classes"], hidden=record["hidden"],
                         options=record.get("options") or {})
    try:
        model.load_state_dict(load_file(str(weights)))
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"{weights}: does not fit the recorded model: {str(err).splitlines()[0]}") from None
    return model.eval()
