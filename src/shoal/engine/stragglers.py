"""Who held back whom: every wait at a gate, attributed to the worker whose delivery opened it.

A worker that waits at its gate (a BSP barrier, an SSP staleness bound, a
local-SGD sync point) starts again at the instant another worker's gradient
is delivered: on the simulator that delivery and the waiting worker's start
share one virtual time exactly, so each wait has exactly one culprit. The
start is the iteration's delivery time less its compute and communication
(``t - compute_s - comm_s``). Pure: it reads metrics.jsonl's iteration
events and nothing else. On ray the times are wall-clock and do not match
exactly, so the runner reports it for sim runs only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

TOLERANCE = 1e-9  # virtual times of one instant agree to the last bits; relative to the time
NOTICEABLE = 0.01  # waiting under this share of the workers' time is not worth a culprit


@dataclass
class Stragglers:
    """Per worker: time spent waiting, time it kept the others waiting, and who each worker waited for."""

    waited_s: list[float]
    held_back_s: list[float]
    busy_s: list[float]
    waited_for: dict[int, dict[int, float]] = field(default_factory=dict)
    unattributed_s: float = 0.0

    @property
    def culprit(self) -> int | None:
        """The worker that kept the others waiting longest, if waiting was noticeable at all."""
        total = sum(self.waited_s) + sum(self.busy_s)
        if not total or sum(self.waited_s) < NOTICEABLE * total or not any(self.held_back_s):
            return None
        return max(range(len(self.held_back_s)), key=lambda w: self.held_back_s[w])

    def verdict(self, unit: str = "s") -> str:
        """One line: who held the others back, and how much of all waiting it caused."""
        waiting = sum(self.waited_s)
        total = waiting + sum(self.busy_s)
        share = waiting / total if total else 0.0
        w = self.culprit
        if w is None:
            return f"no worker held the others back (the workers waited {share:.0%} of their time)"
        caused = self.held_back_s[w]
        return (f"worker {w} held the others back: {caused / waiting:.0%} of all waiting ({caused:.3g} {unit} of "
                f"{waiting:.3g} {unit}) ended when its gradient arrived; the workers waited {share:.0%} of their time")

    def to_dict(self, unit: str = "s") -> dict[str, Any]:
        """summary.json's ``stragglers``."""
        return {"culprit": self.culprit, "verdict": self.verdict(unit),
                "waited_s": [round(x, 9) for x in self.waited_s], "held_back_s": [round(x, 9) for x in self.held_back_s],
                "waited_for": {str(w): {str(b): round(s, 9) for b, s in by.items()} for w, by in self.waited_for.items()},
                "unattributed_s": round(self.unattributed_s, 9)}


def analyse(events: Iterable[Mapping[str, Any]], workers: int) -> Stragglers:
    """Attribute every wait in ``events`` (metrics.jsonl records, in order) to the worker that ended it."""
    result = Stragglers([0.0] * workers, [0.0] * workers, [0.0] * workers)
    recent: dict[int, deque[tuple[float, int]]] = {}  # per group: the last deliveries (time, worker)
    for event in events:
        if event.get("event") != "iteration":
            continue
        w, group, t = int(event["worker"]), int(event.get("group") or 0), float(event["t"])
        if w >= len(result.waited_s):  # a worker that joined mid-run
            for table in (result.waited_s, result.held_back_s, result.busy_s):
                table.extend([0.0] * (w + 1 - len(table)))
        busy = float(event.get("compute_s") or 0.0) + float(event.get("comm_s") or 0.0)
        result.busy_s[w] += busy
        wait = float(event.get("wait_s") or 0.0)
        deliveries = recent.setdefault(group, deque(maxlen=16 * max(workers, 1)))
        if wait > 0:
            result.waited_s[w] += wait
            opener = _opener(deliveries, t - busy, w)
            if opener is None:
                result.unattributed_s += wait
            else:
                result.held_back_s[opener] += wait
                by = result.waited_for.setdefault(w, {})
                by[opener] = by.get(opener, 0.0) + wait
        deliveries.append((t, w))
    return result


def _opener(deliveries: Iterable[tuple[float, int]], started: float, waiter: int) -> int | None:
    """The worker whose delivery happened at ``started`` (the latest such, another worker than the waiter)."""
    for t, w in reversed(deliveries):  # type: ignore[call-overload]
        if abs(t - started) <= TOLERANCE * max(1.0, abs(started)) and w != waiter:
            return w
        if t < started - TOLERANCE * max(1.0, abs(started)):
            return None
    return None
