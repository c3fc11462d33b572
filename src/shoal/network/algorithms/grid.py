"""`grid`: shoal's link- and path-aware planner. It never returns a plan that breaks a constraint.

Model: the paper's, plus every directed link e carries at most
bandwidth_e / lambda streams (worker streams to their aggregation node, and
one aggregated stream per used switch to the PS), on paths the planner picks.

Method (chosen by measurement, see docs/grid.md): binary search on lambda
over the values where a constraint becomes tight (T, C_s/k, B/m, bw_e/l).
At a fixed lambda every resource holds an integer number of streams, and for
a fixed set A of aggregation switches (with their streams to the PS routed)
the worker streams are a single-commodity integer flow: source -> each worker
(1) -> links -> a switch in A (at most floor(C_s/lambda)) or the PS (at most
floor(B/lambda) - |A|) -> sink. A max-flow says exactly whether all workers
fit, and its decomposition gives each worker's node and path. A is grown
greedily, best-looking switch first, keeping a switch only if the flow grows.
Just above the rate that fast pass reaches, a thorough pass retries with
best-improvement growth, rip-up-and-reroute of the aggregated streams, and
swaps; on small instances it matched the exact link-aware MILP
(``grid_milp.optimum_milp``) every time we measured.

Without link limits the flow is min(N, sum over A of floor(C_s/lambda) +
floor(B/lambda) - |A|), and growing A by largest capacity first is the exact
algorithm's greedy: grid then returns the paper model's optimum. With links
the greedy is a heuristic; the link-free optimum is the upper bound it
reports. Whatever the search finds, grid compares it with the plans of the
baselines and of `exact` (on default paths) and returns the best, at the
rate the evaluator certifies, so it is never worse than any of them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np
import scipy.sparse as sp

from shoal.network.algorithms.baselines import plan_atp, plan_atp_two_level, plan_geryon, plan_switchml
from shoal.network.algorithms.exact import optimum, plan_exact, slots
from shoal.network.algorithms.flownet import FlowNet, decompose, stream_path
from shoal.network.algorithms.budget import NO_LIMIT, Deadline, TimeLimit
from shoal.network.evaluator import Plan, complete_paths, evaluate
from shoal.network.instance import Instance
from shoal.network.routing import Routes
from shoal.registry import PLANNERS

T = TypeVar("T")


class _Selection:
    """A set A of aggregation switches at one rate: their streams routed, and the resulting max-flow."""

    def __init__(self, net: FlowNet, rate: float, streaming: Collection[str] = ()) -> None:
        inst = net.inst
        self.net, self.n = net, len(inst.workers)
        self.ps = net.index[inst.ps]
        self.ps_slots = slots(inst.ps_gbps, rate)
        self.room = {s: min(slots(net.capacity[s], rate), self.n) for s in net.prog}
        self.residual = net.stream_caps(rate)
        # switches whose stream to the PS already exists (its links and PS slot are taken out of the net): no arcs to route
        self.chosen: dict[str, list[int]] = {s: [] for s in streaming if s in self.room}
        self.flow, self.fmat = net.max_flow(self.residual, self._sinks())

    def _sinks(self) -> dict[int, int]:
        caps = {self.net.index[s]: self.room[s] for s in self.chosen}
        caps[self.ps] = self.ps_slots - len(self.chosen)
        return caps

    def useful(self, s: str) -> bool:
        return s not in self.chosen and self.room[s] >= 2 and len(self.chosen) < self.ps_slots

    def add(self, s: str) -> bool:
        """Route s's stream to the PS and recompute the flow; False if no route is left.

        The stream prefers arcs the current worker flow leaves spare, so that
        it displaces no worker; failing that, any arc with room.
        """
        spare = self.residual - np.maximum(self.net.arc_flow(self.fmat), 0)
        arcs = stream_path(self.net, spare, self.net.index[s], self.ps) or stream_path(self.net, self.residual, self.net.index[s], self.ps)
        if arcs is None:
            return False
        self.residual[arcs] -= 1
        self.chosen[s] = arcs
        self.flow, self.fmat = self.net.max_flow(self.residual, self._sinks())
        return True

    def reroute(self, s: str) -> None:
        """Rip up s's stream, let the workers flow without it, and route it where they leave room."""
        old = self.snapshot()
        self.residual[self.chosen[s]] += 1
        _, fmat = self.net.max_flow(self.residual, self._sinks())
        spare = self.residual - np.maximum(self.net.arc_flow(fmat), 0)
        arcs = stream_path(self.net, spare, self.net.index[s], self.ps) or stream_path(self.net, self.residual, self.net.index[s], self.ps)
        assert arcs is not None  # its old path is free again
        self.residual[arcs] -= 1
        self.chosen[s] = arcs
        self.flow, self.fmat = self.net.max_flow(self.residual, self._sinks())
        if self.flow <= old[0]:
            self.restore(old)

    def remove(self, s: str) -> None:
        self.residual[self.chosen.pop(s)] += 1
        self.flow, self.fmat = self.net.max_flow(self.residual, self._sinks())

    def snapshot(self) -> tuple[int, dict[str, list[int]], np.ndarray, sp.csr_matrix]:
        return self.flow, dict(self.chosen), self.residual.copy(), self.fmat

    def restore(self, snap: tuple[int, dict[str, list[int]], np.ndarray, sp.csr_matrix]) -> None:
        self.flow, chosen, residual, self.fmat = snap
        self.chosen, self.residual = dict(chosen), residual.copy()

    @property
    def done(self) -> bool:
        return self.flow == self.n


def _grow_in_order(sel: _Selection, order: list[str], deadline: Deadline) -> None:
    """Fast pass: add switches in a fixed order, keeping each only if the flow grows."""
    for s in order:
        deadline.check()
        if sel.done:
            return
        if not sel.useful(s):
            continue
        before = sel.snapshot()
        if sel.add(s) and sel.flow <= before[0]:
            sel.restore(before)


def _grow_best(sel: _Selection, deadline: Deadline) -> None:
    """Thorough pass: repeatedly add the switch that grows the flow most."""
    while not sel.done:
        base = sel.snapshot()
        best: tuple[int, str] | None = None
        for s in [s for s in sel.net.prog if sel.useful(s)]:
            deadline.check()
            if sel.add(s) and sel.flow > base[0] and (best is None or sel.flow > best[0]):
                best = (sel.flow, s)
            sel.restore(base)
        if best is None:
            return
        sel.add(best[1])


def _swap(sel: _Selection, deadline: Deadline) -> None:
    """Local search: replace one chosen switch by another while that grows the flow."""
    improved = True
    while improved and not sel.done:
        improved = False
        for out in list(sel.chosen):
            base = sel.snapshot()
            sel.remove(out)
            mid = sel.snapshot()
            for s in [s for s in sel.net.prog if s != out and sel.useful(s)]:
                deadline.check()
                if sel.add(s) and sel.flow > base[0]:
                    improved = True
                    break
                sel.restore(mid)
            if improved:
                break
            sel.restore(base)


def _reroute_all(sel: _Selection, deadline: Deadline) -> None:
    """Rip-up and reroute each aggregated stream once."""
    for s in list(sel.chosen):
        deadline.check()
        if sel.done:
            return
        sel.reroute(s)


def try_rate(net: FlowNet, rate: float, thorough: bool = False, deadline: Deadline = NO_LIMIT,
             streaming: Collection[str] = ()) -> Plan | None:
    """A plan in which every worker sends at ``rate`` and nothing is overloaded, or None.

    The fast pass adds switches in one fixed order; ``thorough`` then retries
    with best-improvement growth, rip-up-and-reroute of the aggregated
    streams, and one-for-one swaps.
    """
    inst = net.inst
    if rate > inst.worker_gbps * (1 + 1e-9) or slots(inst.ps_gbps, rate) < 1:
        return None
    sel = _Selection(net, rate, streaming)
    _grow_in_order(sel, _order(net, sel.residual, sel.room), deadline)
    if not sel.done and thorough:
        sel = _Selection(net, rate, streaming)
        _grow_best(sel, deadline)
        _reroute_all(sel, deadline)
        _swap(sel, deadline)
        _reroute_all(sel, deadline)
    if not sel.done:
        return None
    assignment, paths = decompose(net, sel.fmat)
    used = set(assignment.values())
    switch_paths = {s: _arc_path(net, arcs) for s, arcs in sel.chosen.items() if s in used and arcs}
    return Plan(assignment, paths, switch_paths)


def _order(net: FlowNet, residual: np.ndarray, room: dict[str, int]) -> list[str]:
    """Switches by how many workers they could absorb: min(capacity slots, inbound stream slots)."""
    workers = {net.index[w] for w in net.inst.workers}
    inbound: dict[int, int] = defaultdict(int)
    for t, h, c in zip(net.tails, net.heads, residual):
        inbound[int(h)] += 1 if int(t) in workers else int(c)
    return sorted(net.prog, key=lambda s: (-min(room[s], inbound[net.index[s]]), -net.capacity[s], s))


def _arc_path(net: FlowNet, arcs: list[int]) -> tuple[str, ...]:
    return tuple([net.names[int(net.tails[arcs[0]])]] + [net.names[int(net.heads[a])] for a in arcs])


def rate_candidates(inst: Instance, lo: float, hi: float) -> np.ndarray:
    """Every rate in (lo, hi] at which some constraint becomes tight, ascending."""
    limit = len(inst.workers) + len(inst.programmable) + 1
    ks = np.arange(1, limit + 1, dtype=float)
    values = {inst.worker_gbps, inst.ps_gbps} | {inst.capacity(s) for s in inst.programmable}
    values |= {bw for _, _, bw in inst.graph.edges(data="bandwidth_gbps") if math.isfinite(bw) and bw > 0}
    cand = np.unique(np.concatenate([v / ks for v in values]))
    return cand[(cand > lo * (1 + 1e-12)) & (cand <= hi * (1 + 1e-12))]


def highest_fit(cand: Sequence[float], fit: Callable[[float], T | None]) -> tuple[tuple[float, T] | None, bool]:
    """((the highest candidate rate at which ``fit`` finds something, what it found), whether time ran out).

    Binary search, so feasibility must be monotone in the rate; a TimeLimit
    from ``fit`` ends the search with the best found so far.
    """
    best: tuple[float, T] | None = None
    left, right = 0, len(cand) - 1
    try:
        while left <= right:
            mid = (left + right) // 2
            found = fit(float(cand[mid]))
            if found is not None:
                best, left = (float(cand[mid]), found), mid + 1
            else:
                right = mid - 1
    except TimeLimit:
        return best, True
    return best, False


def search(net: FlowNet, lo: float, hi: float, thorough: bool = False, deadline: Deadline = NO_LIMIT) -> tuple[Plan | None, bool]:
    """(The plan at the highest candidate rate in (lo, hi] that ``try_rate`` meets, whether time ran out).

    The fast oracle is cheap: plain binary search. The thorough oracle is run
    only just above what the fast one reached, so it gallops upwards (1, 2,
    4, ... candidates) and bisects once it fails: one failed probe when there
    is nothing to gain. When the deadline passes, the best plan so far is returned.
    """
    cand = rate_candidates(net.inst, lo, hi)
    best: Plan | None = None
    left, right = 0, len(cand) - 1
    try:
        if thorough:
            step = 1
            while left <= right:
                probe = min(left + step - 1, right)
                plan = try_rate(net, float(cand[probe]), thorough, deadline)
                if plan is None:
                    right = probe - 1
                    break
                best, left, step = plan, probe + 1, step * 2
        while left <= right:
            mid = (left + right) // 2
            plan = try_rate(net, float(cand[mid]), thorough, deadline)
            if plan is not None:
                best, left = plan, mid + 1
            else:
                right = mid - 1
    except TimeLimit:
        return best, True
    return best, False


def _port_limited_fit(net: FlowNet, rate: float) -> bool:
    """A necessary condition for ``rate``: count each node's worker intake only through its own in-ports.

    A switch aggregating k workers receives k streams over its in-arcs (a
    worker's own link carries one), so k <= min(C_s / rate, in-port slots);
    the PS takes at most min(B / rate, its in-port slots) streams. If even
    the best choice of switches cannot fit every worker under those limits,
    no plan can.
    """
    inst = net.inst
    n = len(inst.workers)
    if rate > inst.worker_gbps * (1 + 1e-9):
        return False
    caps = net.stream_caps(rate)
    worker_idx = {net.index[w] for w in inst.workers}
    intake: dict[int, int] = defaultdict(int)
    has_exit: set[int] = set()
    for t, h, c in zip(net.tails, net.heads, caps):
        if c >= 1:
            intake[h] += 1 if t in worker_idx else int(c)
            has_exit.add(t)
    if not worker_idx <= has_exit:
        return False
    room = sorted((min(slots(net.capacity[s], rate), intake[net.index[s]], n) for s in net.prog), reverse=True)
    ps_slots = min(slots(inst.ps_gbps, rate), intake[net.index[inst.ps]])
    best, left = n, n
    for j, r in enumerate(room, start=1):
        if r < 2 or left == 0:
            break
        left -= min(r, left)
        best = min(best, j + left)
    return best <= ps_slots


def upper_bound(net: FlowNet, hi: float) -> float:
    """The highest candidate rate <= ``hi`` that passes ``_port_limited_fit``: no plan beats it."""
    cand = rate_candidates(net.inst, 0.0, hi)
    left, right, best = 0, len(cand) - 1, 0.0
    while left <= right:
        mid = (left + right) // 2
        if _port_limited_fit(net, float(cand[mid])):
            best, left = float(cand[mid]), mid + 1
        else:
            right = mid - 1
    return best


_FALLBACKS = (("exact", plan_exact), ("atp", plan_atp), ("atp2", plan_atp_two_level), ("switchml", plan_switchml), ("geryon", plan_geryon))


THOROUGH_SHARE = 0.25  # of the time limit, per model: the thorough search refines a certified plan, so it gets a bounded share


@PLANNERS.register("grid", "shoal's planner: link- and path-aware, never breaks a constraint")
def plan_grid(inst: Instance, routes: Routes, seed: int = 0, deadline: Deadline = NO_LIMIT,
              two_level: bool = True) -> tuple[Plan, float | None, dict[str, object]]:
    """Best certified plan: the flow search's (one level, or two through the PS's rack), or a baseline's/exact's.

    The fast search runs on each model first; the thorough one then gets at
    most ``THOROUGH_SHARE`` of the time limit per model. ``two_level=False``
    keeps to one level of aggregation (the paper's and the link-aware MILP's model).
    """
    free_bound, _ = optimum(len(inst.workers), [inst.capacity(s) for s in inst.programmable], inst.ps_gbps, inst.worker_gbps)
    best_rate, method, best = -1.0, "", Plan({})
    for name, planner in _FALLBACKS:
        if name == "atp2" and not two_level:
            continue
        plan = complete_paths(replace(planner(inst, routes, seed, deadline)[0], claimed_rate_gbps=None), inst, routes)
        rate = evaluate(inst, plan, routes).min_rate_gbps
        if rate > best_rate:
            best_rate, method, best = rate, name, plan
    models = [_Model(inst, None, free_bound)]
    rooted = rooted_model(inst) if two_level else None
    if rooted is not None:
        sub, root = rooted
        models.append(_Model(sub, root, optimum(len(sub.workers), [sub.capacity(s) for s in sub.programmable], sub.ps_gbps, sub.worker_gbps)[0]))
    stopped = ""
    for thorough in (False, True):
        for model in models:
            if best_rate >= model.bound * (1 - 1e-12) or deadline.expired():
                continue
            budget = deadline.share(THOROUGH_SHARE) if thorough else deadline
            found, out_of_time = search(model.net, best_rate, model.bound, thorough, budget)
            if out_of_time:
                stopped = "time limit" if deadline.expired() else f"thorough search stopped after its {budget.limit_s:.3g} s share"
            if found is not None:
                plan = found if model.root is None else lift_rooted(found, inst, model.root)
                rate = evaluate(inst, plan, routes).min_rate_gbps
                if rate > best_rate:
                    kind = "flow-search" + ("+local" if thorough else "")
                    best_rate, method, best = rate, kind if model.root is None else "two-level " + kind, plan
    bound = max(m.bound for m in models)
    notes: dict[str, object] = {"method": method, "link_free_optimum_gbps": free_bound, "proved_optimal": best_rate >= bound * (1 - 1e-9)}
    if stopped == "time limit" or deadline.expired():
        notes["time_limit"] = f"stopped searching at the {deadline.limit_s:g} s limit; best plan so far"
    elif stopped:
        notes["search"] = stopped
    return replace(best, claimed_rate_gbps=best_rate), bound, notes


class _Model:
    """One planning model for the flow search: its instance, the root switch if two-level, its flow net and upper bound."""

    def __init__(self, inst: Instance, root: str | None, free_bound: float) -> None:
        self.inst, self.root = inst, root
        self.net = FlowNet(inst)
        self.bound = upper_bound(self.net, free_bound) if inst.links_constrained else free_bound


def rooted_model(inst: Instance) -> tuple[Instance, str] | None:
    """The two-level model, where the PS's top-of-rack switch sums every stream and sends one to the PS.

    It is the one-level model with that switch as the sink: its capacity
    plays the PS's ingress B, and the rate is capped by B and the switch's
    link to the PS, which carry one stream. So it wins whenever C_root is
    well above B, links or not: the paper's model, which aggregates once,
    cannot express it. None when the PS's rack switch cannot aggregate.
    """
    g = inst.graph
    live = [v for v in g[inst.ps] if g[inst.ps][v]["bandwidth_gbps"] > 0 and g.nodes[v]["kind"] == "switch"]
    if len(live) != 1 or live[0] not in inst.programmable:
        return None
    root = live[0]
    sub_graph = g.copy()
    sub_graph.nodes[root]["programmable"] = False  # the sink now
    cap = min(inst.worker_gbps, inst.ps_gbps, float(g[root][inst.ps]["bandwidth_gbps"]))
    return Instance(sub_graph, root, inst.workers, ps_gbps=inst.capacity(root), worker_gbps=cap), root


def lift_rooted(plan: Plan, inst: Instance, root: str) -> Plan:
    """A plan of the rooted model as a two-level plan of the instance: every used switch sends to the root."""
    used = {a for a in plan.assignment.values() if a != root}
    switch_paths = {s: tuple(p) for s, p in plan.switch_paths.items() if s in used}
    switch_paths[root] = (root, inst.ps)
    return Plan(dict(plan.assignment), dict(plan.worker_paths), switch_paths, parents=dict.fromkeys(used, root))
