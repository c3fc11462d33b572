"""Streaming DiLoCo (sync/streaming.py, backends/sim/overlap.py) and the int8/fp4 quantisers of its outer gradients."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shoal.backends.local_model import LocalModel
from shoal.backends.sim import SimBackend
from shoal.compress.quantize import BLOCK, FP4, Int8
from shoal.config import ConfigError, load_config
from shoal.engine.metrics import RunRecorder
from shoal.engine.replica import Replica
from shoal.engine.setup import build_setup
from shoal.engine.gradients import TensorSlot
from shoal.sync.streaming import (FragmentSchedule, StreamingDiLoCo, assign_fragments, equal_fragments, mean_cosine,
                                  split_at_fragments)

from conftest import FAST, ROOT

pytestmark = pytest.mark.timeout(120)


def run_sim(*overrides: str) -> SimBackend:
    cfg = load_config(None, FAST + ["run.stop_at_target=false", *overrides])
    errors: list[dict] = []
    recorder = RunRecorder(listener=lambda kind, fields: errors.append(fields) if kind == "internal_error" else None)
    backend = SimBackend(build_setup(cfg), recorder)
    backend.run()
    assert not errors, errors[0]["traceback"]
    return backend


# -- fragments and turns ------------------------------------------------------------------------


def test_contiguous_fragments_hold_about_equal_shares_in_model_order():
    assert assign_fragments(list("abcdef"), [10, 10, 10, 10, 10, 10], 3) == (0, 0, 1, 1, 2, 2)
    assert assign_fragments(list("abc"), [1000, 1, 1], 3) == (0, 1, 2)  # every fragment gets a tensor


def test_a_layer_pattern_strides_the_layers_and_puts_the_rest_in_the_smallest_fragment():
    names = ["embed", "blocks.0.w", "blocks.1.w", "blocks.2.w", "blocks.3.w", "head"]
    fragments = assign_fragments(names, [5, 10, 10, 10, 10, 1], 2, r"blocks\.(\d+)\.")
    assert fragments == (0, 0, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="leaves fragment"):
        assign_fragments(["blocks.0.w", "blocks.2.w"], [1, 1], 2, r"blocks\.(\d+)\.")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.data())
def test_every_tensor_is_synchronised_exactly_once_per_period(local_steps, data):
    fragments = data.draw(st.integers(1, local_steps))
    tensors = data.draw(st.integers(fragments, fragments + 6))
    fragment_of = assign_fragments([f"t{i}" for i in range(tensors)], [1] * tensors, fragments)
    schedule = FragmentSchedule(fragment_of, local_steps, fragments)
    start = data.draw(st.integers(0, 3 * local_steps))
    counts = [0] * tensors
    for clock in range(start, start + local_steps):
        for i, sent in enumerate(schedule.plan(clock)):
            counts[i] += sent
    assert counts == [1] * tensors
    assert sum(schedule.fragment_at(c) is not None for c in range(local_steps)) == fragments


def slots(numels: list[int]) -> list[TensorSlot]:
    offsets = [sum(numels[:i]) for i in range(len(numels))]
    return [TensorSlot(f"t{i}", (n,), o, n) for i, (n, o) in enumerate(zip(numels, offsets))]


def test_split_fragments_cut_the_tensors_a_boundary_falls_inside():
    layout = split_at_fragments(slots([10, 70, 20]), 4)  # boundaries at 25, 50, 75: all inside t1
    assert [(s.name, s.offset, s.numel) for s in layout] == [
        ("t0", 0, 10), ("t1[0:15]", 10, 15), ("t1[15:40]", 25, 25), ("t1[40:65]", 50, 25), ("t1[65:70]", 75, 5),
        ("t2", 80, 20)]
    assert equal_fragments([s.offset for s in layout], [s.numel for s in layout], 4) == (0, 0, 1, 2, 3, 3)
    assert split_at_fragments(slots([5, 5]), 2) == tuple(slots([5, 5]))  # a boundary between tensors: no cut
    with pytest.raises(ValueError, match="crosses a fragment boundary"):
        equal_fragments([0, 10], [10, 10], 3)
    with pytest.raises(ValueError, match="at least 3 parameter values"):
        equal_fragments([0], [2], 3)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=8), st.integers(1, 8), st.integers(1, 16))
def test_split_fragments_cover_every_value_once_a_period_in_equal_shares(numels, fragments, local_steps):
    """Every value is in exactly one piece, pieces keep model order, each fragment holds total / P values
    (within one), and over any period every piece is synchronised exactly once."""
    assume(fragments <= min(sum(numels), local_steps))
    layout = split_at_fragments(slots(numels), fragments)
    assert [s.offset for s in layout] == [sum(s.numel for s in layout[:i]) for i in range(len(layout))]
    assert sum(s.numel for s in layout) == sum(numels) and len(layout) <= len(numels) + fragments - 1
    fragment_of = equal_fragments([s.offset for s in layout], [s.numel for s in layout], fragments)
    sizes = [sum(s.numel for s, f in zip(layout, fragment_of) if f == p) for p in range(fragments)]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) == -(-sum(numels) // fragments)
    schedule = FragmentSchedule(fragment_of, local_steps, fragments)
    counts = [0] * len(layout)
    for clock in range(local_steps, 2 * local_steps):
        for i, sent in enumerate(schedule.plan(clock)):
            counts[i] += sent
    assert counts == [1] * len(layout)


def test_turns_are_staggered_and_one_fragment_is_diloco():
    assert FragmentSchedule(range(4), 8, 4).offsets == (2, 4, 6, 0)
    one = FragmentSchedule([0, 0], 8, 1)
    assert [c for c in range(24) if any(one.plan(c))] == [7, 15, 23]


def test_least_similar_first_orders_each_period_by_the_last_measured_agreement():
    """H = 8, four fragments of one 2-value tensor each, two workers whose changes are 0, 180, 60 and 120
    degrees apart: each change's cosine with their mean is 1, 0, 0.87 and 0.5, so after the staggered
    period 0, period 1 takes fragments 1, 3, 2, 0; every period covers each fragment once."""
    schedule = FragmentSchedule(range(4), 8, 4, order="least_similar")
    slices = [slice(2 * i, 2 * i + 2) for i in range(4)]
    apart = {0: 0.0, 1: math.pi, 2: math.pi / 3, 3: 2 * math.pi / 3}
    for clock in range(8):
        fragment = schedule.fragment_at(clock)
        if fragment is not None:
            changes = [torch.zeros(8), torch.zeros(8)]
            changes[0][slices[fragment]] = torch.tensor([1.0, 0.0])
            changes[1][slices[fragment]] = torch.tensor([math.cos(apart[fragment]), math.sin(apart[fragment])])
            schedule.on_round(clock, changes, slices)
    assert [round(v, 3) for v in schedule.similarity] == [1.0, 0.0, 0.866, 0.5]
    assert schedule.orders == [(0, 1, 2, 3), (1, 3, 2, 0)]
    assert [schedule.fragment_at(c) for c in range(8, 16)] == [None, 1, None, 3, None, 2, None, 0]
    assert mean_cosine([torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])]) == pytest.approx(1.0)


def test_least_similar_first_trains_and_keeps_covering_every_fragment():
    backend = run_sim("sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=8",
                      "sync.streaming_diloco.fragments=4", "sync.streaming_diloco.fragment_order=least_similar",
                      "model.hidden=[32,32,32]", "run.max_iterations=200")
    schedule = backend.servers[0].schedule
    assert len(schedule.orders) >= 5 and all(sorted(order) == [0, 1, 2, 3] for order in schedule.orders)
    assert any(order != (0, 1, 2, 3) for order in schedule.orders[1:])  # the measured agreement reorders them
    assert backend.recorder.evals[-1]["accuracy"] > 0.5


def test_a_worker_waits_only_for_the_fragment_it_is_about_to_take():
    """H = 8, 4 fragments (turns after steps 2, 4, 6, 8), overlap 1: before step k a worker needs the rounds
    that ended at step k - 1 - 1 or earlier."""
    policy = StreamingDiLoCo([0, 1], FragmentSchedule(range(4), 8, 4, overlap=1))
    thresholds = []
    for _ in range(10):
        thresholds.append(policy.start_threshold(0))
        policy.on_push(0)
    assert thresholds == [0, 0, 0, 2, 2, 4, 4, 6, 6, 8]
    assert policy.is_sync(1) and not policy.is_sync(2) and policy.is_sync(7)


# -- the outer step and the data path ------------------------------------------------------------


def test_the_outer_step_on_one_fragment_is_that_fragments_own_nesterov_optimizer():
    torch.manual_seed(0)
    start = torch.randn(10)
    replica = Replica(start, torch.zeros(0), load_config(None, FAST).optimizer, outer=(0.7, 0.9))
    halves = [slice(0, 4), slice(4, 10)]
    own = [torch.nn.Parameter(start[sl].clone()) for sl in halves]
    optimizers = [torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True) for p in own]
    for step in range(6):
        f = step % 2
        delta = torch.zeros(10)
        delta[halves[f]] = torch.randn(halves[f].stop - halves[f].start)
        replica.add_delta([delta], 1.0, only=[halves[f]])
        own[f].grad = -delta[halves[f]]
        optimizers[f].step()
    assert torch.allclose(replica.params.detach(), torch.cat([p.detach() for p in own]), atol=1e-6)


def test_one_fragment_without_overlap_is_diloco_bit_for_bit():
    common = ["cluster.workers=3", "cluster.speeds=[1,2,3]", "run.max_iterations=60"]
    diloco = run_sim(*common, "sync.scheme=diloco", "sync.diloco.local_steps=4")
    streaming = run_sim(*common, "sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=4",
                        "sync.streaming_diloco.fragments=1", "sync.streaming_diloco.overlap_steps=0")
    assert torch.equal(diloco.model_state()[0], streaming.model_state()[0])
    assert streaming.recorder.bytes_up == diloco.recorder.bytes_up


@pytest.mark.parametrize("split", [False, True])
def test_overlapped_outer_steps_apply_the_change_of_the_step_that_sent_it(split):
    """Two workers, H = 4, two fragments (whole tensors: fc1.weight at steps 2, 6, 10, the rest at 4, 8, 12;
    split: the first and second half of the flat parameters), overlap 1, mixing 0.5: replayed with LocalModel
    and one torch Nesterov optimizer per fragment, the server's model after 12 steps each is exactly the
    simulator's."""
    opts = ["sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=4", "sync.streaming_diloco.fragments=2",
            "sync.streaming_diloco.overlap_steps=1", "sync.streaming_diloco.mixing=0.5", "cluster.workers=2",
            "cluster.speeds=[1,1]", "run.max_iterations=24", "optimizer.momentum=0",
            f"sync.streaming_diloco.split_tensors={str(split).lower()}"]
    backend = run_sim(*opts)
    setup = build_setup(load_config(None, FAST + ["run.stop_at_target=false", *opts]))
    layout = setup.engine.layout
    total = sum(s.numel for s in layout)
    if split:
        layout = split_at_fragments(layout, 2)
        fragment_of = equal_fragments([s.offset for s in layout], [s.numel for s in layout], 2)
    else:
        fragment_of = assign_fragments([s.name for s in layout], [s.numel for s in layout], 2)
        assert fragment_of == (0, 1, 1, 1)
    slices = [slice(s.offset, s.offset + s.numel) for s in layout]
    if split:
        assert [sl for sl, f in zip(slices, fragment_of) if f == 0][-1].stop == total // 2
    params, buffers = setup.engine.initial_state()
    owned = [[sl for sl, f in zip(slices, fragment_of) if f == p] for p in range(2)]
    outer = [torch.nn.Parameter(torch.cat([params[sl] for sl in owned[p]])) for p in range(2)]
    optimizers = [torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True) for p in outer]
    workers = [LocalModel(params, buffers, setup.cfg.optimizer, layout) for _ in range(2)]
    sent_at: dict[int, int] = {}  # fragment -> the step whose result is due
    for step in range(12):
        for fragment, sent in list(sent_at.items()):
            if step == sent + 2:  # overlap 1: sent after step s, taken before step s + 2
                value = global_params(params, owned[fragment], outer[fragment])
                for local in workers:
                    local.pull(value, [f == fragment for f in fragment_of], mixing=0.5)
                del sent_at[fragment]
        for w, local in enumerate(workers):
            x, y = setup.streams[w].next()
            local.step(setup.engine.gradient(local.params, buffers, x, y)[0])
        if (step + 1) % 2 == 0:
            fragment = 0 if (step + 1) % 4 == 2 else 1
            mean = sum(torch.cat([local.change()[sl] for sl in owned[fragment]]) for local in workers) / 2
            outer[fragment].grad = -mean
            optimizers[fragment].step()
            sent_at[fragment] = step
            params = global_params(params, owned[fragment], outer[fragment])
    assert torch.allclose(backend.model_state()[0], params, atol=1e-6)


def global_params(params: torch.Tensor, owned: list[slice], values: torch.Tensor) -> torch.Tensor:
    """``params`` with the fragment's slices replaced by the flat ``values``."""
    out, at = params.clone(), 0
    for sl in owned:
        n = sl.stop - sl.start
        out[sl] = values.detach()[at:at + n]
        at += n
    return out


def test_overlap_hides_the_exchange_behind_the_next_steps():
    """A slow link (0.05 Gbit/s): an exchange takes most of a step; overlapped with the next step, over 80% of
    the time the exchanges cost (the run's time beyond its compute) disappears."""
    common = ["sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=8",
              "sync.streaming_diloco.fragments=2", "cluster.link_gbps=0.05", "cluster.server_gbps=0.05", "run.max_iterations=160", "run.eval_every_s=100"]
    waiting = run_sim(*common, "sync.streaming_diloco.overlap_steps=0")
    overlapped = run_sim(*common, "sync.streaming_diloco.overlap_steps=1")
    compute = max(s.compute_s for s in waiting.stats)
    assert waiting.env.now - compute > 0.05  # the exchanges cost time when waited for
    assert overlapped.env.now - compute < 0.2 * (waiting.env.now - compute), (overlapped.env.now, waiting.env.now)
    assert overlapped.recorder.bytes_up == waiting.recorder.bytes_up


def test_fragments_cut_the_peak_upload_and_fp4_cuts_the_bytes():
    common = ["sync.streaming_diloco.local_steps=8", "model.hidden=[32,32,32]", "run.max_iterations=96"]
    diloco = run_sim(*common, "sync.scheme=diloco", "sync.diloco.local_steps=8")
    streaming = run_sim(*common, "sync.scheme=streaming_diloco", "sync.streaming_diloco.fragments=4")
    fp4 = run_sim(*common, "sync.scheme=streaming_diloco", "sync.streaming_diloco.fragments=4",
                  "sync.streaming_diloco.outer_quantization=fp4")
    whole = run_sim(*common, "sync.scheme=streaming_diloco", "sync.streaming_diloco.fragments=4",
                    "sync.streaming_diloco.split_tensors=false")
    peak = max(s.peak_push_bytes for s in diloco.stats)
    assert max(s.peak_push_bytes for s in streaming.stats) == math.ceil(peak / 4 / 4) * 4  # a quarter, to the value
    assert max(s.peak_push_bytes for s in whole.stats) > 0.3 * peak  # whole tensors: fc1.weight alone is larger
    assert streaming.recorder.bytes_up == whole.recorder.bytes_up == diloco.recorder.bytes_up
    assert fp4.recorder.bytes_up < 0.2 * streaming.recorder.bytes_up
    assert fp4.recorder.evals[-1]["accuracy"] > 0.5


def test_fp4_quantises_the_way_back_too_and_the_server_keeps_what_the_workers_receive():
    """After the first (float32) pull every download is a quantised fragment change; the server's replica is
    its old value plus exactly the change the workers decode, so their bases agree with it bit for bit."""
    common = ["sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=4", "sync.streaming_diloco.fragments=2",
              "sync.streaming_diloco.overlap_steps=0", "cluster.workers=2", "cluster.speeds=[1,1]",
              "run.max_iterations=18"]
    dense = run_sim(*common)
    fp4 = run_sim(*common, "sync.streaming_diloco.outer_quantization=fp4")
    first = 2 * 4 * fp4.setup.engine.num_params
    assert fp4.recorder.bytes_down - first < 0.2 * (dense.recorder.bytes_down - first)
    server = fp4.servers[0].replica.params.detach()
    assert all(torch.equal(local.base, server) for local in fp4.locals)  # after 9 steps every turn was taken


# -- quantisers -------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=200))
def test_int8_and_fp4_round_trip_within_the_formats_error(values):
    x = torch.tensor(values, dtype=torch.float32)
    blocks = torch.nn.functional.pad(x, (0, (-len(x)) % BLOCK)).view(-1, BLOCK).abs().amax(dim=1)
    top = blocks.repeat_interleave(BLOCK)[:len(x)]
    for quantiser, bound in ((Int8(), lambda m: m / 254), (FP4(), None)):
        payload = quantiser.compress(x, 1.0)
        y = quantiser.decompress(payload)
        assert payload.nbytes == quantiser.nominal_bytes(len(x), 1.0)
        err = (x - y).abs()
        if bound is not None:
            assert torch.all(err <= bound(top) * (1 + 1e-5) + 1e-30)
        else:  # half the gap of E2M1 at the value's magnitude: s/4 below 2s, s/2 below 4s, s above
            s = top / 6
            gap = torch.where(x.abs() < 2 * s, s / 4, torch.where(x.abs() < 4 * s, s / 2, s))
            assert torch.all(err <= gap * (1 + 1e-5) + 1e-30)
        assert torch.all(torch.sign(y) * torch.sign(x) >= 0)  # never the wrong sign


def test_the_quantisers_send_what_the_formats_say():
    x = torch.randn(100)
    assert Int8().compress(x, 1.0).nbytes == 4 * 4 + 100
    assert FP4().compress(x, 1.0).nbytes == 4 * 4 + 50
    exact = torch.tensor([0.0, 0.5, -1.0, 1.5, 2.0, -3.0, 4.0, 6.0])
    assert torch.equal(FP4().decompress(FP4().compress(exact, 1.0)), exact)  # the grid points travel exactly


# -- configuration and the CLI -------------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("sync.streaming_diloco.fragments=9", "must not exceed local_steps"),
    ("sync.streaming_diloco.overlap_steps=2", "overlap_steps (2) must be at most 1"),
    ("sync.streaming_diloco.fragment_pattern='blocks'", "needs a group"),
    ("sync.streaming_diloco.outer_quantization=fp8", "outer_quantization"),
])
def test_impossible_streaming_settings_are_one_clear_line(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, FAST + ["sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=8",
                                  "sync.streaming_diloco.fragments=4", override])


def test_streaming_diloco_from_the_cli_records_its_peak_upload(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "shoal", "train", "--config", str(ROOT / "examples/demo.toml"),
                           "--set", "sync.scheme=streaming_diloco", "--set", "sync.streaming_diloco.local_steps=8",
                           "--set", "run.max_time_s=3", "--out", str(out)], capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scheme"] == "streaming_diloco" and summary["peak_push_bytes"] > 0
    assert all(w["peak_push_bytes"] <= summary["peak_push_bytes"] for w in summary["per_worker"])
    bad = subprocess.run([sys.executable, "-m", "shoal", "train", "--config", str(ROOT / "examples/demo.toml"),
                          "--set", "sync.scheme=streaming_diloco", "--set", "sync.streaming_diloco.overlap_steps=99",
                          "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=100)
    assert bad.returncode == 2 and "overlap_steps" in bad.stderr and "Traceback" not in bad.stderr
    # known only once the model is built: more whole-tensor fragments than LeNet-5 has tensors
    uncovered = subprocess.run([sys.executable, "-m", "shoal", "train", "--config", str(ROOT / "examples/demo.toml"),
                                "--set", "sync.scheme=streaming_diloco", "--set", "sync.streaming_diloco.fragments=16",
                                "--set", "sync.streaming_diloco.split_tensors=false", "--out", str(tmp_path / "bad2")],
                               capture_output=True, text=True, timeout=100)
    assert uncovered.returncode == 2 and "Traceback" not in uncovered.stderr
    assert uncovered.stderr.strip() == ("error: sync.streaming_diloco: 16 fragments but the model has only 10 "
                                        "parameter tensors")
    assert not (tmp_path / "bad2").exists()


def test_an_overlapped_exchange_takes_the_time_of_the_bytes_it_accounts():
    """Compute next to nothing on a slow link, so the exchanges (upload, then download) are the run's time: with
    fp4 both ways each value costs 0.625 bytes each way instead of 4, and the overlapped download is charged
    the quantised bytes it records too (a float32 download would leave fp4 at about 0.6x float32's time)."""
    common = ["sync.scheme=streaming_diloco", "sync.streaming_diloco.local_steps=8", "sync.streaming_diloco.fragments=2",
              "sync.streaming_diloco.overlap_steps=1", "cluster.compute_s=0.0001", "cluster.link_gbps=0.005",
              "cluster.server_gbps=0.005", "run.max_iterations=160", "run.eval_every_s=100"]
    dense = run_sim(*common)
    fp4 = run_sim(*common, "sync.streaming_diloco.outer_quantization=fp4")
    assert fp4.recorder.bytes_down < 0.5 * dense.recorder.bytes_down
    assert fp4.env.now < 0.3 * dense.env.now, (fp4.env.now, dense.env.now)


def test_the_dry_run_states_the_fragments_and_the_share_of_the_largest_upload():
    def plan(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "shoal", "train", "--config", str(ROOT / "examples/demo.toml"),
                               "--set", "sync.scheme=streaming_diloco", "--set", "sync.streaming_diloco.local_steps=8",
                               *extra, "--dry-run"], capture_output=True, text=True, timeout=100)
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if line.startswith("plan: "))

    split = plan()
    assert split == ("plan: 4 fragments of 15,426, 15,427, 15,426, 15,427 values, synchronised after local steps "
                     "2, 4, 6, 8 of every 8 (staggered), overlap 1; the largest upload is 0.250 of the model")
    whole = plan("--set", "sync.streaming_diloco.split_tensors=false")
    assert whole.endswith("is 0.820 of the model")  # whole tensors: LeNet-5's first linear layer is most of it
