"""The gradient noise scale (engine/noise.py): exact on a small round, unbiased on random ones, and the
iterations it gives for one worker fewer lie between the per-update and per-sample rules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from shoal.engine.noise import NoiseScale, iterations_with_fewer

pytestmark = pytest.mark.timeout(60)


def test_one_round_of_two_workers_solves_for_the_true_norm_and_the_trace():
    """g = (3, 0) and (1, 0), batch 4: mean |g_i|^2 = 5, |mean|^2 = 4, so |G|^2 = 2 * 4 - 5 = 3 and
    tr(Sigma) = 4 * 2 * (5 - 4) = 8: B_noise = 8 / 3."""
    meter = NoiseScale(batch_size=4)
    meter.add([torch.tensor([3.0, 0.0]), torch.tensor([1.0, 0.0])])
    assert meter.true_norm == pytest.approx(3) and meter.trace == pytest.approx(8)
    assert meter.value == pytest.approx(8 / 3)


def test_a_single_gradient_or_no_signal_gives_no_value():
    meter = NoiseScale(batch_size=8)
    meter.add([torch.ones(3)])  # ASP: one gradient per update says nothing about the noise
    assert meter.rounds == 0 and meter.value is None
    meter.add([torch.tensor([1.0]), torch.tensor([-1.0])])  # opposite gradients: the estimated |G|^2 is negative
    assert meter.value is None


@settings(max_examples=10, deadline=None)
@given(workers=st.integers(2, 8), batch=st.sampled_from([1, 4, 16]), sigma=st.floats(0.2, 1.0),
       seed=st.integers(0, 1000))
def test_the_estimate_recovers_the_noise_scale_of_gaussian_gradients(
        workers: int, batch: int, sigma: float, seed: int):
    """Per-sample gradients G + N(0, sigma^2 I) in d dimensions: B_noise = d sigma^2 / |G|^2; a worker's
    gradient is the mean of ``batch`` of them. 400 rounds estimate it within 15% while a gradient's noise is
    at most 4x its signal (sigma <= 1: the worst case, 2 workers of batch 1, stayed within 0.92..1.10 over 100
    seeds); at 36x (sigma 3) 400 rounds are far too few (0.60..3.6), which is a property of the estimate, not
    of this code."""
    gen = torch.Generator().manual_seed(seed)
    d, true = 50, torch.full((50,), 0.5)
    meter = NoiseScale(batch)
    for _ in range(400):
        meter.add([true + torch.randn(d, generator=gen) * sigma / batch ** 0.5 for _ in range(workers)])
    expected = d * sigma ** 2 / float(true.pow(2).sum())
    assert meter.value == pytest.approx(expected, rel=0.15)


@given(iterations=st.integers(8, 10_000), workers=st.integers(2, 32), batch=st.integers(1, 256),
       noise=st.floats(0, 1e6))
def test_one_worker_fewer_needs_between_the_same_rounds_and_the_same_samples(
        iterations: int, workers: int, batch: int, noise: float):
    fewer = iterations_with_fewer(iterations, workers, workers - 1, batch, noise)
    assert round(iterations * (workers - 1) / workers) - 1 <= fewer <= iterations + 1


def test_the_limits_are_the_per_update_and_the_per_sample_rules():
    assert iterations_with_fewer(400, 4, 3, 32, 0.0) == 300
    assert iterations_with_fewer(400, 4, 3, 32, 1e9) == 400
    assert iterations_with_fewer(400, 4, 3, 32, 96.0) == 343  # 300 * (1 + 1) / (1 + 0.75)
