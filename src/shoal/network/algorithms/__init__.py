"""Routing planners, all scored by the one evaluator.

A planner is a pure function ``(instance, routes, seed) -> (plan, bound_gbps, notes)``;
``solve`` times it and scores the plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.network.algorithms.baselines import plan_atp, plan_geryon, plan_switchml
from shoal.network.algorithms.exact import plan_exact
from shoal.network.algorithms.grid import plan_grid
from shoal.network.algorithms.rgria import plan_rgria
from shoal.network.evaluator import Evaluation, Plan, complete_paths, evaluate
from shoal.network.instance import Instance
from shoal.network.routing import Routes

Planner = Callable[[Instance, Routes, int], tuple[Plan, "float | None", dict[str, object]]]

ALGORITHMS: dict[str, Planner] = {
    "grid": plan_grid,
    "rgria": plan_rgria,
    "exact": plan_exact,
    "geryon": plan_geryon,
    "atp": plan_atp,
    "switchml": plan_switchml,
}


@dataclass(frozen=True)
class Result:
    algo: str
    plan: Plan
    evaluation: Evaluation
    bound_gbps: float | None
    solve_s: float
    notes: dict[str, object] = field(default_factory=dict)

    def to_json(self, with_assignment: bool = True) -> dict[str, object]:
        """The `shoal route --json` record (the route contract, plus detail)."""
        ev = self.evaluation
        out: dict[str, object] = {
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
            "direct_workers": ev.ps_streams - len(ev.switch_workers),
            "notes": self.notes,
        }
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


def solve(inst: Instance, algo: str, seed: int = 0, routes: Routes | None = None) -> Result:
    """Run one planner (timed) and score its plan with the evaluator."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}")
    routes = routes or Routes(inst.graph)
    start = time.perf_counter()
    plan, bound, notes = ALGORITHMS[algo](inst, routes, seed)
    plan = complete_paths(plan, inst, routes)
    elapsed = time.perf_counter() - start
    return Result(algo, plan, evaluate(inst, plan, routes), bound, elapsed, notes)
