"""latest: aggregate at the last programmable switch on each worker's default path to the server.

The opposite of ATP's nearest switch: summing as close to the server as a
worker's own path allows lets the most workers share one switch, so the
server receives the fewest streams, at the price of more load per switch
and of no aggregation on the links below it. A worker with no programmable
switch on its path sends straight to the server. Like the other baselines
it claims no rate: the one evaluator scores what the network allows.
"""

from __future__ import annotations

from shoal.network.algorithms.budget import NO_LIMIT, Deadline
from shoal.network.evaluator import Plan
from shoal.network.instance import Instance
from shoal.network.routing import Routes
from shoal.registry import PLANNERS


@PLANNERS.register("latest", "the last programmable switch on the default path (the fewest streams into the server)")
def plan_latest(inst: Instance, routes: Routes, seed: int = 0,
                deadline: Deadline = NO_LIMIT) -> tuple[Plan, float | None, dict[str, object]]:
    programmable = set(inst.programmable)
    assignment: dict[str, str] = {}
    for w in inst.workers:
        on_path = [node for node in routes.path(w, inst.ps)[1:-1] if node in programmable]
        assignment[w] = on_path[-1] if on_path else inst.ps
    return Plan(assignment), None, {"rule": "last programmable switch on the default path"}
