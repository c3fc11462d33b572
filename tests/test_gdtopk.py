"""GDTopK: the density schedule, top-k with error feedback, and exact byte accounting in runs."""

from __future__ import annotations

import pytest
import torch

from shoal.compress import GDTopKSchedule, GradientCodec, make_compressor
from shoal.engine.gradients import TensorSlot
from shoal.runner import train

from conftest import read_jsonl


def test_warmup_shrinks_geometrically_to_the_final_density():
    s = GDTopKSchedule(initial_density=0.25, warmup_epochs=2.0, final_fast=0.004, final_slow=0.016)
    assert s.density(0.0, 1.0, 1.0, 1.0) == pytest.approx(0.25)
    assert s.density(1.0, 1.0, 1.0, 1.0) == pytest.approx((0.25 * 0.004) ** 0.5)
    assert s.density(2.0, 1.0, 1.0, 1.0) == pytest.approx(0.004)
    assert s.density(9.0, 1.0, 1.0, 1.0) == pytest.approx(0.004)


def test_slower_groups_keep_a_higher_final_density():
    s = GDTopKSchedule(final_fast=0.004, final_slow=0.016)
    assert s.final_density(0.05, 0.05, 0.4) == pytest.approx(0.004)
    assert s.final_density(0.4, 0.05, 0.4) == pytest.approx(0.016)
    # 2x and 4x of a 1x..8x range sit a third and two thirds of the way (log scale)
    assert s.final_density(0.1, 0.05, 0.4) == pytest.approx(0.008)
    assert s.final_density(0.2, 0.05, 0.4) == pytest.approx(0.012)


def test_topk_keeps_the_largest_magnitudes_and_counts_values_and_indices():
    topk = make_compressor("gdtopk")
    x = torch.tensor([0.1, -5.0, 0.3, 4.0, -0.2, 0.0, 1.0, -2.0])
    payload = topk.compress(x, density=0.25)
    assert payload.nbytes == 2 * (4 + 4)
    assert torch.equal(topk.decompress(payload), torch.tensor([0, -5.0, 0, 4.0, 0, 0, 0, 0]))


def test_error_feedback_never_loses_gradient_mass():
    layout = [TensorSlot("w", (4, 5), 0, 20), TensorSlot("b", (5,), 20, 5)]
    codec = GradientCodec(make_compressor("topk"), layout, error_feedback=True)
    gen = torch.Generator().manual_seed(0)
    total_in, total_sent = torch.zeros(25), torch.zeros(25)
    for _ in range(10):
        g = torch.randn(25, generator=gen)
        sent, nbytes = codec.encode(g, density=0.1)
        total_in += g
        total_sent += sent
        assert nbytes == 8 * (2 + 1)  # ceil(0.1 * 20) + ceil(0.1 * 5) values, 4 B value + 4 B index each
    residual = torch.cat([codec.memory.residuals["w"], codec.memory.residuals["b"]])
    assert torch.allclose(total_sent + residual, total_in, atol=1e-5)


def test_gssp_gdtopk_uploads_exactly_what_it_sends(fast_config, tmp_path):
    cfg = fast_config("sync.scheme=gssp", "compression.method=gdtopk", "cluster.speeds=[1, 1, 4, 4]",
                      "run.max_time_s=2", "run.stop_at_target=false", "compression.gdtopk.warmup_epochs=0.5")
    summary = train(cfg, tmp_path / "r")
    dense = 4 * summary["params"] * summary["iterations"]
    assert summary["bytes_up"] < dense / 5
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    densities = [e["densities"] for e in events if e["event"] == "densities"]
    assert densities[0][0] == pytest.approx(0.25)  # warm-up starts dense-ish
    fast, slow = densities[-1]
    assert fast == pytest.approx(0.004) and slow == pytest.approx(0.015)


def test_cost_mode_counts_nominal_topk_bytes(fast_config, tmp_path):
    summary = train(fast_config("backend.mode=cost", "compression.method=topk", "compression.density=0.01",
                                "run.max_iterations=10"), tmp_path / "r")
    # mlp 64->32->10: tensors of 2048, 32, 320, 10 values keep 21, 1, 4, 1
    assert summary["bytes_up"] == 10 * 8 * (21 + 1 + 4 + 1)
