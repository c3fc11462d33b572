"""A worker's compressor state (error feedback, DGC's velocity, PowerSGD's Q, random generators) saves and
restores exactly: a codec restored from a safetensors file encodes what the uninterrupted one would, bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from shoal.compress.codec import worker_codec
from shoal.config import CompressionConfig, OptimizerConfig
from shoal.engine.gradients import TensorSlot

LAYOUT = [TensorSlot("net.0.weight", (16, 12), 0, 192), TensorSlot("net.0.bias", (16,), 192, 16),
          TensorSlot("net.2.weight", (4, 16), 208, 64)]
SIZE = 272
MOMENTUM = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)


def codec(method: str):
    return worker_codec(CompressionConfig(method=method, density=0.1, rank=2), seed=3, worker=1, layout=LAYOUT,
                        opt=MOMENTUM)


def encode_all(c, grads, densities=0.1):
    return [c.encode(g, densities) for g in grads]


@pytest.mark.parametrize("method", ["topk", "dgc", "powersgd", "randk", "qsgd", "signsgd", "gdtopk"])
def test_a_codec_restored_mid_run_encodes_exactly_what_the_uninterrupted_one_does(tmp_path, method):
    torch.manual_seed(0)
    grads = [torch.randn(SIZE) for _ in range(8)]
    straight = encode_all(codec(method), grads)
    first = codec(method)
    before = encode_all(first, grads[:4])
    state = first.state_dict()
    if method in ("topk", "dgc", "powersgd"):
        assert any(k.startswith("memory.") for k in state)  # something real to lose
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "codec.safetensors")
    resumed = codec(method)
    resumed.load_state_dict(load_file(tmp_path / "codec.safetensors"))
    after = encode_all(resumed, grads[4:])
    for (want, want_bytes), (got, got_bytes) in zip(straight, before + after, strict=True):
        assert torch.equal(want, got) and want_bytes == got_bytes


@pytest.mark.parametrize("method", ["topk", "dgc", "powersgd"])
def test_a_codec_that_lost_its_state_drifts_from_the_uninterrupted_one(method):
    """The property above is not vacuous: without the state, the next encodings differ."""
    torch.manual_seed(1)
    grads = [torch.randn(SIZE) for _ in range(6)]
    straight = encode_all(codec(method), grads)
    fresh = encode_all(codec(method), grads[3:])
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(straight[3:], fresh))


@settings(max_examples=15, deadline=None)
@given(steps=st.integers(0, 5), seed=st.integers(0, 1000))
def test_state_round_trips_for_any_history(steps, seed):
    gen = torch.Generator().manual_seed(seed)
    c = codec("dgc")
    for _ in range(steps):
        c.encode(torch.randn(SIZE, generator=gen), 0.1)
    copy = codec("dgc")
    copy.load_state_dict(c.state_dict())
    assert copy.state_dict().keys() == c.state_dict().keys()
    assert all(torch.equal(v, copy.state_dict()[k]) for k, v in c.state_dict().items())
