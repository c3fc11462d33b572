"""The exact link-aware optimum on small instances, as a check of `grid` (tests and benchmarks/grid_sweep.py).

A MILP over assignments and paths (HiGHS), binary-searched over the same
candidate rates as grid: exact, but seconds to minutes already at 20-30
workers, so it measures grid's optimality gap rather than planning. It is
the one-level model (each worker's gradient summed once).
"""

from __future__ import annotations

from collections import defaultdict

from shoal.network.algorithms.exact import optimum, slots
from shoal.network.algorithms.flownet import FlowNet
from shoal.network.algorithms.grid import rate_candidates
from shoal.network.instance import Instance


def feasible_milp(net: FlowNet, rate: float, time_limit_s: float = 30.0) -> bool | None:
    """Is ``rate`` reachable with link limits? Exact MILP (HiGHS); None if it timed out.

    Worker streams: one integer single-commodity flow (workers are
    interchangeable). Aggregated streams: a binary unit flow per switch s,
    switched on by u_s. Too big for large instances; used to measure the
    flow search's optimality gap.
    """
    import highspy

    from shoal.network.algorithms._highs import new_highs

    inst = net.inst
    n_arc, prog = len(net.tails), net.prog
    caps = net.stream_caps(rate)
    room = [min(slots(inst.capacity(s), rate), len(inst.workers)) for s in prog]
    ps_slots = slots(inst.ps_gbps, rate)
    if rate > inst.worker_gbps * (1 + 1e-9) or ps_slots < 1:
        return False
    sw_arcs = [a for a in range(n_arc) if net.names[int(net.tails[a])] not in set(inst.workers)]
    h = new_highs(time_limit_s)
    f = [h.addIntegral(lb=0, ub=float(caps[a])) for a in range(n_arc)]
    u = [h.addBinary() for _ in prog]
    z = [h.addIntegral(lb=0, ub=float(room[i])) for i in range(len(prog))]
    z_ps = h.addIntegral(lb=0, ub=float(ps_slots))
    g = {(i, a): h.addBinary() for i in range(len(prog)) for a in sw_arcs}
    node_in: dict[int, list[int]] = defaultdict(list)
    node_out: dict[int, list[int]] = defaultdict(list)
    for a in range(n_arc):
        node_out[int(net.tails[a])].append(a)
        node_in[int(net.heads[a])].append(a)
    ps = net.index[inst.ps]
    sink_of = {net.index[s]: i for i, s in enumerate(prog)}
    for w in inst.workers:
        h.addConstr(sum(f[a] for a in node_out[net.index[w]]) == 1)
    for v in range(2, len(net.names)):
        if net.names[v] in set(inst.workers):
            continue
        absorbed = z_ps if v == ps else (z[sink_of[v]] if v in sink_of else 0)
        h.addConstr(sum(f[a] for a in node_in[v]) - sum(f[a] for a in node_out[v]) - absorbed == 0)
        for i, s in enumerate(prog):
            supply = u[i] if v == net.index[s] else (-u[i] if v == ps else 0)
            h.addConstr(sum(g[i, a] for a in node_out[v] if (i, a) in g) - sum(g[i, a] for a in node_in[v] if (i, a) in g) - supply == 0)
    for i in range(len(prog)):
        h.addConstr(z[i] - room[i] * u[i] <= 0)
    h.addConstr(z_ps + sum(u) <= ps_slots)
    for a in sw_arcs:
        h.addConstr(f[a] + sum(g[i, a] for i in range(len(prog))) <= float(caps[a]))
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return True
    if status == highspy.HighsModelStatus.kInfeasible:
        return False
    return None


def optimum_milp(inst: Instance, time_limit_s: float = 30.0) -> float | None:
    """The link-aware optimum by binary search with the exact MILP (None if a solve timed out)."""
    net = FlowNet(inst)
    bound, _ = optimum(len(inst.workers), [inst.capacity(s) for s in inst.programmable], inst.ps_gbps, inst.worker_gbps)
    cand = rate_candidates(inst, 0.0, bound)
    left, right, best = 0, len(cand) - 1, 0.0
    while left <= right:
        mid = (left + right) // 2
        ok = feasible_milp(net, float(cand[mid]), time_limit_s)
        if ok is None:
            return None
        if ok:
            best, left = float(cand[mid]), mid + 1
        else:
            right = mid - 1
    return best
