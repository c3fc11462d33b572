"""The Python API: ``shoal.train`` and ``shoal.compare``; the CLI is a thin layer over the same code.

    import shoal
    result = shoal.train("examples/mnist_tiers.toml", overrides=["sync.scheme=gssp"], out="runs/gssp")
    result.summary["final_accuracy"], result.model, result.run_dir

Bad input raises ``shoal.ConfigError`` (one line naming the key or file),
the same error the CLI prints before exiting with code 2.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.config import Config, apply_overrides, build_config, load_config
from shoal.errors import ConfigError

ConfigLike = str | Path | Mapping[str, Any] | Config


@dataclass
class Result:
    """One finished run: its summary.json, the trained module (None in cost mode) and its folder."""

    summary: dict[str, Any]
    model: Any
    run_dir: Path


def override_list(overrides: Sequence[str] | str) -> list[str]:
    """``overrides`` as a list: one ``"section.key=value"`` string is one override (not a list of characters)."""
    if isinstance(overrides, str):
        return [overrides]
    items = list(overrides)
    bad = next((o for o in items if not isinstance(o, str)), None)
    if bad is not None:
        raise ConfigError(f"overrides: expected \"section.key=value\" strings, got {type(bad).__name__} {bad!r}")
    return items


def resolve_config(config: ConfigLike | None, overrides: Sequence[str] | str = ()) -> Config:
    """A path to a TOML file, a dict of sections, or a ``Config``, with ``section.key=value`` overrides."""
    overrides = override_list(overrides)
    if isinstance(config, Config):
        return build_config(apply_overrides(config.model_dump(), list(overrides)))
    if isinstance(config, Mapping):
        return build_config(apply_overrides(dict(config), list(overrides)))
    if config is None or isinstance(config, (str, Path)):
        return load_config(config, list(overrides))
    raise ConfigError(f"config: expected a path, a dict or a shoal.Config, got {type(config).__name__}")


def train(config: ConfigLike | None = None, *, out: str | Path | None = None, overrides: Sequence[str] | str = (),
          progress: bool = True, overwrite: bool = False) -> Result:
    """Train once and return the summary, the trained model and the run folder (default runs/train-<time>)."""
    from shoal.progress import TrainProgress, stderr_console
    from shoal.engine.export import load_model
    from shoal.runner import train as run_training

    cfg = resolve_config(config, overrides)
    run_dir = Path(out) if out is not None else Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    with TrainProgress(stderr_console(), not progress, cfg.run.max_time_s, cfg.run.max_iterations) as update:
        summary = run_training(cfg, run_dir, overwrite=overwrite, progress=update)
    model = load_model(run_dir) if summary.get("model_file") else None
    return Result(summary, model, run_dir)


def compare(config: str | Path | None = None, *, schemes: Sequence[str] | str, out: str | Path | None = None,
            seeds: int = 1, overrides: Sequence[str] | str = (), tune: Sequence[str] = (), tune_seeds: int = 0,
            own_knobs: bool = True, jobs: int = 1, resume: bool = False, progress: bool = True,
            overwrite: bool = False) -> dict[str, Any]:
    """Run ``shoal compare`` and return compare.json (its rows, the command that reproduces it): with
    ``tune_seeds`` K, every scheme is tuned on K development seeds and judged on ``seeds`` evaluation seeds."""
    from shoal.comparison import run_comparison

    names = schemes if isinstance(schemes, str) else ",".join(schemes)
    folder = Path(out) if out is not None else Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")
    result, _ = run_comparison(Path(config) if config is not None else None, names, seeds, override_list(overrides), folder,
                               overwrite, not progress, list(tune), tune_seeds=tune_seeds, own_knobs=own_knobs,
                               jobs=jobs, resume=resume)
    return result
