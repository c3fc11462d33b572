"""Several plans on one network at once: the joint evaluator, and the two planners that need it.

Beyond the paper (GRID, ATP and SwitchML plan one job with one PS):

- **Sharded model over several PSs** (``plan_sharded``): the model is cut
  into P equal shards, shard p lives on PS p, and every worker sends each
  shard to its own PS as a stream at rate r, so its gradient goes out at
  lambda = P * r. Each shard's aggregation is planned (its own commodity:
  switch, paths, one aggregated stream per used switch to *its* PS); all
  shards share the switches' capacity, the links and the workers' T.
- **Several jobs sharing the switches** (``plan_jobs``): each job has its
  own PS and workers; a switch's capacity (Gbps) and its aggregator memory
  (``slots``, units each job holds on every switch it uses, ATP's
  "aggregators") are shared. Rates are max-min fair: first the largest
  rate every job reaches at once, then each job in turn raised as far as
  the others' plans allow (progressive filling).

``evaluate_joint`` is the one judge for both, the evaluator's constraints
summed over every part: a link carries sum_i n_i(e) * rate_i, a switch sums
sum_i k_i(s) * rate_i and holds sum of slots of the parts using it, a PS
takes its parts' streams, a worker sends its parts' streams within T.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import networkx as nx

from shoal.network.algorithms.budget import NO_LIMIT, Deadline
from shoal.network.algorithms.exact import optimum
from shoal.network.algorithms.flownet import FlowNet
from shoal.network.algorithms.grid import highest_fit, lift_rooted, rate_candidates, rooted_model, try_rate
from shoal.network.evaluator import TOL, Plan, Violation, complete_paths, evaluate
from shoal.network.instance import Instance
from shoal.network.routing import Routes

DEFAULT_SLOTS = 40_000  # aggregator units per switch when the topology says nothing (ATP's and SwitchML's figures: 8-40 thousand)


@dataclass(frozen=True)
class Part:
    """One plan on the shared network: its instance (PS, workers, B, T), plan, rate, and slots per used switch."""

    inst: Instance
    plan: Plan
    rate_gbps: float
    slots: int = 0


@dataclass(frozen=True)
class JointEvaluation:
    scale: float  # the largest factor every part's rate can be multiplied by with nothing overloaded (>= 1: feasible)
    bottleneck: str
    violations: tuple[Violation, ...]
    switch_load_gbps: dict[str, float] = field(default_factory=dict)
    switch_slots: dict[str, int] = field(default_factory=dict)
    link_load_gbps: dict[tuple[str, str], float] = field(default_factory=dict)  # per directed link

    @property
    def feasible(self) -> bool:
        return not self.violations


def evaluate_joint(graph: nx.Graph, parts: Sequence[Part], routes: Routes | None = None) -> JointEvaluation:
    """Score several plans at their rates on one graph: every shared constraint, loads summed over the parts."""
    routes = routes or Routes(graph)
    link: Counter[tuple[str, str]] = Counter()
    switch: Counter[str] = Counter()
    slots_used: Counter[str] = Counter()
    ps: Counter[str] = Counter()
    ps_cap: dict[str, float] = {}
    worker: Counter[str] = Counter()
    worker_cap: dict[str, float] = {}
    for part in parts:
        plan = complete_paths(part.plan, part.inst, routes)
        ev = evaluate(part.inst, replace(plan, claimed_rate_gbps=part.rate_gbps), routes)
        for e, n in ev.link_streams.items():
            link[e] += n * part.rate_gbps
        for s, k in ev.switch_inputs.items():
            switch[s] += k * part.rate_gbps
            slots_used[s] += part.slots
        ps[part.inst.ps] += ev.ps_streams * part.rate_gbps
        ps_cap[part.inst.ps] = part.inst.ps_gbps
        for w in part.inst.workers:  # a shard's T is the worker's share of its T, so the caps add up to T
            worker[w] += part.rate_gbps
            worker_cap[w] = worker_cap.get(w, 0.0) + part.inst.worker_gbps
    checks = [("link", f"{u}->{v}", load, float(graph.edges[u, v]["bandwidth_gbps"])) for (u, v), load in sorted(link.items())]
    checks += [("switch_capacity", s, load, float(graph.nodes[s]["capacity_gbps"])) for s, load in sorted(switch.items())]
    checks += [("ps_ingress", p, load, ps_cap[p]) for p, load in sorted(ps.items())]
    checks += [("worker_rate", w, load, worker_cap[w]) for w, load in sorted(worker.items())]
    slot_checks = [("switch_slots", s, float(n), float(switch_slots(graph, s))) for s, n in sorted(slots_used.items()) if n]
    violations = tuple(Violation(kind, where, load, cap, load / cap if cap > 0 else math.inf)
                       for kind, where, load, cap in checks + slot_checks if load > cap * (1 + TOL))
    limits = [(cap / load, f"{kind} {where}") for kind, where, load, cap in checks if load > 0 and math.isfinite(cap)]
    scale, bottleneck = min(limits, default=(math.inf, "none"))
    if any(v.kind == "switch_slots" for v in violations):
        scale = min(scale, 0.0)  # memory does not scale with the rate: no rate makes it fit
    return JointEvaluation(scale, bottleneck, violations, dict(switch), dict(slots_used), dict(link))


def switch_slots(graph: nx.Graph, switch: str) -> int:
    """Aggregator memory units of a switch (node attribute ``slots``, else DEFAULT_SLOTS)."""
    return int(graph.nodes[switch].get("slots", DEFAULT_SLOTS))


# --------------------------------------------------------------------------- planning on what the others leave


def residual_net(inst: Instance, taken: JointEvaluation, blocked: Collection[str] = ()) -> FlowNet:
    """The flow net of ``inst`` with what other parts use (``taken``: their joint loads) taken out of
    switch capacities and of each link, per direction. ``blocked`` switches cannot aggregate."""
    net = FlowNet(inst)
    for s, load in taken.switch_load_gbps.items():
        if s in net.capacity:
            net.capacity[s] = max(0.0, net.capacity[s] - load)
    for (u, v), load in taken.link_load_gbps.items():
        arc = net.arc_index(u, v)
        if arc is not None:
            net.bw[arc] = max(0.0, net.bw[arc] - load)
    if blocked:
        net.prog = [s for s in net.prog if s not in set(blocked)]
    return net


def _fit(inst: Instance, fixed: Sequence[Part], rate: float, routes: Routes, slots: int, deadline: Deadline) -> Plan | None:
    """A plan for ``inst`` at ``rate`` in what the fixed parts leave (switches without ``slots`` free excluded), or None."""
    deadline.check()
    taken = evaluate_joint(inst.graph, fixed, routes)
    blocked = {s for s in inst.programmable if slots and taken.switch_slots.get(s, 0) + slots > switch_slots(inst.graph, s)}
    return try_rate(residual_net(inst, taken, blocked), rate, deadline=deadline)


# --------------------------------------------------------------------------- several PSs, one sharded model


@dataclass(frozen=True)
class ShardedResult:
    """Per shard its PS and plan, the common stream rate r, and what it gives a worker: lambda = P * r."""

    shards: tuple[Part, ...]
    stream_rate_gbps: float
    evaluation: JointEvaluation
    bound_gbps: float
    solve_s: float
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def min_rate_gbps(self) -> float:
        """The honest gradient rate of every worker: P shard streams at the certified rate."""
        return len(self.shards) * self.stream_rate_gbps * min(1.0, self.evaluation.scale)

    def to_json(self) -> dict[str, object]:
        ev = self.evaluation
        return {
            "min_rate_gbps": self.min_rate_gbps, "stream_rate_gbps": self.stream_rate_gbps, "bound_gbps": self.bound_gbps,
            "ps_count": len(self.shards), "bottleneck": ev.bottleneck, "violations": [v.to_json() for v in ev.violations],
            "solve_s": self.solve_s, "notes": self.notes,
            "shards": {p.inst.ps: {"aggregation_switches": dict(Counter(a for a in p.plan.assignment.values() if a != p.inst.ps)),
                                   "direct_workers": sum(1 for a in p.plan.assignment.values() if a == p.inst.ps)} for p in self.shards},
        }


def shard_instances(inst: Instance, servers: Sequence[str]) -> list[Instance]:
    """One instance per shard: its PS, the same workers, each sending 1/P of its rate T to each PS."""
    share = inst.worker_gbps / len(servers)
    return [Instance(inst.graph, ps, inst.workers, inst.ps_gbps, share) for ps in servers]


def sharded_bound(inst: Instance, servers: Sequence[str]) -> float:
    """An upper bound on lambda: the link-free optimum with the P PSs merged into one of ingress P * B
    and each switch free to mix shards in one stream (both only relax the problem)."""
    p, n = len(servers), len(inst.workers)
    rate, _ = optimum(n * p, [inst.capacity(s) for s in inst.programmable], p * inst.ps_gbps, inst.worker_gbps / p)
    return p * rate


def plan_sharded(inst: Instance, servers: Sequence[str], routes: Routes | None = None, deadline: Deadline = NO_LIMIT) -> ShardedResult:
    """grid for a model sharded over ``servers``: the highest common shard rate at which every shard's
    plan fits beside the others (planned one shard after another on what the earlier ones leave)."""
    start = deadline.start
    routes = routes or Routes(inst.graph)
    shards = shard_instances(inst, servers)
    rooted = [rooted_model(shard) for shard in shards]
    bound = sharded_bound(inst, servers)
    cand = rate_candidates(shards[0], 0.0, bound / len(servers))
    found, timed_out = highest_fit(cand, lambda rate: _fit_all(shards, rooted, rate, routes, deadline))
    direct = [Part(s, Plan({w: s.ps for w in s.workers}), s.ps_gbps / len(s.workers)) for s in shards]  # every worker direct
    best = found[1] if found is not None else direct
    rate = min(p.rate_gbps for p in best)
    best = [replace(p, rate_gbps=rate) for p in best]
    ev = evaluate_joint(inst.graph, best, routes)
    notes: dict[str, object] = {"servers": list(servers)}
    if timed_out:
        notes["time_limit"] = f"stopped searching at the {deadline.limit_s:g} s limit; best plan so far"
    return ShardedResult(tuple(best), rate, ev, bound, time.perf_counter() - start, notes)


def _fit_all(shards: Sequence[Instance], rooted: Sequence[tuple[Instance, str] | None], rate: float, routes: Routes,
             deadline: Deadline) -> list[Part] | None:
    """Every shard at ``rate``, one after another: two levels through its PS's rack switch where it can, else one."""
    parts: list[Part] = []
    for shard, root in zip(shards, rooted):
        plan = _fit_rooted(shard, root, parts, rate, routes, deadline) if root is not None else None
        plan = plan or _fit(shard, parts, rate, routes, 0, deadline)
        if plan is None:
            return None
        parts.append(Part(shard, plan, rate))
    return parts


def _fit_rooted(inst: Instance, rooted: tuple[Instance, str], fixed: Sequence[Part], rate: float, routes: Routes,
                deadline: Deadline) -> Plan | None:
    """A two-level plan at ``rate`` through the PS's rack switch, in what the fixed parts leave of it and of its link to the PS."""
    sub, root = rooted
    deadline.check()
    taken = evaluate_joint(inst.graph, fixed, routes)
    left = inst.capacity(root) - taken.switch_load_gbps.get(root, 0.0)
    link = float(inst.graph.edges[root, inst.ps]["bandwidth_gbps"]) - taken.link_load_gbps.get((root, inst.ps), 0.0)
    if rate > min(sub.worker_gbps, link) * (1 + TOL) or left < rate:
        return None
    model = Instance(sub.graph, root, sub.workers, left, sub.worker_gbps, sub.programmable)
    plan = try_rate(residual_net(model, taken), rate, deadline=deadline)
    return lift_rooted(plan, inst, root) if plan is not None else None


def plan_sharded_by(inst: Instance, servers: Sequence[str], algo: str, seed: int = 0, time_limit_s: float = 60.0) -> ShardedResult | None:
    """Any planner per shard, each on its own as if alone, then scored together at the common shard rate
    the network honestly allows (None: the planner ran out of time on a shard)."""
    from shoal.network.algorithms import solve

    start = time.perf_counter()
    routes = Routes(inst.graph)
    parts = []
    for shard in shard_instances(inst, servers):
        res = solve(shard, algo, seed, routes, time_limit_s)
        if res.plan is None:
            return None
        parts.append(Part(shard, res.plan, 1.0))
    scale = evaluate_joint(inst.graph, parts, routes).scale
    parts = [replace(p, rate_gbps=scale) for p in parts]
    return ShardedResult(tuple(parts), scale, evaluate_joint(inst.graph, parts, routes), math.nan, time.perf_counter() - start,
                         {"planned": "each shard on its own"})


# --------------------------------------------------------------------------- several jobs


@dataclass(frozen=True)
class Job:
    name: str
    inst: Instance
    slots: int = 1024  # aggregator units the job holds on each switch it uses


@dataclass(frozen=True)
class JobsResult:
    parts: tuple[Part, ...]
    names: tuple[str, ...]
    evaluation: JointEvaluation
    common_rate_gbps: float  # the max-min level every job reached at once
    solve_s: float
    notes: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        ev = self.evaluation
        return {
            "common_rate_gbps": self.common_rate_gbps, "min_rate_gbps": min(p.rate_gbps for p in self.parts),
            "feasible": ev.feasible, "violations": [v.to_json() for v in ev.violations], "solve_s": self.solve_s,
            "notes": self.notes,
            "jobs": {name: {"ps": p.inst.ps, "workers": len(p.inst.workers), "rate_gbps": p.rate_gbps, "slots_per_switch": p.slots,
                            "aggregation_switches": dict(Counter(a for a in p.plan.assignment.values() if a != p.inst.ps))}
                     for name, p in zip(self.names, self.parts)},
            "switch_slots_used": {s: n for s, n in sorted(ev.switch_slots.items()) if n},
        }


def plan_jobs(graph: nx.Graph, jobs: Sequence[Job], routes: Routes | None = None, deadline: Deadline = NO_LIMIT) -> JobsResult:
    """Max-min fair plans for several jobs: the highest common rate, then each job raised in turn."""
    routes = routes or Routes(graph)
    hi = max(j.inst.worker_gbps for j in jobs)
    cand = sorted(set().union(*(set(rate_candidates(j.inst, 0.0, hi).tolist()) for j in jobs)))
    found, timed_out = highest_fit(cand, lambda rate: _jobs_at(jobs, rate, routes, deadline))
    if found is not None:
        level, best = found
    else:
        best = _direct_level(graph, jobs, routes)
        level = min(p.rate_gbps for p in best)
    for i, job in enumerate(jobs):  # progressive filling: raise each job beside the others' plans
        if timed_out:
            break
        others = best[:i] + best[i + 1:]
        raised, timed_out = highest_fit(rate_candidates(job.inst, 0.0, job.inst.worker_gbps),
                                        lambda rate, job=job, others=others: _fit(job.inst, others, rate, routes, job.slots, deadline))
        if raised is not None and raised[0] > best[i].rate_gbps:
            best = best[:i] + [Part(job.inst, raised[1], raised[0], job.slots)] + best[i + 1:]
    ev = evaluate_joint(graph, best, routes)
    notes: dict[str, object] = {"fairness": "max-min: a common rate for all, then each job raised in turn"}
    if timed_out:
        notes["time_limit"] = f"stopped searching at the {deadline.limit_s:g} s limit; best plans so far"
    return JobsResult(tuple(best), tuple(j.name for j in jobs), ev, level, time.perf_counter() - deadline.start, notes)


def _jobs_at(jobs: Sequence[Job], rate: float, routes: Routes, deadline: Deadline) -> list[Part] | None:
    parts: list[Part] = []
    for job in jobs:
        if rate > job.inst.worker_gbps * (1 + TOL):
            return None
        plan = _fit(job.inst, parts, rate, routes, job.slots, deadline)
        if plan is None:
            return None
        parts.append(Part(job.inst, plan, rate, job.slots))
    return parts


def _direct_level(graph: nx.Graph, jobs: Sequence[Job], routes: Routes) -> list[Part]:
    """Every worker straight to its PS, at the largest common rate the network allows (the last resort)."""
    parts = [Part(j.inst, Plan({w: j.inst.ps for w in j.inst.workers}), 1.0, 0) for j in jobs]
    scale = evaluate_joint(graph, parts, routes).scale
    return [replace(p, rate_gbps=scale, slots=j.slots) for p, j in zip(parts, jobs)]
