"""Reading a run folder for the report: summary, evaluations, groups, SIM events, timeline windows.

metrics.jsonl can hold millions of iteration lines, so it is read in two
streaming passes: one for the (few) non-iteration events, and one that keeps
only the iterations inside the timeline window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ITERATION_PREFIX = '{"event": "iteration"'


@dataclass
class RunData:
    """What the report needs from one run (iterations are loaded separately, by window)."""

    name: str
    path: Path
    summary: dict[str, Any]
    evals: list[tuple[float, float]] = field(default_factory=list)  # (t, the metric: accuracy or task.metric's value)
    losses: list[tuple[float, float]] = field(default_factory=list)  # (t, test loss)
    accuracy_by_bytes: list[tuple[float, float]] = field(default_factory=list)  # (bytes sent and received so far, metric)
    groups: list[dict[str, Any]] = field(default_factory=list)
    sim: list[dict[str, Any]] = field(default_factory=list)
    balance: list[dict[str, Any]] = field(default_factory=list)  # sync.balance: each resize, {t, group, sizes}
    speeds: list[float] = field(default_factory=list)
    has_iterations: bool = False

    @property
    def split_t(self) -> float | None:
        """When the first grouping after the start happened (GSSP's profiled split), if any."""
        return next((g["t"] for g in self.groups if g.get("reason") != "start"), None)


def _lines(path: Path) -> Iterator[str]:
    with open(path) as stream:
        for line in stream:
            if line.strip():
                yield line


def load_run(name: str, path: Path) -> RunData:
    """Read summary.json and every non-iteration event of metrics.jsonl."""
    summary = json.loads((path / "summary.json").read_text())
    run = RunData(name=name, path=path, summary=summary)
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        return run
    for line in _lines(metrics):
        if line.startswith(ITERATION_PREFIX):
            run.has_iterations = True
            continue
        _take(run, json.loads(line))
    for curve in (run.evals, run.losses, run.accuracy_by_bytes):  # refined evaluations (run.eval_refine) come late
        curve.sort()
    return run


def _take(run: RunData, event: dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "eval":
        value = event.get("value", event.get("accuracy"))  # "value": task.metric where it is not accuracy
        if value is not None and math.isfinite(float(value)):
            run.evals.append((float(event["t"]), float(value)))
            if event.get("bytes") is not None:
                run.accuracy_by_bytes.append((float(event["bytes"]), float(value)))
        if event.get("loss") is not None and math.isfinite(float(event["loss"])):
            run.losses.append((float(event["t"]), float(event["loss"])))
    elif kind == "groups":
        run.groups.append(event)
    elif kind == "sim":
        run.sim.append(event)
    elif kind == "balance":
        run.balance.append(event)
    elif kind == "start":
        run.speeds = list(event.get("speeds") or [])
    elif kind == "iteration":
        run.has_iterations = True


def iterations_in(path: Path, t0: float, t1: float) -> list[dict[str, Any]]:
    """The iteration events of ``path``/metrics.jsonl whose span overlaps [t0, t1]."""
    found = []
    for line in _lines(path / "metrics.jsonl"):
        if not line.startswith(ITERATION_PREFIX) and '"iteration"' not in line:
            continue
        event = json.loads(line)
        if event.get("event") != "iteration" or event["t"] < t0:
            continue
        if event["t"] - span(event) <= t1:
            found.append(event)
    return found


def span(event: dict[str, Any]) -> float:
    """How long one iteration took, waiting included."""
    return float(event.get("wait_s") or 0) + float(event.get("comm_s") or 0) + float(event.get("compute_s") or 0)


def segments(event: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(kind, start, duration) of wait -> pull -> compute -> push, ending when the push arrived at ``t``.

    ``pull_s`` says how much of ``comm_s`` was spent pulling; without it the
    communication is split evenly between pull and push.
    """
    comm = float(event.get("comm_s") or 0)
    pull = float(event["pull_s"]) if event.get("pull_s") is not None else comm / 2
    parts = [("wait", float(event.get("wait_s") or 0)), ("comm", pull),
             ("compute", float(event.get("compute_s") or 0)), ("comm", max(0.0, comm - pull))]
    start = float(event["t"]) - sum(d for _, d in parts)
    out = []
    for kind, duration in parts:
        if duration > 0:
            out.append((kind, start, duration))
        start += duration
    return out


def slowest_iteration_s(runs: list[RunData]) -> float:
    """The longest mean iteration (compute + communication, no waiting) of any worker in any run."""
    longest = 0.0
    for run in runs:
        for w in run.summary.get("per_worker") or []:
            if w.get("iterations"):
                longest = max(longest, (w["compute_s"] + w["comm_s"]) / w["iterations"])
    return longest


def timeline_window(runs: list[RunData], iterations_shown: float = 12.0) -> tuple[float, float]:
    """One window for every run: about a dozen of the slowest worker's iterations around GSSP's split.

    The window starts a quarter before the first grouping (if any run has one),
    so the change from one group to several is in view, and is moved earlier
    if a run ended before it.
    """
    logged = [r for r in runs if r.has_iterations] or runs
    width = max(slowest_iteration_s(logged) * iterations_shown, 1e-3)
    ends = [float(r.summary.get("elapsed_s") or 0) for r in logged]
    end = min(ends) if ends else width
    splits = [t for t in (r.split_t for r in logged) if t is not None]
    start = max(splits) - width / 4 if splits else width / 2
    start = max(0.0, min(start, end - width))
    return start, min(start + width, end) if end > start else start + width
