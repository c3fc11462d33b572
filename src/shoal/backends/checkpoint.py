"""Checkpoints of group-server replicas: safetensors for tensors, JSON for everything else.

Nothing here unpickles: tensors load through safetensors, the rest is JSON,
so a checkpoint folder from anywhere is safe to read. Layout of one
checkpoint (written by the ray backend)::

    DIR/checkpoint/latest.json          {"path": "ckpt-000003"}  (written last, atomically)
    DIR/checkpoint/ckpt-000003/run.json the run's state (recorder totals, groups, stats)
    DIR/checkpoint/ckpt-000003/group-0.safetensors + group-0.json  one pair per group server

A checkpoint folder counts only once ``latest.json`` names it, so a crash
while writing leaves the previous checkpoint in force.
"""

from __future__ import annotations

import hashlib
from base64 import b64decode, b64encode
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from shoal.config import OptimizerConfig
from shoal.errors import ConfigError
from shoal.engine.replica import Replica

FORMAT = "shoal-checkpoint/1"
LATEST = "latest.json"
KEEP = 2  # checkpoint folders kept (the newest and the one before)


def rng_text(state: torch.Tensor) -> str:
    """A generator state (torch's uint8 tensor) as base64 text, for run.json."""
    return b64encode(state.numpy().tobytes()).decode("ascii")


def rng_state(text: str) -> torch.Tensor:
    """A generator state saved by ``rng_text``, as the uint8 tensor torch takes."""
    return torch.frombuffer(bytearray(b64decode(text)), dtype=torch.uint8)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_replica(folder: Path, name: str, replica: Replica, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``name``.safetensors (parameters, buffers, own delta, optimizer tensors) and ``name``.json."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"params": replica.params.detach(), "buffers": replica.buffers}
    if replica.own_params is not None and replica.own_buffers is not None:
        tensors |= {"own_params": replica.own_params, "own_buffers": replica.own_buffers}
    state = replica.optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    path = folder / f"{name}.safetensors"
    save_file(tensors, str(path))
    manifest = {
        "format": FORMAT, "tensors": path.name, "sha256": _sha256(path), "version": replica.version,
        "lr": replica.lr, "optimizer": {"param_groups": state["param_groups"], "scalars": scalars}, **meta,
    }
    _write_json(folder / f"{name}.json", manifest)
    return manifest


def load_replica(folder: Path, name: str, opt: OptimizerConfig,
                 outer: tuple[float, float] | None = None) -> tuple[Replica, dict[str, Any]]:
    """The replica (with its optimizer state) and the manifest saved by ``save_replica``.

    DiLoCo's outer momentum is not saved: a resumed run restarts it.
    """
    manifest = json.loads((folder / f"{name}.json").read_text())
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{folder / name}.json: not a {FORMAT} checkpoint")
    path = folder / manifest["tensors"]
    if _sha256(path) != manifest["sha256"]:
        raise ConfigError(f"{path}: checksum does not match its manifest (corrupt or partial checkpoint)")
    tensors = load_file(str(path))
    track_own = "own_params" in tensors
    replica = Replica(tensors["params"], tensors["buffers"], opt, track_own=track_own, outer=outer)
    if track_own:
        replica.own_params.copy_(tensors["own_params"])
        replica.own_buffers.copy_(tensors["own_buffers"])
    replica.optimizer.load_state_dict(_optimizer_state(tensors, manifest["optimizer"]))
    replica.lr = float(manifest.get("lr", replica.lr))  # the schedule's rate then (Adam re-derives its step from it)
    replica.version = int(manifest["version"])
    return replica, manifest


def _optimizer_state(tensors: dict[str, torch.Tensor], saved: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for index, entries in saved["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    return {"state": state, "param_groups": saved["param_groups"]}


def new_folder(root: Path, seq: int) -> Path:
    """The folder for checkpoint number ``seq`` (empty)."""
    folder = root / f"ckpt-{seq:06d}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def commit(root: Path, folder: Path, run_state: dict[str, Any]) -> None:
    """Write run.json, make ``folder`` the latest checkpoint, drop older ones."""
    _write_json(folder / "run.json", {"format": FORMAT, **run_state})
    _write_json(root / LATEST, {"path": folder.name})
    for old in sorted(root.glob("ckpt-*"))[:-KEEP]:
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


def latest(root: Path) -> tuple[Path, dict[str, Any]]:
    """The latest committed checkpoint folder under ``root`` and its run state."""
    pointer = root / LATEST
    if not pointer.is_file():
        raise ConfigError(f"--resume {root.parent}: no checkpoint found (missing {pointer})")
    folder = root / json.loads(pointer.read_text())["path"]
    run_file = folder / "run.json"
    if not run_file.is_file():
        raise ConfigError(f"--resume {root.parent}: checkpoint {folder} has no run.json")
    state = json.loads(run_file.read_text())
    if state.get("format") != FORMAT:
        raise ConfigError(f"{run_file}: not a {FORMAT} checkpoint")
    return folder, state


def saved_at(folder: Path) -> float:
    """The run time (seconds) a committed checkpoint folder was taken at."""
    return float(json.loads((folder / "run.json").read_text()).get("elapsed_s") or 0.0)
