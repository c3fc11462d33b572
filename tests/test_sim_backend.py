"""The sim backend: exact updates on tiny cases, schedules, determinism, stopping rules."""

from __future__ import annotations

import json

import pytest
import torch

from shoal.backends.sim import SimBackend
from shoal.engine.metrics import RunRecorder
from shoal.engine.setup import build_setup
from shoal.runner import train

from conftest import read_jsonl


def _run(cfg):
    setup = build_setup(cfg)
    backend = SimBackend(setup, RunRecorder())
    return backend, backend.run()


def test_one_bsp_round_applies_the_mean_gradient(fast_config):
    """Two workers, plain SGD: after one round params = p0 - lr * (g0 + g1) / 2."""
    cfg = fast_config("cluster.workers=2", "optimizer.momentum=0", "run.max_iterations=2", "run.stop_at_target=false")
    setup = build_setup(cfg)
    p0, b0 = setup.engine.initial_state()
    # the same batches the workers will draw (fresh streams from the same seed)
    expected_grads = []
    for w in range(2):
        x, y = build_setup(cfg).streams[w].next()
        expected_grads.append(setup.engine.gradient(p0, b0, x, y)[0])
    backend = SimBackend(setup, RunRecorder())
    backend.run()
    expected = p0 - cfg.optimizer.lr * (expected_grads[0] + expected_grads[1]) / 2
    assert torch.allclose(backend.servers[0].replica.params.detach(), expected, atol=1e-6)


def test_asp_applies_each_gradient_with_weight_one_over_n(fast_config):
    cfg = fast_config("cluster.workers=2", "sync.scheme=asp", "optimizer.momentum=0",
                      "run.max_iterations=1", "cluster.speeds=[1, 3]")
    setup = build_setup(cfg)
    p0, b0 = setup.engine.initial_state()
    x, y = build_setup(cfg).streams[0].next()
    g0 = setup.engine.gradient(p0, b0, x, y)[0]
    backend = SimBackend(setup, RunRecorder())
    backend.run()
    assert torch.allclose(backend.servers[0].replica.params.detach(), p0 - cfg.optimizer.lr * g0 / 2, atol=1e-6)


def test_bsp_on_equal_workers_never_waits_and_is_never_stale(fast_config, tmp_path):
    summary = train(fast_config("run.max_iterations=40", "run.stop_at_target=false"), tmp_path / "r")
    assert [w["iterations"] for w in summary["per_worker"]] == [10] * 4
    assert all(w["wait_s"] == pytest.approx(0, abs=1e-9) for w in summary["per_worker"])
    its = [e for e in read_jsonl(tmp_path / "r" / "metrics.jsonl") if e["event"] == "iteration"]
    assert len(its) == 40 and all(e["staleness"] == 0 for e in its)


def test_bsp_on_allreduce_is_the_same_math_at_the_ring_all_reduces_cost(fast_config, tmp_path):
    """Same updates as the server path; each iteration pays a ring all-reduce instead of a pull and a push."""
    from shoal.engine.cost import ring_allreduce_bytes, ring_allreduce_time

    budget = ("run.max_iterations=40", "run.stop_at_target=false", "cluster.link_gbps=1", "cluster.latency_ms=0.5")
    server = train(fast_config(*budget), tmp_path / "server")
    ring = train(fast_config(*budget, "sync.intra_group=allreduce"), tmp_path / "ring")
    assert ring["final_accuracy"] == server["final_accuracy"] and ring["iterations"] == 40
    params = ring["params"]
    per_iteration = ring_allreduce_time(4 * params, 4, 1e9, 0.5e-3)
    for worker in ring["per_worker"]:
        assert worker["comm_s"] == pytest.approx(10 * per_iteration)
    assert ring["bytes_up"] == ring["bytes_down"] == 40 * int(ring_allreduce_bytes(4 * params, 4))


def test_ssp_keeps_clock_spread_within_the_bound(fast_config, tmp_path):
    cfg = fast_config("sync.scheme=ssp", "sync.ssp.staleness=2", "cluster.speeds=[1, 1, 3, 7]", "run.stop_at_target=false")
    train(cfg, tmp_path / "r")
    clocks = {w: 0 for w in range(4)}
    for event in read_jsonl(tmp_path / "r" / "metrics.jsonl"):
        if event["event"] == "iteration":
            clocks[event["worker"]] = event["clock"]
            assert max(clocks.values()) - min(clocks.values()) <= 2 + 1


def _wait_ratio(summary, worker=0):
    w = summary["per_worker"][worker]
    return w["wait_s"] / w["compute_s"]


def test_tiers_show_what_each_scheme_costs_the_fast_workers(fast_config):
    """BSP: fast workers mostly wait; ASP: nobody waits; SSP in between."""
    common = ("backend.mode=cost", "cluster.workers=8", "cluster.speeds=[1,1,2,2,4,4,8,8]", "run.max_time_s=100",
              "cluster.stragglers.probability=0.05", "cluster.stragglers.slowdown=4")
    results = {s: _run(fast_config(*common, f"sync.scheme={s}"))[1] for s in ("bsp", "ssp", "asp")}
    assert _wait_ratio(results["bsp"]) > 5
    assert all(w["wait_s"] == 0 for w in results["asp"]["per_worker"])
    assert 0 < _wait_ratio(results["ssp"]) < _wait_ratio(results["bsp"])
    fast_iters = {s: r["per_worker"][0]["iterations"] for s, r in results.items()}
    assert fast_iters["bsp"] < fast_iters["ssp"] < fast_iters["asp"]


def test_same_seed_same_results(fast_config, tmp_path):
    cfg = fast_config("sync.scheme=ssp", "cluster.speeds=[1, 2, 2, 5]", "cluster.stragglers.probability=0.1")
    a = train(cfg, tmp_path / "a")
    b = train(cfg, tmp_path / "b")
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == (tmp_path / "b" / "metrics.jsonl").read_text()


def test_different_seeds_differ(fast_config, tmp_path):
    a = train(fast_config("run.seed=1", "run.max_iterations=20"), tmp_path / "a")
    b = train(fast_config("run.seed=2", "run.max_iterations=20"), tmp_path / "b")
    assert a["final_accuracy"] != b["final_accuracy"] or a["per_worker"] != b["per_worker"]


def test_stops_at_target_with_time_to_target(fast_config, tmp_path):
    """The run stops at the third evaluation in a row at the target (patience 3) and reports the first."""
    summary = train(fast_config("run.max_time_s=30"), tmp_path / "r")
    assert summary["stop_reason"] == "target_reached"
    evals = [e for e in read_jsonl(tmp_path / "r" / "metrics.jsonl") if e["event"] == "eval"]
    assert [e["accuracy"] >= 0.9 for e in evals[-3:]] == [True] * 3
    assert summary["time_to_target_s"] == evals[-3]["t"] and summary["elapsed_s"] == evals[-1]["t"]
    assert summary["final_accuracy"] >= 0.9
    once = train(fast_config("run.max_time_s=30", "run.target_patience=1"), tmp_path / "once")
    assert once["time_to_target_s"] == once["elapsed_s"] <= summary["time_to_target_s"]


def test_time_budget_and_unreached_target(fast_config, tmp_path):
    summary = train(fast_config("run.target_accuracy=0.999", "run.max_time_s=0.5"), tmp_path / "r")
    assert summary["stop_reason"] == "time_budget"
    assert summary["time_to_target_s"] is None
    assert summary["elapsed_s"] == pytest.approx(0.5)


def test_iteration_budget(fast_config, tmp_path):
    summary = train(fast_config("run.max_iterations=13", "sync.scheme=asp"), tmp_path / "r")
    assert summary["iterations"] == 13 and summary["stop_reason"] == "iteration_budget"


def test_cost_mode_runs_the_schedule_without_gradients(fast_config, tmp_path):
    summary = train(fast_config("backend.mode=cost", "run.max_iterations=100"), tmp_path / "r")
    assert summary["final_accuracy"] is None and summary["iterations"] == 100
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert not [e for e in events if e["event"] == "eval"]
    assert summary["bytes_up"] == 100 * 4 * summary["params"]


def test_bytes_are_real_message_sizes(fast_config, tmp_path):
    summary = train(fast_config("run.max_iterations=8", "run.stop_at_target=false"), tmp_path / "r")
    # mlp 64 -> 32 -> 10: (64*32 + 32) + (32*10 + 10) float32 values per message
    assert summary["params"] == 64 * 32 + 32 + 32 * 10 + 10
    assert summary["bytes_up"] == summary["bytes_down"] == 8 * 4 * summary["params"]


def test_transfer_time_follows_the_shared_server_link(fast_config, tmp_path):
    """4 workers push 1 MB at once through a 0.1 Gbps server: each push takes 4 * 1e6*8/1e8 s."""
    cfg = fast_config("backend.mode=cost", "model.hidden=[4000]", "cluster.server_gbps=0.1",
                      "cluster.latency_ms=0", "run.max_iterations=4")
    summary = train(cfg, tmp_path / "r")
    size = 4 * summary["params"]
    one_way = 4 * size * 8 / 0.1e9  # pulls share egress, pushes share ingress
    assert summary["per_worker"][0]["comm_s"] == pytest.approx(2 * one_way, rel=1e-6)


def test_measured_compute_time_when_zero(fast_config, tmp_path):
    summary = train(fast_config("cluster.compute_s=0", "run.max_iterations=4"), tmp_path / "r")
    assert summary["compute_s"] > 0 and summary["compute_s_measured"] == summary["compute_s"]


def test_outputs_follow_the_contract(fast_config, tmp_path):
    train(fast_config(), tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for key in ("scheme", "backend", "final_accuracy", "best_accuracy", "target_accuracy", "time_to_target_s",
                "elapsed_s", "iterations", "bytes_up", "bytes_down", "groups", "per_worker"):
        assert key in summary
    assert summary["groups"] == [[0, 1, 2, 3]]
    assert set(summary["per_worker"][0]) >= {"id", "group", "iterations", "compute_s", "wait_s", "comm_s"}
    kinds = {e["event"] for e in read_jsonl(tmp_path / "r" / "metrics.jsonl")}
    assert {"start", "groups", "eval", "iteration", "end"} <= kinds


JOIN_AND_LEAVE = "cluster.membership=[{at_s=1, add=2, speeds=[1, 4]}, {at_s=3, remove=[1]}]"


@pytest.mark.parametrize("scheme", ["bsp", "asp"])
def test_joiners_train_from_their_join_and_a_leaver_stops_at_its_leave(fast_config, tmp_path, scheme):
    """BSP on 4 equal workers (10 ms): one joiner at 1x, one at 4x at t = 1 s, worker 1 leaves at t = 3 s."""
    cfg = fast_config(f"sync.scheme={scheme}", "run.max_time_s=6", "run.stop_at_target=false", JOIN_AND_LEAVE)
    summary = train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    joined = [e for e in events if e["event"] == "worker_joined"]
    assert [(e["worker"], e["t"], e["speed"]) for e in joined] == [(4, 1.0, 1.0), (5, 1.0, 4.0)]
    assert [(e["worker"], e["t"]) for e in events if e["event"] == "worker_left"] == [(1, 3.0)]
    first = {w: min(e["t"] for e in events if e["event"] == "iteration" and e["worker"] == w) for w in (4, 5)}
    assert all(1.0 < t < 1.1 for t in first.values())  # they start at once, at the group's slowest clock
    assert max(e["t"] for e in events if e["event"] == "iteration" and e["worker"] == 1) <= 3.0
    per = {p["id"]: p for p in summary["per_worker"]}
    assert len(per) == 6 and all(per[w]["iterations"] > 0 for w in (4, 5))
    assert summary["groups"] == [[0, 2, 3, 4, 5]]
    if scheme == "bsp":  # the 4x joiner sets the pace from t = 1 s: 100 rounds at 10 ms, then 125 at 40 ms
        assert per[0]["iterations"] == pytest.approx(100 + 125, abs=3)
        assert per[1]["iterations"] == pytest.approx(100 + 50, abs=3)
    else:  # nobody waits: the 4x joiner does a quarter of a fast worker's iterations
        assert per[5]["iterations"] == pytest.approx(per[4]["iterations"] / 4, rel=0.1)


def test_gssp_places_joiners_in_groups_by_their_profiled_speed(fast_config, tmp_path):
    cfg = fast_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.max_time_s=6",
                      "run.stop_at_target=false", JOIN_AND_LEAVE)
    summary = train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    joined = {e["worker"]: e["group"] for e in events if e["event"] == "worker_joined"}
    assert joined == {4: 0, 5: 0}  # unknown speed: the fastest group first
    moves = [m for e in events if e["event"] == "groups" and e["reason"] == "regroup" for m in e["moves"]]
    assert [5, 0, 1] in moves  # once profiled, the slow joiner moves to the slow group
    assert summary["groups"] == [[0, 4], [2, 3, 5]]
    assert all(p["iterations"] > 0 for p in summary["per_worker"])


def test_churn_at_a_thousand_workers_in_cost_mode(tmp_path):
    """The simulator models the same schedule at scale: 1,000 lognormal workers, 100 join, 100 leave."""
    from shoal.config import load_config

    leave = ",".join(str(w) for w in range(0, 1000, 10))
    cfg = load_config(None, ["backend.mode=cost", "cluster.workers=1000", "cluster.profile=lognormal",
                             "sync.scheme=gssp", "run.max_time_s=6", "backend.log_iterations=false",
                             f"cluster.membership=[{{at_s=2, add=100}}, {{at_s=4, remove=[{leave}]}}]"])
    summary = train(cfg, tmp_path / "r")
    members = sorted(w for g in summary["groups"] for w in g)
    assert members == sorted(set(range(1100)) - set(range(0, 1000, 10)))
    assert all(p["iterations"] > 0 for p in summary["per_worker"])


def test_an_internal_error_mid_run_still_writes_the_summary_and_the_end_event(fast_config, tmp_path, monkeypatch):
    """A bug after the start: summary.json (stop_reason internal_error) and metrics.jsonl are written, then it raises."""
    from shoal.engine.metrics import InternalError

    calls = {"n": 0}
    account = SimBackend._account

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 50:
            raise ZeroDivisionError("a bug")
        return account(self, *args, **kwargs)

    monkeypatch.setattr(SimBackend, "_account", flaky)
    with pytest.raises(InternalError, match="ZeroDivisionError: a bug"):
        train(fast_config("run.stop_at_target=false"), tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["stop_reason"] == "internal_error" and summary["error"].startswith("ZeroDivisionError: a bug")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    # the failed process is reported once simpy reaches its event: workers due at the same instant still ran
    assert 49 <= summary["iterations"] == sum(e["event"] == "iteration" for e in events) <= 52
    error = next(e for e in events if e["event"] == "internal_error")
    assert "Traceback" in error["traceback"] and "flaky" in error["traceback"]
    assert events[-1]["event"] == "end" and events[-1]["reason"] == "internal_error"


@pytest.mark.parametrize("membership, n", [("[{at_s=0.5, add=1}]", 3), ("[{at_s=0.5, add=1}, {at_s=1, remove=[0]}]", 2)])
def test_a_gradients_weight_follows_the_workers_taking_part(fast_config, membership, n):
    """1/N with N = configured + joined - left, so the update per sample stays the same as membership changes."""
    cfg = fast_config("cluster.workers=2", "sync.scheme=asp", "run.max_time_s=1.5", "run.stop_at_target=false",
                      f"cluster.membership={membership}")
    backend = SimBackend(build_setup(cfg), RunRecorder())
    backend.run()
    assert backend.servers[0].weight == pytest.approx(1 / n)


def test_gssp_on_allreduce_groups_pays_each_groups_own_ring_and_still_exchanges(fast_config, tmp_path):
    """GSSP with all-reduce groups: one ring of all four while profiling, then a ring per group of two; the
    groups are synchronous inside (in lockstep) and exchange their deltas."""
    from shoal.engine.cost import ring_allreduce_time

    cfg = fast_config("sync.scheme=gssp", "sync.intra_group=allreduce", "cluster.speeds=[1, 1, 4, 4]",
                      "cluster.link_gbps=1", "cluster.latency_ms=0.5", "run.stop_at_target=false")
    summary = train(cfg, tmp_path / "r")
    assert sorted(summary["groups"]) == [[0, 1], [2, 3]] and summary["exchanges"] > 0
    nbytes = 4 * summary["params"]
    rings = {n: ring_allreduce_time(nbytes, n, 1e9, 0.5e-3) for n in (2, 4)}
    its = [e for e in read_jsonl(tmp_path / "r" / "metrics.jsonl") if e["event"] == "iteration"]
    done = {w["id"]: w["iterations"] for w in summary["per_worker"]}
    assert abs(done[0] - done[1]) <= 1 and abs(done[2] - done[3]) <= 1 < done[0] - done[2]  # lockstep inside
    assert all(any(e["comm_s"] == pytest.approx(r) for r in rings.values()) for e in its)
    assert its[0]["comm_s"] == pytest.approx(rings[4]) and its[-1]["comm_s"] == pytest.approx(rings[2])


@pytest.mark.parametrize("scheme", ["bsp", "asp"])
def test_evaluation_every_k_iterations_lands_on_the_multiples(fast_config, tmp_path, scheme):
    cfg = fast_config("run.eval_every_iterations=10", "run.stop_at_target=false", f"sync.scheme={scheme}",
                      "cluster.speeds=[1, 1, 2, 3]")
    summary = train(cfg, tmp_path / "run")
    evals = [e for e in read_jsonl(tmp_path / "run" / "metrics.jsonl") if e["event"] == "eval"]
    counts = [e["iterations"] for e in evals]
    assert counts[0] == 0 and counts[1:-1] == list(range(10, 10 * (len(counts) - 1), 10))
    assert counts[-1] == summary["iterations"]  # the final evaluation at the stop
