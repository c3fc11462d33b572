"""Topologies, the JSON format, and instance building: shapes, round trips, and clear errors."""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.config import ConfigError
from shoal.network.instance import build_instance, parse_bandwidth, parse_range, parse_workers, reachable_hosts
from shoal.network.topology import (
    fat_tree,
    hosts,
    leaf_spine,
    load_topology,
    parse_topology_spec,
    save_topology,
    switches,
    top_of_rack,
    topology_from_dict,
)


def test_fat_tree_k8_has_the_papers_80_switches() -> None:
    g = fat_tree(8)
    assert len(switches(g)) == 80
    assert len(hosts(g)) == 8 * 4 * 4
    assert len(top_of_rack(g)) == 32
    assert nx.is_connected(g)
    assert all(g.degree(s) == 8 for s in switches(g) if not s.startswith("e"))  # core and agg: k ports


def test_fat_tree_hosts_per_edge_is_configurable() -> None:
    g = fat_tree(4, hosts_per_edge=7)
    assert len(hosts(g)) == 4 * 2 * 7
    assert len(switches(g)) == 20


def test_leaf_spine_shape() -> None:
    g = leaf_spine(30, 30, 10)
    assert len(switches(g)) == 60 and len(hosts(g)) == 300
    assert sorted(top_of_rack(g)) == sorted(f"l{i}" for i in range(30))
    assert g.number_of_edges() == 30 * 30 + 300


@pytest.mark.parametrize(
    ("spec", "n_switches"),
    [("fattree:k=4", 20), ("fattree:k=8,hosts=2", 80), ("leafspine:spines=2,leaves=3,hosts=4", 5), ("fattree:", 80)],
)
def test_parse_topology_spec(spec: str, n_switches: int) -> None:
    assert len(switches(parse_topology_spec(spec))) == n_switches


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fattree:k=7", "even"),
        ("fattree:k=x", "integer"),
        ("fattree:q=3", "bad parameter"),
        ("leafspine:spines=0,leaves=2", ">= 1"),
        ("torus:n=4", "neither"),
    ],
)
def test_bad_topology_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_topology_spec(spec)
    assert str(err.value).startswith("--topology: ")


def test_link_gbps_override() -> None:
    g = parse_topology_spec("leafspine:spines=2,leaves=2,hosts=1", link_gbps=math.inf)
    assert all(math.isinf(bw) for _, _, bw in g.edges(data="bandwidth_gbps"))


def _tiny() -> dict:
    return {
        "hosts": ["ps", "w1", "w2"],
        "switches": [{"name": "s1", "programmable": True, "capacity_gbps": 400}, {"name": "s2"}],
        "links": [{"a": "ps", "b": "s1", "bandwidth_gbps": 100}, {"a": "w1", "b": "s2"}, {"a": "w2", "b": "s2", "bandwidth_gbps": 40}, {"a": "s1", "b": "s2", "bandwidth_gbps": 100}],
        "ps": "ps",
        "workers": ["w1", "w2"],
    }


def test_json_round_trip(tmp_path) -> None:
    g = topology_from_dict(_tiny(), "t.json")
    assert math.isinf(g.edges["w1", "s2"]["bandwidth_gbps"])
    path = tmp_path / "t.json"
    save_topology(g, path)
    back = load_topology(path)
    assert nx.utils.graphs_equal(g, back)
    assert back.graph["ps"] == "ps" and back.graph["workers"] == ["w1", "w2"]


def test_generated_topology_round_trips_with_instance(tmp_path) -> None:
    inst = build_instance(fat_tree(4), workers=6, programmable="random:0.5", seed=3)
    path = tmp_path / "ft.json"
    save_topology(inst.graph, path, inst.ps, inst.workers)
    again = build_instance(load_topology(path), programmable="file", capacity=None, source=str(path))
    assert again.ps == inst.ps and again.workers == inst.workers
    assert again.programmable == inst.programmable
    assert [again.capacity(s) for s in again.programmable] == [inst.capacity(s) for s in inst.programmable]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["links"].append({"a": "w1", "b": "nowhere"}), "links[4]: unknown node 'nowhere'"),
        (lambda d: d["switches"][0].update(capacity_gbps=-5), "switches[0].capacity_gbps: Input should be greater than or equal to 0"),
        (lambda d: d["links"][0].update(bandwidth_gbps=-1), "links[0].bandwidth_gbps"),
        (lambda d: d["hosts"].append("lonely"), "host 'lonely' has no links"),
        (lambda d: d.update(ps="s1"), "ps: 's1' is not one of the hosts"),
        (lambda d: d.update(workers=["w1", "ghost"]), "workers: 'ghost' is not one of the hosts"),
        (lambda d: d["switches"].append({"name": "w1"}), "node 'w1' is defined twice"),
        (lambda d: d["links"].append({"a": "s1", "b": "s1"}), "to itself"),
        (lambda d: d["links"].append({"a": "s2", "b": "s1"}), "duplicate link"),
        (lambda d: d.update(colour="blue"), "colour: unknown key"),
        (lambda d: d.pop("links"), "links: Field required"),
        (lambda d: d.update(hosts=[], links=[], ps=None, workers=None), "no hosts"),
    ],
)
def test_malformed_topology_files(mutate, message: str) -> None:
    data = _tiny()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        topology_from_dict(data, "topo.json")
    assert str(err.value).startswith("topo.json: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unreadable_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_topology(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"hosts": [1,}')
    with pytest.raises(ConfigError, match=r"bad.json: not valid JSON \(line 1"):
        load_topology(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_topology(bad)


def test_placement_is_seeded_and_valid() -> None:
    a = build_instance(fat_tree(8), workers=40, programmable="random:0.2", seed=7)
    b = build_instance(fat_tree(8), workers=40, programmable="random:0.2", seed=7)
    c = build_instance(fat_tree(8), workers=40, programmable="random:0.2", seed=8)
    assert (a.ps, a.workers, a.programmable) == (b.ps, b.workers, b.programmable)
    assert (a.ps, a.workers) != (c.ps, c.workers)
    assert len(a.workers) == 40 and a.ps not in a.workers
    assert len(a.programmable) == 16  # 20% of 80
    assert all(100 <= a.capacity(s) <= 3200 for s in a.programmable)


def test_programmable_modes(tmp_path) -> None:
    g = leaf_spine(3, 4, 2)
    assert set(build_instance(g, programmable="tor").programmable) == {"l0", "l1", "l2", "l3"}
    assert len(build_instance(g, programmable="all").programmable) == 7
    assert build_instance(g, programmable="none").programmable == ()
    assert build_instance(g, programmable=["s1"]).programmable == ("s1",)
    listed = tmp_path / "prog.json"
    listed.write_text('["s0", "l2"]')
    assert build_instance(g, programmable=str(listed)).programmable == ("l2", "s0")
    with pytest.raises(ConfigError, match="--programmable: 'x9' is not a switch"):
        build_instance(g, programmable=["x9"])
    with pytest.raises(ConfigError, match="fraction must be in"):
        build_instance(g, programmable="random:1.5")
    with pytest.raises(ConfigError, match="--programmable:"):
        build_instance(g, programmable="sometimes")


def test_fixed_capacity_and_zero_capacity_switches_cannot_aggregate() -> None:
    inst = build_instance(leaf_spine(2, 2, 2), capacity=(0.0, 0.0), programmable="all")
    assert inst.programmable == ()  # programmable but C_s = 0: never a candidate
    inst = build_instance(leaf_spine(2, 2, 2), capacity=(800.0, 800.0), programmable="all")
    assert {inst.capacity(s) for s in inst.programmable} == {800.0}


def test_impossible_instances_are_config_errors() -> None:
    data = _tiny()
    data["links"][2]["bandwidth_gbps"] = 0  # w2's only link is dead
    g = topology_from_dict(data, "t.json")
    with pytest.raises(ConfigError, match="t.json: no path from worker 'w2' to the PS 'ps'"):
        build_instance(g, programmable="file", capacity=None, source="t.json")
    zero = _tiny()
    for link in zero["links"]:
        link["bandwidth_gbps"] = 0
    zero["switches"][0]["capacity_gbps"] = 0
    with pytest.raises(ConfigError, match="every switch capacity and link bandwidth is zero"):
        build_instance(topology_from_dict(zero, "z.json"), capacity=None, source="z.json")
    with pytest.raises(ConfigError, match="--workers: asked for 200 workers but only 127"):
        build_instance(fat_tree(8), workers=200)
    with pytest.raises(ConfigError, match="--ps: 'e0.0' is not a host"):
        build_instance(fat_tree(4), ps="e0.0")
    with pytest.raises(ConfigError, match="--ps-gbps: must be a positive"):
        build_instance(fat_tree(4), ps_gbps=0)
    with pytest.raises(ConfigError, match="worker 'h0.0.0' is also the PS"):
        build_instance(fat_tree(4), ps="h0.0.0", workers=["h0.0.0"])


def test_hosts_do_not_forward() -> None:
    g = topology_from_dict({"hosts": ["ps", "relay", "w"], "switches": [{"name": "s"}], "links": [{"a": "ps", "b": "s"}, {"a": "s", "b": "relay"}, {"a": "relay", "b": "w"}]})
    assert reachable_hosts(g, "ps") == {"relay"}


def _reachable_by_hand(g: nx.Graph, ps: str) -> set[str]:
    """The rule spelled out: walk positive links from the PS, forwarding only through switches."""
    seen, frontier = {ps}, [ps]
    while frontier:
        u = frontier.pop()
        if u != ps and g.nodes[u]["kind"] == "host":
            continue
        for v in g[u]:
            if v not in seen and g[u][v]["bandwidth_gbps"] > 0:
                seen.add(v)
                frontier.append(v)
    return {h for h in seen if h != ps and g.nodes[h]["kind"] == "host"}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_reachable_hosts_follow_the_rule_on_random_graphs_with_dead_links(seed: int) -> None:
    import random

    rng = random.Random(seed)
    g = fat_tree(4)
    for u, v in g.edges:
        if rng.random() < 0.25:
            g[u][v]["bandwidth_gbps"] = 0.0  # dead links cut some hosts off
    hosts = [n for n in g.nodes if g.nodes[n]["kind"] == "host"]
    ps = rng.choice(hosts)
    assert reachable_hosts(g, ps) == _reachable_by_hand(g, ps)


def test_option_parsers() -> None:
    assert parse_range("800", "--capacity") == (800.0, 800.0)
    assert parse_range("100:3200", "--capacity") == (100.0, 3200.0)
    for bad, msg in (("-5", ">= 0"), ("3:1", "LO must not exceed HI"), ("a:b", "expected a number"), ("1:2:3", "expected")):
        with pytest.raises(ConfigError, match=msg):
            parse_range(bad, "--capacity")
    assert math.isinf(parse_bandwidth("inf", "--link-gbps")) and parse_bandwidth("40", "--link-gbps") == 40
    with pytest.raises(ConfigError, match="must be positive"):
        parse_bandwidth("0", "--link-gbps")
    assert parse_workers("12") == 12 and parse_workers("a, b") == ["a", "b"] and parse_workers(None) is None
    with pytest.raises(ConfigError, match="at least one worker"):
        parse_workers("0")


def test_saved_file_is_plain_json(tmp_path) -> None:
    path = tmp_path / "x.json"
    save_topology(leaf_spine(1, 1, 1), path)
    data = json.loads(path.read_text())
    assert set(data) >= {"hosts", "switches", "links"}
