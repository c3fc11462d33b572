"""The ray backend when things go wrong: killed and stopped workers, killed servers (replaced from a checkpoint or
a peer replica), workers that join and leave, checkpoint/stop/resume, actors reserved in placement groups, and
Ctrl-C on the CLI. Every test here runs on the one embedded Ray of conftest's ray_session (Ctrl-C: its own).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from shoal.backends import checkpoint  # noqa: E402
from shoal.backends.ray import RayBackend  # noqa: E402
from shoal.backends.ray.recovery import position_digest  # noqa: E402
from shoal.backends.ray.session import ActorPool  # noqa: E402
from shoal.config import ConfigError  # noqa: E402
from shoal.engine.metrics import RunRecorder  # noqa: E402
from shoal.engine.setup import build_setup  # noqa: E402
from shoal.runner import train  # noqa: E402

from conftest import FAST, ROOT, default_sigint, read_jsonl  # noqa: E402
from ray_support import RAY, SERVER_PATH, descendants, events_of, ray_config, run_backend, stop_once  # noqa: E402


@pytest.mark.timeout(120)  # a hang fails the test with its stack instead of blocking the suite
def test_killed_worker_is_dropped_and_training_goes_on(ray_session):
    """SIGKILL a worker mid-run under BSP: the barrier releases, the failure is recorded, no hang."""
    killed: dict[str, float] = {}

    def kill(backend, info):
        if not killed and info["iterations"] >= 20:
            os.kill(backend.pids[1], signal.SIGKILL)
            killed["t"] = info["t"]

    stream = io.StringIO()
    start = time.monotonic()
    _, summary = run_backend(ray_config("run.target_accuracy=0.99", "run.max_time_s=4", SERVER_PATH), kill, stream)
    wall = time.monotonic() - start
    assert killed and summary["stop_reason"] == "time_budget" and wall < 60
    assert [f["worker"] for f in summary["failures"]] == [1] and not summary["failures"][0]["restarted"], summary["failures"]
    events = events_of(stream)
    failed_at = next(e["t"] for e in events if e["event"] == "worker_failed")
    after = [e for e in events if e["event"] == "iteration" and e["t"] > failed_at + 0.2]
    assert {e["worker"] for e in after} == {0, 2, 3}
    assert len(after) > 12  # the three survivors kept doing BSP rounds without worker 1


@pytest.mark.timeout(120)  # a hang fails the test with its stack instead of blocking the suite
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

    def back(backend, info, events):  # worker 1 back in the rounds, and the target was met
        rejoined = [e["t"] for e in events if e["event"] == "worker_rejoined"]
        ones = [e["t"] for e in events if e["event"] == "iteration" and e["worker"] == 1]
        return bool(rejoined) and len(ones) > 25 and sum(t > rejoined[0] for t in ones) > 10 \
            and backend.recorder.time_to_target_s is not None

    stream = io.StringIO()
    cfg = ray_config("optimizer.lr=0.02", "run.target_accuracy=0.9", "run.stop_at_target=false",
                     "run.max_time_s=9", "backend.worker_timeout_s=2", SERVER_PATH)
    _, summary = run_backend(cfg, stop_once(back, stream, stop), stream)
    assert summary["time_to_target_s"] is not None  # the run reached its target through it all
    assert stopped and [f["worker"] for f in summary["failures"]] == [1], summary["failures"]
    failure = summary["failures"][0]
    assert "no answer for 2 s" in failure["error"] and failure["t"] - stopped["t"] < 2 + 5
    events = events_of(stream)
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
    events = events_of(stream)
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


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
def test_a_killed_bsp_server_is_replaced_from_the_checkpoint_and_the_run_reaches_its_target(ray_session, tmp_path):
    """kill -9 the only server under BSP: rebuilt from the newest saved state, the run goes on to its target."""
    killed, kill = _kill_server_when(0, lambda b, info: info["iterations"] >= 40 and b.last_checkpoint)
    stream = io.StringIO()
    cfg = ray_config("optimizer.lr=0.02", "run.target_accuracy=0.85", "run.max_time_s=40",
                     "backend.checkpoint_every_s=0.3", SERVER_PATH)
    backend = RayBackend(build_setup(cfg), RunRecorder(stream=stream), lambda info: kill(backend, info),
                         out=tmp_path)
    summary = backend.run()
    assert killed and summary["stop_reason"] == "target_reached", summary["failures"]
    [failure] = summary["failures"]
    assert failure["server"] == 0 and failure["recovered"] and "worker" not in failure
    assert failure["recovered_from"].startswith(("checkpoint ckpt-", "the state evaluated at"))
    assert failure["t"] >= killed["t"] and failure["cutoff"] <= failure["t"]
    assert isinstance(failure["gradients_lost"], int) and failure["gradients_lost"] >= 0
    events = events_of(stream)
    replaced = next(e for e in events if e["event"] == "server_replaced")
    after = {e["worker"] for e in events if e["event"] == "iteration" and e["t"] > replaced["t"]}
    assert after == {0, 1, 2, 3}  # every worker followed the new server
    assert not any(e["event"] == "worker_failed" for e in events)  # nobody blames a worker


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
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
    cfg = ray_config("optimizer.lr=0.02", "run.target_accuracy=0.85", "run.max_time_s=40", "run.eval_every_s=0.5",
                     "backend.checkpoint_every_s=0.3", SERVER_PATH)
    summary = RayBackend(build_setup(cfg), RunRecorder(stream=io.StringIO()), lambda info: None, out=tmp_path).run()
    assert killed and summary["stop_reason"] == "target_reached", summary["failures"]
    [failure] = summary["failures"]
    assert failure["recovered_from"].startswith(("checkpoint ckpt-", "the state evaluated at")), failure


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
def test_a_killed_gssp_group_server_is_replaced_from_a_peer_replica(ray_session):
    """kill -9 one of two GSSP group servers: a warm standby takes over from the other group's replica."""
    killed, kill = _kill_server_when(1, lambda b, info: b.gssp.grouped and info["iterations"] >= 60)

    def recovered(backend, info, events):  # every worker trained on after the replacement, and the target was met
        replaced = [e["t"] for e in events if e["event"] == "server_replaced"]
        after = {e["worker"] for e in events if e["event"] == "iteration" and replaced and e["t"] > replaced[0]}
        return after == {0, 1, 2, 3} and backend.recorder.time_to_target_s is not None

    stream = io.StringIO()
    cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.target_accuracy=0.85",
                     "run.stop_at_target=false", "run.max_time_s=10", "backend.standby_servers=1")
    _, summary = run_backend(cfg, stop_once(recovered, stream, kill), stream)
    assert killed and summary["stop_reason"] == "interrupted" and summary["time_to_target_s"], summary["failures"]
    [failure] = summary["failures"]
    assert failure["server"] == 1 and failure["recovered_from"] == "group 0's replica"
    assert 0 <= failure["gradients_lost"] <= summary["iterations"]
    events = events_of(stream)
    replaced = next(e for e in events if e["event"] == "server_replaced")
    assert replaced["seconds"] < 3  # no process to start: the standby was warm
    assert {e["worker"] for e in events if e["event"] == "iteration" and e["t"] > replaced["t"]} == {0, 1, 2, 3}
    assert summary["exchanges"] > 0


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
def test_two_workers_added_mid_run_train_and_gssp_places_them_by_speed(ray_session):
    """cluster.membership on ray: a 1x and a 4x worker join at 1.5 s; worker 1 leaves at 4 s."""
    def placed(backend, info, events):  # a second and a half after worker 1 left, the joiners placed by speed
        left = [e["t"] for e in events if e["event"] == "worker_left"]
        return bool(left) and info["t"] > left[0] + 1.5 and backend._groups() == [[0, 4], [2, 3, 5]]

    stream = io.StringIO()
    cfg = ray_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.stop_at_target=false",
                     "run.max_time_s=14",
                     "cluster.membership=[{at_s=1.5, add=2, speeds=[1, 4]}, {at_s=4, remove=[1]}]")
    _, summary = run_backend(cfg, stop_once(placed, stream), stream)
    events = events_of(stream)
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

    def back(backend, info, events):
        restarted = [e["t"] for e in events if e["event"] == "worker_restarted"]
        return any(e["event"] == "iteration" and e["worker"] == 2 and e["t"] > restarted[0] for e in events) \
            if restarted else False

    stream = io.StringIO()
    cfg = ray_config("sync.scheme=ssp", "backend.max_restarts=1", "run.target_accuracy=0.99", "run.max_time_s=15")
    _, summary = run_backend(cfg, stop_once(back, stream, fail), stream)
    assert summary["stop_reason"] == "interrupted"  # ended once worker 2 trained again, within the budget
    assert summary["restarts"] == 1 and summary["failures"][0]["restarted"]
    assert "injected failure" in summary["failures"][0]["error"]


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


@pytest.mark.timeout(150)  # a hang fails the test with its stack instead of blocking the suite
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

    _, summary = run_backend(ray_config("backend.cpus_per_worker=0.4", "backend.max_restarts=1"), fail)
    assert summary["stop_reason"] == "target_reached" and summary["restarts"] == 1
    assert len(seen) == 1 and len(seen[0]["bundles"]) == 5 and seen[0]["strategy"] == "PACK"
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


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
        code = proc.wait(timeout=180)  # generous: on a loaded machine Ray's shutdown has taken over 60 s
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, proc.stderr.read().decode()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["iterations"] > 0
    time.sleep(2)
    left = [p for p in tree if Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]]
    assert not left, f"processes left behind: {left}"
