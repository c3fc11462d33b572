"""`shoal route` end to end: table, JSON contract, plot, and exit code 2 with one line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_route
from shoal.registry import PLANNERS

CONTRACT = {"min_rate_gbps", "bound_gbps", "ps_load_gbps", "max_switch_utilisation", "violations", "solve_s"}


def test_route_is_registered_on_the_shoal_cli() -> None:
    from shoal.cli import app as shoal_app

    names = {c.name for c in shoal_app.registered_commands}
    assert "route" in names


def test_table_output(app) -> None:
    res = run_route(app, "--topology", "fattree:k=4", "--workers", "10", "--programmable", "random:0.3", "--algo", "grid,atp,geryon", "--seed", "2")
    assert res.exit_code == 0, res.output
    for word in ("grid", "atp", "geryon", "min rate Gbps", "violations", "10 workers"):
        assert word in res.stdout


def test_json_contract_for_every_algorithm(app) -> None:
    res = run_route(app, "--topology", "fattree:k=8", "--workers", "100", "--programmable", "random:0.2", "--capacity", "100:3200",
              "--ps-gbps", "100", "--seed", "1", "--algo", "all", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["instance"]["workers"] == 100 and out["instance"]["programmable"] == 16
    results = out["results"]
    assert set(results) == set(PLANNERS.names())  # every registered planner, scored by the one evaluator
    assert {"grid", "rgria", "exact", "geryon", "atp", "atp2", "switchml"} <= set(results)
    for name, rec in results.items():
        assert CONTRACT <= set(rec), name
        assert len(rec["assignment"]) == 100
    assert results["grid"]["violations"] == []
    assert results["rgria"]["bound_gbps"] >= results["exact"]["bound_gbps"] - 1e-6
    assert results["rgria"]["violations"] and all(v["factor"] > 1 for v in results["rgria"]["violations"])
    assert results["geryon"]["min_rate_gbps"] == pytest.approx(1.0)  # B / N
    assert results["geryon"]["bound_gbps"] is None
    assert results["grid"]["min_rate_gbps"] >= 2 * results["atp"]["min_rate_gbps"]


def test_unconstrained_links_give_the_papers_model(app) -> None:
    res = run_route(app, "--topology", "leafspine:spines=4,leaves=6,hosts=4", "--workers", "20", "--link-gbps", "inf", "--algo", "grid,exact", "--json")
    results = json.loads(res.stdout)["results"]
    assert results["grid"]["min_rate_gbps"] == pytest.approx(results["exact"]["min_rate_gbps"])
    assert results["grid"]["max_link_utilisation"] is None


def test_plot_and_save_round_trip(app, tmp_path: Path) -> None:
    png, topo = tmp_path / "plan.png", tmp_path / "inst.json"
    res = run_route(app, "--topology", "fattree:k=4", "--workers", "8", "--algo", "grid,atp", "--plot", str(png), "--save", str(topo), "--json")
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    first = json.loads(res.stdout)["results"]
    again = run_route(app, "--topology", str(topo), "--algo", "grid,atp", "--json")  # PS, workers, capacities from the file
    assert again.exit_code == 0, again.output
    second = json.loads(again.stdout)["results"]
    assert second["grid"]["min_rate_gbps"] == pytest.approx(first["grid"]["min_rate_gbps"])
    assert second["atp"]["assignment"] == first["atp"]["assignment"]


def write(tmp_path: Path, data: object, name: str = "topo.json") -> str:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def tiny(**over: object) -> dict:
    data = {
        "hosts": ["ps", "w1", "w2"],
        "switches": [{"name": "s1", "programmable": True, "capacity_gbps": 400}],
        "links": [{"a": "ps", "b": "s1", "bandwidth_gbps": 100}, {"a": "w1", "b": "s1", "bandwidth_gbps": 100}, {"a": "w2", "b": "s1", "bandwidth_gbps": 100}],
        "ps": "ps",
        "workers": ["w1", "w2"],
    }
    data.update(over)
    return data


BAD_FILES = {
    "malformed JSON": ('{"hosts": ["a",', "not valid JSON"),
    "unknown node": (tiny(links=[{"a": "w1", "b": "s9"}]), "links[0]: unknown node 's9'"),
    "negative capacity": (tiny(switches=[{"name": "s1", "capacity_gbps": -1}]), "switches[0].capacity_gbps"),
    "missing PS": (tiny(ps="ghost"), "ps: 'ghost' is not one of the hosts"),
    "disconnected worker": (tiny(hosts=["ps", "w1", "w2", "w3"], workers=["w1", "w3"]), "host 'w3' has no links"),
    "no path to the PS": (tiny(links=[{"a": "ps", "b": "s1", "bandwidth_gbps": 100}, {"a": "w1", "b": "s1", "bandwidth_gbps": 100}, {"a": "w2", "b": "s1", "bandwidth_gbps": 0}]),
                          "no path from worker 'w2' to the PS 'ps'"),
    "zero capacities everywhere": (tiny(switches=[{"name": "s1", "programmable": True, "capacity_gbps": 0}],
                                        links=[{"a": x, "b": "s1", "bandwidth_gbps": 0} for x in ("ps", "w1", "w2")]),
                                   "every switch capacity and link bandwidth is zero"),
    "empty worker list": (tiny(workers=[]), "workers: List should have at least 1 item"),
    "empty host name": (tiny(hosts=["ps", "w1", "w2", ""]), "hosts[3]: String should have at least 1 character"),
    "empty link end": (tiny(links=[{"a": "", "b": "s1"}]), "links[0].a: String should have at least 1 character"),
    "string number": (tiny(switches=[{"name": "s1", "programmable": True, "capacity_gbps": "100"}]), "switches[0].capacity_gbps: Input should be a valid number"),
    "number as a flag": (tiny(switches=[{"name": "s1", "programmable": 1}]), "switches[0].programmable: Input should be a valid boolean"),
    "Infinity capacity": ('{"hosts": ["ps"], "switches": [{"name": "s1", "capacity_gbps": Infinity}], "links": []}', "switches[0].capacity_gbps: Input should be a finite number"),
    "NaN bandwidth": ('{"hosts": ["ps"], "switches": [], "links": [{"a": "ps", "b": "s1", "bandwidth_gbps": NaN}]}', "links[0].bandwidth_gbps: Input should be a finite number"),
    "not UTF-8": (b'\xff\xfe{"hosts": []}', "not UTF-8 text"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_topology_files_exit_2_with_one_line(app, tmp_path: Path, case: str) -> None:
    data, message = BAD_FILES[case]
    path = write(tmp_path, data)
    res = run_route(app, "--topology", path, "--algo", "all")
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology", "fattree:k=5"], "--topology: fattree k must be an even integer"),
        (["--topology", "mesh:n=3"], "--topology: 'mesh:n=3' is neither"),
        (["--topology", "fattree:k=4", "--algo", "magic"], "--algo: unknown algorithm 'magic'"),
        (["--topology", "fattree:k=4", "--capacity", "-3"], "--capacity: capacities must be >= 0"),
        (["--topology", "fattree:k=4", "--workers", "99"], "--workers: asked for 99 workers"),
        (["--topology", "fattree:k=4", "--ps-gbps", "0"], "--ps-gbps: must be a positive"),
        (["--topology", "fattree:k=4", "--link-gbps", "0"], "--link-gbps: must be positive"),
        (["--topology", "fattree:k=4", "--programmable", "random:2"], "--programmable: fraction must be in [0, 1]"),
        (["--topology", "fattree:k=4", "--plot", "/nonexistent/dir/x.png"], "--plot: /nonexistent/dir/x.png: folder"),
        (["--topology", "fattree:k=4", "--plot", "plan.jpg"], "--plot: plan.jpg: expected a .png file name"),
        (["--topology", "fattree:k=4", "--save", "/proc/1/shoal-x.json"], "--save: /proc/1/shoal-x.json: cannot write there"),
        (["--topology", "fattree:k=4", "--plot", __file__ + "/x.png"], "is not a folder"),
        (["--topology", "nothere.json"], "nothere.json: no such file"),
        (["--topology", "fattree:k=4", "--seed", "-1"], "--seed: must be >= 0, got -1"),
        (["--topology", "fattree:k=4", "--workers", "-3"], "--workers: need at least one worker, got -3"),
        (["--topology", "fattree:k=4", "--time-limit", "0"], "--time-limit: must be a positive number"),
        (["--topology", "fattree:k=4", "--placement", "clustered"], "--placement: expected random or packed"),
        (["--topology", "fattree:k=4,hosts=2", "--hosts-per-rack", "3"], "--hosts-per-rack 3 contradicts hosts=2"),
        (["--topology", "fattree:k=1000000"], "--topology: fattree k=1000000 has 1,250,000,000,000 switches; shoal plans on at most 20,000"),
        (["--topology", "leafspine:spines=10,leaves=10,hosts=100000"], "1,000,000 hosts; shoal plans on at most 250,000"),
    ],
)
def test_bad_options_exit_2_with_one_line(app, args: list[str], message: str) -> None:
    res = run_route(app, *args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr


def test_console_script_json_is_clean_stdout() -> None:
    """Through the real entry point: HiGHS' banner must not leak into --json output."""
    shoal = Path(sys.executable).with_name("shoal")
    if not shoal.exists():
        pytest.skip("console script not installed")
    proc = subprocess.run([str(shoal), "route", "--topology", "fattree:k=4", "--workers", "6", "--algo", "rgria,grid", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["results"]) == {"rgria", "grid"}
    bad = subprocess.run([str(shoal), "route", "--topology", "fattree:k=3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["error: --topology: fattree k must be an even integer >= 2, got 3"]


def test_a_narrow_terminal_gets_the_table_with_algorithms_as_columns():
    import io

    from rich.console import Console

    from shoal.commands.route import _print_table
    from shoal.network import build_instance, parse_topology_spec, solve

    inst = build_instance(parse_topology_spec("fattree:k=4"), seed=0)
    results = [solve(inst, algo) for algo in ("grid", "atp")]
    for width, transposed in ((80, True), (200, False)):
        out = io.StringIO()
        _print_table(inst, results, Console(file=out, width=width, force_terminal=False))
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        header = next(line for line in lines if "grid" in line or "algorithm" in line)
        assert ("grid" in header and "atp" in header) == transposed, header
        assert "…" not in out.getvalue()  # nothing is cut


def test_the_plot_colour_scale_reaches_the_worst_overload():
    from shoal.network import build_instance, parse_topology_spec, solve
    from shoal.network.plot import utilisation_norm

    inst = build_instance(parse_topology_spec("fattree:k=4"), seed=0)
    results = [solve(inst, algo) for algo in ("grid", "exact")]
    worst = max(r.evaluation.max_link_utilisation for r in results)
    assert worst > 2  # exact claims more than the links carry on this instance
    norm = utilisation_norm(results)
    assert norm.vmax >= worst and norm.vcenter == 1.0
    assert utilisation_norm(results[:1]).vmax == 2  # a plan that breaks nothing keeps the 0..2 scale


def test_an_unreachable_programmable_switch_is_left_out_with_a_note(app, tmp_path: Path) -> None:
    """A big switch behind a 0 Gbps link used to crash grid, rgria and exact; now it is excluded."""
    data = tiny(switches=[{"name": "s1", "programmable": True, "capacity_gbps": 400}, {"name": "island", "programmable": True, "capacity_gbps": 3200}],
                links=tiny()["links"] + [{"a": "s1", "b": "island", "bandwidth_gbps": 0}])
    res = run_route(app, "--topology", write(tmp_path, data), "--algo", "all", "--json")
    assert res.exit_code == 0, res.output
    assert "note: 1 programmable switch(es) cannot be reached" in res.stderr and "island" in res.stderr
    out = json.loads(res.stdout)
    assert out["instance"]["unreachable_programmable"] == ["island"]
    for algo, r in out["results"].items():
        assert r["status"] == "ok" and "island" not in r["aggregation_switches"], algo
        assert r["min_rate_gbps"] > 0


def test_a_planner_that_runs_out_of_time_says_so(app, monkeypatch) -> None:
    """rgria's LP cannot finish in a microsecond: its entry says "time limit"; grid returns its best plan so far."""
    res = run_route(app, "--topology", "fattree:k=4", "--algo", "rgria,grid", "--time-limit", "0.000001", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["results"]
    assert out["rgria"]["status"] == "time limit" and out["rgria"]["min_rate_gbps"] is None
    assert "time limit" in out["rgria"]["notes"]["time_limit"]
    assert out["grid"]["min_rate_gbps"] > 0 and out["grid"]["violations"] == []
    table = run_route(app, "--topology", "fattree:k=4", "--algo", "rgria,grid", "--time-limit", "0.000001")
    assert table.exit_code == 0 and "time limit" in table.stdout


def test_hosts_per_rack_and_packed_placement(app) -> None:
    out = json.loads(run_route(app, "--topology", "fattree:k=4", "--hosts-per-rack", "3", "--workers", "7", "--placement", "packed",
                         "--ps", "h3.1.2", "--algo", "geryon", "--json").stdout)
    assert out["instance"]["hosts"] == 4 * 2 * 3
    workers = sorted(out["results"]["geryon"]["assignment"])
    assert workers == ["h0.0.0", "h0.0.1", "h0.0.2", "h0.1.0", "h0.1.1", "h0.1.2", "h1.0.0"]  # rack by rack


def test_switch_labels_of_a_crowded_plan_never_overlap():
    """fat-tree k = 8 with 100 workers: busy switches keep their labels, the rest move or hide, none collide."""
    from shoal.network import build_instance, solve
    from shoal.network.plot import plan_figure
    from shoal.network.topology import fat_tree

    inst = build_instance(fat_tree(8), workers=100, programmable="random:0.2", seed=0)
    fig = plan_figure(inst, [solve(inst, a) for a in ("grid", "atp", "switchml", "exact")])
    renderer = fig.canvas.get_renderer()
    labelled = 0
    for ax in fig.axes[:4]:
        boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_visible() and "w" in t.get_text() and ":" in t.get_text()]
        labelled += len(boxes)
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert labelled >= 30  # most switches keep a label
