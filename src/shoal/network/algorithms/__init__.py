"""Routing planners, all scored by the one evaluator.

A planner is a pure function ``(instance, routes, seed, deadline) -> (plan, bound_gbps, notes)``;
``solve`` times it and scores the plan. A planner checks the deadline between
steps: it returns its best plan so far (saying so in ``notes["time_limit"]``)
or raises TimeLimit when it has none.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.network.algorithms.budget import Deadline, TimeLimit
from shoal.network.evaluator import Evaluation, Plan, complete_paths, evaluate
from shoal.network.instance import Instance
from shoal.network.routing import Routes
from shoal.registry import PLANNERS

Planner = Callable[..., tuple[Plan, "float | None", dict[str, object]]]  # (instance, routes, seed, deadline, **options)

#: every planner by name (the registry, filled by each planner's module)
ALGORITHMS = PLANNERS


@dataclass(frozen=True)
class Result:
    """One planner's plan and its evaluation; both None when it ran out of time with no plan (``timed_out``)."""

    algo: str
    plan: Plan | None
    evaluation: Evaluation | None
    bound_gbps: float | None
    solve_s: float
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def timed_out(self) -> bool:
        return self.plan is None

    def to_json(self, with_assignment: bool = True) -> dict[str, object]:
        """The `shoal route --json` record (the route contract, plus detail)."""
        if self.plan is None or self.evaluation is None:
            return _clean({"status": "time limit", "min_rate_gbps": None, "bound_gbps": self.bound_gbps,
                           "solve_s": self.solve_s, "notes": self.notes})
        ev = self.evaluation
        out: dict[str, object] = {
            "status": "time limit, best plan so far" if "time_limit" in self.notes else "ok",
            "min_rate_gbps": ev.min_rate_gbps,
            "bound_gbps": self.bound_gbps,
            "claimed_rate_gbps": self.plan.claimed_rate_gbps,
            "ps_load_gbps": ev.ps_load_gbps,
            "ps_streams": ev.ps_streams,
            "max_switch_utilisation": ev.max_switch_utilisation,
            "max_link_utilisation": ev.max_link_utilisation,
            "bottleneck": ev.bottleneck,
            "violations": [v.to_json() for v in ev.violations],
            "solve_s": self.solve_s,
            "aggregation_switches": ev.switch_workers,
            "direct_workers": sum(1 for a in self.plan.assignment.values() if a not in ev.switch_workers),
            "notes": self.notes,
        }
        if self.plan.parents:
            out["second_level"] = dict(sorted(self.plan.parents.items()))
        if with_assignment:
            out["assignment"] = dict(sorted(self.plan.assignment.items()))
        return _clean(out)


def _clean(obj: object) -> object:
    """JSON has no inf/nan: write null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


DEFAULT_TIME_LIMIT_S = 60.0


def solve(inst: Instance, algo: str, seed: int = 0, routes: Routes | None = None, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
          **options: object) -> Result:
    """Run one planner (timed, within ``time_limit_s``) and score its plan with the evaluator.

    ``options`` go to the planner (``two_level=False`` keeps grid to one level of aggregation).
    """
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}")
    routes = routes or Routes(inst.graph)
    deadline = Deadline(time_limit_s)
    try:
        plan, bound, notes = ALGORITHMS[algo](inst, routes, seed, deadline, **options)
    except TimeLimit as err:
        return Result(algo, None, None, None, time.perf_counter() - deadline.start, {"time_limit": str(err)})
    plan = complete_paths(plan, inst, routes)
    elapsed = time.perf_counter() - deadline.start
    return Result(algo, plan, evaluate(inst, plan, routes), bound, elapsed, notes)
