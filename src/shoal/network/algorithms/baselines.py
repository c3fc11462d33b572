"""The paper's baselines, as the GRID paper describes them, and ATP as ATP itself works.

- geryon: no in-network aggregation; every worker sends straight to the PS.
- atp (GRID paper, section on baselines and its Fig. 1): each worker
  aggregates at its *nearest* programmable switch (fewest hops; ties go to a
  switch on the worker's default path to the PS, then by name). Switches
  admit every worker and share their capacity among them: Fig. 1's switch
  of 9 Gbps with 4 workers gives each 9/4 = 2.25 Gbps. No admission rule,
  so the rate is what the shared capacities and the PS allow.
- atp2 (ATP, NSDI 2021, "two-level aggregation"): a worker's gradient is
  summed first at its own top-of-rack switch, then at the PS's top-of-rack
  switch, which sends one stream to the PS; a level that is not
  programmable is skipped (its streams pass through to the next level).
  Capacity is shared as above.
- switchml (SwitchML, NSDI 2021): each worker aggregates at its top-of-rack
  switch when that switch is programmable, else at the PS; the switch's
  capacity is shared among its workers.

They claim no rate: like the congestion-controlled protocols they model, they
get the rate the network honestly allows. All use default (ECMP shortest)
paths.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from shoal.network.algorithms.budget import NO_LIMIT, Deadline
from shoal.network.evaluator import Plan
from shoal.network.instance import Instance
from shoal.network.routing import Routes
from shoal.registry import PLANNERS

Planned = tuple[Plan, "float | None", dict[str, object]]


@PLANNERS.register("geryon", "Geryon: shortest path to the server, no in-network aggregation")
def plan_geryon(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT) -> Planned:
    return Plan({w: inst.ps for w in inst.workers}), None, {}


@PLANNERS.register("atp", "ATP: the nearest programmable switch on the default path, capacity shared at the achieved rate")
def plan_atp(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT) -> Planned:
    """Nearest programmable switch per worker, capacity shared."""
    nearest = _nearest_sources(routes.graph, inst.programmable)
    assignment: dict[str, str] = {}
    for w in inst.workers:
        ties = nearest.get(w, ())
        on_path = set(routes.path(w, inst.ps)) if len(ties) > 1 else set()
        assignment[w] = min(ties, key=lambda s: (s not in on_path, s), default=inst.ps)
    return Plan(assignment), None, {"rule": "nearest programmable switch, capacity shared"}


def _nearest_sources(g: nx.Graph, sources: Iterable[str]) -> dict[str, frozenset[str]]:
    """Every node's nearest sources (all those at the fewest hops), by one multi-source BFS.

    Streams are forwarded only by switches and only over links with positive
    bandwidth, so hosts are reached but never expanded.
    """
    near: dict[str, set[str]] = {s: {s} for s in sources}
    dist = dict.fromkeys(near, 0)
    frontier = list(near)
    while frontier:
        nxt: list[str] = []
        for u in frontier:
            if g.nodes[u]["kind"] != "switch":
                continue
            for v, attrs in g[u].items():
                if attrs["bandwidth_gbps"] <= 0:
                    continue
                if v not in dist:
                    dist[v], near[v] = dist[u] + 1, set(near[u])
                    nxt.append(v)
                elif dist[v] == dist[u] + 1:
                    near[v] |= near[u]
        frontier = nxt
    return {n: frozenset(s) for n, s in near.items()}


@PLANNERS.register("atp2", "ATP in two levels, as ATP itself works: a rack switch, then the next one up")
def plan_atp_two_level(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT) -> Planned:
    """The worker's top-of-rack switch, then the PS's, each where programmable; capacity shared."""
    programmable = set(inst.programmable)
    ps_tor = _tor(routes, inst.ps, inst.ps)
    second = ps_tor if ps_tor in programmable else None
    reach = routes.dist_to(second) if second is not None else {}
    assignment: dict[str, str] = {}
    parents: dict[str, str] = {}
    for w in inst.workers:
        tor = _tor(routes, w, inst.ps)
        if tor in programmable:
            assignment[w] = tor
            if second is not None and tor != second and tor in reach:
                parents[tor] = second
        else:
            assignment[w] = second if w in reach else inst.ps
    return Plan(assignment, parents=parents), None, {"second_level": second}


@PLANNERS.register("switchml", "SwitchML: aggregate at the top-of-rack switch")
def plan_switchml(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT) -> Planned:
    """The worker's top-of-rack switch where programmable, capacity shared."""
    programmable = set(inst.programmable)
    assignment: dict[str, str] = {}
    for w in inst.workers:
        tor = _tor(routes, w, inst.ps)
        assignment[w] = tor if tor in programmable else inst.ps
    return Plan(assignment), None, {}


def _tor(routes: Routes, host: str, ps: str) -> str | None:
    """The first switch on a worker's default path to the PS; for the PS, its first-named live neighbour switch."""
    g = routes.graph
    if host == ps:
        return min((v for v in g[host] if g[host][v]["bandwidth_gbps"] > 0 and g.nodes[v]["kind"] == "switch"), default=None)
    return routes.path(host, ps)[1]
