"""Running a comparison's plan: in order or ``jobs`` at a time in worker processes, reusing finished runs with
``--resume``, on one progress display; Ctrl-C ends it as :class:`Interrupted` with what finished, and a file
``OUT/STOP`` ends it the same way once the runs in flight have finished (none is cut short)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shoal.comparison.plan import COMPARE_FILES, PlannedRun
from shoal.config import Config, load_config, to_toml
from shoal.errors import ConfigError
from shoal.report.tuning import point_label

console = Console(stderr=True)
#: the stop reasons of a run that must run again (``--resume``): none yet, cut short, or a bug
UNFINISHED = (None, "interrupted", "internal_error")
#: a file of this name in a comparison's folder asks it to stop once the runs in flight have finished
STOP_FILE = "STOP"


class Interrupted(KeyboardInterrupt):
    """A comparison stopped before its end: what finished (plan index -> summary), which runs were cut short
    (Ctrl-C), and whether it was asked to stop after the runs in flight (``OUT/STOP``: ``drained``)."""

    def __init__(self, plan: list["PlannedRun"], finished: dict[int, dict[str, Any]], cut: list[int],
                 drained: bool = False) -> None:
        super().__init__("interrupted")
        self.plan, self.finished, self.cut, self.drained = plan, finished, cut, drained


def stop_requested(out: Path) -> bool:
    """Whether ``OUT/STOP`` asks the comparison to start no more runs (a long one ends at a run's end, not in
    the middle of one: nothing computed is lost)."""
    return (out / STOP_FILE).exists()


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
    if resume:
        for i in todo:
            set_aside(out / plan[i].run_dir)
    if jobs <= 1:
        for i in todo:
            if stop_requested(out):
                raise Interrupted(plan, summaries, [], drained=True)
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
    interrupted, the queued ones are cancelled, and the comparison stops. ``OUT/STOP``, seen when a run ends,
    cancels the queued runs and lets the ones in flight finish."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet_when_idle)
    futures = {pool.submit(_train_quietly, plan[i].cfg, out / plan[i].run_dir, out): i for i in todo}
    try:
        for future in as_completed(futures):
            i = futures[future]
            if future.cancelled() or (summary := future.result()) is None:  # not started: OUT/STOP came first
                continue
            summaries[i] = summary
            _stop_if_interrupted(plan, summaries, i)
            progress.end(plan[i], summaries[i])
            if stop_requested(out):
                for waiting in futures:
                    waiting.cancel()  # the queued ones; the runs in flight go on to their end
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        ended = {i: f.result() for f, i in futures.items()
                 if f.done() and not f.cancelled() and f.exception() is None and f.result() is not None}
        cut = [i for i, summary in ended.items() if summary.get("stop_reason") == "interrupted"]
        for i, summary in ended.items():
            if i not in cut:
                summaries.setdefault(i, summary)
        for i in cut:
            summaries.pop(i, None)
        raise Interrupted(plan, summaries, cut) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if len(summaries) < len(plan):  # only OUT/STOP leaves runs unstarted without an exception
        raise Interrupted(plan, summaries, [], drained=True)


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


def _train_quietly(cfg: Config, run_dir: Path, out: Path) -> dict[str, Any] | None:
    """One run in a worker process of ``--jobs``; None when ``OUT/STOP`` asked for no more runs before it began
    (the pool hands a process its next run before the comparison can cancel it)."""
    from shoal.runner import train

    if stop_requested(out):
        return None
    _RUNNING["now"] = True
    try:
        return train(cfg, run_dir, overwrite=True)
    finally:
        _RUNNING["now"] = False


def set_aside(run_dir: Path) -> Path | None:
    """Move a finished run that is to be run again under another config (``--resume`` after the plan changed:
    another kept grid point, ``--widen``, other ``--set`` values) to ``RUN_DIR.replaced-N``, so that resuming
    never deletes a finished run. A run cut short (no summary, or an unfinished one) is simply run again."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.get("stop_reason") in UNFINISHED:
        return None
    n = 1
    while (target := run_dir.with_name(f"{run_dir.name}.replaced-{n}")).exists():
        n += 1
    run_dir.rename(target)
    return target


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
    if summary.get("stop_reason") in UNFINISHED:
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
    """Two bars on stderr: runs done of total (with the time left), and the current run's virtual time,
    iterations, accuracy; a line per finished run, which a log keeps."""

    def __init__(self, total: int, quiet: bool, jobs: int = 1) -> None:
        self.quiet, self.total, self.jobs = quiet, total, max(1, jobs)
        self.walls: list[float] = []  # wall seconds of the runs this comparison ran (not those --resume kept)
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
        if not reused:
            self.walls.append(summary["wall_s"])
        runs = f"{self.done}/{self.total} runs{self.time_left()}"
        self.bar.update(self.all, completed=self.done, info=runs)
        ttt, acc = summary["time_to_target_s"], summary.get("final_metric", summary["final_accuracy"])
        reached = f"target at {ttt:.1f}s" if ttt is not None else "target not reached"
        acc_text = f"{acc:.3f}" if acc is not None else "-"
        self.bar.console.print(f"[green]{'kept' if reused else 'done'}[/] {self._label(run)}: {reached}, final "
                               f"{summary.get('metric', 'accuracy')} {acc_text}, {summary['iterations']} iterations, "
                               f"wall {summary['wall_s']:.0f}s; {runs}", soft_wrap=True)  # a line per run in a log

    def time_left(self) -> str:
        """", about T left": the runs still to do at the mean wall time of those run so far, ``jobs`` at a time
        (a guess: runs of other schemes may take longer); nothing before a run has finished here."""
        left = self.total - self.done
        if not self.walls or left <= 0:
            return ""
        seconds = sum(self.walls) / len(self.walls) * math.ceil(left / self.jobs)
        return f", about {duration(seconds)} left"

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.bar.stop()


def duration(seconds: float) -> str:
    """A rough duration: "40 s", "12 min", "3.5 h"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
