"""Comparing schemes: plan every (scheme, grid point, seed) run, check it all, run them, write compare.json.

The library behind ``shoal compare`` and ``shoal.compare``. Every scheme's
config (and every seed's) is validated, and the output folder checked,
before the first run starts, so a typo in the last scheme never costs the
runs before it.
"""

from __future__ import annotations

import functools
import json
import shlex
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shoal.config import Config, load_config, to_toml, toml_value
from shoal.errors import ConfigError
from shoal.report.rows import add_significance, add_speedups, seeds_row, single_row, tuning_entry
from shoal.report.protocol import Protocol
from shoal.report.schemes import Scheme, parse_schemes
from shoal.report.tuning import choose, grid_edges, grid_points, parse_tune, point_label

console = Console(stderr=True)

# What marks a folder as holding a run; the same names as shoal.runner.RUN_FILES (importing the runner loads
# torch, which the checks below run without).
RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "model.safetensors")
COMPARE_FILES = ("compare.json", "report.html")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a comparison: what finished (plan index -> summary), and which runs were cut short."""

    def __init__(self, plan: list["PlannedRun"], finished: dict[int, dict[str, Any]], cut: list[int]) -> None:
        super().__init__("interrupted")
        self.plan, self.finished, self.cut = plan, finished, cut


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


def run_comparison(config: Path | None, schemes: str, seeds: int, overrides: list[str], out: Path, overwrite: bool,
                   quiet: bool, tune: list[str], command: str | None = None, tune_seeds: int = 0,
                   own_knobs: bool = True, jobs: int = 1, resume: bool = False) -> tuple[dict[str, Any], Path]:
    """Validate everything, tune on the development seeds, run the evaluation seeds, write compare.json and
    report.html."""
    protocol = Protocol(seeds, tune_seeds, parse_tune(tune), own_knobs)
    parsed = parse_schemes(schemes)
    base_seed = load_config(config, overrides).run.seed
    plan = plan_runs(config, parsed, protocol, overrides, base_seed)
    eval_dirs = [protocol.eval_dir(s.name, k - base_seed) for s in parsed for k in protocol.eval_seeds(base_seed)]
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be at least 1")
    check_compare_dir(out, plan, overwrite or resume, eval_dirs)
    check_backends(plan)
    from shoal.runner import make_out_dir

    make_out_dir(out)
    command = command or command_line(config, schemes, seeds, overrides, None, out, tune, tune_seeds, own_knobs)
    total = len(plan) + (len(eval_dirs) if protocol.tune_seeds else 0)
    tuning: list[tuple[PlannedRun, dict[str, Any]]] = []
    try:
        with RunsProgress(total, quiet) as progress:
            summaries = execute(plan, out, progress, jobs, resume)
            if protocol.tune_seeds:
                tuning = list(zip(plan, summaries))
                plan = [run for s in parsed for run in evaluation_runs(config, s, protocol, overrides,
                                                                       chosen_point(tuning, s.name), base_seed)]
                summaries = execute(plan, out, progress, jobs, resume)
    except Interrupted as stop:
        _write_interrupted(out, stop, protocol, command, tuning, base_seed, parsed)
        raise
    result = build_compare(plan, summaries, protocol, command, tuning, base_seed, parsed)
    from shoal.engine.metrics import write_json_atomic
    from shoal.report.html import write_report

    write_json_atomic(out / "compare.json", result)
    with console.status("drawing the plots and writing report.html") if not quiet else nullcontext():
        report = write_report(out)
    for warning in result["warnings"] if not quiet else []:
        console.print(f"[yellow]warning:[/] {warning}")
    return result, report


def _write_interrupted(out: Path, stop: Interrupted, protocol: Protocol, command: str,
                       tuning: list[tuple["PlannedRun", dict[str, Any]]], base_seed: int, parsed: list[Scheme]) -> None:
    """compare.json of an interrupted comparison: the rows of the runs that finished, marked ``interrupted``
    (no report: its rows would compare unequal numbers of seeds). ``--resume`` goes on from here."""
    from shoal.engine.metrics import write_json_atomic

    done = sorted(stop.finished)
    cut = {stop.plan[i].scheme for i in stop.cut} | {p.scheme for i, p in enumerate(stop.plan) if i not in done}
    result: dict[str, Any] = {"command": command, "interrupted": True, "rows": []}
    if done:
        result = build_compare([stop.plan[i] for i in done], [stop.finished[i] for i in done], protocol, command,
                               tuning, base_seed, [s for s in parsed if any(stop.plan[i].scheme == s.name for i in done)])
        result["interrupted"] = True
    for row in result["rows"]:
        row["interrupted"] = row["scheme"] in cut
    result["interrupted_runs"] = [stop.plan[i].run_dir for i in stop.cut]
    result["runs_finished"], result["runs_planned"] = len(done), len(stop.plan)
    write_json_atomic(out / "compare.json", result)


def plan_runs(config: Path | None, schemes: list[Scheme], protocol: Protocol | int, overrides: list[str],
              base_seed: int | None = None) -> list[PlannedRun]:
    """Validate every run of the first phase up front: each (scheme, grid point, development seed) when tuning,
    else each (scheme, evaluation seed). The scheme's keys win over the grid and --set."""
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
        for point in grid_points(grid, dict(scheme.pinned)):
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
    try:
        cfg = load_config(config, overrides + tuned + list(scheme.overrides) + [f"run.seed={seed}"])
    except ConfigError as err:
        raise ConfigError(f"scheme {scheme.name}: {err}") from None
    return PlannedRun(scheme.name, seed, cfg, run_dir, tuple(point.items()), scheme.pinned, tuning)


def chosen_point(tuning: list[tuple[PlannedRun, dict[str, Any]]], scheme: str) -> dict[str, Any]:
    """The grid point a scheme keeps: the best by ``choose`` over its development seeds."""
    entries = tuning_entries(tuning, scheme)
    return entries[choose(entries)]["point"]


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
                 tune: list[str] = (), tune_seeds: int = 0, own_knobs: bool = True) -> str:
    """The command line that reproduces this comparison (shown in the report)."""
    args = ["shoal", "compare"] + (["--config", str(config)] if config else []) + ["--schemes", schemes]
    args += (["--seeds", str(seeds)] if seeds > 1 else []) + (["--backend", backend] if backend else [])
    args += (["--tune-seeds", str(tune_seeds)] if tune_seeds else []) + ([] if own_knobs else ["--no-own-knobs"])
    for t in tune:
        args += ["--tune", t]
    for s in sets:
        args += ["--set", s]
    return shlex.join(args + ["--out", str(out)])


# -- running -------------------------------------------------------------------------------------


def execute(plan: list[PlannedRun], out: Path, progress: "RunsProgress", jobs: int = 1,
            resume: bool = False) -> list[dict[str, Any]]:
    """Run the plan, each run into its folder, on the comparison's progress display: in order, or ``jobs`` at a
    time in worker processes (a sim run's results do not depend on what else the machine runs). With ``resume``
    a run whose folder already holds its finished summary under the same config is read, not run again."""
    from shoal.runner import train  # heavy (torch): only once everything is validated

    if out.exists():
        for name in COMPARE_FILES:  # --overwrite: no stale report may describe the new runs
            (out / name).unlink(missing_ok=True)
    summaries: dict[int, dict[str, Any]] = {}
    for i, run in enumerate(plan):
        done = finished_summary(out / run.run_dir, run.cfg) if resume else None
        if done is not None:
            summaries[i] = done
            progress.end(run, done, reused=True)
    todo = [i for i in range(len(plan)) if i not in summaries]
    if jobs <= 1:
        for i in todo:
            progress.begin(plan[i])
            try:
                summaries[i] = train(plan[i].cfg, out / plan[i].run_dir, overwrite=True, progress=progress.tick)
            except KeyboardInterrupt:  # before the run's own loop caught it (setting up, writing)
                raise Interrupted(plan, summaries, [i]) from None
            _stop_if_interrupted(plan, summaries, i)
            progress.end(plan[i], summaries[i])
    else:
        _execute_in_processes(plan, out, progress, jobs, todo, summaries)
    return [summaries[i] for i in range(len(plan))]


def _execute_in_processes(plan: list[PlannedRun], out: Path, progress: "RunsProgress", jobs: int, todo: list[int],
                          summaries: dict[int, dict[str, Any]]) -> None:
    """``jobs`` runs at a time. Ctrl-C reaches every process of the terminal's group: the runs in flight end as
    interrupted, the queued ones are cancelled, and the comparison stops."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet_when_idle)
    futures = {pool.submit(_train_quietly, plan[i].cfg, out / plan[i].run_dir): i for i in todo}
    try:
        for future in as_completed(futures):
            i = futures[future]
            summaries[i] = future.result()
            _stop_if_interrupted(plan, summaries, i)
            progress.end(plan[i], summaries[i])
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        cut = [i for f, i in futures.items() if f.done() and not f.cancelled() and f.exception() is None
               and f.result().get("stop_reason") == "interrupted"]
        for f, i in futures.items():
            if f.done() and not f.cancelled() and f.exception() is None and i not in cut:
                summaries.setdefault(i, f.result())
        for i in cut:
            summaries.pop(i, None)
        raise Interrupted(plan, summaries, cut) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stop_if_interrupted(plan: list[PlannedRun], summaries: dict[int, dict[str, Any]], i: int) -> None:
    """A run that ended by Ctrl-C stops the whole comparison; it is not counted as finished."""
    if summaries[i].get("stop_reason") == "interrupted":
        del summaries[i]
        raise Interrupted(plan, summaries, [i])


_RUNNING = {"now": False}  # in a --jobs worker process: whether a run is in progress


def _quiet_when_idle() -> None:
    """A --jobs worker process: Ctrl-C ends the run in progress as interrupted (its summary is written), and an
    idle process ignores it instead of dying with a traceback."""
    import signal

    def on_sigint(signum: int, frame: Any) -> None:
        if _RUNNING["now"]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def _train_quietly(cfg: Config, run_dir: Path) -> dict[str, Any]:
    """One run in a worker process of ``--jobs``."""
    from shoal.runner import train

    _RUNNING["now"] = True
    try:
        return train(cfg, run_dir, overwrite=True)
    finally:
        _RUNNING["now"] = False


def finished_summary(run_dir: Path, cfg: Config) -> dict[str, Any] | None:
    """The summary of a finished run in ``run_dir`` made with exactly ``cfg`` (None: it must run again).

    Its config.toml must say the same as ``cfg``: the same text, or the same
    values once read (a run written before a key existed holds that key's
    default, which is how the run behaved).
    """
    try:
        if not _same_config(run_dir / "config.toml", cfg):
            return None
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.get("stop_reason") in (None, "interrupted", "internal_error"):
        return None
    return summary


def _same_config(path: Path, cfg: Config) -> bool:
    text = path.read_text()
    if text == to_toml(cfg):
        return True
    try:
        return load_config(path).model_dump() == cfg.model_dump()
    except ConfigError:
        return False


class RunsProgress:
    """Two bars on stderr: runs done of total, and the current run's virtual time, iterations, accuracy."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.quiet, self.total = quiet, total
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
        tuning = f" tuning {point_label(dict(run.point))}" if run.tuning else ""
        return run.scheme + tuning + (f" seed {run.seed}" if "/seed-" in run.run_dir else "")

    def tick(self, tick: dict[str, Any]) -> None:
        if self.quiet:
            return
        acc = tick.get("accuracy")
        info = f"t={tick['t']:.1f}/{self.budget:g}s iters={tick['iterations']}" + (
            f" acc={acc:.3f}" if acc is not None else "")
        self.bar.update(self.current, completed=min(tick["t"], self.budget), info=info)

    def end(self, run: PlannedRun, summary: dict[str, Any], reused: bool = False) -> None:
        if self.quiet:
            return
        self.done += 1
        self.bar.update(self.all, completed=self.done, info=f"{self.done}/{self.total} runs")
        ttt, acc = summary["time_to_target_s"], summary.get("final_metric", summary["final_accuracy"])
        reached = f"target at {ttt:.1f}s" if ttt is not None else "target not reached"
        acc_text = f"{acc:.3f}" if acc is not None else "-"
        self.bar.console.print(f"[green]{'kept' if reused else 'done'}[/] {self._label(run)}: {reached}, final "
                               f"{summary.get('metric', 'accuracy')} {acc_text}, {summary['iterations']} iterations, "
                               f"wall {summary['wall_s']:.0f}s")

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.bar.stop()


# -- results -------------------------------------------------------------------------------------


def build_compare(plan: list[PlannedRun], summaries: list[dict[str, Any]], protocol: Protocol, command: str,
                  tuning: list[tuple[PlannedRun, dict[str, Any]]] = (), base_seed: int = 0,
                  parsed: list[Scheme] = ()) -> dict[str, Any]:
    """compare.json: what was compared and how, and one row per scheme (its evaluation seeds at its kept point) with
    the speed-up over BSP and the p-value against the best baseline."""
    names = list(dict.fromkeys(p.scheme for p in plan))
    rows = []
    for name in names:
        runs = [(p, s) for p, s in zip(plan, summaries) if p.scheme == name]
        if len(runs) == 1:
            row = single_row(name, runs[0][1], runs[0][0].run_dir)
        else:
            row = seeds_row(name, [s for _, s in runs], [p.run_dir for p, _ in runs], [p.seed for p, _ in runs])
        if protocol.tune_seeds:
            row["tuned"] = dict(runs[0][0].point)
            row["tuning"] = tuning_entries(list(tuning), name)
        if runs[0][0].pinned:
            row["pinned"] = dict(runs[0][0].pinned)
        rows.append(row)
    schemes = {s.name: s for s in parsed}
    grids = {n: protocol.scheme_grid(schemes[n]) for n in names if n in schemes} if protocol.tune_seeds else {}
    first = plan[0].cfg
    return {
        "command": command,
        "provenance": provenance(),
        "schemes": names,
        "seeds": protocol.seeds,
        "tune": protocol.grid,
        "tune_seeds": protocol.tune_seeds,
        "tuning_seeds": protocol.tuning_seeds(base_seed),
        "eval_seeds": protocol.eval_seeds(base_seed),
        "grids": grids,
        "backend": first.backend.name,
        "metric": first.task.metric,
        "target": first.run.target,
        "target_accuracy": first.run.target_accuracy,
        "max_time_s": first.run.max_time_s,
        "rows": add_significance(add_speedups(rows), {n for n, s in schemes.items() if s.baseline}),
        "warnings": resolution_warnings(rows, first) + tuning_warnings(rows, grids),
    }


#: evaluations a time to target needs before it means something (docs/fair-comparison.md)
MIN_EVALUATIONS = 20


def resolution_warnings(rows: list[dict[str, Any]], cfg: Config) -> list[str]:
    """Rows whose time to target spans fewer than MIN_EVALUATIONS evaluations: one evaluation tick is then a large
    share of the quantity compared."""
    warnings = []
    every_it, every_s = cfg.run.eval_every_iterations, cfg.run.eval_every_s
    for row in rows:
        ttt = row.get("time_to_target_s")
        if ttt is None:
            continue
        ticks = (row.get("iterations") or 0) / every_it if every_it else ttt / every_s
        if ticks < MIN_EVALUATIONS:
            unit = f"every {every_it} iterations" if every_it else f"every {every_s:g} s"
            warnings.append(f"resolution: {row['scheme']}'s time to target spans {ticks:.0f} evaluations ({unit}), "
                            f"fewer than {MIN_EVALUATIONS}; evaluate more often (run.eval_every_s or "
                            "run.eval_every_iterations)")
    return warnings


def tuning_warnings(rows: list[dict[str, Any]], grids: dict[str, dict[str, list[Any]]]) -> list[str]:
    """Schemes that kept the smallest or largest value of a grid: their best may lie beyond it."""
    warnings = []
    for row in rows:
        for key, value, side in grid_edges(grids.get(row["scheme"], {}), row.get("tuned") or {}):
            warnings.append(f"tuning: {row['scheme']} kept {key} = {value}, the {side} value of its grid "
                            f"{grids[row['scheme']][key]}: its best may lie beyond the grid; widen it (and every "
                            "other scheme's by as many points)")
    return warnings


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
            "cpu": cpu_model(), "torch": importlib.metadata.version("torch"), **git_provenance()}


#: where every default lives: the config sections (each key's default) and the schemes (their own grids)
DEFAULT_PATHS = ("src/shoal/config", "src/shoal/sync")


def defaults_digest() -> str:
    """A hash of every default of the config and every scheme's own grid: two comparisons with the same digest ran
    with the same defaults, whatever else changed in the code."""
    import hashlib

    from shoal.registry import SCHEMES

    grids = {name: [list(k) for k in e.item.grid] for name, e in SCHEMES.entries().items()}
    text = json.dumps([Config().model_dump(mode="json"), grids], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_provenance() -> dict[str, Any]:
    """The commit of the code that ran, the commit at which the defaults were last changed (frozen), and the
    defaults' digest.

    ``defaults_dirty`` is true when the defaults' files have uncommitted
    changes: such a results file was not produced with frozen defaults. The
    commits are left out outside a git checkout of shoal (an installed wheel).
    """
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return {"defaults_digest": defaults_digest()}

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"defaults_digest": defaults_digest(), "commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src")),
            "defaults_commit": git("log", "-1", "--format=%H", "--", *DEFAULT_PATHS) or None,
            "defaults_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", *DEFAULT_PATHS))}

