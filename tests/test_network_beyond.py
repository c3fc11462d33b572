"""Beyond the paper: the joint evaluator, a model sharded over several PSs, several jobs, re-planning after failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_route
from shoal.config import ConfigError
from shoal.network import Plan, build_instance, evaluate, solve
from shoal.network.instance import Instance, extra_servers
from shoal.network.joint import Job, Part, evaluate_joint, plan_jobs, plan_sharded, sharded_bound
from shoal.network.replan import Failure, apply_failure, parse_failures, replan
from shoal.network.topology import fat_tree, leaf_spine, topology_from_dict


def star(**switch: object) -> dict:
    """One switch s (C = 400) with hosts a, b (PSs) and w1..w4, every link 100 Gbps."""
    names = ["a", "b", "w1", "w2", "w3", "w4"]
    return {"hosts": names, "switches": [{"name": "s", "programmable": True, "capacity_gbps": 400, **switch}],
            "links": [{"a": h, "b": "s", "bandwidth_gbps": 100} for h in names]}


def test_the_joint_evaluator_sums_every_shared_constraint() -> None:
    g = topology_from_dict(star(slots=1000))
    job1 = Instance(g, "a", ("w1", "w2"))
    job2 = Instance(g, "b", ("w3", "w4"))
    both = [Part(job1, Plan({"w1": "s", "w2": "s"}), 50.0, 600), Part(job2, Plan({"w3": "s", "w4": "s"}), 50.0, 600)]
    ev = evaluate_joint(g, both)
    assert ev.switch_load_gbps == {"s": 200.0} and ev.switch_slots == {"s": 1200}
    assert [v.kind for v in ev.violations] == ["switch_slots"]  # 1200 units on a 1000-unit switch; 200 of 400 Gbps is fine
    assert ev.scale == 0.0  # no rate makes memory fit
    job3 = Instance(g, "a", ("w3", "w4"))  # a second job on PS a, its workers sent straight to it
    ev = evaluate_joint(g, [Part(job1, Plan({"w1": "s", "w2": "s"}), 150.0), Part(job3, Plan({"w3": "a", "w4": "a"}), 30.0)])
    # switch: 2 x 150 = 300 <= 400; PS a: its own job's stream 150 (> 100) and job 2's two direct streams 60: 210 on B = 100
    assert {(v.kind, v.where) for v in ev.violations} >= {("ps_ingress", "a"), ("worker_rate", "w1")}
    assert ev.scale == pytest.approx(100 / 210)


def test_a_sharded_model_over_two_pss_doubles_the_rate_a_single_ps_allows() -> None:
    inst = build_instance(topology_from_dict(star()), workers=["w1", "w2", "w3", "w4"], ps="a", programmable="none", capacity=None)
    assert solve(inst, "grid").evaluation.min_rate_gbps == pytest.approx(25)  # four streams into one 100 Gbps PS
    res = plan_sharded(inst, ["a", "b"])
    # two PSs, each takes 4 streams of 12.5: a worker sends 2 x 12.5 = 25 ... per PS, but the PS's link is the limit:
    assert res.evaluation.feasible and res.min_rate_gbps == pytest.approx(50)
    assert res.bound_gbps >= res.min_rate_gbps
    assert extra_servers(inst, 2, seed=0) == ["a", "b"]
    with pytest.raises(ConfigError, match="only 1 hosts are neither workers nor the PS"):
        extra_servers(inst, 3, seed=0)


@pytest.mark.parametrize("links", [float("inf"), 100.0])
def test_sharding_over_four_pss_never_loses_and_is_feasible(links: float) -> None:
    for seed in range(3):
        inst = build_instance(fat_tree(8, 6), workers=100, programmable="random:0.2", link_gbps=links, seed=seed)
        one = solve(inst, "grid", seed).evaluation.min_rate_gbps
        four = plan_sharded(inst, extra_servers(inst, 4, seed))
        assert four.evaluation.feasible
        assert four.min_rate_gbps >= min(one, four.bound_gbps) * (1 - 1e-9) or four.min_rate_gbps >= 1.5 * 25
        assert four.min_rate_gbps <= sharded_bound(inst, extra_servers(inst, 4, seed)) * (1 + 1e-9)


def test_jobs_share_a_switch_within_its_aggregator_slots_and_max_min_fair() -> None:
    g = topology_from_dict(star(slots=1024))
    jobs = [Job("one", Instance(g, "a", ("w1", "w2")), slots=1024), Job("two", Instance(g, "b", ("w3", "w4")), slots=1024)]
    res = plan_jobs(g, jobs)
    assert res.evaluation.feasible
    on_switch = [name for name, p in zip(res.names, res.parts) if "s" in p.plan.assignment.values()]
    assert len(on_switch) <= 1  # only one job fits in the switch's memory
    rates = sorted(p.rate_gbps for p in res.parts)
    assert rates[0] == pytest.approx(50) and res.common_rate_gbps == pytest.approx(50)  # the direct job: 2 streams into B = 100
    alone = [solve(j.inst, "grid") for j in jobs]  # each job alone takes the switch
    together = evaluate_joint(g, [Part(j.inst, r.plan, r.evaluation.min_rate_gbps, j.slots) for j, r in zip(jobs, alone)])
    assert any(v.kind == "switch_slots" for v in together.violations)


def test_four_jobs_on_a_fat_tree_are_feasible_together() -> None:
    g = build_instance(fat_tree(4, 4), workers=1, programmable="all", link_gbps=100.0, seed=1).graph
    hosts = sorted(n for n, d in g.nodes(data=True) if d["kind"] == "host")
    jobs = [Job(f"j{i}", Instance(g, hosts[8 * i], tuple(hosts[8 * i + 1: 8 * i + 8])), slots=2000) for i in range(4)]
    res = plan_jobs(g, jobs)
    assert res.evaluation.feasible and min(p.rate_gbps for p in res.parts) >= res.common_rate_gbps * (1 - 1e-9) > 0


def two_paths() -> dict:
    """w1, w2 under t1; t1 reaches the PS's switch t0 through x or y; t1 programmable (C = 200)."""
    return {"hosts": ["ps", "w1", "w2"],
            "switches": [{"name": "t0"}, {"name": "t1", "programmable": True, "capacity_gbps": 200}, {"name": "x"}, {"name": "y"}],
            "links": [{"a": "ps", "b": "t0"}, {"a": "w1", "b": "t1"}, {"a": "w2", "b": "t1"}, {"a": "t1", "b": "x"}, {"a": "x", "b": "t0"},
                      {"a": "t1", "b": "y"}, {"a": "y", "b": "t0"}], "ps": "ps", "workers": ["w1", "w2"]}


def test_replan_moves_only_the_streams_a_failure_cut() -> None:
    inst = build_instance(topology_from_dict(two_paths()), programmable="file", capacity=None)
    before = solve(inst, "grid")
    assert before.evaluation.min_rate_gbps == pytest.approx(100) and before.plan.assignment == {"w1": "t1", "w2": "t1"}
    hop = before.plan.switch_paths["t1"][1]  # x or y
    fail = parse_failures(inst.graph, [f"t1-{hop}"])
    assert evaluate(apply_failure(inst, fail), before.plan).min_rate_gbps == 0  # the old plan crosses the dead link
    res = replan(inst, before.plan, fail)
    assert res.evaluation.violations == () and res.evaluation.min_rate_gbps == pytest.approx(100)
    assert res.affected == ("w1", "w2")  # their switch's stream was cut
    assert hop not in res.plan.switch_paths["t1"]
    worker_link = parse_failures(inst.graph, ["w1-t1"])
    with pytest.raises(ConfigError, match="worker 'w1' has no path to the PS"):
        replan(inst, before.plan, worker_link)


def test_a_failed_switch_and_bad_failure_specs() -> None:
    inst = build_instance(leaf_spine(3, 3, 4), workers=8, programmable="all", link_gbps=100.0, seed=2)
    before = solve(inst, "grid", 2)
    used = sorted(before.evaluation.switch_workers)[0]
    if inst.graph.nodes[used]["tier"] == "leaf":  # a leaf carries its hosts: fail a spine instead
        used = next(s for s in ("s0", "s1", "s2") if any(s in p for p in before.plan.worker_paths.values()))
    res = replan(inst, before.plan, Failure(switches=(used,)))
    assert res.evaluation.violations == () and used not in res.evaluation.switch_workers
    assert all(used not in p for p in res.plan.worker_paths.values())
    with pytest.raises(ConfigError, match="neither a switch nor a link"):
        parse_failures(inst.graph, ["s0-s1"])  # spines are not linked to each other


# --------------------------------------------------------------------------- through the CLI


def test_cli_sharded_model(app) -> None:
    res = run_route(app, "--topology", "fattree:k=4", "--workers", "8", "--ps-count", "3", "--algo", "grid,geryon", "--link-gbps", "inf", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["instance"]["servers"]) == 3 and out["results"]["grid"]["ps_count"] == 3
    assert out["results"]["grid"]["violations"] == [] and out["results"]["grid"]["min_rate_gbps"] >= out["results"]["geryon"]["min_rate_gbps"]
    assert out["results"]["geryon"]["min_rate_gbps"] == pytest.approx(3 * 100 / 8)  # each PS takes all 8 workers' streams
    table = run_route(app, "--topology", "fattree:k=4", "--workers", "8", "--ps", "h0.0.0,h3.1.1")
    assert table.exit_code == 0 and "2 PSs" in table.stdout


def test_cli_jobs_and_failures(app, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps({"switch_slots": 2048, "jobs": [{"name": "a", "workers": 5}, {"name": "b", "workers": 5, "slots": 1024}]}))
    res = run_route(app, "--topology", "fattree:k=4", "--programmable", "all", "--jobs", str(jobs), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["joint"]["feasible"] and set(out["joint"]["jobs"]) == {"a", "b"}
    assert all(n <= 2048 for n in out["joint"]["switch_slots_used"].values())
    assert out["joint"]["switch_slots_used"]  # with the file's 2048 units the jobs aggregate in the network
    tight = json.loads(run_route(app, "--topology", "fattree:k=4", "--programmable", "all", "--jobs", str(jobs), "--switch-slots", "512",
                                 "--json").stdout)  # the command line wins over the file: 512 units hold no job's 1024
    assert tight["joint"]["feasible"] and tight["joint"]["switch_slots_used"] == {}
    assert all(job["aggregation_switches"] == {} for job in tight["joint"]["jobs"].values())
    res = run_route(app, "--topology", "fattree:k=4", "--workers", "8", "--programmable", "all", "--fail", "e0.0-a0.0", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["failed"]["links"] == [["e0.0", "a0.0"]] and out["replan"]["violations"] == []
    assert out["replan"]["min_rate_gbps"] > 0 and out["full_solve"]["min_rate_gbps"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail", "nowhere"], "--fail: 'nowhere' is neither a switch nor a link"),
        (["--ps-count", "0"], "--ps-count: need at least one PS"),
        (["--ps-count", "2", "--fail", "e0.0"], "cannot be combined"),
        (["--ps-count", "2", "--workers", "15"], "--ps-count 2: only 0 hosts are neither workers nor the PS"),
        (["--jobs", "missing.json"], "--jobs: missing.json: no such file"),
        (["--jobs", "missing.json", "--workers", "3"], "--jobs: the jobs file places every job's PS and workers"),
        (["--ps-count", "2", "--plot", "x.png"], "--plot and --save draw or save one job's single plan"),
    ],
)
def test_cli_bad_beyond_options_exit_2_with_one_line(app, args: list[str], message: str) -> None:
    res = run_route(app, "--topology", "fattree:k=4", *args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr


def test_cli_bad_jobs_files(app, tmp_path: Path) -> None:
    cases = {
        "shared host": ({"jobs": [{"name": "a", "ps": "h0.0.0", "workers": 2}, {"name": "b", "workers": ["h0.0.0"]}]}, "host 'h0.0.0' is in jobs 'a' and 'b'"),
        "duplicate name": ({"jobs": [{"name": "a", "workers": 2}, {"name": "a", "workers": 2}]}, "two jobs are named 'a'"),
        "zero workers": ({"jobs": [{"name": "a", "workers": 0}]}, "workers must be a non-empty host list or a count >= 1"),
        "string count": ({"jobs": [{"name": "a", "workers": "3"}]}, "jobs[0].workers: Input should be a valid list or Input should be a valid integer"),
        "unknown key": ({"jobs": [{"name": "a", "workers": 2, "gpus": 4}]}, "jobs[0].gpus: unknown key"),
        "too many": ({"jobs": [{"name": "a", "workers": 99}]}, "asks for 99 workers"),
    }
    for case, (data, message) in cases.items():
        path = tmp_path / "jobs.json"
        path.write_text(json.dumps(data))
        res = run_route(app, "--topology", "fattree:k=4", "--jobs", str(path))
        assert res.exit_code == 2, (case, res.output)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, (case, res.stderr)
