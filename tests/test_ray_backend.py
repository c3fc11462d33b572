"""The ray backend: schemes and compressors on real processes, loopback-only local mode,
worker failures, checkpoint/resume, and the group server's gating (without Ray).

One local Ray session serves the whole module, and idle actors are kept
between runs (ActorPool), so most runs here cost a second or two instead of
starting processes and importing torch again.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from shoal.backends import checkpoint  # noqa: E402
from shoal.backends.ray import DRAIN_S, RayBackend  # noqa: E402
from shoal.backends.ray.recovery import position_digest  # noqa: E402
from shoal.backends.ray.session import ActorPool, start_local_ray  # noqa: E402
from shoal.backends.ray.server import GroupServer  # noqa: E402
from shoal.backends.ray.wire import Link, actor_device, actor_threads  # noqa: E402
from shoal.backends.ray.switch import SERVER, ServerSide, worker_name  # noqa: E402
from shoal.backends.sim import SimBackend  # noqa: E402
from shoal.config import ConfigError, load_config  # noqa: E402
from shoal.engine.metrics import RunRecorder  # noqa: E402
from shoal.engine.setup import build_setup  # noqa: E402
from shoal.network import dataplane  # noqa: E402
from shoal.runner import train  # noqa: E402
from shoal.sync import make_policy  # noqa: E402

from conftest import FAST, ROOT, default_sigint, read_jsonl  # noqa: E402

# 0.2 CPU each: the kept actors of both data paths (4 all-reduce ranks; 4 workers and a server) fit in 2 CPUs together
RAY = ["backend.name=ray", "backend.cpus_per_worker=0.2", "backend.cpus_per_server=0.2",
       "backend.checkpoint_every_s=0", "run.max_time_s=20"]
SERVER_PATH = "sync.intra_group=server"  # the server path, whose fault tolerance and checkpoints a test checks
CONTRACT = ("scheme", "backend", "final_accuracy", "best_accuracy", "target_accuracy", "time_to_target_s",
            "elapsed_s", "iterations", "bytes_up", "bytes_down", "groups", "per_worker")


@pytest.fixture(scope="module")
def ray_session():
    """One embedded Ray for the module (as shoal starts it), with actor reuse between runs."""
    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(2)
    ActorPool.enabled = True
    yield
    ActorPool.clear()
    ActorPool.enabled = False
    ray.shutdown()


def free_cpus_settle(wait_s: float = 10.0) -> float:
    """Ray's free CPUs once they stop changing (an ended actor's CPUs come back a moment later)."""
    deadline, last = time.monotonic() + wait_s, -1.0
    while time.monotonic() < deadline:
        now = ray.available_resources().get("CPU", 0.0)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def ray_config(*overrides: str):
    return load_config(None, FAST + RAY + list(overrides))


def run_backend(cfg, progress=None, stream=None):
    """A RayBackend (for tests that reach into it) and its summary."""
    holder: dict = {}

    def tick(info):
        if progress is not None:
            progress(holder["backend"], info)

    backend = RayBackend(build_setup(cfg), RunRecorder(stream=stream), tick)
    holder["backend"] = backend
    return backend, backend.run()


# -- sockets of this process tree (Linux /proc) ------------------------------------------


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        for child in children[todo.pop()]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    flat = b"".join(words)
    if flat[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in flat[12:])
    return ":".join(flat[i : i + 2].hex() for i in range(0, 16, 2))


def bound_sockets(pids: set[int]) -> list[tuple[int, str, str]]:
    """(pid, protocol, local address) of every listening TCP and bound UDP socket the processes hold."""
    table: dict[str, tuple[str, str]] = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/net/{proto}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if proto.startswith("tcp") and state != "0A":  # 0A = LISTEN
                continue
            table[inode] = (proto, _address(local.split(":")[0]))
    found = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in table:
                found.append((pid, *table[link[8:-1]]))
    return found


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address.startswith("::ffff:127.") or address == "0000:0000:0000:0000:0000:0000:0000:0001"


# -- end-to-end on Ray -----------------------------------------------------------------------


def test_local_mode_listens_on_loopback_only_and_bsp_trains(ray_session, tmp_path):
    seen: list[tuple[int, str, str]] = []

    def look(backend, info):
        if not seen:
            seen.extend(bound_sockets(descendants(os.getpid()) | {os.getpid()}))

    cfg = ray_config()
    summary = train(cfg, tmp_path / "r", progress=lambda info: look(None, info))
    pids = {p for p, _, _ in seen}
    assert len(pids) >= 3, f"expected gcs, raylet and actors among the listeners, saw {seen}"
    assert all(is_loopback(addr) for _, _, addr in seen), [s for s in seen if not is_loopback(s[2])]
    assert summary["backend"] == "ray" and summary["stop_reason"] == "target_reached"
    assert set(CONTRACT) <= set(summary) and summary["groups"] == [[0, 1, 2, 3]]
    assert summary["data_path"]["intra_group"] == "allreduce"  # BSP's default on ray: DDP all-reduce groups
    assert "bsp on ray with dense gradients" in summary["data_path"]["why"]
    its = [e for e in read_jsonl(tmp_path / "r" / "metrics.jsonl") if e["event"] == "iteration"]
    assert its and all(e["staleness"] == 0 for e in its)  # BSP: every gradient on the current round's parameters
    counts = [w["iterations"] for w in summary["per_worker"]]
    # lockstep; at the stop a worker's records of the last collection interval (DRAIN_S) may not be drained yet
    per_interval = max(counts) / summary["elapsed_s"] * DRAIN_S
    assert max(counts) - min(counts) <= 1 + math.ceil(per_interval), (counts, summary["elapsed_s"])
    sim = train(load_config(None, FAST), tmp_path / "sim")
    assert set(sim) - {"compute_s_measured"} <= set(summary)


def test_gssp_splits_emulated_tiers_and_exchanges(ray_session):
    cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.stop_at_target=false", "run.max_time_s=3")
    backend, summary = run_backend(cfg)
    assert summary["best_accuracy"] >= 0.85
    assert summary["groups"] == [[0, 1], [2, 3]]
    assert summary["exchanges"] > 0 and summary["bytes_exchange"] > 0
    fast, slow = summary["per_worker"][0], summary["per_worker"][3]
    assert fast["iterations"] > 1.5 * slow["iterations"]
    assert slow["compute_s"] / slow["iterations"] == pytest.approx(4 * 0.01, rel=0.3)  # padded to its tier


def test_paced_gssp_groups_on_ray_let_the_faster_member_run_ahead(ray_session):
    """1x and 1.4x share a group: the group server's paced SSP lets worker 0 run at its own speed (plain SSP
    holds it within ``staleness`` of worker 1)."""
    ratios = {}
    for paced in ("true", "false"):
        cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1.4, 4, 4]", "run.stop_at_target=false",
                         "run.max_time_s=4", f"sync.gssp.paced={paced}")
        _, summary = run_backend(cfg)
        assert summary["groups"] == [[0, 1], [2, 3]]
        its = [w["iterations"] for w in summary["per_worker"]]
        ratios[paced] = its[0] / its[1]
    assert ratios["true"] > 1.1 and ratios["false"] < 1.06, ratios


@pytest.mark.slow
@pytest.mark.parametrize("confirm", ["48", "0"])
def test_gssp_keeps_an_equal_speed_cluster_with_slow_spells_in_one_group(ray_session, tmp_path, confirm):
    """Real processes, 4 equal workers, 4x spells of 5 iterations: on seed 0 worker 3 is in a spell when profiled.
    By default it confirms its speed (nobody waits for it) and is never slow long enough to be split off; split
    on the profiles alone (confirm_span = 0), the first grouping splits it off."""
    cfg = ray_config("sync.scheme=gssp", "cluster.profile=uniform", "cluster.compute_s=0.05",
                     "cluster.stragglers.probability=0.1", "cluster.stragglers.slowdown=4",
                     "cluster.stragglers.duration=5", "run.seed=0", "run.stop_at_target=false", "run.max_time_s=4",
                     f"sync.gssp.confirm_span={confirm}")
    train(cfg, tmp_path / "r")
    first = next(e for e in read_jsonl(tmp_path / "r" / "metrics.jsonl")
                 if e["event"] == "groups" and e["reason"] == "profiled")
    assert (first["groups"] == [[0, 1, 2, 3]]) == (confirm != "0")


@pytest.mark.slow
@pytest.mark.ends_kept_actors
def test_gssp_splits_into_no_more_group_servers_than_the_cpus_hold(ray_session, tmp_path):
    """8 workers at 0.2 CPUs and a server at 0.25 leave 0.15 of 2 CPUs: no room for a second group server. Equal
    speeds predict one group, but on seed 4 worker 1 is in a slow spell when profiled, and split on the profiles
    (confirm_span = 0) a second group server would be needed. The split used to wait forever for a server Ray
    could not place; now the groups are capped to the servers the CPUs hold and the run ends on time."""
    cfg = ray_config("sync.scheme=gssp", "cluster.workers=8", "backend.cpus_per_worker=0.2",
                     "backend.cpus_per_server=0.25",
                     "cluster.profile=uniform", "cluster.compute_s=0.05", "cluster.stragglers.probability=0.1",
                     "cluster.stragglers.slowdown=4", "cluster.stragglers.duration=5", "run.seed=4",
                     "sync.gssp.confirm_span=0", "run.stop_at_target=false", "run.max_time_s=3")
    ActorPool.clear()  # actors kept from other tests hold CPUs, and these would hold them for the next
    try:
        summary = train(cfg, tmp_path / "r")
    finally:
        ActorPool.clear()
    assert summary["stop_reason"] == "time_budget" and summary["groups"] == [list(range(8))]
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert {"event": "group_servers_limited", "t": 0.0, "servers": 1, "cpus_free": 0.15,
            "cpus_per_server": 0.25} in events
    profiled = next(e for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    assert max(profiled["times"]) > 1.5 * min(profiled["times"])  # a split was wanted


@pytest.mark.parametrize("extra", [
    ("sync.scheme=asp", "compression.method=qsgd"),
    ("sync.scheme=ssp", "cluster.speeds=[1, 1, 3, 7]", "compression.method=topk", "compression.density=0.1"),
    ("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "compression.method=gdtopk"),
    ("compression.method=fp16",),
    ("compression.method=randk", "compression.density=0.3"),
    ("compression.method=dgc", "compression.density=0.1"),
    ("compression.method=powersgd", "compression.rank=2"),
])
def test_every_scheme_and_compressor_runs(ray_session, extra):
    backend, summary = run_backend(ray_config("run.max_time_s=1", "run.target_accuracy=0.99", *extra))
    assert summary["iterations"] > 8 and summary["final_accuracy"] > 0.2
    if any("compression.method" in e for e in extra):
        assert summary["bytes_up"] < summary["iterations"] * 4 * summary["params"]
    if summary.get("exchanges"):  # GSSP's deltas go through the compressor too (gdtopk: 8 bytes per kept value)
        assert summary["bytes_exchange"] <= 0.6 * summary["exchanges"] * 4 * summary["params"]


@pytest.mark.parametrize("scheme", ["localsgd", "diloco"])
def test_local_sgd_and_diloco_train_on_ray_and_send_only_at_syncs(ray_session, scheme):
    backend, summary = run_backend(ray_config(f"sync.scheme={scheme}", f"sync.{scheme}.local_steps=4", "run.max_time_s=3",
                                              "run.target_accuracy=0.99"))
    assert summary["scheme"] == scheme and summary["final_accuracy"] > 0.6
    syncs = summary["iterations"] / 4  # one full model change per worker and period, nothing in between
    assert summary["bytes_up"] <= (syncs + 4) * 4 * summary["params"]
    assert "similarity" not in summary


def test_streaming_diloco_trains_on_ray_one_quantised_fragment_at_a_time(ray_session):
    """Two fragments, fp4 outer gradients both ways, no overlap, the least similar fragment first: each worker's
    largest upload is a fragment in 4 bits, and so is every download after the first."""
    backend, summary = run_backend(ray_config(
        "sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=4", "sync.streaming_diloco.fragments=2",
        "sync.streaming_diloco.overlap_steps=0", "sync.streaming_diloco.outer_quantization=fp4", "run.max_time_s=3",
        "sync.streaming_diloco.fragment_order=least_similar", "run.target_accuracy=0.99"))
    assert summary["scheme"] == "streaming_diloco" and summary["final_accuracy"] > 0.6
    # half the values (the tensors are cut at the middle), 0.5 bytes each plus a float32 scale per 32
    assert abs(summary["peak_push_bytes"] / (0.625 * summary["params"] / 2) - 1) < 0.02
    first_pulls = 4 * 4 * summary["params"]
    assert summary["bytes_down"] - first_pulls < 0.2 * 4 * summary["params"] * summary["iterations"] / 2


def test_streaming_diloco_on_ray_hides_the_exchange_behind_the_next_step(ray_session):
    """A slow emulated link (2 Mbit/s: a fragment's upload, and its download, each take about one 20 ms step, so
    waiting costs two steps in every four): with overlap 2 the exchange runs beside the next two steps, so the
    same wall budget holds about 1.5 times the steps (1.2 leaves room for a loaded machine)."""
    common = ("sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=8", "sync.streaming_diloco.fragments=2",
              "cluster.workers=2", "cluster.compute_s=0.02", "cluster.link_gbps=0.002", "run.max_time_s=4",
              "run.target_accuracy=0.99")
    _, waiting = run_backend(ray_config(*common, "sync.streaming_diloco.overlap_steps=0"))
    _, overlapped = run_backend(ray_config(*common, "sync.streaming_diloco.overlap_steps=2"))
    assert overlapped["iterations"] >= 1.2 * waiting["iterations"], (overlapped["iterations"], waiting["iterations"])
    assert overlapped["final_accuracy"] > 0.5


def test_adaptive_local_sgd_on_ray_averages_more_often_as_the_loss_falls(ray_session):
    """The workers report their loss with each push; the server's policy shrinks the periods from H = 16, so per
    iteration the run sends more than fixed H = 16 does."""
    common = ("sync.scheme=localsgd", "sync.localsgd.local_steps=16", "run.max_time_s=3", "run.target_accuracy=0.99")
    _, fixed = run_backend(ray_config(*common))
    _, adaptive = run_backend(ray_config(*common, "sync.localsgd.adaptive=true"))
    assert adaptive["bytes_up"] / adaptive["iterations"] > 1.5 * fixed["bytes_up"] / fixed["iterations"]
    assert adaptive["final_accuracy"] > 0.6


def test_asynchronous_diloco_on_ray_lets_the_fast_worker_run_ahead(ray_session):
    """Speeds 1, 1, 4, 4 (emulated): no barrier, so the fast workers take about three times the inner steps
    (measured 256 and 86 on a quiet machine; synchronous DiLoCo: 88 each, the fast ones waiting 2.5 s) and the
    run still learns."""
    backend, summary = run_backend(ray_config(
        "sync.scheme=diloco", "sync.diloco.local_steps=4", "sync.diloco.asynchronous=true",
        "cluster.speeds=[1,1,4,4]", "cluster.compute_s=0.01", "run.max_time_s=4", "run.target_accuracy=0.99"))
    iterations = [w["iterations"] for w in summary["per_worker"]]
    assert min(iterations[:2]) >= 2 * max(iterations[2:]), iterations
    assert summary["final_accuracy"] > 0.4


@pytest.mark.parametrize("path", ["server", "allreduce"])
def test_balanced_batches_on_ray_follow_each_workers_emulated_speed(ray_session, tmp_path, path):
    """sync.balance = "batch": each actor's batch is sized to its speed, by the server or, in an all-reduce group,
    by the same balancer on every rank fed the group's agreed observations; the actor computes exactly that many
    samples, its records show it, and the run reaches its target."""
    cfg = ray_config("cluster.workers=3", "cluster.speeds=[1,1,4]", "sync.balance=batch", f"sync.intra_group={path}",
                     "balance.profile_iterations=2", "cluster.compute_s=0.02", "run.max_time_s=40")
    summary = train(cfg, tmp_path / "run")
    events = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    last = {e["worker"]: e["batch"] for e in events if e["event"] == "iteration"}
    assert summary["stop_reason"] == "target_reached" and summary["data_path"]["intra_group"] == path
    assert last[2] < 32 < last[0] and sum(last.values()) == 3 * 32, last
    resized = [e for e in events if e["event"] == "balance"]
    assert resized and sum(resized[-1]["sizes"].values()) == 3 * 32


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


def test_balanced_local_steps_on_ray_follow_each_workers_emulated_speed(ray_session, tmp_path):
    """sync.balance = "steps": the server sizes each worker's local steps to its speed (12 in all a period), the
    worker takes exactly that many before it sends its change, its records show them, the run's iterations count
    every step, and it reaches its target."""
    cfg = ray_config("sync.scheme=localsgd", "sync.localsgd.local_steps=4", "sync.balance=steps",
                     "cluster.workers=3", "cluster.speeds=[1,1,4]", "balance.profile_iterations=2",
                     "cluster.compute_s=0.01", "run.max_time_s=40")
    summary = train(cfg, tmp_path / "run")
    events = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    records = [e for e in events if e["event"] == "iteration"]
    last = {e["worker"]: e["steps"] for e in records}
    assert summary["stop_reason"] == "target_reached"
    assert last[2] < 4 < last[0] and sum(last.values()) == 3 * 4, last
    assert summary["iterations"] == sum(e["steps"] for e in records)
    resized = [e for e in events if e["event"] == "balance"]
    assert resized and sum(resized[-1]["sizes"].values()) == 3 * 4


def test_a_deadline_round_on_ray_cuts_the_slow_workers_batch_at_the_deadline(ray_session, tmp_path):
    """sync.balance = "deadline": once every worker is profiled a round lasts the median worker's batch time; the
    worker three times slower computes the one whole micro-batch (8 samples) it finishes by then (0.015 s of its
    0.02 s), never longer, and the rounds, weighed by samples, reach the target."""
    cfg = ray_config("sync.balance=deadline", "cluster.workers=3", "cluster.speeds=[1,1,3]",
                     "balance.profile_iterations=2", "balance.micro_batch=8", "cluster.compute_s=0.02",
                     "run.max_time_s=40")
    summary = train(cfg, tmp_path / "run")
    slow = [e for e in read_jsonl(tmp_path / "run" / "metrics.jsonl") if e["event"] == "iteration" and e["worker"] == 2]
    assert summary["stop_reason"] == "target_reached"
    cut = [e for e in slow if e["batch"] < 32]
    assert cut and all(e["batch"] == 8 for e in cut), [e["batch"] for e in slow]
    assert slow[-1]["batch"] == 8 and max(e["compute_s"] for e in cut) < 0.05, [e["compute_s"] for e in cut]


def test_a_deadline_round_in_an_all_reduce_group_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="a deadline round on ray cuts batches on the server path"):
        train(ray_config("sync.balance=deadline", "sync.intra_group=allreduce"), Path("/nonexistent/never"))


def test_a_plugin_compressor_and_scheme_train_on_ray(ray_session, tmp_path):
    """The user's classes are loaded in the server and worker actors; the compressor's bytes are a quarter of dense."""
    plugins = ROOT / "examples" / "plugins"
    cfg = ray_config(f'sync.scheme="python:{plugins}/quantile_ssp.py:QuantileSSP"',
                     "sync.options={staleness = 2, quantile = 0.5}",
                     f'compression.method="python:{plugins}/int8_quantizer.py:Int8Quantizer"', "run.max_time_s=30")
    summary = train(cfg, tmp_path / "run")
    assert summary["backend"] == "ray" and summary["scheme"].endswith("quantile_ssp.py:QuantileSSP")
    assert summary["stop_reason"] == "target_reached"
    assert summary["bytes_up"] <= 0.26 * summary["iterations"] * 4 * summary["params"]


def test_a_plugin_model_from_a_folder_outside_the_project_trains_on_ray(ray_session, tmp_path):
    """The user's file is loaded in every worker actor; the run's model.safetensors loads back through it."""
    import shoal

    (tmp_path / "user_model.py").write_text(
        "from torch import nn\n"
        "def build(input_shape, num_classes, width=32):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))\n")
    cfg = ray_config(f"model.name=\"python:{tmp_path}/user_model.py:build\"", "run.max_time_s=30")
    summary = train(cfg, tmp_path / "run")
    assert summary["backend"] == "ray" and summary["stop_reason"] == "target_reached"
    model = shoal.load_model(tmp_path / "run")
    ds = build_setup(cfg).dataset
    with torch.no_grad():
        assert int((model(ds.x_test).argmax(1) == ds.y_test).sum()) / len(ds.y_test) == summary["final_accuracy"]


def test_the_stdlib_language_model_trains_on_ray_with_two_workers(ray_session, tmp_path):
    """examples/stdlib_lm.toml on --backend ray: each worker loads the byte windows itself; the held-out loss falls."""
    cfg = load_config(ROOT / "examples" / "stdlib_lm.toml", RAY + [
        "cluster.workers=2", "data.options={context = 32, max_bytes = 300000, test_windows = 200}",
        "model.options={layers = 1, width = 32, heads = 2}", "run.max_iterations=300", "run.eval_every_s=1",
        "run.max_time_s=60", "run.stop_at_target=false", "cluster.compute_s=0.01"])
    summary = train(cfg, tmp_path / "run")
    values = [e["value"] for e in read_jsonl(tmp_path / "run" / "metrics.jsonl") if e["event"] == "eval"]
    assert summary["backend"] == "ray" and summary["iterations"] >= 300
    assert values[0] > 7.5 and values[-1] < values[0] - 1.5, values


def test_killed_worker_is_dropped_and_training_goes_on(ray_session):
    """SIGKILL a worker mid-run under BSP: the barrier releases, the failure is recorded, no hang."""
    killed: dict[str, float] = {}

    def kill(backend, info):
        if not killed and info["iterations"] >= 20:
            os.kill(backend.pids[1], signal.SIGKILL)
            killed["t"] = info["t"]

    signal.alarm(120)  # the bound: a hang fails the test instead of blocking the suite
    try:
        stream = io.StringIO()
        start = time.monotonic()
        _, summary = run_backend(ray_config("run.target_accuracy=0.99", "run.max_time_s=4", SERVER_PATH), kill, stream)
        wall = time.monotonic() - start
    finally:
        signal.alarm(0)
    assert killed and summary["stop_reason"] == "time_budget" and wall < 60
    assert [f["worker"] for f in summary["failures"]] == [1] and not summary["failures"][0]["restarted"], summary["failures"]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    failed_at = next(e["t"] for e in events if e["event"] == "worker_failed")
    after = [e for e in events if e["event"] == "iteration" and e["t"] > failed_at + 0.2]
    assert {e["worker"] for e in after} == {0, 2, 3}
    assert len(after) > 12  # the three survivors kept doing BSP rounds without worker 1


def test_a_stopped_worker_is_evicted_within_the_timeout_and_rejoins_when_it_answers_again(ray_session):
    """SIGSTOP a worker under BSP: evicted after worker_timeout_s (no hang); SIGCONT: it rejoins and trains."""
    stopped: dict[str, float] = {}

    def stop(backend, info):
        if not stopped and info["iterations"] >= 20:
            os.kill(backend.pids[1], signal.SIGSTOP)
            stopped["t"] = info["t"]
        if backend.failures and "cont" not in stopped and info["t"] > backend.failures[0]["t"] + 1.5:
            os.kill(backend.pids[1], signal.SIGCONT)
            stopped["cont"] = info["t"]

    signal.alarm(120)
    try:
        stream = io.StringIO()
        cfg = ray_config("optimizer.lr=0.02", "run.target_accuracy=0.9", "run.stop_at_target=false",
                         "run.max_time_s=9", "backend.worker_timeout_s=2", SERVER_PATH)
        _, summary = run_backend(cfg, stop, stream)
    finally:
        signal.alarm(0)
    assert summary["time_to_target_s"] is not None  # the run reached its target through it all
    assert stopped and [f["worker"] for f in summary["failures"]] == [1], summary["failures"]
    failure = summary["failures"][0]
    assert "no answer for 2 s" in failure["error"] and failure["t"] - stopped["t"] < 2 + 5
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    rejoined = next(e for e in events if e["event"] == "worker_rejoined")
    assert rejoined["worker"] == 1 and failure["rejoined_t"] == pytest.approx(rejoined["t"], abs=1e-6)
    between = [e for e in events if e["event"] == "iteration" and failure["t"] + 0.2 < e["t"] < stopped["cont"]]
    assert {e["worker"] for e in between} == {0, 2, 3} and len(between) > 12  # the barrier no longer waited
    back = [e for e in events if e["event"] == "iteration" and e["worker"] == 1 and e["t"] > rejoined["t"]]
    assert len(back) > 5 and summary["per_worker"][1]["iterations"] > 20  # back in the BSP rounds


def test_an_internal_error_in_the_driver_still_stops_the_actors_and_returns_the_summary(ray_session, monkeypatch):
    apply = RayBackend._apply_speed_changes

    def flaky(self, now):
        if now > 0.5:
            raise KeyError("a bug")
        return apply(self, now)

    monkeypatch.setattr(RayBackend, "_apply_speed_changes", flaky)
    stream = io.StringIO()
    backend, summary = run_backend(ray_config("run.target_accuracy=0.99"), None, stream)
    assert summary["stop_reason"] == "internal_error" and summary["error"].startswith("KeyError: 'a bug'")
    assert summary["iterations"] > 0 and summary["final_accuracy"] is not None  # evaluated on the way out
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert any(e["event"] == "internal_error" and "flaky" in e["traceback"] for e in events)
    assert events[-1] == {"event": "end", "t": events[-1]["t"], "reason": "internal_error"}


def _kill_server_when(group: int, ready) -> tuple[dict, callable]:
    """A progress callback that kill -9s group ``group``'s server once ``ready(backend, info)``."""
    killed: dict = {}

    def kill(backend, info):
        if not killed and ready(backend, info):
            killed["pid"] = ray.get(backend.servers[group].ping.remote())
            killed["t"] = info["t"]
            os.kill(killed["pid"], signal.SIGKILL)

    return killed, kill


def test_a_killed_bsp_server_is_replaced_from_the_checkpoint_and_the_run_reaches_its_target(ray_session, tmp_path):
    """kill -9 the only server under BSP: rebuilt from the newest saved state, the run goes on to its target."""
    killed, kill = _kill_server_when(0, lambda b, info: info["iterations"] >= 40 and b.last_checkpoint)
    signal.alarm(150)
    try:
        stream = io.StringIO()
        cfg = ray_config("optimizer.lr=0.02", "run.target_accuracy=0.85", "run.max_time_s=40",
                         "backend.checkpoint_every_s=0.3", SERVER_PATH)
        backend = RayBackend(build_setup(cfg), RunRecorder(stream=stream), lambda info: kill(backend, info),
                             out=tmp_path)
        summary = backend.run()
    finally:
        signal.alarm(0)
    assert killed and summary["stop_reason"] == "target_reached", summary["failures"]
    [failure] = summary["failures"]
    assert failure["server"] == 0 and failure["recovered"] and "worker" not in failure
    assert failure["recovered_from"].startswith(("checkpoint ckpt-", "the state evaluated at"))
    assert failure["t"] >= killed["t"] and failure["cutoff"] <= failure["t"]
    assert isinstance(failure["gradients_lost"], int) and failure["gradients_lost"] >= 0
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    replaced = next(e for e in events if e["event"] == "server_replaced")
    after = {e["worker"] for e in events if e["event"] == "iteration" and e["t"] > replaced["t"]}
    assert after == {0, 1, 2, 3}  # every worker followed the new server
    assert not any(e["event"] == "worker_failed" for e in events)  # nobody blames a worker


def test_a_server_killed_before_handing_out_its_evaluated_state_is_replaced_from_the_checkpoint(
        ray_session, tmp_path, monkeypatch):
    """kill -9 the server right after an evaluation asked for its state: that state never existed, so it must not
    be chosen over the checkpoint (it was, and the replacement fell back to the initial state)."""
    killed: dict = {}
    submit = RayBackend._submit_evaluation

    def submit_then_kill(backend):
        ready = not killed and backend.last_checkpoint and backend.recorder.iterations >= 40
        pid = ray.get(backend.servers[0].ping.remote()) if ready else None
        submit(backend)
        if ready:
            killed["t"] = backend.now()
            os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(RayBackend, "_submit_evaluation", submit_then_kill)
    signal.alarm(150)
    try:
        cfg = ray_config("optimizer.lr=0.02", "run.target_accuracy=0.85", "run.max_time_s=40", "run.eval_every_s=0.5",
                         "backend.checkpoint_every_s=0.3", SERVER_PATH)
        summary = RayBackend(build_setup(cfg), RunRecorder(stream=io.StringIO()), lambda info: None, out=tmp_path).run()
    finally:
        signal.alarm(0)
    assert killed and summary["stop_reason"] == "target_reached", summary["failures"]
    [failure] = summary["failures"]
    assert failure["recovered_from"].startswith(("checkpoint ckpt-", "the state evaluated at")), failure


def test_a_killed_gssp_group_server_is_replaced_from_a_peer_replica(ray_session):
    """kill -9 one of two GSSP group servers: a warm standby takes over from the other group's replica."""
    killed, kill = _kill_server_when(1, lambda b, info: b.gssp.grouped and info["iterations"] >= 60)
    signal.alarm(150)
    try:
        stream = io.StringIO()
        cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.target_accuracy=0.85",
                         "run.stop_at_target=false", "run.max_time_s=10", "backend.standby_servers=1")
        _, summary = run_backend(cfg, kill, stream)
    finally:
        signal.alarm(0)
    assert killed and summary["stop_reason"] == "time_budget" and summary["time_to_target_s"], summary["failures"]
    [failure] = summary["failures"]
    assert failure["server"] == 1 and failure["recovered_from"] == "group 0's replica"
    assert 0 <= failure["gradients_lost"] <= summary["iterations"]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    replaced = next(e for e in events if e["event"] == "server_replaced")
    assert replaced["seconds"] < 3  # no process to start: the standby was warm
    assert {e["worker"] for e in events if e["event"] == "iteration" and e["t"] > replaced["t"]} == {0, 1, 2, 3}
    assert summary["exchanges"] > 0


def test_two_workers_added_mid_run_train_and_gssp_places_them_by_speed(ray_session):
    """cluster.membership on ray: a 1x and a 4x worker join at 1.5 s; worker 1 leaves at 4 s."""
    signal.alarm(150)
    try:
        stream = io.StringIO()
        cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.stop_at_target=false",
                         "run.max_time_s=14",
                         "cluster.membership=[{at_s=1.5, add=2, speeds=[1, 4]}, {at_s=4, remove=[1]}]")
        _, summary = run_backend(cfg, None, stream)
    finally:
        signal.alarm(0)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    joined = {e["worker"]: e for e in events if e["event"] == "worker_joined"}
    assert sorted(joined) == [4, 5] and all(e["t"] >= 1.5 for e in joined.values())
    per = {p["id"]: p for p in summary["per_worker"]}
    assert per[4]["iterations"] > 0 and per[5]["iterations"] > 0  # they train
    assert summary["groups"] == [[0, 4], [2, 3, 5]]  # GSSP profiled them and placed them by speed
    left = next(e for e in events if e["event"] == "worker_left")
    assert left["worker"] == 1 and not summary["failures"]  # leaving is not failing
    assert not [e for e in events if e["event"] == "iteration" and e["worker"] == 1 and e["t"] > left["t"] + 0.5]


@pytest.mark.slow
def test_failed_worker_restarts_from_its_groups_replica(ray_session):
    injected: dict[str, bool] = {}

    def fail(backend, info):
        if not injected and info["iterations"] >= 20:
            backend.workers[2].fail_next.remote()
            injected["done"] = True

    stream = io.StringIO()
    cfg = ray_config("sync.scheme=ssp", "backend.max_restarts=1", "run.target_accuracy=0.99", "run.max_time_s=15")
    _, summary = run_backend(cfg, fail, stream)
    assert summary["restarts"] == 1 and summary["failures"][0]["restarted"]
    assert "injected failure" in summary["failures"][0]["error"]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    back_at = next(e["t"] for e in events if e["event"] == "worker_restarted")
    assert any(e["event"] == "iteration" and e["worker"] == 2 and e["t"] > back_at for e in events)


def test_checkpoint_stop_resume_reaches_target(ray_session, tmp_path):
    out = tmp_path / "run"
    slow = ("optimizer.lr=0.02", "run.target_accuracy=0.85", SERVER_PATH)
    first = train(ray_config(*slow, "run.max_time_s=0.6", "backend.checkpoint_every_s=0.2"), out)
    assert first["stop_reason"] == "time_budget" and first["time_to_target_s"] is None
    folder, state = checkpoint.latest(out / "checkpoint")
    manifest = json.loads((folder / "group-0.json").read_text())
    assert manifest["format"] == checkpoint.FORMAT and (folder / "group-0.safetensors").is_file()
    assert state["iterations"] == first["iterations"]
    positions = state["positions"]  # each worker's data stream and generators at the checkpoint
    assert sorted(positions) == ["0", "1", "2", "3"] and all(p["epoch"] or p["offset"] for p in positions.values())

    resumed = train(ray_config(*slow, "run.max_time_s=30", "backend.checkpoint_every_s=0.2"), out, resume=out)
    assert resumed["stop_reason"] == "target_reached" and resumed["resumed_from"] == str(out)
    assert resumed["iterations"] > first["iterations"] and resumed["elapsed_s"] > first["elapsed_s"]
    assert Path(resumed["checkpoint"]).name > Path(first["checkpoint"]).name  # numbering goes on
    events = read_jsonl(out / "metrics.jsonl")
    at = next(i for i, e in enumerate(events) if e["event"] == "resume")
    before = [e for e in events[:at] if e["event"] == "eval"][-1]
    after = next(e for e in events[at:] if e["event"] == "eval")
    assert after["accuracy"] >= before["accuracy"]
    restored = next(e for e in events[at:] if e["event"] == "data_positions")
    assert restored["positions"] == {w: position_digest(p) for w, p in positions.items()}  # seeked exactly there


def test_a_checkpoint_keeps_each_workers_compressor_state_and_a_resume_restores_it(ray_session, tmp_path):
    """Error feedback's residuals go into the checkpoint beside the data position and come back on resume."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    topk = ("compression.method=topk", "compression.density=0.05", "optimizer.lr=0.02", "run.target_accuracy=0.85")
    train(ray_config(*topk, "run.max_time_s=0.6", "backend.checkpoint_every_s=0.2"), out)
    folder, state = checkpoint.latest(out / "checkpoint")
    positions = state["positions"]
    for w, position in positions.items():
        assert position["codec"] == f"worker-{w}.safetensors"
        saved = load_file(folder / position["codec"])
        assert any(k.startswith("memory.residual.") for k in saved) and all(t.isfinite().all() for t in saved.values())
    resumed = train(ray_config(*topk, "run.max_time_s=30", "backend.checkpoint_every_s=0.2"), out, resume=out)
    assert resumed["stop_reason"] == "target_reached"
    events = read_jsonl(out / "metrics.jsonl")
    at = next(i for i, e in enumerate(events) if e["event"] == "resume")
    restored = next(e for e in events[at:] if e["event"] == "data_positions")
    assert restored["positions"] == {w: position_digest(p) for w, p in positions.items()}  # codec file included


@pytest.mark.slow
def test_a_resumed_gssp_run_goes_on_in_the_groups_of_its_checkpoint(ray_session, tmp_path):
    out = tmp_path / "run"
    gssp = ("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.stop_at_target=false",
            "backend.checkpoint_every_s=0.3")
    first = train(ray_config(*gssp, "run.max_time_s=2"), out)
    _, state = checkpoint.latest(out / "checkpoint")
    assert state["grouped"] and state["groups"] == first["groups"] == [[0, 1], [2, 3]]
    assert state["confirming"] is False  # 2 of 4 look slow: split on the profiles
    resumed = train(ray_config(*gssp, "run.max_time_s=3"), out, resume=out)
    assert resumed["groups"] == [[0, 1], [2, 3]] and resumed["exchanges"] > first["exchanges"]
    events = read_jsonl(out / "metrics.jsonl")
    at = next(i for i, e in enumerate(events) if e["event"] == "resume")
    assert not [e for e in events[at:] if e["event"] == "groups" and e["reason"] == "profiled"]  # no new split


def test_resume_refuses_a_folder_without_checkpoint_and_a_checkpoint_of_the_other_backend(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(ray_config(SERVER_PATH), tmp_path / "r", resume=tmp_path)
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(load_config(None, FAST), tmp_path / "r", resume=tmp_path)
    simulated = FAST + ["backend.sim_checkpoint_every_s=0.5", "run.max_time_s=1", "run.stop_at_target=false"]
    train(load_config(None, simulated), tmp_path / "sim")
    with pytest.raises(ConfigError, match="written by the sim backend; resume it with --backend sim"):
        train(ray_config("run.max_time_s=2", SERVER_PATH), tmp_path / "sim", resume=tmp_path / "sim")


# SIM with every tensor similar enough (threshold -1), so skipping certainly happens after a short warm-up
SIM = ["compression.similarity.enabled=true", "compression.similarity.rule=cosine", "compression.similarity.threshold=-1",
       "compression.similarity.max_period=4", "compression.similarity.warmup_iterations=3",
       "compression.similarity.min_numel=1"]


def test_sim_on_ray_skips_tensors_and_moves_fewer_bytes(ray_session):
    """BSP + SIM on Ray: sim events with tau > 1, the sim backend's summary fields, fewer bytes per iteration."""
    budget = ("run.stop_at_target=false", "run.max_iterations=120", "run.max_time_s=10")
    _, dense = run_backend(ray_config(*budget))
    stream = io.StringIO()
    _, summary = run_backend(ray_config(*budget, *SIM), stream=stream)
    assert summary["final_accuracy"] >= 0.8, summary["final_accuracy"]
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    sims = [e for e in events if e["event"] == "sim"]
    assert sims and max(max(e["tau"]) for e in sims) > 1
    assert {"group", "clock", "names", "tau", "similarity", "measured", "bytes_saved"} <= set(sims[0])
    assert [e["clock"] for e in sims] == sorted(e["clock"] for e in sims)
    assert summary["bytes_saved_sim"] > 0 and len(summary["similarity"]) == 1
    for key in ("bytes_up", "bytes_down"):
        assert summary[key] / summary["iterations"] < 0.8 * dense[key] / dense["iterations"], key


def test_gssp_with_sim_on_ray_keeps_a_schedule_per_group(ray_session):
    cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.stop_at_target=false",
                     "run.max_time_s=2.5", "compression.method=topk", "compression.density=0.3", *SIM)
    stream = io.StringIO()
    _, summary = run_backend(cfg, stream=stream)
    assert summary["groups"] == [[0, 1], [2, 3]] and summary["best_accuracy"] >= 0.6
    sims = [json.loads(line) for line in stream.getvalue().splitlines()]
    sims = [e for e in sims if e["event"] == "sim"]
    assert {e["group"] for e in sims} == {0, 1}
    assert len(summary["similarity"]) == 2 and summary["bytes_saved_sim"] > 0


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


# -- reserving the actors (placement groups) --------------------------------------------------------


@pytest.mark.ends_kept_actors
def test_a_cluster_that_cannot_hold_the_run_fails_fast_in_one_line_and_keeps_nothing(ray_session, monkeypatch):
    monkeypatch.setattr(ActorPool, "enabled", False)  # reserved when actors are not kept between runs
    ActorPool.clear()
    other_job = ray.util.placement_group([{"CPU": 1.5}])  # CPUs another job holds on a shared cluster
    assert other_job.wait(timeout_seconds=10)
    try:  # 4 workers and a server at 0.2 CPU: 1 of the 2 CPUs the instance has, but only 0.5 are free
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"cannot place this run's actors \(4 workers x 0.2 CPU, 1 servers"):
            run_backend(ray_config(SERVER_PATH))
        assert time.monotonic() - start < 20
        assert [pg["state"] for pg in ray.util.placement_group_table().values()].count("CREATED") == 1
    finally:
        ray.util.remove_placement_group(other_job)


@pytest.mark.ends_kept_actors
def test_reserved_actors_train_and_a_restarted_worker_takes_its_predecessors_bundle(ray_session, monkeypatch):
    """4 x 0.4 + 0.2 of 2 CPUs are reserved: 0.2 stay free, so the restart fits only in the dead worker's
    bundle. The group is removed at the end."""
    monkeypatch.setattr(ActorPool, "enabled", False)
    ActorPool.clear()
    seen: list[dict] = []

    def fail(backend, info):
        if info["iterations"] >= 20 and not backend.failures:
            seen.extend(pg for pg in ray.util.placement_group_table().values() if pg["state"] == "CREATED")
            backend.workers[1].fail_next.remote()

    signal.alarm(150)
    try:
        _, summary = run_backend(ray_config("backend.cpus_per_worker=0.4", "backend.max_restarts=1"), fail)
    finally:
        signal.alarm(0)
    assert summary["stop_reason"] == "target_reached" and summary["restarts"] == 1
    assert len(seen) == 1 and len(seen[0]["bundles"]) == 5 and seen[0]["strategy"] == "PACK"
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


# -- BSP on all-reduce (torch.distributed inside the actors) ---------------------------------------


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


def test_a_failed_rank_ends_an_allreduce_run_cleanly(ray_session):
    def fail(backend, info):
        if info["iterations"] >= 20 and not backend.failures:
            backend.workers[2].fail_next.remote()

    signal.alarm(150)
    try:
        _, summary = run_backend(ray_config("sync.intra_group=allreduce", "run.target_accuracy=0.99"), fail)
    finally:
        signal.alarm(0)
    assert summary["stop_reason"] == "worker_failed"
    assert [f["worker"] for f in summary["failures"]] == [2] and summary["final_accuracy"] is not None
    assert ActorPool.cpus_held(lambda key: key[0] == "CollectiveWorker") == 0  # a broken group is not kept


def test_gssp_on_allreduce_groups_splits_exchanges_and_keeps_each_groups_replicas_equal(ray_session):
    """One all-reduce group while profiling, then a DDP group per speed tier: every member of a group ends with
    exactly the same replica (the same peer deltas and settings after the same iteration), the groups differ
    (asynchronous exchange), and the split paused the cluster once, measured."""
    cfg = ray_config("sync.scheme=gssp", "sync.intra_group=allreduce", "cluster.speeds=[1, 1, 4, 4]",
                     "cluster.emulate=true", "run.stop_at_target=false", "run.max_time_s=8")
    stream = io.StringIO()
    backend = RayBackend(build_setup(cfg), RunRecorder(stream=stream))
    states: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    evaluate = backend._final_evaluation

    def capture() -> None:  # every rank has stopped after its group's agreed iteration
        states.update(zip(range(4), ray.get([backend.workers[w].state.remote() for w in range(4)])))
        evaluate()

    backend._final_evaluation = capture
    signal.alarm(150)
    try:
        summary = backend.run()
    finally:
        signal.alarm(0)
    assert summary["stop_reason"] == "time_budget" and sorted(summary["groups"]) == [[0, 1], [2, 3]]
    assert summary["exchanges"] > 0 and summary["bytes_exchange"] > 0 and backend.servers == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["reason"] for e in events if e["event"] == "groups"][:2] == ["start", "profiled"]
    assert any(e["event"] == "regroup_pause" and e["form_s"] > 0 for e in events)
    for a, b in ((0, 1), (2, 3)):
        assert np.array_equal(states[a][0], states[b][0]) and np.array_equal(states[a][1], states[b][1])
    assert not np.array_equal(states[0][0], states[2][0])
    assert summary["final_accuracy"] > 0.5


def test_workers_load_their_own_shards_and_refuse_data_that_is_not_the_drivers(ray_session, tmp_path):
    """Each worker loads the data itself (the driver sends indices and a digest); a data function that draws
    other samples in every process (unseeded) is caught by the digest before any training, in one line."""
    (tmp_path / "user_data.py").write_text(
        "import numpy as np\n"
        "import torch\n"
        "def load(seeded=True):\n"
        "    rng = np.random.default_rng(0 if seeded else None)\n"
        "    x = torch.from_numpy(rng.normal(size=(240, 1, 8, 8)).astype('float32'))\n"
        "    y = (x[:, 0, 0, 0] > 0).long()\n"
        "    return (x[:200], y[:200]), (x[200:], y[200:])\n")
    data = f"data.name=\"python:{tmp_path}/user_data.py:load\""
    summary = train(ray_config(data, "run.max_time_s=3", "run.target_accuracy=1.0"), tmp_path / "ok")
    assert summary["iterations"] > 0
    with pytest.raises(ConfigError, match=r"worker \d+ loaded other data than the driver"):  # whichever starts first
        train(ray_config(data, "data.options={seeded = false}", "run.max_time_s=3"), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # refused before it started: nothing written
    assert free_cpus_settle() == pytest.approx(2.0 - ActorPool.cpus_held(lambda key: True))  # no actor left behind
    shipped = train(ray_config(data, "data.options={seeded = false}", "backend.data_loading=driver",
                               "run.max_time_s=3", "run.target_accuracy=1.0"), tmp_path / "shipped")
    assert shipped["iterations"] > 0


def test_a_run_the_ray_cluster_cannot_hold_is_refused_and_leaves_nothing(ray_session, tmp_path):
    with pytest.raises(ConfigError, match="request fractions of a CPU"):
        train(ray_config("backend.cpus_per_worker=2"), tmp_path / "r")
    assert not (tmp_path / "r").exists()  # so a corrected rerun into the same folder needs no --overwrite
    assert train(ray_config("run.max_time_s=3"), tmp_path / "r")["iterations"] > 0


def test_a_slow_evaluation_runs_in_its_own_actor_and_never_stalls_the_driver(ray_session, tmp_path):
    """A metric that takes 1 s: the driver loop keeps ticking (progress every 0.5 s) while it runs elsewhere."""
    plugin = tmp_path / "slow_metric.py"
    plugin.write_text("import time\n\ndef slow_accuracy(output, target):\n    time.sleep(1.0)\n"
                      "    return float((output.argmax(1) == target).float().mean())\n")
    ticks: list[float] = []
    cfg = ray_config(f"task.metric=\"python:{plugin}:slow_accuracy\"", "task.higher_is_better=true",
                     "run.target=0.999", "run.max_time_s=4", "run.eval_every_s=0.5")
    backend, summary = run_backend(cfg, lambda backend, info: info.get("status") or ticks.append(time.monotonic()))
    assert backend.evaluator is not None and summary["stop_reason"] == "time_budget"
    running = [b - a for a, b in zip(ticks, ticks[1:-1])]  # the last gap holds the final, driver-side evaluation
    assert running and max(running) < 0.9, max(running)
    evals = backend.recorder.evals
    assert 3 <= len(evals) <= 6 and all(a["t"] < b["t"] for a, b in zip(evals, evals[1:]))  # one in flight at a time


# -- in-network aggregation: software switch actors ----------------------------------------------

# A pinned plan (hosts, server host, programmable ToRs, capacity): switch e0.0 aggregates workers 0-2, worker 3
# sends straight to the server.
INA = ["network.aggregation=ina", "network.topology=fattree:k=4", "network.ps_host=\"h3.1.1\"",
       "network.programmable=tor", "network.worker_hosts=['h0.0.0', 'h0.0.1', 'h0.1.0', 'h1.0.0']",
       "network.algorithm=grid", "cluster.link_gbps=10", "cluster.server_gbps=10", "network.capacity_gbps=[15]",
       "network.fragment_size=256"]


def test_bsp_trains_through_a_switch_that_really_aggregates(ray_session):
    stream = io.StringIO()
    _, summary = run_backend(ray_config(*INA, "run.max_time_s=15"), stream=stream)
    routing = summary["routing"]
    assert routing["worker_nodes"] == ["e0.0", "e0.0", "e0.0", "server"]
    assert summary["stop_reason"] == "target_reached" and summary["final_accuracy"] >= 0.9
    plane = routing["dataplane"]
    switch = plane["switches"]["e0.0"]
    assert switch["fan_in"] == 3
    assert switch["aggregated_fragments"] > 0 and switch["completed"] > 0  # summed in the switch, not fallen back
    assert switch["aggregated_fragments"] >= 3 * switch["completed"]
    assert plane["server"]["aggregates"] == switch["completed"] and plane["server"]["direct_fragments"] > 0
    fragments = -(-summary["params"] // 256)
    assert switch["completed"] >= 0.9 * summary["group_updates"][0] * fragments  # (almost) every fragment, every round
    ends = [json.loads(line) for line in stream.getvalue().splitlines() if '"dataplane"' in line]
    assert len(ends) == 1 and ends[0]["switches"]["e0.0"]["completed"] == switch["completed"]


def test_a_one_slot_switch_falls_back_and_still_trains(ray_session):
    _, summary = run_backend(ray_config(*INA, "network.switch_slots=1", "network.resend_timeout_s=0.05",
                                        "run.max_iterations=150", "run.stop_at_target=false"))
    switch = summary["routing"]["dataplane"]["switches"]["e0.0"]
    assert switch["fallbacks_full"] + switch["fallbacks_collision"] > 0 and switch["aggregated_fragments"] > 0
    assert summary["iterations"] >= 150 and summary["final_accuracy"] > 0.6


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


# -- the group server's gating, driven directly (no Ray) -----------------------------------------


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

    for name in ("sgd", "adam"):
        opt = load_config(None, [f"optimizer.name=\"{name}\""]).optimizer
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


# -- the CLI: Ctrl-C writes the summary and leaves no process behind ------------------------------


@pytest.mark.slow
def test_ctrl_c_writes_summary_and_leaves_no_process(tmp_path):
    out = tmp_path / "r"
    cmd = [str(Path(sys.executable).parent / "shoal"), "train", "--backend", "ray", "--out", str(out), "-q",
           *[f"--set={o}" for o in FAST + RAY[1:] + ["run.max_time_s=120", "run.target_accuracy=0.999"]]]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    tree: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            metrics = out / "metrics.jsonl"  # flushed per event: wait for an evaluation after some training
            if metrics.exists() and any(e.get("event") == "eval" and e.get("iterations", 0) > 0
                                        for e in map(json.loads, metrics.read_text().splitlines())):
                break
            time.sleep(0.5)
        tree = descendants(proc.pid)
        assert tree, "no Ray processes under shoal train"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        code = proc.wait(timeout=180)  # in the full suite shutdown has taken over 60 s (open: issue 16)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, proc.stderr.read().decode()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["iterations"] > 0
    time.sleep(2)
    left = [p for p in tree if Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]]
    assert not left, f"processes left behind: {left}"


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

