"""The latest planner: a planner added as one registered file (shoal/network/algorithms/latest.py)."""

from __future__ import annotations

import json

import pytest

from shoal.network import ALGORITHMS, build_instance, solve
from shoal.network.topology import fat_tree, topology_from_dict

from conftest import run_route
from test_network_algorithms import two_racks  # the same two-rack topology


def test_latest_aggregates_at_the_last_programmable_switch_by_hand():
    inst = build_instance(topology_from_dict(two_racks()), programmable="file", capacity=None)
    result = solve(inst, "latest")
    # w0's path (tor0) has no programmable switch; w1..w3 pass tor1 then the spine, the later one
    assert result.plan.assignment == {"w0": "ps", "w1": "spine", "w2": "spine", "w3": "spine"}
    assert result.evaluation.min_rate_gbps == pytest.approx(50)  # the PS takes w0's and the spine's streams
    assert result.bound_gbps is None and result.evaluation.violations == ()


def test_latest_is_registered_and_never_beats_the_exact_optimum_of_the_model():
    assert "latest" in ALGORITHMS
    inst = build_instance(fat_tree(4), workers=8, programmable="all", capacity=(100.0, 400.0), seed=3)
    latest, exact = solve(inst, "latest"), solve(inst, "exact")
    assert latest.evaluation.ps_streams <= 8
    assert latest.evaluation.min_rate_gbps <= exact.evaluation.min_rate_gbps + 1e-9


def test_shoal_route_runs_it(app):
    result = run_route(app, "--topology", "fattree:k=4", "--workers", "8", "--programmable", "all",
                       "--algo", "latest,geryon", "--json")
    assert result.exit_code == 0, result.output
    results = json.loads(result.output)["results"]
    assert results["latest"]["status"] == "ok" and results["latest"]["ps_streams"] == 1  # all under one core switch
    assert results["latest"]["violations"] == [] and results["latest"]["min_rate_gbps"] > 0
