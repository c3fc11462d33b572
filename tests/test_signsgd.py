"""signSGD with error feedback: a compressor added as one registered file (shoal/compress/signsgd.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.compress import GradientCodec, make_compressor
from shoal.engine.gradients import TensorSlot
from shoal.registry import COMPRESSORS

from conftest import FAST


def test_signsgd_is_registered_and_biased():
    assert "signsgd" in COMPRESSORS
    assert not make_compressor("signsgd").unbiased


def test_signs_and_mean_magnitude_by_hand():
    signsgd = make_compressor("signsgd")
    x = torch.tensor([[0.5, -1.0, 0.0], [2.0, -0.1, 0.3]])
    payload = signsgd.compress(x, density=0.5)
    packed, scale = payload.tensors
    assert packed.tolist() == [0b10110100] and torch.equal(scale, x.abs().mean().reshape(1))
    assert payload.nbytes == 4 + 1
    expected = torch.tensor([[1.0, -1.0, 1.0], [1.0, -1.0, 1.0]]) * scale
    assert torch.equal(signsgd.decompress(payload), expected)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, width=32, allow_subnormal=False), min_size=1, max_size=70))
def test_round_trip_keeps_shape_signs_and_counts_bits(values):
    signsgd = make_compressor("signsgd")
    x = torch.tensor(values)
    payload = signsgd.compress(x, density=0.01)
    out = signsgd.decompress(payload)
    assert out.shape == x.shape and payload.nbytes == 4 + math.ceil(len(values) / 8)
    assert payload.nbytes == signsgd.nominal_bytes(len(values), 0.01)
    if x.abs().mean() > 0:  # a scale that underflows to 0 (subnormal means) cannot carry a sign
        assert torch.equal(out >= 0, x >= 0)
    assert torch.allclose(out.abs(), x.abs().mean().expand_as(x))


def test_error_feedback_keeps_what_the_sign_dropped():
    layout = [TensorSlot("w", (3, 4), 0, 12)]
    codec = GradientCodec(make_compressor("signsgd"), layout, error_feedback=True)
    grads = [torch.randn(12, generator=torch.Generator().manual_seed(s)) for s in range(5)]
    sent = sum(codec.encode(g, 0.01)[0] for g in grads)
    residual = codec.memory.residuals["w"]
    assert torch.allclose(sent + residual, sum(grads), atol=1e-5)


@pytest.mark.slow
def test_signsgd_trains_end_to_end_and_sends_32x_less(tmp_path):
    def run(method: str) -> dict:
        out = tmp_path / method
        sets = [f"--set={o}" for o in FAST + ["run.max_time_s=1.0", f"compression.method={method}"]]
        done = subprocess.run([sys.executable, "-m", "shoal", "train", *sets, "--out", str(out), "-q"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads((out / "summary.json").read_text())

    dense, signs = run("none"), run("signsgd")
    assert signs["final_accuracy"] > 0.5
    assert dense["bytes_up"] / dense["iterations"] > 25 * signs["bytes_up"] / signs["iterations"]
