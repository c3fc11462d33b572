"""shoal.ddp: shoal's compressors as DDP communication hooks, on a real 2-process DDP job (gloo, loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT

#: one rank of a 2-process DDP job: MLP on digits; with --check, one step compared with shoal's own codec
JOB = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, sys.argv[1])
    import shoal.ddp
    from shoal.compress.codec import worker_codec
    from shoal.config import CompressionConfig
    from shoal.data import load_dataset
    from shoal.engine.gradients import GradientEngine

    rank, port, method, mode, out = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{port}", rank=rank, world_size=2)
    ds = load_dataset("digits", seed=0, test_fraction=0.2)
    x, y = ds.x_train.reshape(len(ds.y_train), -1), ds.y_train
    loss_fn = nn.CrossEntropyLoss()
    mine = slice(rank * 700, rank * 700 + 700)

    def hooked(method):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        model = DDP(net)
        return net, model, shoal.ddp.register(model, method=method, density=0.1) if method != "none" else None

    if mode == "check":  # one step per method: DDP's averaged gradient against shoal's codec on each rank's own
        result = {}
        xb, yb = x[mine][:64], y[mine][:64]
        for name in method.split(","):
            net, model, state = hooked(name)
            reference = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
            reference.load_state_dict(net.state_dict())
            engine = GradientEngine(reference)
            grad, _, _ = engine.gradient(*engine.initial_state(), xb, yb)
            codec = worker_codec(CompressionConfig(method=name, density=0.1), 0, rank, engine.layout)
            sent, nbytes = codec.encode(grad, 0.1)
            both = [torch.zeros_like(sent) for _ in range(2)]
            dist.all_gather(both, sent)
            loss_fn(model(xb), yb).backward()
            ddp_grad = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
            result[name] = {"max_diff": float((ddp_grad - (both[0] + both[1]) / 2).abs().max()), "bytes": nbytes,
                            "hook_bytes": state.bytes_sent}
    else:  # train 30 epochs of 700 samples per rank, batch 50; then round-trip the hook's state
        net, model, state = hooked(method)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for epoch in range(30):
            for i in range(0, 700, 50):
                opt.zero_grad()
                loss_fn(model(x[mine][i:i + 50]), y[mine][i:i + 50]).backward()
                opt.step()
        xt, yt = ds.x_test.reshape(len(ds.y_test), -1), ds.y_test
        with torch.no_grad():
            accuracy = float((net(xt).argmax(1) == yt).float().mean())
        result = {"accuracy": accuracy}
        if state is not None:
            saved = state.state_dict()
            again = shoal.ddp.make_state(net.named_parameters(), method, 0.1)
            again.load_state_dict(saved)
            result |= {"sent": state.bytes_sent, "dense": state.bytes_dense,
                       "round_trip": all(torch.equal(saved[k], v) for k, v in again.state_dict().items())
                       and saved.keys() == again.state_dict().keys()}
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()  # neither rank tears gloo down while the other still talks to it
    dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown: gloo threads of several DDP models can abort it (a test job only)
''')


def run_job(tmp_path: Path, method: str, mode: str) -> list[dict]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    rendezvous = str(tmp_path / "rendezvous")  # a file, not a port: nothing to race for; gloo on loopback
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, str(script), str(ROOT / "src"), str(r), rendezvous, method, mode,
                               str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


METHODS = ("topk", "dgc", "fp16", "qsgd", "randk", "signsgd", "powersgd")


@pytest.mark.timeout(300)
def test_a_hooked_ddp_step_averages_what_shoals_codec_sends_on_each_rank(tmp_path):
    for rank in run_job(tmp_path, ",".join(METHODS), "check"):
        assert set(rank) == set(METHODS)
        for method, result in rank.items():
            assert result["max_diff"] < 1e-6, (method, result)
            assert result["hook_bytes"] == result["bytes"], method  # the same payloads, counted the same


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_with_topk_hooks_trains_as_well_as_without_sending_a_tenth(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "topk").mkdir()
    plain = run_job(tmp_path / "plain", "none", "train")
    hooked = run_job(tmp_path / "topk", "topk", "train")
    assert abs(hooked[0]["accuracy"] - plain[0]["accuracy"]) <= 0.01, (hooked, plain)
    assert hooked[0]["accuracy"] == hooked[1]["accuracy"]  # the ranks stay in sync
    ratio = hooked[0]["sent"] / hooked[0]["dense"]
    assert 0.15 < ratio < 0.25, ratio  # values and int32 indices of 10%: 20% of dense
    assert hooked[0]["round_trip"] and hooked[1]["round_trip"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_documented_example_runs(tmp_path):
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "WORLD_SIZE": "2"}
    args = [sys.executable, str(ROOT / "examples" / "ddp_hooks.py"), "--epochs", "2", "--init",
            f"file://{tmp_path / 'rendezvous'}"]
    procs = [subprocess.Popen(args, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    outs = [proc.communicate(timeout=180) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outs
    assert outs[0][0].startswith("topk: test accuracy") and "dense (20." in outs[0][0]
