"""The ray backend's all-reduce path (BSP and GSSP's groups in torch.distributed, as DDP runs them): loopback-only
lockstep, the same model as the simulated server step for step (with every optimizer option), a failed rank, and
groups that split and exchange.

Every test here runs on the one embedded Ray of conftest's ray_session, whose idle actors are kept between runs
(ActorPool).
"""

from __future__ import annotations

import io
import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from shoal.backends.ray import RayBackend  # noqa: E402
from shoal.backends.ray.session import ActorPool  # noqa: E402
from shoal.backends.sim import SimBackend  # noqa: E402
from shoal.config import load_config  # noqa: E402
from shoal.engine.metrics import RunRecorder  # noqa: E402
from shoal.engine.setup import build_setup  # noqa: E402

from conftest import FAST  # noqa: E402
from ray_support import bound_sockets, descendants, events_of, is_loopback, ray_config, run_backend, stop_once  # noqa: E402


def test_bsp_on_allreduce_trains_in_lockstep_on_loopback_only(ray_session):
    seen: list[tuple[int, str, str]] = []

    def look(backend, info):
        if not seen and info["iterations"] > 0:
            seen.extend(bound_sockets(descendants(os.getpid()) | {os.getpid()}))

    backend, summary = run_backend(ray_config("sync.intra_group=allreduce"), look)
    assert summary["stop_reason"] == "target_reached" and summary["groups"] == [[0, 1, 2, 3]]
    assert seen and all(is_loopback(addr) for _, _, addr in seen), [s for s in seen if not is_loopback(s[2])]
    counts = [w["iterations"] for w in summary["per_worker"]]
    assert len(set(counts)) == 1, counts  # every rank leaves after the same agreed iteration
    assert backend.servers == [] and summary["bytes_exchange"] == 0
    ring = 2 * 3 / 4 * 4 * backend.setup.engine.num_params  # what each rank sends per ring all-reduce
    assert summary["bytes_up"] == pytest.approx(ring * summary["iterations"], rel=1e-6)


def test_bsp_on_allreduce_computes_exactly_what_the_simulated_bsp_does(ray_session):
    """Same seed, same batches, 20 rounds: the all-reduce replicas end where the sim's BSP server ends, on ranks
    kept from a GSSP run with other settings (ActorPool: the same processes, re-initialised)."""
    budget = ["run.max_iterations=80", "run.target_accuracy=1.0", "run.max_time_s=60", "optimizer.momentum=0.9",
              "optimizer.weight_decay=0.001"]
    before, gssp = run_backend(ray_config("sync.scheme=gssp", "sync.intra_group=allreduce", "optimizer.lr=0.3",
                                          "cluster.speeds=[1, 1, 4, 4]", "run.seed=5", "run.stop_at_target=false",
                                          "run.max_time_s=3"))
    assert gssp["exchanges"] > 0  # the ranks' sender threads ran
    backend, ray_summary = run_backend(ray_config("sync.intra_group=allreduce", *budget))
    assert sorted(backend.pids.values()) == sorted(before.pids.values())  # kept, not started again
    sim = SimBackend(build_setup(load_config(None, FAST + budget)), RunRecorder())
    sim_summary = sim.run()
    assert ray_summary["stop_reason"] == "iteration_budget" and ray_summary["iterations"] == 80
    assert ray_summary["final_accuracy"] == sim_summary["final_accuracy"]
    assert backend.recorder.evals[-1]["loss"] == pytest.approx(sim.recorder.evals[-1]["loss"], rel=1e-4)


def test_adamw_clipping_and_schedules_on_allreduce_step_as_the_simulated_bsp_server_does(ray_session):
    """AdamW's decoupled decay, a clipped mean gradient, a warm-up's stairs and a cosine's: the ranks move the model
    as the sim's BSP server does."""
    budget = ["run.max_iterations=40", "run.target_accuracy=1.0", "run.max_time_s=60", 'optimizer.name="adamw"',
              "optimizer.lr=0.01", "optimizer.weight_decay=0.05", "optimizer.clip_norm=0.3", "optimizer.warmup_epochs=2",
              "optimizer.cosine_epochs=1"]
    backend, ray_summary = run_backend(ray_config("sync.intra_group=allreduce", *budget))
    sim = SimBackend(build_setup(load_config(None, FAST + budget)), RunRecorder())
    sim.run()
    assert ray_summary["iterations"] == 40
    assert backend.recorder.evals[-1]["loss"] == pytest.approx(sim.recorder.evals[-1]["loss"], rel=1e-4)


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
def test_a_failed_rank_ends_an_allreduce_run_cleanly(ray_session):
    """The other ranks wait in the collective for the failed one: they are ended, not waited for (that took 10 s)."""
    failed_at: list[float] = []

    def fail(backend, info):
        if info["iterations"] >= 20 and not failed_at:
            backend.workers[2].fail_next.remote()
            failed_at.append(time.monotonic())

    def evaluators() -> int:
        return sum(len(handles) for key, handles in ActorPool._idle.items() if key[0] == "Evaluator")

    kept_before = evaluators()
    _, summary = run_backend(ray_config("sync.intra_group=allreduce", "run.target_accuracy=0.99"), fail)
    assert summary["stop_reason"] == "worker_failed" and time.monotonic() - failed_at[0] < 6
    assert [f["worker"] for f in summary["failures"]] == [2] and summary["final_accuracy"] is not None
    assert ActorPool.cpus_held(lambda key: key[0] == "CollectiveWorker") == 0  # a broken group is not kept ...
    assert evaluators() == max(kept_before, 1)  # ... its evaluator is, for the next run


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
def test_gssp_on_allreduce_groups_splits_exchanges_and_keeps_each_groups_replicas_equal(ray_session):
    """One all-reduce group while profiling, then a DDP group per speed tier: every member of a group ends with
    exactly the same replica (the same peer deltas and settings after the same iteration), the groups differ
    (asynchronous exchange), and the split paused the cluster once, measured."""
    cfg = ray_config("sync.scheme=gssp", "sync.intra_group=allreduce", "cluster.speeds=[1, 1, 4, 4]",
                     "cluster.emulate=true", "run.stop_at_target=false", "run.max_time_s=8")

    def split_and_ran_on(backend, info, events):  # two seconds of training in the split groups
        pauses = [e["t"] for e in events if e["event"] == "regroup_pause"]
        return bool(pauses) and info["t"] > pauses[0] + 2

    stream = io.StringIO()
    tick = stop_once(split_and_ran_on, stream)
    backend = RayBackend(build_setup(cfg), RunRecorder(stream=stream), lambda info: tick(backend, info))
    states: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    evaluate = backend._final_evaluation

    def capture() -> None:  # every rank has stopped after its group's agreed iteration
        states.update(zip(range(4), ray.get([backend.workers[w].state.remote() for w in range(4)])))
        evaluate()

    backend._final_evaluation = capture
    summary = backend.run()
    assert summary["stop_reason"] == "interrupted" and sorted(summary["groups"]) == [[0, 1], [2, 3]]
    assert summary["exchanges"] > 0 and summary["bytes_exchange"] > 0 and backend.servers == []
    events = events_of(stream)
    assert [e["reason"] for e in events if e["event"] == "groups"][:2] == ["start", "profiled"]
    assert any(e["event"] == "regroup_pause" and e["form_s"] > 0 for e in events)
    for a, b in ((0, 1), (2, 3)):
        assert np.array_equal(states[a][0], states[b][0]) and np.array_equal(states[a][1], states[b][1])
    assert not np.array_equal(states[0][0], states[2][0])
    assert summary["final_accuracy"] > 0.5
