"""Re-planning after a link or switch fails, incrementally: only the streams the failure cut are planned again.

A full solve starts over. After one failure most of a plan still works: the
workers whose stream, or whose switch's aggregated stream, crossed the
failed element are *affected*; everyone else keeps node, path and rate. The
affected workers are planned on what the others leave (links per
direction, switch capacity, the PS's ingress), first at the old rate (one
flow search) and, if they do not fit, at the highest lower rate where they
do (the kept streams shrink with the rate, so there is more room). The
merged plan is scored by the one evaluator. A switch used by both kept and
re-planned workers sends one stream, though the sub-plan reserved a second
one for it: the reservation is only conservative.

A two-level plan is re-planned in its rooted model (the PS's rack switch as
the sink); if the failure hits that switch or its link to the PS, there is
nothing to keep and the result is a full solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import networkx as nx

from shoal.errors import ConfigError
from shoal.network.algorithms.budget import NO_LIMIT, Deadline
from shoal.network.algorithms.flownet import FlowNet
from shoal.network.algorithms.grid import highest_fit, lift_rooted, plan_grid, rate_candidates, rooted_model, try_rate
from shoal.network.evaluator import Evaluation, Plan, complete_paths, evaluate
from shoal.network.instance import Instance
from shoal.network.joint import Part, evaluate_joint, residual_net
from shoal.network.routing import Routes


@dataclass(frozen=True)
class Failure:
    """Failed links (as node pairs) and failed switches."""

    links: tuple[tuple[str, str], ...] = ()
    switches: tuple[str, ...] = ()

    def arcs(self, graph: nx.Graph) -> set[tuple[str, str]]:
        """Every directed arc that no longer carries traffic."""
        out = {(u, v) for u, v in self.links} | {(v, u) for u, v in self.links}
        for s in self.switches:
            out |= {(s, v) for v in graph[s]} | {(v, s) for v in graph[s]}
        return out


def parse_failures(graph: nx.Graph, specs: list[str]) -> Failure:
    """``--fail`` values: a switch name, or a link as ``A-B`` (split at the dash that names two linked nodes)."""
    links: list[tuple[str, str]] = []
    nodes: list[str] = []
    for spec in specs:
        if spec in graph and graph.nodes[spec]["kind"] == "switch":
            nodes.append(spec)
            continue
        splits = [(spec[:i], spec[i + 1:]) for i, c in enumerate(spec) if c == "-"]
        pair = next(((a, b) for a, b in splits if a in graph and b in graph and graph.has_edge(a, b)), None)
        if pair is None:
            raise ConfigError(f"--fail: {spec!r} is neither a switch nor a link A-B of the topology")
        links.append(pair)
    return Failure(tuple(links), tuple(nodes))


def apply_failure(inst: Instance, failure: Failure) -> Instance:
    """The instance after the failure: failed links and every link of a failed switch at 0 Gbps, failed switches unprogrammable."""
    g = inst.graph.copy()
    for u, v in failure.links:
        g[u][v]["bandwidth_gbps"] = 0.0
    for s in failure.switches:
        g.nodes[s]["programmable"] = False
        for v in g[s]:
            g[s][v]["bandwidth_gbps"] = 0.0
    reach = Routes(g).dist_to(inst.ps)
    cut = [w for w in inst.workers if w not in reach]
    if cut:
        raise ConfigError(f"--fail: worker {cut[0]!r} has no path to the PS {inst.ps!r} after the failure")
    return Instance(g, inst.ps, inst.workers, inst.ps_gbps, inst.worker_gbps)


@dataclass(frozen=True)
class Replan:
    plan: Plan
    evaluation: Evaluation
    affected: tuple[str, ...]
    solve_s: float
    notes: dict[str, object] = field(default_factory=dict)


def replan(before: Instance, plan: Plan, failure: Failure, deadline: Deadline = NO_LIMIT) -> Replan:
    """Repair ``plan`` (complete, for ``before``) after ``failure``: keep what still works, re-plan the rest."""
    start = time.perf_counter()
    after = apply_failure(before, failure)
    routes = Routes(after.graph)
    plan = complete_paths(plan, before, Routes(before.graph))
    old_rate = plan.claimed_rate_gbps if plan.claimed_rate_gbps is not None else evaluate(before, plan).min_rate_gbps  # grid claims its certified rate
    if plan.parents:
        root = next(iter(plan.parents.values()))
        rooted = rooted_model(after)
        if rooted is None or rooted[1] != root:  # the second level itself is gone
            return _full(after, routes, start, deadline, "the PS's rack switch or its link to the PS failed")
        model, inner = rooted[0], _unlift(plan, root)
        repaired, affected, rate_note = _repair(model, inner, old_rate, failure, Routes(model.graph), deadline)
        merged = lift_rooted(repaired, after, root)
    else:
        merged, affected, rate_note = _repair(after, plan, old_rate, failure, routes, deadline)
    ev = evaluate(after, merged, routes)
    return Replan(merged, ev, affected, time.perf_counter() - start, {"method": "incremental", **rate_note})


def _full(after: Instance, routes: Routes, start: float, deadline: Deadline, why: str) -> Replan:
    plan, _, notes = plan_grid(after, routes, 0, deadline)
    plan = complete_paths(plan, after, routes)
    return Replan(plan, evaluate(after, plan, routes), tuple(after.workers), time.perf_counter() - start,
                  {"method": "full solve", "why": why, **notes})


def _unlift(plan: Plan, root: str) -> Plan:
    """A two-level plan as a one-level plan of the rooted model (its root is the sink)."""
    switch_paths = {s: p for s, p in plan.switch_paths.items() if s != root}
    return Plan(dict(plan.assignment), dict(plan.worker_paths), switch_paths)


def _repair(inst: Instance, plan: Plan, old_rate: float, failure: Failure, routes: Routes,
            deadline: Deadline) -> tuple[Plan, tuple[str, ...], dict[str, object]]:
    """One-level repair: the kept part at the highest rate where the affected workers still fit beside it."""
    dead = failure.arcs(inst.graph)
    broken = {s for s, p in plan.switch_paths.items() if _crosses(p, dead)} | (set(failure.switches) & set(plan.assignment.values()))
    affected = tuple(sorted(w for w, a in plan.assignment.items() if a in broken or _crosses(plan.worker_paths[w], dead)))
    if not affected:
        return plan, (), {"affected_workers": 0}
    keep = {w: a for w, a in plan.assignment.items() if w not in set(affected)}
    kept = Plan(keep, {w: plan.worker_paths[w] for w in keep}, {s: plan.switch_paths[s] for s in set(keep.values()) - {inst.ps}})
    fixed_inst = inst.restricted(tuple(sorted(keep)))
    def fit(rate: float) -> Plan | None:
        return _fit_affected(inst, fixed_inst, kept, affected, rate, routes, deadline)

    sub = fit(old_rate) if old_rate > 0 else None
    best: tuple[float, Plan] | None = (old_rate, sub) if sub is not None else None  # the usual case: one flow search
    if best is None:  # the highest lower rate where they fit (the kept streams shrink with it)
        best, _ = highest_fit(rate_candidates(inst, 0.0, old_rate), fit)
    if best is None:  # not even at the lowest rate: everyone affected goes to the PS
        sub = Plan({w: inst.ps for w in affected})
        best = (0.0, complete_paths(sub, inst.restricted(affected), routes))
    rate, sub = best
    merged = Plan({**keep, **sub.assignment}, {**kept.worker_paths, **sub.worker_paths},
                  {**{s: p for s, p in sub.switch_paths.items() if s in set(sub.assignment.values())}, **kept.switch_paths})
    return merged, affected, {"affected_workers": len(affected), "old_rate_gbps": old_rate, "repair_rate_gbps": rate}


def _fit_affected(inst: Instance, fixed_inst: Instance, kept: Plan, affected: tuple[str, ...], rate: float,
                  routes: Routes, deadline: Deadline) -> Plan | None:
    """The affected workers' plan at ``rate`` in what the kept plan leaves.

    The kept switches already stream to the PS, so an affected worker may
    join one for no new PS stream (``streaming``); the kept direct workers'
    streams come off B.
    """
    deadline.check()
    direct = sum(1 for a in kept.assignment.values() if a == inst.ps)
    sub_inst = inst.restricted(affected, max(0.0, inst.ps_gbps - direct * rate))
    net = residual_net(sub_inst, evaluate_joint(inst.graph, [Part(fixed_inst, kept, rate)], routes)) if kept.assignment else FlowNet(sub_inst)
    return try_rate(net, rate, deadline=deadline, streaming=set(kept.switch_paths))


def _crosses(path: tuple[str, ...], dead: set[tuple[str, str]]) -> bool:
    return any((u, v) in dead for u, v in zip(path, path[1:]))
