"""The Python API: ``shoal.train`` and ``shoal.compare``; the CLI is a thin layer over the same code.

    import shoal
    result = shoal.train("examples/mnist_tiers.toml", overrides=["sync.scheme=gssp"], out="runs/gssp",
                         on_eval=lambda e: print(e["t"], e["accuracy"]))
    result.summary["final_accuracy"], result.model, result.run_dir, result.metrics("eval")
    table = shoal.compare("examples/mnist_tiers.toml", schemes="bsp,gssp")
    table.rows, table.row("gssp")["speedup_vs_bsp"], table.report

Bad input raises ``shoal.ConfigError`` (one line naming the key or file),
the same error the CLI prints before exiting with code 2.
"""

from __future__ import annotations

import time
import json
from collections.abc import Callable, Mapping, Sequence
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

    def metrics(self, event: str | None = None) -> list[dict[str, Any]]:
        """The run's metrics.jsonl as a list of dicts: every event, or those of one kind ("eval", "iteration",
        "balance", ...; docs/getting-started.md lists them)."""
        rows = []
        with open(self.run_dir / "metrics.jsonl") as lines:
            for line in lines:
                row = json.loads(line)
                if event is None or row.get("event") == event:
                    rows.append(row)
        return rows

    def dataframe(self, event: str = "eval") -> Any:
        """``metrics(event)`` as a pandas DataFrame (pandas is not a dependency of shoal: install it to use this)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("Result.dataframe needs pandas (pip install pandas); Result.metrics gives the same "
                              "rows as dicts") from None
        return pandas.DataFrame(self.metrics(event))


class Comparison(dict):
    """compare.json as returned by ``shoal.compare``: a dict (as before), plus where it was written and by-name rows."""

    def __init__(self, data: Mapping[str, Any], out: Path, report: Path) -> None:
        super().__init__(data)
        self.out, self.report = out, report

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per scheme (medians over its evaluation seeds, speed-up over BSP, p-value)."""
        return self["rows"]

    def row(self, scheme: str) -> dict[str, Any]:
        """The row of ``scheme`` as named in ``schemes`` (e.g. "gssp+topk")."""
        for row in self.rows:
            if row["scheme"] == scheme:
                return row
        raise KeyError(f"no row {scheme!r}; the rows are {', '.join(r['scheme'] for r in self.rows)}")


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
          progress: bool = True, overwrite: bool = False, on_eval: Callable[[dict[str, Any]], None] | None = None,
          on_iteration: Callable[[dict[str, Any]], None] | None = None) -> Result:
    """Train once and return the summary, the trained model and the run folder (default runs/train-<time>).

    ``on_eval(event)`` is called after every evaluation and ``on_iteration(event)`` after every worker
    iteration, each with the event's fields (as metrics.jsonl records them), while the run goes on.
    """
    from shoal.progress import TrainProgress, stderr_console
    from shoal.engine.export import load_model
    from shoal.runner import train as run_training

    cfg = resolve_config(config, overrides)
    run_dir = Path(out) if out is not None else Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    with TrainProgress(stderr_console(), not progress, cfg.run.max_time_s, cfg.run.max_iterations) as update:
        summary = run_training(cfg, run_dir, overwrite=overwrite, progress=update,
                               on_event=_callbacks(on_eval, on_iteration))
    model = load_model(run_dir) if summary.get("model_file") else None
    return Result(summary, model, run_dir)


def _callbacks(on_eval: Callable[[dict[str, Any]], None] | None,
               on_iteration: Callable[[dict[str, Any]], None] | None) -> Callable[[str, dict[str, Any]], None] | None:
    """The runner's event listener that calls the API's callbacks (None without any)."""
    if on_eval is None and on_iteration is None:
        return None
    by_kind = {"eval": on_eval, "iteration": on_iteration}

    def listen(kind: str, fields: dict[str, Any]) -> None:
        callback = by_kind.get(kind)
        if callback is not None:
            callback({"event": kind, **fields})

    return listen


def compare(config: str | Path | None = None, *, schemes: Sequence[str] | str, out: str | Path | None = None,
            seeds: int = 1, overrides: Sequence[str] | str = (), tune: Sequence[str] = (), tune_seeds: int = 0,
            own_knobs: bool = True, jobs: int = 1, resume: bool = False, progress: bool = True,
            overwrite: bool = False, widen: int = 0) -> Comparison:
    """Run ``shoal compare`` and return compare.json (its rows, the command that reproduces it) as a
    ``Comparison`` (a dict, with ``.rows``, ``.row(scheme)``, ``.out`` and ``.report``): with ``tune_seeds`` K,
    every scheme is tuned on K development seeds and judged on ``seeds`` evaluation seeds (``widen`` N: every
    numeric grid with N more values past each end, as ``--widen``)."""
    from shoal.comparison import run_comparison

    names = schemes if isinstance(schemes, str) else ",".join(schemes)
    folder = Path(out) if out is not None else Path("runs") / time.strftime("compare-%Y%m%d-%H%M%S")
    result, report = run_comparison(Path(config) if config is not None else None, names, seeds,
                                    override_list(overrides), folder, overwrite, not progress, list(tune),
                                    tune_seeds=tune_seeds, own_knobs=own_knobs, jobs=jobs, resume=resume,
                                    widen=widen)
    return Comparison(result, folder, report)
