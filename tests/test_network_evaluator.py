"""The honest evaluator on hand-checked cases."""

from __future__ import annotations

import pytest

from shoal.network.evaluator import Plan, evaluate
from shoal.network.instance import build_instance
from shoal.network.routing import Routes
from shoal.network.topology import fat_tree, topology_from_dict


def line(link_gbps: float | None = 100) -> dict:
    """ps - s1 - s2, workers w1, w2 on s1 and w3, w4 on s2; s2 programmable (C = 150)."""
    bw = {"bandwidth_gbps": link_gbps}
    return {
        "hosts": ["ps", "w1", "w2", "w3", "w4"],
        "switches": [{"name": "s1", "programmable": True, "capacity_gbps": 1000}, {"name": "s2", "programmable": True, "capacity_gbps": 150}],
        "links": [
            {"a": "ps", "b": "s1", **bw},
            {"a": "w1", "b": "s1", **bw},
            {"a": "w2", "b": "s1", **bw},
            {"a": "s1", "b": "s2", **bw},
            {"a": "w3", "b": "s2", **bw},
            {"a": "w4", "b": "s2", **bw},
        ],
        "ps": "ps",
        "workers": ["w1", "w2", "w3", "w4"],
    }


def inst_of(data: dict, ps_gbps: float = 100, worker_gbps: float = 100):
    return build_instance(topology_from_dict(data), programmable="file", capacity=None, ps_gbps=ps_gbps, worker_gbps=worker_gbps)


def test_all_direct_is_limited_by_the_ps() -> None:
    inst = inst_of(line())
    ev = evaluate(inst, Plan({w: "ps" for w in inst.workers}))
    assert ev.min_rate_gbps == pytest.approx(25.0)
    assert ev.ps_streams == 4 and ev.ps_load_gbps == pytest.approx(100)
    assert ev.link_streams[("s2", "s1")] == 2 and ev.link_streams[("s1", "ps")] == 4
    assert ev.violations == () and ev.max_switch_utilisation == 0.0
    assert ev.max_link_utilisation == pytest.approx(1.0)


def test_switch_aggregation_counts_one_stream_and_the_switch_capacity() -> None:
    inst = inst_of(line())
    ev = evaluate(inst, Plan({"w1": "ps", "w2": "ps", "w3": "s2", "w4": "s2"}))
    # PS: w1, w2 and s2's single stream = 3 -> 33.3; s2: 2 workers x lambda <= 150 -> 75
    assert ev.min_rate_gbps == pytest.approx(100 / 3)
    assert ev.bottleneck == "ps_ingress"
    assert ev.link_streams[("s2", "s1")] == 1
    assert ev.switch_workers == {"s2": 2}
    assert ev.switch_utilisation["s2"] == pytest.approx(2 * (100 / 3) / 150)


def test_switch_capacity_binds() -> None:
    inst = inst_of(line(), ps_gbps=1000)
    ev = evaluate(inst, Plan({w: "s2" for w in inst.workers}))
    assert ev.min_rate_gbps == pytest.approx(150 / 4)
    assert ev.bottleneck == "switch s2"


def test_links_bind_when_they_are_narrow() -> None:
    inst = inst_of(line(link_gbps=30), ps_gbps=1000)
    ev = evaluate(inst, Plan({w: "s1" for w in inst.workers}))
    # w3 and w4 share s2 -> s1 (30 Gbps): 15 each
    assert ev.min_rate_gbps == pytest.approx(15.0)
    assert ev.bottleneck == "link s2->s1"


def test_violations_are_measured_at_the_claimed_rate() -> None:
    inst = inst_of(line())
    ev = evaluate(inst, Plan({w: "s2" for w in inst.workers}, claimed_rate_gbps=60))
    kinds = {(v.kind, v.where): v.factor for v in ev.violations}
    assert kinds[("switch_capacity", "s2")] == pytest.approx(4 * 60 / 150)
    assert kinds[("link", "s1->s2")] == pytest.approx(2 * 60 / 100)  # w1, w2 travel down to s2
    assert ("ps_ingress", "ps") not in kinds  # one stream of 60 fits in 100
    assert ev.min_rate_gbps == pytest.approx(37.5)  # honest: 150 / 4
    assert ev.rate_gbps == 60 and ev.max_switch_utilisation == pytest.approx(1.6)


def test_worker_rate_violation() -> None:
    inst = inst_of(line(), worker_gbps=10)
    ev = evaluate(inst, Plan({w: "s1" for w in inst.workers}, claimed_rate_gbps=20))
    assert ("worker_rate", "workers") in {(v.kind, v.where) for v in ev.violations}
    assert ev.min_rate_gbps == pytest.approx(10)


def test_unconstrained_links_reduce_to_the_papers_formula() -> None:
    inst = inst_of(line(link_gbps=None))
    ev = evaluate(inst, Plan({"w1": "s2", "w2": "s2", "w3": "s2", "w4": "ps"}))
    assert ev.min_rate_gbps == pytest.approx(min(100, 150 / 3, 100 / 2))
    assert ev.max_link_utilisation is None


def test_explicit_paths_are_used() -> None:
    inst = build_instance(fat_tree(4), workers=["h1.0.0"], ps="h0.0.0", programmable="none", link_gbps=10)
    routes = Routes(inst.graph)
    default = routes.path("h1.0.0", "h0.0.0")
    assert len(default) == 7  # host, edge, agg, core, agg, edge, host
    other = ("h1.0.0", "e1.0", "a1.1", "c2", "a0.1", "e0.0", "h0.0.0")
    ev = evaluate(inst, Plan({"h1.0.0": "h0.0.0"}, worker_paths={"h1.0.0": other}))
    assert ("c2", "a0.1") in ev.link_streams and ev.min_rate_gbps == 10


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (Plan({"w1": "ps"}), "every worker"),
        (Plan({"w1": "ps", "w2": "ps", "w3": "ps", "w4": "nowhere"}), "cannot aggregate"),
        (Plan({"w1": "ps", "w2": "ps", "w3": "ps", "w4": "ps"}, worker_paths={"w4": ("w4", "ps")}), "missing link"),
        (Plan({"w1": "ps", "w2": "ps", "w3": "ps", "w4": "ps"}, worker_paths={"w4": ("w4", "s2", "w3", "s2", "s1", "ps")}), "transits host"),
        (Plan({"w1": "ps", "w2": "ps", "w3": "ps", "w4": "ps"}, worker_paths={"w4": ("w4", "s2")}), "does not run"),
    ],
)
def test_malformed_plans_are_rejected(plan: Plan, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(inst_of(line()), plan)


def test_ecmp_paths_are_shortest_deterministic_and_spread() -> None:
    g = fat_tree(8)
    routes = Routes(g)
    paths = {routes.path(f"h1.{i}.{j}", "h0.0.0") for i in range(4) for j in range(4)}
    assert all(len(p) == 7 for p in paths)
    assert len({p[3] for p in paths}) > 4  # flows spread over several cores
    assert routes.path("h1.0.0", "h0.0.0") == Routes(g).path("h1.0.0", "h0.0.0")
