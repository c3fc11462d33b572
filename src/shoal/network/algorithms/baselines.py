"""The paper's baselines, as it describes them; all use default (ECMP shortest) paths.

- geryon: no in-network aggregation; every worker sends straight to the PS.
- atp: each worker aggregates at the first programmable switch on its default
  path to the PS that still has room for one more worker at full rate T
  (first come, first served, workers in name order), else at the PS.
- switchml: each worker aggregates at its top-of-rack switch when that switch
  is programmable, else at the PS.

They claim no rate: like the congestion-controlled protocols they model, they
get the rate the network honestly allows.
"""

from __future__ import annotations

from shoal.network.evaluator import Plan
from shoal.network.instance import Instance
from shoal.network.routing import Routes


def plan_geryon(inst: Instance, routes: Routes, seed: int = 0) -> tuple[Plan, float | None, dict[str, object]]:
    return Plan({w: inst.ps for w in inst.workers}), None, {}


def plan_atp(inst: Instance, routes: Routes, seed: int = 0) -> tuple[Plan, float | None, dict[str, object]]:
    programmable = set(inst.programmable)
    load = {s: 0.0 for s in programmable}
    assignment: dict[str, str] = {}
    paths: dict[str, tuple[str, ...]] = {}
    for w in sorted(inst.workers):
        path = routes.path(w, inst.ps)
        assignment[w], paths[w] = inst.ps, path
        for i, node in enumerate(path[1:-1], start=1):
            if node in programmable and load[node] + inst.worker_gbps <= inst.capacity(node):
                load[node] += inst.worker_gbps
                assignment[w], paths[w] = node, path[: i + 1]
                break
    return Plan(assignment, worker_paths=paths), None, {}


def plan_switchml(inst: Instance, routes: Routes, seed: int = 0) -> tuple[Plan, float | None, dict[str, object]]:
    programmable = set(inst.programmable)
    assignment: dict[str, str] = {}
    for w in inst.workers:
        tor = routes.path(w, inst.ps)[1]
        assignment[w] = tor if tor in programmable else inst.ps
    return Plan(assignment), None, {}
