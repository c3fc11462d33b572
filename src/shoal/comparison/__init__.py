"""Comparing schemes: plan every (scheme, grid point, seed) run, check it all, run them, write compare.json.

The library behind ``shoal compare`` and ``shoal.compare``, in three roles:
``plan`` (validate every run and the output folder up front), ``execute``
(run the plan, resumable, one or several at a time) and ``results``
(compare.json with its provenance). Every scheme's config (and every
seed's) is validated, and the output folder checked, before the first run
starts, so a typo in the last scheme never costs the runs before it.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

from shoal.comparison.execute import STOP_FILE, Interrupted, RunsProgress, console, execute, finished_summary
from shoal.comparison.plan import (RUN_FILES, PlannedRun, check_backends, check_compare_dir, chosen_point,
                                   command_line, evaluation_runs, plan_runs)
from shoal.comparison.results import build_compare, cpu_model, provenance, resolution_warnings
from shoal.config import load_config
from shoal.errors import ConfigError
from shoal.report.protocol import Protocol
from shoal.report.schemes import Scheme, parse_schemes
from shoal.report.tuning import parse_tune

__all__ = ["Interrupted", "PlannedRun", "Protocol", "RUN_FILES", "STOP_FILE", "build_compare", "command_line",
           "cpu_model", "evaluation_runs", "finished_summary", "phase_of", "plan_runs", "provenance",
           "resolution_warnings", "run_comparison"]


def run_comparison(config: Path | None, schemes: str, seeds: int, overrides: list[str], out: Path, overwrite: bool,
                   quiet: bool, tune: list[str], command: str | None = None, tune_seeds: int = 0,
                   own_knobs: bool = True, jobs: int = 1, resume: bool = False,
                   widen: int = 0) -> tuple[dict[str, Any], Path]:
    """Validate everything, tune on the development seeds, run the evaluation seeds, write compare.json and
    report.html."""
    protocol = Protocol(seeds, tune_seeds, parse_tune(tune), own_knobs, widen)
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
    (out / STOP_FILE).unlink(missing_ok=True)  # a stop asked of an earlier comparison in this folder is spent
    command = command or command_line(config, schemes, seeds, overrides, None, out, tune, tune_seeds, own_knobs,
                                      widen)
    total = len(plan) + (len(eval_dirs) if protocol.tune_seeds else 0)
    tuning: list[tuple[PlannedRun, dict[str, Any]]] = []
    try:
        with RunsProgress(total, quiet, jobs) as progress:
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
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    return result, report


def _write_interrupted(out: Path, stop: Interrupted, protocol: Protocol, command: str,
                       tuning: list[tuple["PlannedRun", dict[str, Any]]], base_seed: int, parsed: list[Scheme]) -> None:
    """compare.json of an interrupted comparison: the rows of the evaluation runs that finished, marked
    ``interrupted``, and the development seeds' results per grid point so far when the tuning phase was cut
    (``tuning_so_far``: a row never mixes grid points). No report: its rows would compare unequal numbers of
    seeds. ``--resume`` goes on from here."""
    from shoal.comparison.plan import tuning_entries
    from shoal.engine.metrics import write_json_atomic

    done = sorted(stop.finished)
    evaluated = [i for i in done if not stop.plan[i].tuning]
    developed = [(stop.plan[i], stop.finished[i]) for i in done if stop.plan[i].tuning]
    cut = {stop.plan[i].scheme for i in stop.cut} | {p.scheme for i, p in enumerate(stop.plan) if i not in done}
    result: dict[str, Any] = {"command": command, "interrupted": True, "rows": []}
    if evaluated:
        ran = [s for s in parsed if any(stop.plan[i].scheme == s.name for i in evaluated)]
        result = build_compare([stop.plan[i] for i in evaluated], [stop.finished[i] for i in evaluated], protocol,
                               command, tuning, base_seed, ran)
        result["interrupted"] = True
    for row in result["rows"]:
        row["interrupted"] = row["scheme"] in cut
    if developed:
        result["tuning_so_far"] = {name: tuning_entries(developed, name)
                                   for name in dict.fromkeys(p.scheme for p, _ in developed)}
    result["phase"] = phase_of(stop.plan)
    result["interrupted_runs"] = [stop.plan[i].run_dir for i in stop.cut]
    result["runs_finished"], result["runs_planned"] = len(done), len(stop.plan)
    write_json_atomic(out / "compare.json", result)


def phase_of(plan: list[PlannedRun]) -> str:
    """Which phase of the comparison a plan is: "tuning" (the development seeds) or "evaluation"."""
    return "tuning" if any(run.tuning for run in plan) else "evaluation"
