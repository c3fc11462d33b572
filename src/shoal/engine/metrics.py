"""Run metrics: the metrics.jsonl event stream and the summary.json record.

Every backend records the same events through ``RunRecorder``, so a result
from one backend reads like a result from the other.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from shoal.errors import InternalError  # noqa: F401 - re-exported: older code imports it from here

if TYPE_CHECKING:
    from shoal.engine.task import Evaluation


@dataclass
class WorkerStats:
    """Where one worker's time went."""

    id: int
    group: int
    speed: float
    iterations: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    comm_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    #: the largest single upload: what the link must carry at once (Streaming DiLoCo cuts it by its fragments)
    peak_push_bytes: int = 0

    def sent(self, up: int, down: int) -> None:
        """Count one iteration's upload and download."""
        self.bytes_up += int(up)
        self.bytes_down += int(down)
        self.peak_push_bytes = max(self.peak_push_bytes, int(up))


@dataclass
class RunRecorder:
    """Collects events (optionally streaming them to a JSONL file) and run totals."""

    stream: IO[str] | None = None
    log_iterations: bool = True
    evals: list[dict[str, Any]] = field(default_factory=list)
    iterations: int = 0
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    best_accuracy: float | None = None
    time_to_target_s: float | None = None
    metric: str = "accuracy"
    higher_is_better: bool = True
    best_metric: float | None = None
    last_metric: float | None = None
    _streak: list[float] = field(default_factory=list)  # times of the evaluations in a row at or above the target
    listener: Callable[[str, dict[str, Any]], None] | None = None  # also sees every event (TensorBoard scalars)
    traceback: str | None = None  # the traceback of an internal error (``shoal --debug`` prints it)

    def event(self, kind: str, **fields: Any) -> None:
        """One line of metrics.jsonl, flushed at once (a reader or a crash sees every event so far)."""
        if self.stream is not None:
            self.stream.write(dumps({"event": kind, **fields}) + "\n")
            self.stream.flush()
        if self.listener is not None:
            self.listener(kind, fields)

    def iteration(self, **fields: Any) -> None:
        """One worker iteration (``steps``: a period of that many local steps, sync.balance = "steps")."""
        self.iterations += int(fields.get("steps", 1))
        if self.log_iterations:
            self.event("iteration", **fields)
        elif self.listener is not None:
            self.listener("iteration", fields)

    def evaluation(self, t: float, value: float, loss: float, target: float | None, patience: int = 1, *,
                   accuracy: float | None = None) -> bool:
        """Record an evaluation of the metric; True the first time ``patience`` evaluations in a row reached the
        target (at least it, or at most it when lower is better; None: no target).

        The time to target is then the first evaluation of that streak, so
        patience makes the result trustworthy without making it later.
        """
        if self.metric == "accuracy":
            accuracy = value
        record: dict[str, Any] = {"t": t, "accuracy": accuracy, "loss": loss, "iterations": self.iterations,
                                  "bytes": int(self.bytes_up + self.bytes_down)}
        if self.metric != "accuracy":
            record.update(metric=self.metric, value=value)
        self.evals.append(record)
        self.event("eval", **record)
        if accuracy is not None:
            self.best_accuracy = accuracy if self.best_accuracy is None else max(self.best_accuracy, accuracy)
        better = max if self.higher_is_better else min
        self.best_metric = value if self.best_metric is None else better(self.best_metric, value)
        self.last_metric = value
        if self.time_to_target_s is not None or target is None:
            return False
        hit = self._hits(value, target)
        self._streak = [*self._streak, t] if hit else []
        if len(self._streak) >= patience:
            self.time_to_target_s = self._streak[0]
            return True
        return False

    @property
    def streak_length(self) -> int:
        """Regular evaluations in a row, up to the last one, that reached the target."""
        return len(self._streak)

    def refined_evaluation(self, point: dict[str, Any], ev: Evaluation, target: float) -> bool:
        """Record an evaluation of a model kept between two regular ones (run.eval_refine, engine/refine.py), in
        time order; a hit moves the time to target back to it. The best and final values stay those of the regular
        evaluations. True if it reached the target."""
        accuracy = ev.value if self.metric == "accuracy" else ev.accuracy
        record: dict[str, Any] = {**point, "accuracy": accuracy, "loss": ev.loss, "refined": True}
        if self.metric != "accuracy":
            record.update(metric=self.metric, value=ev.value)
        self.evals.insert(bisect.bisect_right(self.evals, point["t"], key=lambda e: e["t"]), record)
        self.event("eval", **record)
        hit = self._hits(ev.value, target)
        if hit:
            self.time_to_target_s = point["t"]
        return hit

    def _hits(self, value: float, target: float) -> bool:
        """Whether ``value`` reaches ``target``: at least it, or at most it when lower is better."""
        return value >= target if self.higher_is_better else value <= target

    @property
    def iterations_to_target(self) -> int | None:
        """The iterations all workers had done at the evaluation that is the time to target."""
        if self.time_to_target_s is None:
            return None
        return next((e["iterations"] for e in self.evals if e["t"] == self.time_to_target_s), None)

    @property
    def bytes_to_target(self) -> int | None:
        """The bytes every worker had sent and received at the evaluation that is the time to target."""
        if self.time_to_target_s is None:
            return None
        return next((e["bytes"] for e in self.evals if e["t"] == self.time_to_target_s), None)

    @property
    def final_accuracy(self) -> float | None:
        return self.evals[-1]["accuracy"] if self.evals else None

    def metric_fields(self, target: float | None) -> dict[str, Any]:
        """summary.json's metric fields: which metric, its direction, target, final and best values."""
        return {"metric": self.metric, "higher_is_better": self.higher_is_better, "target": target,
                "final_metric": self.last_metric, "best_metric": self.best_metric}


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (null), so the output stays valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(data: Any, indent: int | None = None) -> str:
    """Strict JSON (no bare NaN): non-finite numbers become null."""
    return json.dumps(finite(data), indent=indent, default=_jsonable, allow_nan=False)


def diverged(*values: float | None) -> bool:
    """A loss that is NaN or infinite: the run cannot recover, so it stops with ``stop_reason = "diverged"``."""
    return any(v is not None and not math.isfinite(v) for v in values)


def internal_error(recorder: "RunRecorder", t: float, err: BaseException) -> str:
    """Record an ``internal_error`` event with the traceback; returns the one-line error for the summary."""
    import traceback

    from shoal.plugins import user_frame

    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
    where = user_frame(err)  # a plug-in's own bug: the user's file and line, not shoal's
    text += f" (in your code: {where})" if where else ""
    recorder.traceback = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    recorder.event("internal_error", t=round(t, 6), error=text, traceback=recorder.traceback)
    return text


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return finite(value.item())
    if isinstance(value, set):
        return finite(sorted(value))
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def build_summary(
    *,
    recorder: RunRecorder,
    scheme: str,
    backend: str,
    mode: str,
    target_accuracy: float,
    elapsed_s: float,
    wall_s: float,
    stop_reason: str,
    groups: list[list[int]],
    workers: list[WorkerStats],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary.json record (the contract other tools read; docs/ARCHITECTURE.md, Outputs)."""
    return {
        "scheme": scheme,
        "backend": backend,
        "mode": mode,
        "final_accuracy": recorder.final_accuracy,
        "best_accuracy": recorder.best_accuracy,
        "target_accuracy": target_accuracy,
        "time_to_target_s": recorder.time_to_target_s,
        "bytes_to_target": recorder.bytes_to_target,
        "elapsed_s": elapsed_s,
        "wall_s": wall_s,
        "stop_reason": stop_reason,
        "iterations": recorder.iterations,
        "bytes_up": int(recorder.bytes_up),
        "bytes_down": int(recorder.bytes_down),
        "peak_push_bytes": max((w.peak_push_bytes for w in workers), default=0),
        "groups": groups,
        "per_worker": [_rounded(asdict(w)) for w in workers],
        **(extra or {}),
    }


def _rounded(record: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 9) if isinstance(v, float) and math.isfinite(v) else v for k, v in record.items()}


WALL_CLOCK_FIELDS = ("wall_s", "compute_s_measured")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file so a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
