"""In-network aggregation in the sim backend: the plan drives push timing, never the math."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shoal.backends.sim import SimBackend
from shoal.config import ConfigError, load_config
from shoal.engine.metrics import RunRecorder
from shoal.engine.setup import build_setup
from shoal.network.training import plan_aggregation

COST = [
    "backend.mode=cost", "cluster.workers=12", "cluster.compute_s=0.001", "run.max_iterations=240",
    "cluster.link_gbps=100", "cluster.server_gbps=100", "network.topology=fattree:k=4",
    "network.programmable=random:0.3", "model.name=mlp", "data.name=digits", "model.hidden=[512, 512]",
]


def run(overrides: list[str]) -> tuple[SimBackend, dict]:
    backend = SimBackend(build_setup(load_config(None, overrides)), RunRecorder())
    return backend, backend.run()


def ina(algorithm: str) -> list[str]:
    return COST + ["network.aggregation=ina", f"network.algorithm={algorithm}"]


def test_a_plan_that_sends_everything_to_the_server_times_exactly_like_server_aggregation():
    """geryon: every worker straight to the server at min(T, B/N), which is the server's fair share."""
    _, server = run(COST)
    _, geryon = run(ina("geryon"))
    assert geryon["routing"]["aggregation_switches"] == {}
    assert geryon["elapsed_s"] == pytest.approx(server["elapsed_s"], rel=1e-9)
    assert [w["comm_s"] for w in geryon["per_worker"]] == pytest.approx([w["comm_s"] for w in server["per_worker"]])


def test_grid_pushes_faster_than_server_aggregation_and_reports_its_plan():
    _, server = run(COST)
    _, grid = run(ina("grid"))
    routing = grid["routing"]
    assert routing["algorithm"] == "grid" and routing["violations"] == []
    assert sum(routing["aggregation_switches"].values()) > 1  # a switch sums several workers
    assert routing["rate_gbps"] > 100 / 12
    assert grid["elapsed_s"] < server["elapsed_s"]
    assert sum(w["comm_s"] for w in grid["per_worker"]) < sum(w["comm_s"] for w in server["per_worker"])


def test_plan_rate_and_nodes_follow_the_planner():
    plan = plan_aggregation(load_config(None, ina("grid")))
    assert len(plan.node_of) == 12
    for switch in set(plan.node_of) - {None}:
        assert plan.members(switch) >= 1 and plan.switch_bps[switch] > 0
    assert plan.rate_bps == pytest.approx(plan.summary["rate_gbps"] * 1e9)


def test_in_network_aggregation_changes_timing_not_the_model(fast_config):
    """Same iterations: identical parameters with and without INA (the switch sums what the server would)."""
    base = ["run.max_iterations=24", "run.stop_at_target=false", "cluster.workers=6", "network.topology=fattree:k=4"]
    plain = SimBackend(build_setup(fast_config(*base)), RunRecorder())
    plain.run()
    grid = SimBackend(build_setup(fast_config(*base, "network.aggregation=ina")), RunRecorder())
    grid.run()
    assert torch.equal(plain.servers[0].replica.params, grid.servers[0].replica.params)


@pytest.mark.parametrize("override, message", [
    ("sync.scheme=ssp", "needs sync.scheme"),
    ("compression.method=topk", "dense gradients"),
    ("network.topology=ring:n=3", "network.topology"),
    ("network.worker_hosts=['h0.0.0']", "network.worker_hosts"),
])
def test_bad_network_input_is_one_line_and_exit_2(tmp_path, override, message):
    cmd = [str(Path(sys.executable).with_name("shoal")), "train", "--set", "network.aggregation=ina", "--set", override,
           "--set", "backend.mode=cost", "--out", str(tmp_path / "r"), "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_too_many_workers_for_the_topology_is_a_config_error():
    with pytest.raises(ConfigError, match="cluster.workers"):
        plan_aggregation(load_config(None, ina("grid") + ["cluster.workers=40"]))
