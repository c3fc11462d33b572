"""The batched simulator (engine/batched.py, backends/sim/lazy.py): every pending worker's gradient in one vmapped
call equals the loop's (float64: within 1e-10), batch-norm running statistics included; a model vmap cannot take
falls back to the loop; a batched run matches the loop run per scheme and reruns bit for bit."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import FAST
from shoal.backends.sim.lazy import LazyGradients
from shoal.config import load_config
from shoal.engine.batched import BatchedGradients, Request
from shoal.engine.gradients import GradientEngine, worker_seed
from shoal.engine.task import DEFAULT_TASK, Task, cross_entropy, cross_entropy_per_sample, mse, mse_per_sample
from shoal.models import MODELS as BUILT_IN, build_model
from shoal.runner import train

pytestmark = pytest.mark.timeout(120)

MODELS = {  # name: (input shape, classes, options, a batch of inputs)
    "mlp": ((1, 8, 8), 10, {}, lambda g: torch.randn(4, 1, 8, 8, generator=g, dtype=torch.float64)),
    "lenet5": ((1, 28, 28), 10, {}, lambda g: torch.randn(4, 1, 28, 28, generator=g, dtype=torch.float64)),
    "resnet18": ((3, 16, 16), 4, {"width": 2}, lambda g: torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64)),
    "vgg11": ((3, 8, 8), 4, {}, lambda g: torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)),
    "transformer": ((8,), 32, {"layers": 1, "width": 16, "heads": 2},
                    lambda g: torch.randint(0, 32, (4, 8), generator=g)),
}


def engine_for(name: str) -> tuple[GradientEngine, torch.Generator]:
    shape, classes, options, _ = MODELS[name]
    torch.manual_seed(0)
    model = build_model(name, shape, classes, hidden=[16] if name == "mlp" else None, options=options)
    return GradientEngine(model.double(), DEFAULT_TASK), torch.Generator().manual_seed(1)


def requests_for(name: str, engine: GradientEngine, gen: torch.Generator, workers: int) -> list[Request]:
    """``workers`` requests at different parameters and buffers, each with its own batch."""
    params, buffers = engine.initial_state()
    shape, classes, _, inputs = MODELS[name]
    out = []
    for w in range(workers):
        x = inputs(gen)
        y = torch.randint(0, classes, (4, 8) if name == "transformer" else (4,), generator=gen)
        out.append(Request(params + 0.05 * torch.randn(params.shape, generator=gen, dtype=params.dtype),
                           buffers + 0.1 * w, x, y))
    return out


def test_every_built_in_model_is_checked():
    """``batched = true`` must work on every built-in model: a new one joins MODELS above."""
    assert set(MODELS) == set(BUILT_IN)


def test_the_channels_last_resnet_runs_batched_as_in_the_loop():
    """model.options.channels_last: the batched call (vmap has no NHWC, so it keeps the default layout) gives the
    NHWC loop's gradients (float64: the other order of additions is far below the tolerance)."""
    shape, classes, options, _ = MODELS["resnet18"]
    torch.manual_seed(0)
    model = build_model("resnet18", shape, classes, options={**options, "channels_last": True})
    engine, gen = GradientEngine(model.double(), DEFAULT_TASK), torch.Generator().manual_seed(1)
    requests = requests_for("resnet18", engine, gen, 3)
    loop = [engine.gradient(r.params, r.buffers, r.x, r.y) for r in requests]
    for (grad, delta, loss), (b_grad, b_delta, b_loss) in zip(loop, BatchedGradients(engine).compute(requests)):
        assert torch.allclose(b_grad, grad, rtol=0, atol=1e-10) and torch.allclose(b_delta, delta, rtol=0, atol=1e-10)
        assert b_loss == pytest.approx(loss, abs=1e-10)


@pytest.mark.parametrize("workers", [1, 3, 16])
@pytest.mark.parametrize("name", list(MODELS))
def test_batched_gradients_buffer_changes_and_losses_equal_the_loops(name: str, workers: int):
    engine, gen = engine_for(name)
    requests = requests_for(name, engine, gen, workers)
    loop = [engine.gradient(r.params, r.buffers, r.x, r.y) for r in requests]
    batched = BatchedGradients(engine).compute(requests)
    assert len(batched) == workers
    for (grad, delta, loss), (b_grad, b_delta, b_loss) in zip(loop, batched):
        assert torch.allclose(b_grad, grad, rtol=0, atol=1e-10)
        assert torch.allclose(b_delta, delta, rtol=0, atol=1e-10)
        assert b_loss == pytest.approx(loss, abs=1e-10)
    if name in ("resnet18", "vgg11"):  # the running statistics moved, and the batched path kept the move
        assert all(float(d.abs().max()) > 1e-3 for _, d, _ in batched)


def test_shared_parameters_go_in_once_and_give_what_stacked_ones_give():
    engine, gen = engine_for("resnet18")
    requests = requests_for("resnet18", engine, gen, 3)
    shared = [Request(requests[0].params, r.buffers, r.x, r.y) for r in requests]
    copies = [Request(requests[0].params.clone(), r.buffers, r.x, r.y) for r in requests]
    for (a, da, la), (b, db, lb) in zip(BatchedGradients(engine).compute(shared),
                                        BatchedGradients(engine).compute(copies)):
        assert torch.allclose(a, b, rtol=0, atol=1e-12) and torch.allclose(da, db, rtol=0, atol=1e-12)


def test_batches_of_different_sizes_and_a_call_limit_split_the_calls_not_the_results():
    """A batch-norm layer that is not torch's own cannot leave padding out: there each batch size gets its own
    calls."""
    engine, gen = engine_for("resnet18")
    model = engine.model
    name, norm = next((n, m) for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d))
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, CustomNorm(norm.num_features).double())
    engine = GradientEngine(model, DEFAULT_TASK)
    requests = requests_for("resnet18", engine, gen, 5)
    requests[1] = Request(requests[1].params, requests[1].buffers, requests[1].x[:2], requests[1].y[:2])
    batcher = BatchedGradients(engine, limit=2)
    assert not batcher.pads
    results = batcher.compute(requests)
    assert batcher.calls == 3 and batcher.largest == 2  # sizes 4 (four: two calls) and 2 (one)
    for r, (grad, delta, loss) in zip(requests, results):
        expected, expected_delta, expected_loss = engine.gradient(r.params, r.buffers, r.x, r.y)
        assert torch.allclose(grad, expected, rtol=0, atol=1e-10) and loss == pytest.approx(expected_loss)
        assert torch.allclose(delta, expected_delta, rtol=0, atol=1e-10)


class CustomNorm(nn.BatchNorm2d):
    """A user's batch norm with a forward of its own (here torch's, unchanged)."""

    def forward(self, x):
        return super().forward(x)


@pytest.mark.parametrize("name", ["mlp", "lenet5", "transformer", "resnet18", "vgg11"])
def test_unequal_batches_share_one_padded_call_and_give_the_loops_gradients(name: str):
    """Balanced batches differ per worker: padded to the largest, the padding weighted 0 in the mean of the
    per-sample losses and left out of batch norm's statistics, every worker's gradient, loss and running
    statistics are its own unpadded batch's."""
    engine, gen = engine_for(name)
    requests = requests_for(name, engine, gen, 4)
    # at least 3 samples each: batch norm over 2 values (VGG's last layers are 1x1) amplifies float rounding to 1e-8
    for i, size in enumerate((4, 3, 4, 3)):
        r = requests[i]
        requests[i] = Request(r.params, r.buffers, r.x[:size], r.y[:size])
    batcher = BatchedGradients(engine)
    assert batcher.pads
    results = batcher.compute(requests)
    assert batcher.calls == 1 and batcher.largest == 4
    for r, (grad, delta, loss) in zip(requests, results):
        expected, expected_delta, expected_loss = engine.gradient(r.params, r.buffers, r.x, r.y)
        assert torch.allclose(grad, expected, rtol=0, atol=1e-10) and loss == pytest.approx(expected_loss, abs=1e-10)
        assert torch.allclose(delta, expected_delta, rtol=0, atol=1e-10)
    if name in ("resnet18", "vgg11"):  # the running statistics moved, by the real samples' statistics alone
        assert all(float(d.abs().max()) > 1e-3 for _, d, _ in results)


def test_a_users_loss_gives_only_its_mean_so_unequal_batches_are_not_padded():
    engine, _ = engine_for("mlp")
    engine.task = Task(lambda output, target: torch.nn.functional.cross_entropy(output, target))
    assert not BatchedGradients(engine).pads


@pytest.mark.parametrize("loss, per_sample", [(cross_entropy, cross_entropy_per_sample), (mse, mse_per_sample)])
@pytest.mark.parametrize("shape, target", [((5, 7), (5,)), ((5, 3, 7), (5, 3))])
def test_the_mean_of_the_per_sample_losses_is_the_loss(loss, per_sample, shape, target):
    gen = torch.Generator().manual_seed(0)
    output = torch.randn(shape, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 7, target, generator=gen) if loss is cross_entropy else torch.randn(shape, generator=gen)
    assert per_sample(output, labels).shape == (5,)
    assert float(per_sample(output, labels).mean()) == pytest.approx(float(loss(output, labels)), abs=1e-12)


def test_a_call_out_of_memory_is_retried_in_halves_and_the_limit_stays_halved(monkeypatch):
    engine, gen = engine_for("mlp")
    requests = requests_for("mlp", engine, gen, 6)
    batcher = BatchedGradients(engine, limit=4)  # 4 runs out of memory: 2, 2 and 2
    real = batcher._call

    def small_memory(chunk: list[Request]):
        if len(chunk) > 2:
            raise torch.OutOfMemoryError("out of memory")
        return real(chunk)

    monkeypatch.setattr(batcher, "_call", small_memory)
    results = batcher.compute(requests)
    assert batcher.limit == 2 and batcher.calls == 3 and batcher.largest == 2
    for r, (grad, _, _) in zip(requests, results):
        assert torch.allclose(grad, engine.gradient(r.params, r.buffers, r.x, r.y)[0], rtol=0, atol=1e-10)


class Reads(nn.Module):
    """A model vmap cannot take: its forward reads a value out of a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * (2.0 if float(x.sum().item()) > 0 else 1.0)


def test_a_model_vmap_cannot_take_falls_back_to_the_loop_and_says_why():
    engine = GradientEngine(Reads())
    params, buffers = engine.initial_state()
    lazy = LazyGradients(engine, batched=True)
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    taken = [lazy.request(w, params + w, buffers, x, y) for w in range(2)]
    results = [take() for take in taken]
    assert lazy.summary()["batched"] is False and "item" in lazy.summary()["fallback"]
    for w, (grad, _, loss) in enumerate(results):
        expected, _, expected_loss = engine.gradient(params + w, buffers, x, y)
        assert torch.equal(grad, expected) and loss == expected_loss


def test_pending_requests_are_computed_together_when_the_first_is_taken():
    engine, gen = engine_for("mlp")
    requests = requests_for("mlp", engine, gen, 3)
    lazy = LazyGradients(engine, batched=True)
    taken = [lazy.request(w, r.params, r.buffers, r.x, r.y) for w, r in enumerate(requests)]
    lazy.drop(1)  # a worker that left: its request is never computed
    taken[2]()
    taken[0]()
    assert lazy.summary() == {"device": "cpu", "batched": True, "calls": 1, "largest_call": 2}


def test_a_request_on_a_local_model_computes_at_the_values_it_was_asked_at():
    """A local model steps in place before the batch is computed: a mutable request keeps its own copy."""
    engine, gen = engine_for("mlp")
    r = requests_for("mlp", engine, gen, 1)[0]
    expected, _, _ = engine.gradient(r.params, r.buffers, r.x, r.y)
    lazy = LazyGradients(engine, batched=True)
    params = r.params.clone()
    take = lazy.request(0, params, r.buffers, r.x, r.y, mutable=True)
    params.add_(1.0)
    assert torch.allclose(take()[0], expected, rtol=0, atol=1e-10)


SCHEMES = {
    "bsp": [], "asp": ["sync.scheme=asp"], "ssp": ["sync.scheme=ssp"], "gssp": ["sync.scheme=gssp"],
    "localsgd": ["sync.scheme=localsgd", "sync.localsgd.local_steps=4"],
    "diloco": ["sync.scheme=diloco", "sync.diloco.local_steps=4"],
    "bsp+sim": ["compression.similarity.enabled=true"],
    "topk": ["compression.method=topk", "compression.density=0.1"],
    "dgc": ["compression.method=dgc", "compression.density=0.1"],
    "powersgd": ["compression.method=powersgd"],
    "streaming_diloco": ["sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=4",
                         "sync.streaming_diloco.fragments=2"],
    "bsp+balance": ["sync.balance=batch"],  # batch sizes differ per worker: padded into shared calls
}


@pytest.mark.slow
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_batched_run_matches_the_loop_run(tmp_path: Path, scheme: str):
    """The same schedule (iterations, bytes: cost does not depend on batching) and, within noise, the same
    curve: gradients differ from the loop's at float rounding, which training then amplifies a little."""
    sets = FAST + ["cluster.speeds=[1, 1, 2, 3]", "run.stop_at_target=false", "run.max_time_s=1.5", *SCHEMES[scheme]]
    loop = train(load_config(None, sets + ["backend.batched=false"]), tmp_path / "loop")
    batched = train(load_config(None, sets + ["backend.batched=true"]), tmp_path / "batched")
    assert loop["batching"] == {"device": "cpu", "batched": False} and batched["batching"]["batched"] is True
    assert batched["batching"]["calls"] > 0
    assert batched["iterations"] == loop["iterations"] and batched["bytes_up"] == loop["bytes_up"]
    assert abs(batched["final_accuracy"] - loop["final_accuracy"]) < 0.05
    again = train(load_config(None, sets + ["backend.batched=true"]), tmp_path / "again")
    assert {k: v for k, v in again.items() if k != "wall_s"} == {k: v for k, v in batched.items() if k != "wall_s"}


def test_auto_is_the_loop_on_the_cpu_and_cuda_where_there_is_none_is_one_clear_line(tmp_path: Path):
    summary = train(load_config(None, FAST + ["run.max_time_s=0.3"]), tmp_path / "auto")
    assert summary["batching"] == {"device": "cpu", "batched": False}
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    sets = [a for s in FAST + ["backend.device=cuda"] for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "shoal", "train", *sets, "--out", str(tmp_path / "cuda")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "backend.device = \"cuda\"" in done.stderr and "sees no CUDA device" in done.stderr
    assert not (tmp_path / "cuda").exists()


def dropout_engine() -> GradientEngine:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))
    return GradientEngine(model.double())


def test_a_seed_decides_a_workers_dropout_masks_and_leaves_the_global_stream_alone():
    engine = dropout_engine()
    params, buffers = engine.initial_state()
    x, y = torch.randn(5, 16, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    before = torch.get_rng_state()
    first = engine.gradient(params, buffers, x, y, seed=worker_seed(7, 1, 3))[0]
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(engine.gradient(params, buffers, x, y, seed=worker_seed(7, 1, 3))[0], first)
    for other in (worker_seed(7, 2, 3), worker_seed(7, 1, 4), worker_seed(8, 1, 3)):
        assert not torch.equal(engine.gradient(params, buffers, x, y, seed=other)[0], first)


def test_a_batched_call_draws_a_mask_per_worker_and_a_rerun_draws_the_same():
    engine = dropout_engine()
    params, buffers = engine.initial_state()
    x, y = torch.randn(5, 16, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    requests = [Request(params, buffers, x, y, worker_seed(0, w, 0)) for w in range(3)]
    grads = [g for g, _, _ in BatchedGradients(engine).compute(requests)]
    assert not torch.equal(grads[0], grads[1]) and not torch.equal(grads[1], grads[2])  # same inputs, own masks
    again = [g for g, _, _ in BatchedGradients(engine).compute(requests)]
    assert all(torch.equal(a, b) for a, b in zip(grads, again))


DROPOUT_PLUGIN = '''
from torch import nn

def build(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, num_classes))

class Reads(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1)) * (2.0 if float(x.sum().item()) > 0 else 1.0)

def reads(input_shape, num_classes):
    return Reads(num_classes)
'''


def run_cli(tmp_path: Path, name: str, sets: list[str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    args = [a for s in FAST + ["run.max_time_s=0.5"] + sets for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "shoal", "train", *args, "--out", str(tmp_path / name)],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads((tmp_path / name / "summary.json").read_text())


def test_a_plugin_model_with_dropout_runs_batched_from_the_cli_and_reruns_bit_for_bit(tmp_path: Path):
    (tmp_path / "plugin.py").write_text(DROPOUT_PLUGIN)
    sets = [f'model.name="python:{tmp_path / "plugin.py"}:build"', "backend.batched=true"]
    _, first = run_cli(tmp_path, "first", sets)
    assert first["batching"]["batched"] is True and "fallback" not in first["batching"]
    again = train(load_config(None, FAST + ["run.max_time_s=0.5"] + sets), tmp_path / "again")  # the API
    assert {k: v for k, v in first.items() if k != "wall_s"} == {k: v for k, v in again.items() if k != "wall_s"}
    loop = train(load_config(None, FAST + ["run.max_time_s=0.5", sets[0], "backend.batched=false"]), tmp_path / "loop")
    assert loop["iterations"] == first["iterations"]  # the schedule does not depend on the masks


def test_a_plugin_model_vmap_cannot_take_says_so_in_one_line_and_trains_in_the_loop(tmp_path: Path):
    (tmp_path / "plugin.py").write_text(DROPOUT_PLUGIN)
    done, summary = run_cli(tmp_path, "run", [f'model.name="python:{tmp_path / "plugin.py"}:reads"',
                                              "backend.batched=true"])
    lines = [line for line in done.stderr.splitlines() if "fall back to the per-worker loop" in line]
    assert len(lines) == 1 and "item" in lines[0] and "Traceback" not in done.stderr
    assert summary["batching"]["batched"] is False and "item" in summary["batching"]["fallback"]
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["reason"] for e in events if e.get("event") == "batching_fallback"] == [summary["batching"]["fallback"]]
    assert summary["iterations"] > 0


@pytest.mark.parametrize("layer, shape", [(nn.BatchNorm1d(3), (5, 3)), (nn.BatchNorm1d(3), (5, 3, 4)),
                                          (nn.BatchNorm2d(3), (5, 3, 4, 4)), (nn.BatchNorm2d(3, affine=False), (5, 3, 2, 2))])
def test_masked_batch_norm_on_a_padded_batch_is_torchs_on_the_real_samples(layer, shape):
    from shoal.engine.masked_norm import MaskedBatchNorm, SampleWeights

    torch.manual_seed(0)
    reference = layer.double().train()
    if reference.affine:
        nn.init.normal_(reference.weight)
        nn.init.normal_(reference.bias)
    weights = SampleWeights()
    masked = MaskedBatchNorm(copy.deepcopy(reference), weights)
    x = torch.randn(shape, dtype=torch.float64)
    padded = torch.cat([x[:3], torch.zeros_like(x[:2])])  # 3 real samples, 2 of padding
    weights.weights = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    out = masked(padded)
    expected = reference(x[:3])
    assert torch.allclose(out[:3], expected, rtol=0, atol=1e-12)
    assert torch.allclose(masked.running_mean, reference.running_mean, rtol=0, atol=1e-12)
    assert torch.allclose(masked.running_var, reference.running_var, rtol=0, atol=1e-12)
    assert int(masked.num_batches_tracked) == int(reference.num_batches_tracked) == 1
