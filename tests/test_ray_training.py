"""The ray backend trains: every scheme, compressor and balance mode on real processes, loopback-only local
mode, plug-ins, the language model, SIM, workers that load their own shards, and software switches that really
aggregate. The all-reduce path has its own file, test_ray_allreduce.py.

Every test here runs on the one embedded Ray of conftest's ray_session, whose idle actors are kept between runs
(ActorPool): most runs cost a second or two instead of starting processes and importing torch again.
"""

from __future__ import annotations

import io
import json
import math
import os
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from shoal.backends.ray import DRAIN_S  # noqa: E402
from shoal.backends.ray.session import ActorPool  # noqa: E402
from shoal.config import ConfigError, load_config  # noqa: E402
from shoal.engine.setup import build_setup  # noqa: E402
from shoal.runner import train  # noqa: E402

from conftest import FAST, ROOT, read_jsonl  # noqa: E402
from ray_support import (CONTRACT, RAY, bound_sockets, descendants, events_of, free_cpus_settle,  # noqa: E402
                         is_loopback, ray_config, run_backend)


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
    holds it within ``staleness`` of worker 1). Iterations of 30 ms, not the suite's 10: the emulated speeds must
    outweigh what a loaded machine adds to every iteration, or the two workers' paces converge."""
    ratios = {}
    for paced in ("true", "false"):
        cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1.4, 4, 4]", "run.stop_at_target=false",
                         "cluster.compute_s=0.03", "run.max_time_s=6", f"sync.gssp.paced={paced}")
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
    ("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "compression.method=gdtopk", "optimizer.warmup_epochs=1"),
    ("compression.method=fp16",),
    ("compression.method=randk", "compression.density=0.3"),
    ("compression.method=dgc", "compression.density=0.1"),
    ("compression.method=powersgd", "compression.rank=2"),
])
def test_every_scheme_and_compressor_runs(ray_session, extra):
    stream = io.StringIO()
    backend, summary = run_backend(ray_config("run.max_time_s=1", "run.target_accuracy=0.99", *extra), stream=stream)
    stairs = [e["lr"] for e in events_of(stream) if e["event"] == "lr_warmup"]
    assert stairs == sorted(stairs) and bool(stairs) == ("optimizer.warmup_epochs=1" in extra)  # servers follow
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
    events = events_of(stream)
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
    sims = [e for e in events_of(stream) if e["event"] == "sim"]
    assert {e["group"] for e in sims} == {0, 1}
    assert len(summary["similarity"]) == 2 and summary["bytes_saved_sim"] > 0


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
    summary = train(ray_config(data, "run.max_time_s=1", "run.target_accuracy=1.0"), tmp_path / "ok")
    assert summary["iterations"] > 0
    with pytest.raises(ConfigError, match=r"worker \d+ loaded other data than the driver"):  # whichever starts first
        train(ray_config(data, "data.options={seeded = false}", "run.max_time_s=3"), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # refused before it started: nothing written
    assert free_cpus_settle() == pytest.approx(2.0 - ActorPool.cpus_held(lambda key: True))  # no actor left behind
    shipped = train(ray_config(data, "data.options={seeded = false}", "backend.data_loading=driver",
                               "run.max_time_s=1", "run.target_accuracy=1.0"), tmp_path / "shipped")
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
