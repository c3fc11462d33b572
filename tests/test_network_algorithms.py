"""Planners: exact cases on small topologies, properties on random ones."""

from __future__ import annotations

import math
import time

import highspy
import numpy as np
import pytest

from shoal.network import ALGORITHMS, Plan, build_instance, evaluate, solve
from shoal.network.algorithms._highs import new_highs
from shoal.network.algorithms.exact import optimum
from shoal.network.algorithms import Result
from shoal.network.algorithms.flownet import FlowNet
from shoal.network.algorithms.grid import plan_grid, search
from shoal.network.algorithms.grid_milp import optimum_milp
from shoal.network.algorithms.rgria import round_rates, solve_relaxation
from shoal.network.routing import Routes
from shoal.network.topology import fat_tree, leaf_spine, topology_from_dict


def two_racks() -> dict:
    """ps and w0 on tor0, w1..w3 on tor1 (programmable, C=300), both under spine (programmable, C=1000)."""
    return {
        "hosts": ["ps", "w0", "w1", "w2", "w3"],
        "switches": [
            {"name": "tor0", "programmable": False},
            {"name": "tor1", "programmable": True, "capacity_gbps": 300},
            {"name": "spine", "programmable": True, "capacity_gbps": 1000},
        ],
        "links": [{"a": "ps", "b": "tor0"}, {"a": "w0", "b": "tor0"}, {"a": "tor0", "b": "spine"}, {"a": "tor1", "b": "spine"}]
        + [{"a": f"w{i}", "b": "tor1"} for i in (1, 2, 3)],
        "ps": "ps",
        "workers": ["w0", "w1", "w2", "w3"],
    }


def small(data: dict, **kw):
    return build_instance(topology_from_dict(data), programmable="file", capacity=None, **kw)


def test_baselines_on_a_hand_checked_topology() -> None:
    inst = small(two_racks(), ps_gbps=100, worker_gbps=100)
    geryon = solve(inst, "geryon")
    assert set(geryon.plan.assignment.values()) == {"ps"} and geryon.evaluation.min_rate_gbps == pytest.approx(25)
    sml = solve(inst, "switchml")
    assert sml.plan.assignment == {"w0": "ps", "w1": "tor1", "w2": "tor1", "w3": "tor1"}  # tor0 is not programmable
    assert sml.evaluation.min_rate_gbps == pytest.approx(50)  # PS: w0 + tor1's stream
    atp = solve(inst, "atp")
    # nearest programmable switch: tor1 for its three workers; w0's tor0 is not programmable, the spine is 2 hops away
    assert atp.plan.assignment == {"w0": "spine", "w1": "tor1", "w2": "tor1", "w3": "tor1"}
    assert atp.evaluation.min_rate_gbps == pytest.approx(50)  # PS: tor1's and the spine's streams
    assert atp.bound_gbps is None and atp.evaluation.violations == ()


def test_atp_shares_a_switch_among_all_its_workers() -> None:
    """The GRID paper's Fig. 1: a switch is not full at T; its capacity is divided among its workers."""
    data = two_racks()
    data["switches"][1]["capacity_gbps"] = 9
    inst = small(data, ps_gbps=100, worker_gbps=100)
    atp = solve(inst, "atp")
    assert [w for w, a in atp.plan.assignment.items() if a == "tor1"] == ["w1", "w2", "w3"]
    assert atp.evaluation.min_rate_gbps == pytest.approx(3) and atp.evaluation.bottleneck == "switch tor1"


def test_atp_prefers_a_nearest_switch_on_the_default_path() -> None:
    """Two programmable switches two hops from w0; the one its packets pass wins the tie."""
    data = {
        "hosts": ["ps", "w0"],
        "switches": [{"name": "t0"}, {"name": "a", "programmable": True, "capacity_gbps": 100},
                     {"name": "b", "programmable": True, "capacity_gbps": 100}, {"name": "t1"}],
        "links": [{"a": "w0", "b": "t0"}, {"a": "t0", "b": "a"}, {"a": "t0", "b": "b"}, {"a": "b", "b": "t1"}, {"a": "t1", "b": "ps"},
                  {"a": "a", "b": "t1", "bandwidth_gbps": 0}],
        "ps": "ps", "workers": ["w0"],
    }
    assert solve(small(data), "atp").plan.assignment == {"w0": "b"}  # a is as near but not on w0's path (its uplink is down)


def test_atp2_aggregates_at_the_workers_rack_then_at_the_ps_rack() -> None:
    data = two_racks()
    data["switches"][0].update(programmable=True, capacity_gbps=200)  # the PS's top-of-rack switch
    inst = small(data, ps_gbps=100, worker_gbps=100)
    res = solve(inst, "atp2")
    assert res.plan.assignment == {"w0": "tor0", "w1": "tor1", "w2": "tor1", "w3": "tor1"}
    assert res.plan.parents == {"tor1": "tor0"}
    ev = res.evaluation
    assert ev.switch_inputs == {"tor0": 2, "tor1": 3} and ev.switch_workers == {"tor0": 1, "tor1": 3}
    assert ev.ps_streams == 1 and ev.min_rate_gbps == pytest.approx(100) and ev.violations == ()
    assert res.plan.switch_paths["tor1"] == ("tor1", "spine", "tor0")
    assert res.to_json()["second_level"] == {"tor1": "tor0"}
    # without a programmable PS rack it is SwitchML: one level
    assert solve(small(two_racks()), "atp2").plan.parents == {}


def test_exact_and_grid_on_the_hand_checked_topology() -> None:
    inst = small(two_racks(), ps_gbps=100, worker_gbps=100)
    ex = solve(inst, "exact")
    assert ex.evaluation.min_rate_gbps == pytest.approx(100)  # all four at the spine: 4 x 100 <= 1000, one PS stream
    gr = solve(inst, "grid")
    assert gr.evaluation.min_rate_gbps == pytest.approx(100) and gr.evaluation.violations == ()


def test_grid_respects_links_where_exact_breaks_them() -> None:
    data = two_racks()
    for link in data["links"]:
        link["bandwidth_gbps"] = 100
    inst = small(data, ps_gbps=100, worker_gbps=100)
    ex = solve(inst, "exact")
    assert ex.evaluation.min_rate_gbps < ex.plan.claimed_rate_gbps  # the link tor1 -> spine carries 3 streams
    assert any(v.kind == "link" for v in ex.evaluation.violations)
    gr = solve(inst, "grid")
    # best with links: everyone at tor1 (w0 travels down through the spine), one stream to the PS:
    # 300 / 4 = 75; at the spine instead, tor1 -> spine would carry 3 streams (33.3)
    assert gr.evaluation.min_rate_gbps == pytest.approx(75)
    assert set(gr.plan.assignment.values()) == {"tor1"}
    assert gr.evaluation.violations == ()


def test_rgria_lp_is_the_papers_loose_relaxation() -> None:
    # the LP splits every worker into slivers and reaches T (PAPERS.md)
    value, rates = solve_relaxation(100, [float(c) for c in np.linspace(100, 3200, 16)], 100.0, 100.0)
    assert value == pytest.approx(100.0, rel=1e-6)
    assert rates.shape == (100, 17) and (rates.sum(axis=1) >= 100 * (1 - 1e-6)).all()
    assert value >= optimum(100, list(np.linspace(100, 3200, 16)), 100.0, 100.0)[0]


def full_gria_lp(n: int, caps: list[float], ps_gbps: float, worker_gbps: float) -> float:
    """GRIA's LP relaxation with x kept, to check that projecting x out changes nothing."""
    h = new_highs()
    lam = h.addVariable(lb=0, ub=highspy.kHighsInf)
    nodes = range(len(caps) + 1)
    x = {(i, j): h.addVariable(lb=0, ub=1) for i in range(n) for j in nodes}
    r = {(i, j): h.addVariable(lb=0, ub=highspy.kHighsInf) for i in range(n) for j in nodes}
    y = [h.addVariable(lb=0, ub=highspy.kHighsInf) for _ in caps]
    for i in range(n):
        h.addConstr(sum(x[i, j] for j in nodes) == 1)
        h.addConstr(lam - sum(r[i, j] for j in nodes) <= 0)
        for j in nodes:
            h.addConstr(r[i, j] - worker_gbps * x[i, j] <= 0)
        for j in range(len(caps)):
            h.addConstr(r[i, j] - y[j] <= 0)
    for j, c in enumerate(caps):
        h.addConstr(sum(r[i, j] for i in range(n)) <= c)
    h.addConstr(sum(r[i, len(caps)] for i in range(n)) + sum(y) <= ps_gbps)
    h.maximize(lam)
    return float(h.getInfo().objective_function_value)


def test_rgria_projected_lp_equals_the_full_relaxation() -> None:
    rng = np.random.default_rng(1)
    for _ in range(15):
        n, s = int(rng.integers(1, 12)), int(rng.integers(0, 5))
        caps = list(rng.uniform(0, 400, s))
        b, t = float(rng.uniform(5, 200)), float(rng.choice([10, 50, 100]))
        assert solve_relaxation(n, caps, b, t)[0] == pytest.approx(full_gria_lp(n, caps, b, t), rel=1e-6)


def test_rounding_is_proportional_to_fractional_rates() -> None:
    rates = np.tile([30.0, 10.0, 0.0, 60.0], (20000, 1))
    picks = round_rates(rates, np.random.default_rng(0))
    freq = np.bincount(picks, minlength=4) / len(picks)
    assert freq == pytest.approx([0.3, 0.1, 0.0, 0.6], abs=0.015)
    assert (round_rates(np.zeros((3, 4)), np.random.default_rng(0)) == 3).all()  # nothing: the PS


def test_rgria_reports_its_lp_bound_and_honest_rate() -> None:
    inst = build_instance(fat_tree(8), workers=100, programmable="random:0.2", seed=0, link_gbps=math.inf)
    res = solve(inst, "rgria", seed=0)
    assert res.bound_gbps == pytest.approx(100.0, rel=1e-6) and res.plan.claimed_rate_gbps == res.bound_gbps
    assert res.evaluation.violations  # rounding the slivers breaks the PS / switch constraints
    assert res.evaluation.min_rate_gbps < res.bound_gbps
    assert solve(inst, "rgria", seed=0).plan.assignment == res.plan.assignment  # seeded


def random_instances(count: int, seed0: int = 0):
    for seed in range(seed0, seed0 + count):
        rng = np.random.default_rng(seed)
        g = [fat_tree(4), leaf_spine(3, 5, 3), fat_tree(6, 2)][seed % 3]
        n_hosts = sum(1 for _, d in g.nodes(data=True) if d["kind"] == "host")
        yield seed, build_instance(
            g,
            workers=int(rng.integers(2, n_hosts)),
            programmable=["tor", "all", "random:0.3", "random:0.1"][seed % 4],
            capacity=(float(rng.choice([0, 10, 100])), float(rng.choice([400, 1000, 3200]))),
            link_gbps=[math.inf, 100.0, 40.0, 25.0][(seed // 3) % 4],
            ps_gbps=float(rng.choice([20, 100, 400])),
            worker_gbps=float(rng.choice([25, 100])),
            seed=seed,
        )


def test_grid_properties_on_random_instances() -> None:
    """Never a violation; exact when links are unconstrained; never below any other algorithm."""
    for seed, inst in random_instances(36):
        routes = Routes(inst.graph)
        res = {a: solve(inst, a, seed, routes) for a in ALGORITHMS}
        grid = res["grid"].evaluation
        assert grid.violations == (), seed
        assert res["grid"].plan.claimed_rate_gbps == pytest.approx(grid.min_rate_gbps)
        assert grid.min_rate_gbps <= res["grid"].bound_gbps * (1 + 1e-9)
        for other in ("rgria", "exact", "geryon", "atp", "switchml"):
            assert grid.min_rate_gbps >= res[other].evaluation.min_rate_gbps * (1 - 1e-9), (seed, other)
        if not inst.links_constrained:
            assert grid.min_rate_gbps == pytest.approx(res["exact"].evaluation.min_rate_gbps, rel=1e-12), seed
            assert res["exact"].evaluation.violations == ()


def test_flow_search_alone_is_exact_without_link_limits() -> None:
    """The reduction argument, checked: with unconstrained links the max-flow search finds the paper model's optimum."""
    checked = 0
    for seed, inst in random_instances(36, seed0=48):
        if inst.links_constrained:
            continue
        checked += 1
        best = optimum(len(inst.workers), [inst.capacity(s) for s in inst.programmable], inst.ps_gbps, inst.worker_gbps)[0]
        for thorough in (False, True):  # the thorough search gallops all the way up to the bound here
            plan, out_of_time = search(FlowNet(inst), 0.0, best, thorough)
            assert plan is not None and not out_of_time, seed
            assert evaluate(inst, plan).min_rate_gbps == pytest.approx(best, rel=1e-12), seed
    assert checked >= 8


def test_grid_plan_is_certified_by_the_evaluator() -> None:
    inst = build_instance(fat_tree(8), workers=100, programmable="random:0.2", seed=4)
    res = solve(inst, "grid", 4)
    again = evaluate(inst, Plan(res.plan.assignment, res.plan.worker_paths, res.plan.switch_paths, res.plan.claimed_rate_gbps))
    assert again.violations == () and again.min_rate_gbps == pytest.approx(res.evaluation.min_rate_gbps)
    assert set(res.plan.switch_paths) == set(res.evaluation.switch_workers)


def tight_small(seed: int):
    """Tiny topologies with narrow links, where the link-aware optimum is provable by MILP."""
    rng = np.random.default_rng(seed)
    g = fat_tree(4) if seed % 2 else leaf_spine(2, 3, 3)
    return build_instance(g, workers=int(rng.integers(4, 8)), programmable=["all", "random:0.4"][seed % 2], capacity=(10.0, 400.0),
                          link_gbps=float(rng.choice([25, 40, 100])), ps_gbps=100.0, worker_gbps=100.0, seed=seed)


def one_level_grid(inst, seed: int):
    """grid restricted to the one-level model the link-aware MILP solves."""
    routes = Routes(inst.graph)
    plan, bound, notes = plan_grid(inst, routes, seed, two_level=False)
    return Result("grid", plan, evaluate(inst, plan, routes), bound, 0.0, notes)


def test_grid_matches_the_link_aware_milp_optimum_on_small_instances() -> None:
    beaten = 0
    for seed in range(4):
        inst = tight_small(seed)
        opt = optimum_milp(inst, time_limit_s=20)
        assert opt is not None
        one = one_level_grid(inst, seed)
        assert one.evaluation.min_rate_gbps == pytest.approx(opt, rel=1e-9), seed
        assert one.bound_gbps >= opt * (1 - 1e-9)  # the port-limited bound is a true upper bound
        assert not one.plan.parents
        two = solve(inst, "grid", seed)  # two levels through the PS's rack can beat every one-level plan
        assert two.evaluation.min_rate_gbps >= opt * (1 - 1e-9) and two.evaluation.violations == ()
        if two.evaluation.min_rate_gbps > opt * (1 + 1e-9):
            beaten += 1
    assert beaten >= 1  # seed 2: the PS's 25 Gbps access link carries one summed stream instead of several


@pytest.mark.slow
def test_grid_against_the_link_aware_milp_on_more_instances() -> None:
    worse = []
    for seed, inst in random_instances(24, seed0=200):
        if not inst.links_constrained or len(inst.workers) > 16:
            continue
        opt = optimum_milp(inst, time_limit_s=30)
        res = one_level_grid(inst, seed)
        got = res.evaluation.min_rate_gbps
        assert opt is None or got <= opt * (1 + 1e-9)  # the MILP is exact over one-level plans: grid can't beat it there
        assert solve(inst, "grid", seed).evaluation.min_rate_gbps >= got * (1 - 1e-9)  # two levels only add options
        assert opt is None or res.bound_gbps >= opt * (1 - 1e-9)
        if opt is not None and got < opt * (1 - 1e-9):
            worse.append((seed, got, opt))
    assert not worse


@pytest.mark.slow
def test_grid_solves_leaf_spine_250_in_under_two_seconds() -> None:
    inst = build_instance(leaf_spine(30, 30, 10), workers=250, programmable="tor", seed=0)
    start = time.perf_counter()
    res = solve(inst, "grid")
    assert time.perf_counter() - start < 2.0
    assert res.evaluation.violations == ()
