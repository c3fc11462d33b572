"""The one honest evaluator: what rate does a plan really allow, and what does it break?

Every worker sends its gradient stream at the same rate lambda (the PS waits
for all of them, so a faster worker gains nothing). A worker's stream runs
along its path to its aggregation node; a switch that aggregates k >= 1
input streams sends one stream at lambda along its path to its parent: the
PS, or (two-level aggregation, as ATP does it) another switch, where that
stream is one more input. Then

    lambda <= T                      (worker rate)
    k_s * lambda <= C_s              (each used switch, k_s = its workers + child switches)
    (d + a) * lambda <= B            (PS ingress: d direct workers, a switches whose parent is the PS)
    n_e * lambda <= bandwidth_e      (each directed link e carrying n_e streams)

and the honest rate is the largest lambda that meets them all. Loads,
utilisations and violations are measured at the rate the plan claims
(``claimed_rate_gbps``; the honest rate when it claims none), so a plan that
promises more than the network carries shows every constraint it breaks and
by what factor.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from shoal.network.instance import Instance
from shoal.network.routing import Routes

TOL = 1e-9


@dataclass(frozen=True)
class Plan:
    """Each worker's aggregation node (a programmable switch or the PS), and paths if chosen.

    ``parents`` sends a used switch's aggregated stream to another switch
    instead of the PS (two-level aggregation); ``switch_paths[s]`` runs from
    s to its parent.
    """

    assignment: Mapping[str, str]
    worker_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    switch_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    claimed_rate_gbps: float | None = None
    parents: Mapping[str, str] = field(default_factory=dict)

    def parent(self, switch: str, ps: str) -> str:
        """Where a used switch sends its aggregated stream."""
        return self.parents.get(switch, ps)

    def used_switches(self, ps: str) -> list[str]:
        """Switches that aggregate at least one stream: the workers' nodes and every parent above them."""
        used = {a for a in self.assignment.values() if a != ps}
        frontier = set(used)
        while frontier:
            frontier = {self.parents[s] for s in frontier if s in self.parents and self.parents[s] != ps} - used
            used |= frontier
        return sorted(used)


@dataclass(frozen=True)
class Violation:
    kind: str  # worker_rate | switch_capacity | ps_ingress | link
    where: str
    load_gbps: float
    capacity_gbps: float
    factor: float  # load / capacity (inf when the capacity is zero)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "where": self.where, "load_gbps": self.load_gbps, "capacity_gbps": self.capacity_gbps, "factor": _finite(self.factor)}


@dataclass(frozen=True)
class Evaluation:
    min_rate_gbps: float
    rate_gbps: float  # the rate loads are measured at
    bottleneck: str
    ps_streams: int
    ps_load_gbps: float
    switch_workers: dict[str, int]  # workers aggregated at each used switch
    switch_inputs: dict[str, int]  # streams into each used switch: its workers plus its child switches
    switch_utilisation: dict[str, float]
    link_streams: dict[tuple[str, str], int]
    link_utilisation: dict[tuple[str, str], float]
    violations: tuple[Violation, ...]

    @property
    def max_switch_utilisation(self) -> float:
        return max(self.switch_utilisation.values(), default=0.0)

    @property
    def max_link_utilisation(self) -> float | None:
        """None when no loaded link has a finite bandwidth."""
        finite = [u for u in self.link_utilisation.values() if not math.isnan(u)]
        return max(finite, default=None)


def complete_paths(plan: Plan, inst: Instance, routes: Routes) -> Plan:
    """Fill in default (ECMP shortest) paths where the plan has none."""
    wp = {w: tuple(plan.worker_paths[w]) if w in plan.worker_paths else routes.path(w, plan.assignment[w]) for w in inst.workers}
    sp = {s: tuple(plan.switch_paths[s]) if s in plan.switch_paths else routes.path(s, plan.parent(s, inst.ps))
          for s in plan.used_switches(inst.ps)}
    return Plan(dict(plan.assignment), wp, sp, plan.claimed_rate_gbps, dict(plan.parents))


def evaluate(inst: Instance, plan: Plan, routes: Routes | None = None) -> Evaluation:
    """Score a plan honestly; raise ValueError if it is malformed (a planner bug, not user input)."""
    _check_assignment(inst, plan)
    plan = complete_paths(plan, inst, routes or Routes(inst.graph))
    _check_paths(inst, plan)
    workers = Counter(a for a in plan.assignment.values() if a != inst.ps)
    used = plan.used_switches(inst.ps)
    k = Counter({s: workers[s] for s in used}) + Counter(plan.parent(s, inst.ps) for s in used)
    del k[inst.ps]
    ps_streams = sum(1 for a in plan.assignment.values() if a == inst.ps) + sum(1 for s in used if plan.parent(s, inst.ps) == inst.ps)
    streams = _link_streams(plan)
    limits = _limits(inst, k, ps_streams, streams)
    honest, bottleneck = min(limits, key=lambda t: t[0]) if limits else (math.inf, "none")
    rate = honest if plan.claimed_rate_gbps is None else plan.claimed_rate_gbps
    return Evaluation(
        min_rate_gbps=honest,
        rate_gbps=rate,
        bottleneck=bottleneck,
        ps_streams=ps_streams,
        ps_load_gbps=ps_streams * rate,
        switch_workers={s: workers[s] for s in used},
        switch_inputs={s: k[s] for s in used},
        switch_utilisation={s: _util(k[s] * rate, inst.capacity(s)) for s in used},
        link_streams=streams,
        link_utilisation={e: _util(n * rate, _bw(inst, e)) if math.isfinite(_bw(inst, e)) else math.nan for e, n in streams.items()},
        violations=tuple(_violations(inst, k, ps_streams, streams, rate)),
    )


def _check_assignment(inst: Instance, plan: Plan) -> None:
    if set(plan.assignment) != set(inst.workers):
        raise ValueError("plan must assign every worker exactly once")
    allowed = set(inst.programmable) | {inst.ps}
    for w, a in plan.assignment.items():
        if a not in allowed:
            raise ValueError(f"worker {w!r} assigned to {a!r}, which cannot aggregate")
    for s, parent in plan.parents.items():
        if s not in inst.programmable or parent not in allowed:
            raise ValueError(f"switch {s!r} sends to {parent!r}: both must be able to aggregate")
        seen = {s}
        while parent != inst.ps:
            if parent in seen:
                raise ValueError(f"aggregation loop through {parent!r}")
            seen.add(parent)
            parent = plan.parent(parent, inst.ps)


def _check_paths(inst: Instance, plan: Plan) -> None:
    for w, a in plan.assignment.items():
        _check_path(inst, plan.worker_paths[w], w, a)
    for s, p in plan.switch_paths.items():
        _check_path(inst, p, s, plan.parent(s, inst.ps))


def _check_path(inst: Instance, path: tuple[str, ...], src: str, dst: str) -> None:
    if not path or path[0] != src or path[-1] != dst:
        raise ValueError(f"path {path} does not run from {src!r} to {dst!r}")
    for u, v in zip(path, path[1:]):
        if not inst.graph.has_edge(u, v):
            raise ValueError(f"path {path} uses a missing link {u!r}-{v!r}")
    for node in path[1:-1]:
        if inst.graph.nodes[node]["kind"] != "switch":
            raise ValueError(f"path {path} transits host {node!r}")


def _link_streams(plan: Plan) -> dict[tuple[str, str], int]:
    streams: Counter[tuple[str, str]] = Counter()
    for path in [*plan.worker_paths.values(), *plan.switch_paths.values()]:
        streams.update(zip(path, path[1:]))
    return dict(streams)


def _bw(inst: Instance, arc: tuple[str, str]) -> float:
    return float(inst.graph.edges[arc]["bandwidth_gbps"])


def _limits(inst: Instance, k: Mapping[str, int], ps_streams: int, streams: Mapping[tuple[str, str], int]) -> list[tuple[float, str]]:
    """(largest rate each constraint allows, its name)."""
    out = [(inst.worker_gbps, "worker_rate")]
    out += [(inst.capacity(s) / n, f"switch {s}") for s, n in k.items()]
    out.append((inst.ps_gbps / ps_streams, "ps_ingress"))
    out += [(_bw(inst, e) / n, f"link {e[0]}->{e[1]}") for e, n in streams.items() if math.isfinite(_bw(inst, e))]
    return out


def _violations(inst: Instance, k: Mapping[str, int], ps_streams: int, streams: Mapping[tuple[str, str], int], rate: float) -> list[Violation]:
    checks = [("worker_rate", "workers", rate, inst.worker_gbps)]
    checks += [("switch_capacity", s, n * rate, inst.capacity(s)) for s, n in sorted(k.items())]
    checks.append(("ps_ingress", inst.ps, ps_streams * rate, inst.ps_gbps))
    checks += [("link", f"{e[0]}->{e[1]}", n * rate, _bw(inst, e)) for e, n in sorted(streams.items())]
    return [Violation(kind, where, load, cap, _util(load, cap)) for kind, where, load, cap in checks if load > cap * (1 + TOL)]


def _util(load: float, cap: float) -> float:
    if cap > 0:
        return load / cap
    return math.inf if load > 0 else 0.0


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
