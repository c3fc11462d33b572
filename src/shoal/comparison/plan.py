"""Planning a comparison: every (scheme, grid point, seed) run validated, and the folder and backends checked,
before the first run starts, so a typo in the last scheme never costs the runs before it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.config import Config, load_config, override_keys, toml_value
from shoal.errors import ConfigError
from shoal.report.protocol import Protocol
from shoal.report.rows import tuning_entry
from shoal.report.schemes import Scheme
from shoal.report.tuning import choose, grid_points, point_label

# What marks a folder as holding a run; the same names as shoal.runner.RUN_FILES (importing the runner loads
# torch, which the checks below run without).
RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "model.safetensors")
COMPARE_FILES = ("compare.json", "report.html")


@dataclass(frozen=True)
class PlannedRun:
    """One training of the comparison: a scheme, a seed, its validated config and its folder (relative to --out)."""

    scheme: str
    seed: int
    cfg: Config
    run_dir: str
    point: tuple[tuple[str, Any], ...] = ()  # the grid point this run belongs to
    pinned: tuple[tuple[str, str], ...] = ()  # values the scheme spec pins after "@"
    tuning: bool = False  # a development seed of the tuning phase (else an evaluation seed)


def plan_runs(config: Path | None, schemes: list[Scheme], protocol: Protocol | int, overrides: list[str],
              base_seed: int | None = None) -> list[PlannedRun]:
    """Validate every run of the first phase up front: each (scheme, grid point, development seed) when tuning,
    else each (scheme, evaluation seed). The scheme's keys win over the grid and --set. A scheme with nothing
    to tune (no own knob, no shared grid) runs no development seed: only its evaluation seeds, later."""
    protocol = protocol if isinstance(protocol, Protocol) else Protocol(seeds=protocol)
    protocol.check(schemes)
    base_seed = load_config(config, overrides).run.seed if base_seed is None else base_seed
    plan = []
    for scheme in schemes:
        grid = protocol.scheme_grid(scheme)
        _check_tunable(scheme, grid)
        if not protocol.tune_seeds:
            plan += evaluation_runs(config, scheme, protocol, overrides, {}, base_seed)
            continue
        points = grid_points(grid, dict(scheme.pinned))
        if points == [{}]:  # nothing to tune: its development seeds would choose nothing (chosen_point: defaults)
            continue
        for point in points:
            for seed in protocol.tuning_seeds(base_seed):
                run_dir = f"{scheme.name}/tune/{point_label(point)}/seed-{seed - base_seed}"
                plan.append(_planned(config, scheme, overrides, point, seed, run_dir, tuning=True))
    return plan


def evaluation_runs(config: Path | None, scheme: Scheme, protocol: Protocol, overrides: list[str],
                    point: dict[str, Any], base_seed: int | None = None) -> list[PlannedRun]:
    """The scheme at ``point`` on every evaluation seed."""
    base_seed = load_config(config, overrides).run.seed if base_seed is None else base_seed
    return [_planned(config, scheme, overrides, point, seed, protocol.eval_dir(scheme.name, seed - base_seed))
            for seed in protocol.eval_seeds(base_seed)]


def _planned(config: Path | None, scheme: Scheme, overrides: list[str], point: dict[str, Any], seed: int,
             run_dir: str, tuning: bool = False) -> PlannedRun:
    tuned = [f"{k}={toml_value(v)}" for k, v in point.items()]
    # a value the scheme's own spec or the seed plan wrote is blamed on the scheme (the prefix below), not on --set
    own = [*scheme.overrides, f"run.seed={seed}"]
    origins = {key: "--tune" for key in override_keys(tuned)} | {key: "" for key in override_keys(own)}
    try:
        cfg = load_config(config, overrides + tuned + own, origins)
    except ConfigError as err:
        raise ConfigError(f"scheme {scheme.name}: {err}") from None
    return PlannedRun(scheme.name, seed, cfg, run_dir, tuple(point.items()), scheme.pinned, tuning)


def chosen_point(tuning: list[tuple[PlannedRun, dict[str, Any]]], scheme: str) -> dict[str, Any]:
    """The grid point a scheme keeps: the best by ``choose`` over its development seeds (no entry: nothing to
    tune, the defaults)."""
    entries = tuning_entries(tuning, scheme)
    return entries[choose(entries)]["point"] if entries else {}


def tuning_entries(tuning: list[tuple[PlannedRun, dict[str, Any]]], scheme: str) -> list[dict[str, Any]]:
    """One entry per grid point of a scheme: its development seeds' times to target and final values."""
    mine = [(p, s) for p, s in tuning if p.scheme == scheme]
    points = list(dict.fromkeys(p.point for p, _ in mine))
    return [tuning_entry(dict(point), [s for p, s in mine if p.point == point],
                         [p.run_dir for p, _ in mine if p.point == point]) for point in points]


def _check_tunable(scheme: Scheme, grid: dict[str, list[Any]]) -> None:
    """A scheme's own keys (sync.scheme, a compressor) cannot be tuned; pinned ones simply are not."""
    own = {o.partition("=")[0] for o in scheme.overrides} - {k for k, _ in scheme.pinned}
    for key in grid:
        if key in own:
            raise ConfigError(f"--tune {key}: scheme {scheme.name} sets it itself; tune another key")


def check_compare_dir(out: Path, plan: list[PlannedRun], overwrite: bool, later: list[str] = ()) -> None:
    """Refuse a folder that holds an earlier comparison (or any of the runs, ``later`` ones included) unless
    --overwrite."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if (out / "summary.json").exists() or (out / "config.toml").exists():  # --overwrite or not
        raise ConfigError(f"--out {out}: holds a training run (summary.json, config.toml); a comparison needs a "
                          "folder of its own")
    if overwrite:
        return
    dirs = [p.run_dir for p in plan] + list(later)
    taken = [out / name for name in COMPARE_FILES] + [out / d / name for d in dirs for name in RUN_FILES]
    found = next((path for path in taken if path.exists()), None)
    if found is not None:
        raise ConfigError(f"--out {out}: already holds a comparison ({found.relative_to(out)}); "
                          "choose another folder or pass --overwrite")


def check_backends(plan: list[PlannedRun]) -> None:
    """The ray backend's own input checks (e.g. no SIM yet) for every run, so a late scheme cannot fail mid-way."""
    if not any(p.cfg.backend.name == "ray" for p in plan):
        return
    try:
        from shoal.backends.ray.session import validate
    except ImportError:  # a build without the ray backend: the runner rejects the first run, before writing
        return
    for p in plan:
        try:
            validate(p.cfg)
        except ConfigError as err:
            raise ConfigError(f"scheme {p.scheme}: {err}") from None


def command_line(config: Path | None, schemes: str, seeds: int, sets: list[str], backend: str | None, out: Path,
                 tune: list[str] = (), tune_seeds: int = 0, own_knobs: bool = True, widen: int = 0) -> str:
    """The command line that reproduces this comparison (shown in the report)."""
    args = ["shoal", "compare"] + (["--config", str(config)] if config else []) + ["--schemes", schemes]
    args += (["--seeds", str(seeds)] if seeds > 1 else []) + (["--backend", backend] if backend else [])
    args += (["--tune-seeds", str(tune_seeds)] if tune_seeds else []) + ([] if own_knobs else ["--no-own-knobs"])
    args += ["--widen", str(widen)] if widen else []
    for t in tune:
        args += ["--tune", t]
    for s in sets:
        args += ["--set", s]
    return shlex.join(args + ["--out", str(out)])
