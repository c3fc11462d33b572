"""The ray backend's parts, driven without a Ray instance: the group server's gating and SIM, the data plane's
sum at the server, all-reduce ranks agreeing on balanced sizes, checkpoints on disk, the actor pool's book-keeping,
and what ray refuses before it starts anything. They run with the rest of the suite, in parallel; an autouse
fixture fails any test here that starts Ray.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from shoal.backends import checkpoint  # noqa: E402
from shoal.backends.ray.session import ActorPool  # noqa: E402
from shoal.backends.ray.server import GroupServer  # noqa: E402
from shoal.backends.ray.wire import Link, actor_device, actor_threads  # noqa: E402
from shoal.backends.ray.switch import SERVER, ServerSide, worker_name  # noqa: E402
from shoal.config import ConfigError, load_config  # noqa: E402
from shoal.network import dataplane  # noqa: E402
from shoal.runner import train  # noqa: E402
from shoal.sync import make_policy  # noqa: E402

from conftest import FAST, ROOT  # noqa: E402
from ray_support import SERVER_PATH, ray_config  # noqa: E402


@pytest.fixture(autouse=True)
def no_ray_instance(monkeypatch):
    """These tests run beside others (pytest -n): one that started Ray would time its processes against them."""
    def refuse(*args, **kwargs):
        raise AssertionError("this test started Ray: it belongs in one of conftest.RAY_FILES")

    monkeypatch.setattr(ray, "init", refuse)


def test_all_reduce_ranks_agree_on_balanced_sizes_through_the_min_of_their_observations():
    """Each rank puts its own (compute seconds, samples) in its slots and infinity elsewhere; the group's MIN all-reduce
    (here: an elementwise min) hands every rank every observation, and the same balancer fed the same numbers gives
    every rank the same sizes: the slow rank (4x the seconds per sample) gets a quarter of a fast one's batch."""
    import threading

    from shoal.backends.group_exchange import StepScale
    from shoal.backends.ray.collective import CollectiveWorker, GroupPlan
    from shoal.sync.balance import WorkBalancer

    members = (0, 1, 2)
    ranks = []
    for rank, worker in enumerate(members):
        r = CollectiveWorker.__new__(CollectiveWorker)  # the agreement logic alone, no process group
        r.w, r._records, r._t0 = worker, [], 0.0
        r.lock = threading.Lock()
        r.balancer = WorkBalancer(3, 32, warmup=2)
        r.plan = GroupPlan(index=0, rank=rank, members=members, groups=1, scale=StepScale(3, 3, 0.9), lr=0.1,
                           epoch=0)
        ranks.append(r)
    for _ in range(3):  # three agreements, each after an iteration of 32 samples
        for r, seconds in zip(ranks, (0.032, 0.032, 0.128)):
            r._observed = (seconds, 32)
        vectors = [r._observation() for r in ranks]
        assert vectors[2][:4] == [math.inf] * 4 and vectors[2][4:] == [0.128, 32.0]
        agreed = [min(column) for column in zip(*vectors)]
        for r in ranks:
            r._rebalance(agreed)
    sizes = [[r.balancer.size(w) for w in members] for r in ranks]
    # 96 samples in proportion 4 : 4 : 1 (42.7, 42.7, 10.7: the two left over go by remainder, then worker order)
    assert sizes[0] == sizes[1] == sizes[2] == [43, 42, 11], sizes
    assert [e["sizes"] for e in ranks[0]._records] == [{"0": 43, "1": 42, "2": 11}] and not ranks[1]._records


def test_a_deadline_round_in_an_all_reduce_group_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="a deadline round on ray cuts batches on the server path"):
        train(ray_config("sync.balance=deadline", "sync.intra_group=allreduce"), Path("/nonexistent/never"))


def test_resume_refuses_a_folder_without_checkpoint_and_a_checkpoint_of_the_other_backend(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(ray_config(SERVER_PATH), tmp_path / "r", resume=tmp_path)
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(load_config(None, FAST), tmp_path / "r", resume=tmp_path)
    simulated = FAST + ["backend.sim_checkpoint_every_s=0.5", "run.max_time_s=1", "run.stop_at_target=false"]
    train(load_config(None, simulated), tmp_path / "sim")
    with pytest.raises(ConfigError, match="written by the sim backend; resume it with --backend sim"):
        train(ray_config("run.max_time_s=2", SERVER_PATH), tmp_path / "sim", resume=tmp_path / "sim")


def test_ray_rejects_what_it_does_not_run(tmp_path):
    with pytest.raises(ConfigError, match="cost mode"):
        train(ray_config("backend.mode=cost"), tmp_path / "r")
    with pytest.raises(ConfigError, match="backend.max_restarts"):  # INA runs on ray (below), but without restarts
        train(ray_config("network.aggregation=\"ina\"", "backend.max_restarts=1"), tmp_path / "r")
    with pytest.raises(ConfigError, match="backend.max_restarts"):
        train(ray_config("sync.intra_group=allreduce", "backend.max_restarts=1"), tmp_path / "r")
    if not torch.cuda.is_available():  # a GPU asked for where torch has none: an error, not a CPU run
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            train(ray_config("backend.gpus_per_worker=1"), tmp_path / "r")
        with pytest.raises(RuntimeError, match="no CUDA device"):
            actor_device(0.5)
    assert actor_threads(0.25) == 1 and actor_threads(4) == 4
    assert not (tmp_path / "r").exists()


def test_the_server_applies_the_data_planes_sum_exactly_as_bsp_with_weight_decay():
    """Same gradients: the replica after an INA round equals plain BSP's, weight decay and momentum included."""
    opt = load_config(None, ["optimizer.lr=0.1", "optimizer.momentum=0.9", "optimizer.weight_decay=0.01"]).optimizer
    n, size = 3, 1000
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=size).astype(np.float32) for _ in range(n)]
    p0 = rng.normal(size=size).astype(np.float32)

    class Acks:  # stands in for a worker actor's handle
        def __init__(self) -> None:
            self.got: list[dataplane.Ack] = []
            self.on_acks = self

        def remote(self, acks, run_id):
            self.got.extend(acks)

    async def one(ina: bool) -> tuple[torch.Tensor, list[Acks]]:
        server = GroupServer(0, opt, 1.0 / n, 4, Link(0.0, 1e9, False))
        server.install(make_policy("bsp", range(n)), p0, np.zeros(0, np.float32), False, 0)
        handles = [Acks() for _ in range(n)]
        if ina:
            server.ina = ServerSide({worker_name(w): h for w, h in enumerate(handles)}, size, 128)
            plan = {worker_name(w): "s" if w < 2 else SERVER for w in range(n)}
            nodes = dataplane.build_nodes(plan, SERVER, size, fragment_size=128)
            for w in range(n):
                frags = nodes.workers[worker_name(w)].send(0, grads[w], 0.0)
                if w < 2:
                    frags = [m for f in frags for m in nodes.switches["s"].receive(f)]
                await server.receive(frags)
        for w in range(n):
            await server.push(w, 0, None if ina else grads[w], np.zeros(0, np.float32))
        return torch.from_numpy(np.array(server.state()[0])), handles

    plain, _ = asyncio.run(one(False))
    summed, handles = asyncio.run(one(True))
    assert not torch.equal(plain, torch.from_numpy(p0))
    assert torch.allclose(summed, plain, rtol=0, atol=1e-6)
    assert all(len(h.got) == -(-size // 128) for h in handles)  # every fragment of every worker acknowledged


def _server(scheme: str, workers: int, lr: float = 0.1) -> tuple[GroupServer, torch.Tensor]:
    opt = load_config(None, [f"optimizer.lr={lr}", "optimizer.momentum=0"]).optimizer
    server = GroupServer(0, opt, 1.0 / workers, 4, Link(0.0, 1e9, False))
    p0 = torch.arange(4, dtype=torch.float32)
    server.install(make_policy(scheme, range(workers)), p0.numpy(), torch.zeros(0).numpy(), False, 0)
    return server, p0


def test_bsp_barrier_waits_for_every_worker_then_applies_the_mean():
    async def scenario():
        server, p0 = _server("bsp", 2)
        g0, g1 = torch.ones(4), torch.full((4,), 3.0)
        await server.push(0, 0, g0.numpy(), torch.zeros(0).numpy())
        waiting = asyncio.ensure_future(server.pull(0))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # worker 0 is at the barrier
        await server.push(1, 0, g1.numpy(), torch.zeros(0).numpy())
        reply = await asyncio.wait_for(waiting, 1.0)
        assert reply["status"] == "ok"
        assert torch.allclose(torch.from_numpy(reply["params"]), p0 - 0.1 * (g0 + g1) / 2)

    asyncio.run(scenario())


def test_removing_a_worker_releases_the_barrier_it_held():
    async def scenario():
        server, p0 = _server("bsp", 3)
        for w in (0, 1):
            await server.push(w, 0, torch.ones(4).numpy(), torch.zeros(0).numpy())
        waiting = asyncio.ensure_future(server.pull(0))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        server.remove_worker(2, epoch=1)  # worker 2 died before pushing
        reply = await asyncio.wait_for(waiting, 1.0)
        assert torch.allclose(torch.from_numpy(reply["params"]), p0 - 0.1 * 2 / 3)
        assert (await server.pull(2))["status"] == "moved"

    asyncio.run(scenario())


def test_ssp_gate_holds_the_fast_worker_within_the_bound():
    async def scenario():
        opt = load_config(None, []).optimizer
        server = GroupServer(0, opt, 0.5, 4, Link(0.0, 1e9, False))
        server.install(make_policy("ssp", range(2), 1), torch.zeros(4).numpy(), torch.zeros(0).numpy(), False, 0)
        for _ in range(2):
            await server.push(0, None, torch.zeros(4).numpy(), torch.zeros(0).numpy())
        waiting = asyncio.ensure_future(server.pull(0))  # clock 2 > slowest 0 + s 1
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await server.push(1, None, torch.zeros(4).numpy(), torch.zeros(0).numpy())
        assert (await asyncio.wait_for(waiting, 1.0))["status"] == "ok"
        server.stop()
        assert (await server.pull(1))["status"] == "stop"

    asyncio.run(scenario())


def test_sim_group_server_sends_only_fresh_tensors_and_averages_changes():
    """SIM on a group server (no Ray): the pull after a skipped clock carries nothing, the re-sync averages."""
    from shoal.backends.ray.wire import pack
    from shoal.compress.similarity import SimilaritySchedule

    async def scenario():
        server, p0 = _server("bsp", 2)
        slices = [(0, 2), (2, 4)]
        schedule = SimilaritySchedule(["a", "b"], [2, 2], threshold=-1, max_period=2, warmup_iterations=0,
                                      min_numel=1)
        server.set_similarity(schedule, slices)
        sl = [slice(a, b) for a, b in slices]
        first = [await server.pull(w) for w in range(2)]  # clock 0: everything, fresh (new to this replica)
        assert first[0]["fresh"] == (True, True) and first[0]["params"].size == 4 and first[0]["nbytes"] == 16
        for w in range(2):
            sim = {"delta": np.zeros(0, np.float32), "grad_mask": (True, True), "delta_mask": (False, False), "clock": 0}
            await server.push(w, 0, torch.full((4,), w + 1.0).numpy(), torch.zeros(0).numpy(), sim)
        assert [e["clock"] for e in server.drain()["events"] if e["event"] == "sim"] == [0]
        second = await server.pull(0)  # clock 1: both tensors skipped (tau 2), still takes clock 0's values
        assert second["plan"] == (False, False) and second["fresh"] == (True, True)
        p1 = p0 - 0.1 * 1.5
        assert torch.allclose(torch.from_numpy(second["params"]), p1)
        await server.pull(1)
        for w in range(2):
            sim = {"delta": np.zeros(0, np.float32), "grad_mask": (False, False), "delta_mask": (False, False),
                   "clock": 1}
            await server.push(w, 1, np.zeros(0, np.float32), torch.zeros(0).numpy(), sim)
        assert torch.allclose(server.replica.params, p1)  # nothing aggregated at a skipped clock
        third = await server.pull(0)  # clock 2: re-synchronise; nothing came at clock 1, so nothing travels
        assert third["plan"] == (True, True) and third["fresh"] == (False, False)
        assert third["params"].size == 0 and third["nbytes"] == 0
        await server.pull(1)
        for w in range(2):
            change = torch.full((4,), -0.2 * (w + 1))
            sim = {"delta": pack(change, (True, True), sl), "grad_mask": (False, False), "delta_mask": (True, True),
                   "clock": 2}
            await server.push(w, 2, np.zeros(0, np.float32), torch.zeros(0).numpy(), sim)
        assert torch.allclose(server.replica.params, p1 - 0.3)  # the mean of the two local changes

    asyncio.run(scenario())


def test_the_actor_pool_counts_and_ends_only_the_kept_actors_it_is_asked_to(monkeypatch):
    """Kept actors by key (class, options): the CPUs they hold, and clearing one kind leaves the others kept."""
    from shoal.backends.ray.session import pool_key

    monkeypatch.setattr(ActorPool, "_idle", {})
    monkeypatch.setattr(ActorPool, "_same_session", classmethod(lambda cls: True))  # no Ray needed here
    monkeypatch.setattr(ray, "kill", lambda handle, no_restart=True: killed.append(handle))
    killed: list[str] = []
    rank, worker = pool_key("CollectiveWorker", {"num_cpus": 0.2}), pool_key("Worker", {"num_cpus": 0.5})
    for key, names in ((rank, ["r0", "r1"]), (worker, ["w0"]), (pool_key("Evaluator", {"num_cpus": 0}), ["e"])):
        for name in names:
            ActorPool.give(key, name)
    assert ActorPool.cpus_held(lambda key: True) == pytest.approx(0.9)
    assert ActorPool.cpus_held(lambda key: key[0] == "CollectiveWorker") == pytest.approx(0.4)
    ActorPool.clear(lambda key: key[0] == "CollectiveWorker", wait_s=0)
    assert sorted(killed) == ["r0", "r1"] and ActorPool.cpus_held(lambda key: True) == pytest.approx(0.5)
    ActorPool.clear(wait_s=0)
    assert sorted(killed) == ["e", "r0", "r1", "w0"] and ActorPool._idle == {}


def test_checkpoint_round_trip_keeps_optimizer_state(tmp_path):
    from shoal.engine.replica import Replica

    for name in ("sgd", "adam", "adamw"):
        opt = load_config(None, [f"optimizer.name=\"{name}\"", "optimizer.weight_decay=0.01"]).optimizer
        replica = Replica(torch.randn(6), torch.randn(2), opt, track_own=True)
        for _ in range(3):
            replica.apply([torch.randn(6)], 0.5)
        checkpoint.save_replica(tmp_path, name, replica, {"updates": 3})
        loaded, manifest = checkpoint.load_replica(tmp_path, name, opt)
        grad = torch.randn(6)
        replica.apply([grad], 0.5)
        loaded.apply([grad], 0.5)
        assert torch.equal(loaded.params, replica.params) and manifest["updates"] == 3
    (tmp_path / "sgd.safetensors").write_bytes(b"tampered")
    with pytest.raises(ConfigError, match="checksum"):
        checkpoint.load_replica(tmp_path, "sgd", opt)


def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one_in_force(tmp_path):
    """A checkpoint counts only once latest.json names it: a half-written newer one is never read."""
    from shoal.engine.replica import Replica

    opt = load_config(None, []).optimizer
    root = tmp_path / "checkpoint"
    replica = Replica(torch.randn(6), torch.randn(2), opt)
    first = checkpoint.new_folder(root, 1)
    checkpoint.save_replica(first, "group-0", replica, {})
    checkpoint.commit(root, first, {"elapsed_s": 5.0, "iterations": 10})
    second = checkpoint.new_folder(root, 2)  # the crash: tensors half written, no manifest, no run.json, no commit
    (second / "group-0.safetensors").write_bytes(b"\0" * 17)
    (root / "latest.json.tmp").write_text('{"path": "ckpt-0000')  # and a pointer update cut short
    folder, state = checkpoint.latest(root)
    assert folder == first and state["iterations"] == 10 and checkpoint.saved_at(folder) == 5.0
    loaded, _ = checkpoint.load_replica(folder, "group-0", opt)
    assert torch.equal(loaded.params, replica.params)


def test_an_address_where_nothing_listens_fails_in_seconds_with_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "r"
    cmd = [str(Path(sys.executable).parent / "shoal"), "train", "--backend", "ray", "--out", str(out), "-q",
           "--set", "backend.address=127.0.0.1:9", "--set", "data.name=digits", "--set", "model.name=mlp"]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and time.monotonic() - start < 30
    [line] = proc.stderr.strip().splitlines()
    assert "backend.address '127.0.0.1:9': nothing answers at 127.0.0.1:9" in line
    assert not out.exists()


def test_a_joined_cluster_gets_time_to_grow_then_a_too_small_one_is_refused():
    from shoal.backends.ray.start import wait_for_cpus

    now = [0.0]
    clock, sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
    grows = iter([2.0, 2.0, 6.0, 9.0])
    assert wait_for_cpus(8, lambda: next(grows), timeout_s=20, clock=clock, sleep=sleep) == 9.0 and now[0] == 3.0
    now[0] = 0.0
    assert wait_for_cpus(8, lambda: 4.0, timeout_s=20, clock=clock, sleep=sleep) == 4.0 and now[0] == 20.0
