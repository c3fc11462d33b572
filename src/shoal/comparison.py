"""Comparing schemes: plan every (scheme, grid point, seed) run, check it all, run them, write compare.json.

The library behind ``shoal compare`` and ``shoal.compare``. Every scheme's
config (and every seed's) is validated, and the output folder checked,
before the first run starts, so a typo in the last scheme never costs the
runs before it.
"""

from __future__ import annotations

import functools
import shlex
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shoal.config import Config, load_config, toml_value
from shoal.errors import ConfigError
from shoal.report.rows import add_speedups, seeds_row, single_row, tuning_entry
from shoal.report.schemes import Scheme, parse_schemes
from shoal.report.tuning import choose, grid_points, parse_tune, point_label

console = Console(stderr=True)

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
    point: tuple[tuple[str, Any], ...] = ()  # the --tune grid point this run belongs to
    pinned: tuple[tuple[str, str], ...] = ()  # values the scheme spec pins after "@"


def run_comparison(config: Path | None, schemes: str, seeds: int, overrides: list[str], out: Path, overwrite: bool,
                   quiet: bool, tune: list[str], command: str | None = None) -> tuple[dict[str, Any], Path]:
    """Validate everything, run every (scheme, grid point, seed), write compare.json and report.html."""
    grid = parse_tune(tune)
    plan = plan_runs(config, parse_schemes(schemes), seeds, overrides, grid)
    check_compare_dir(out, plan, overwrite)
    check_backends(plan)
    from shoal.runner import make_out_dir

    make_out_dir(out)
    command = command or command_line(config, schemes, seeds, overrides, None, out, tune)
    summaries = execute(plan, out, quiet)
    result = build_compare(plan, summaries, seeds, command, grid)
    from shoal.engine.metrics import write_json_atomic
    from shoal.report.html import write_report

    write_json_atomic(out / "compare.json", result)
    with console.status("drawing the plots and writing report.html") if not quiet else nullcontext():
        report = write_report(out)
    return result, report


def plan_runs(config: Path | None, schemes: list[Scheme], seeds: int, overrides: list[str],
              grid: dict[str, list[Any]] | None = None) -> list[PlannedRun]:
    """Validate every (scheme, grid point, seed) config up front; the scheme's keys win over --tune and --set."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be at least 1")
    grid = grid or {}
    base_seed = load_config(config, overrides).run.seed
    plan = []
    for scheme in schemes:
        pinned = dict(scheme.pinned)
        _check_tunable(scheme, grid)
        for point in grid_points(grid, pinned) if grid else [{}]:
            tuned = [f"{k}={toml_value(v)}" for k, v in point.items()]
            for k in range(seeds):
                try:
                    cfg = load_config(config, overrides + tuned + list(scheme.overrides) + [f"run.seed={base_seed + k}"])
                except ConfigError as err:
                    raise ConfigError(f"scheme {scheme.name}: {err}") from None
                parts = [scheme.name] + ([f"tune-{point_label(point)}"] if grid else []) + (
                    [f"seed-{k}"] if seeds > 1 else [])
                plan.append(PlannedRun(scheme.name, base_seed + k, cfg, "/".join(parts), tuple(point.items()),
                                       scheme.pinned))
    return plan


def _check_tunable(scheme: Scheme, grid: dict[str, list[Any]]) -> None:
    """A scheme's own keys (sync.scheme, a compressor) cannot be tuned; pinned ones simply are not."""
    own = {o.partition("=")[0] for o in scheme.overrides} - {k for k, _ in scheme.pinned}
    for key in grid:
        if key in own:
            raise ConfigError(f"--tune {key}: scheme {scheme.name} sets it itself; tune another key")


def check_compare_dir(out: Path, plan: list[PlannedRun], overwrite: bool) -> None:
    """Refuse a folder that holds an earlier comparison (or any of the runs) unless --overwrite."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if overwrite:
        return
    taken = [out / name for name in COMPARE_FILES] + [out / p.run_dir / name for p in plan for name in RUN_FILES]
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
             tune: list[str] = ()) -> str:
    """The command line that reproduces this comparison (shown in the report)."""
    args = ["shoal", "compare"] + (["--config", str(config)] if config else []) + ["--schemes", schemes]
    args += (["--seeds", str(seeds)] if seeds > 1 else []) + (["--backend", backend] if backend else [])
    for t in tune:
        args += ["--tune", t]
    for s in sets:
        args += ["--set", s]
    return shlex.join(args + ["--out", str(out)])


# -- running -------------------------------------------------------------------------------------


def execute(plan: list[PlannedRun], out: Path, quiet: bool) -> list[dict[str, Any]]:
    """Run the plan in order, each into its folder, with one progress display across runs."""
    from shoal.runner import train  # heavy (torch): only once everything is validated

    if out.exists():
        for name in COMPARE_FILES:  # --overwrite: no stale report may describe the new runs
            (out / name).unlink(missing_ok=True)
    summaries = []
    with RunsProgress(plan, quiet) as progress:
        for run in plan:
            progress.begin(run)
            summary = train(run.cfg, out / run.run_dir, overwrite=True, progress=progress.tick)
            progress.end(run, summary)
            summaries.append(summary)
    return summaries


class RunsProgress:
    """Two bars on stderr: runs done of total, and the current run's virtual time, iterations, accuracy."""

    def __init__(self, plan: list[PlannedRun], quiet: bool) -> None:
        self.quiet, self.total = quiet, len(plan)
        self.bar = Progress(
            TextColumn("{task.description}", style="bold"), BarColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=console, transient=True,
        )

    def __enter__(self) -> "RunsProgress":
        if not self.quiet:
            self.bar.start()
            self.done = 0
            self.all = self.bar.add_task("compare", total=self.total, info=f"0/{self.total} runs")
            self.current = self.bar.add_task("", total=1, info="")
        return self

    def begin(self, run: PlannedRun) -> None:
        if not self.quiet:
            self.budget = run.cfg.run.max_time_s
            self.bar.reset(self.current, total=self.budget, description=self._label(run), info="starting")

    @staticmethod
    def _label(run: PlannedRun) -> str:
        return run.scheme + (f" seed {run.seed}" if "/seed-" in run.run_dir else "")

    def tick(self, tick: dict[str, Any]) -> None:
        if self.quiet:
            return
        acc = tick.get("accuracy")
        info = f"t={tick['t']:.1f}/{self.budget:g}s iters={tick['iterations']}" + (
            f" acc={acc:.3f}" if acc is not None else "")
        self.bar.update(self.current, completed=min(tick["t"], self.budget), info=info)

    def end(self, run: PlannedRun, summary: dict[str, Any]) -> None:
        if self.quiet:
            return
        self.done += 1
        self.bar.update(self.all, completed=self.done, info=f"{self.done}/{self.total} runs")
        ttt, acc = summary["time_to_target_s"], summary["final_accuracy"]
        reached = f"target at {ttt:.1f}s" if ttt is not None else "target not reached"
        acc_text = f"{acc:.3f}" if acc is not None else "-"
        self.bar.console.print(f"[green]done[/] {self._label(run)}: {reached}, final accuracy {acc_text}, "
                               f"{summary['iterations']} iterations, wall {summary['wall_s']:.0f}s")

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.bar.stop()


# -- results -------------------------------------------------------------------------------------


def build_compare(plan: list[PlannedRun], summaries: list[dict[str, Any]], seeds: int, command: str,
                  grid: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """compare.json: what was compared, and one row per scheme (at its tuned grid point) with the speed-up over BSP."""
    names = list(dict.fromkeys(p.scheme for p in plan))
    rows = []
    for name in names:
        mine = [(p, s) for p, s in zip(plan, summaries) if p.scheme == name]
        points = list(dict.fromkeys(p.point for p, _ in mine))
        by_point = [[(p, s) for p, s in mine if p.point == point] for point in points]
        entries = [tuning_entry(dict(point), [s for _, s in runs], [p.run_dir for p, _ in runs])
                   for point, runs in zip(points, by_point)]
        runs = by_point[choose(entries)]
        if seeds == 1:
            row = single_row(name, runs[0][1], runs[0][0].run_dir)
        else:
            row = seeds_row(name, [s for _, s in runs], [p.run_dir for p, _ in runs], [p.seed for p, _ in runs])
        if grid:
            row["tuned"] = dict(runs[0][0].point)
            row["tuning"] = entries
        if runs[0][0].pinned:
            row["pinned"] = dict(runs[0][0].pinned)
        rows.append(row)
    first = plan[0].cfg
    return {
        "command": command,
        "provenance": provenance(),
        "schemes": names,
        "seeds": seeds,
        "tune": grid or {},
        "backend": first.backend.name,
        "target_accuracy": first.run.target_accuracy,
        "max_time_s": first.run.max_time_s,
        "rows": add_speedups(rows),
    }


@functools.cache
def cpu_model() -> str:
    """The processor's model name.

    Training on real gradients is chaotic: last-bit differences between CPU
    kernels grow into different trajectories, so a sim run repeats exactly
    only on the same kind of CPU (docs/fair-comparison.md).
    """
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict[str, Any]:
    """Which shoal, when and where a comparison ran (the report's footer)."""
    import importlib.metadata
    import platform

    from shoal import __version__

    return {"shoal": __version__, "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
            "python": platform.python_version(), "platform": platform.platform(terse=True),
            "cpu": cpu_model(), "torch": importlib.metadata.version("torch")}

