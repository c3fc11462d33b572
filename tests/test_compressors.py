"""Compressors: round trips, exact byte counts, unbiasedness, error feedback, selection."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.compress import GradientCodec, make_compressor
from shoal.compress.base import Compressor, Payload
from shoal.compress.codec import COMPRESSORS
from shoal.compress.quantize import FP16, QSGD, level_bits, pack_bits, unpack_bits
from shoal.compress.sparsify import DGC, RandK, TopK, keep_count, random_indices
from shoal.engine.gradients import TensorSlot

METHODS = ["fp16", "topk", "gdtopk", "randk", "dgc", "qsgd"]
SHAPES = [(), (1,), (7,), (3, 4), (2, 3, 4, 5), (1000,), (3000,)]
HYP = settings(max_examples=40, deadline=None)


def tensor_bytes(payload: Payload) -> int:
    return sum(t.numel() * t.element_size() for t in payload.tensors)


def expected_bytes(method: str, compressor: Compressor, payload: Payload, numel: int, density: float) -> int:
    """The byte formula of each wire format, from the numbers it depends on."""
    k = keep_count(numel, density)
    if method == "fp16":
        return 2 * numel
    if method in ("topk", "gdtopk"):
        return 8 * k
    if method == "randk":
        return 4 * k + 4
    if method == "dgc":
        return 8 * payload.tensors[0].numel()
    assert isinstance(compressor, QSGD)
    return 4 * math.ceil(numel / min(512, numel)) + math.ceil(numel * compressor.bits / 8)


def test_registry_and_none():
    assert make_compressor("none") is None
    assert isinstance(make_compressor("gdtopk"), TopK)
    expected = {"fp16": FP16, "topk": TopK, "randk": RandK, "dgc": DGC, "qsgd": QSGD}
    for name, cls in expected.items():
        compressor = make_compressor(name)
        assert type(compressor) is cls and compressor.name == name
    assert set(expected) <= set(COMPRESSORS)
    assert make_compressor("randk").unbiased and make_compressor("qsgd").unbiased
    assert not any(make_compressor(m).unbiased for m in ("fp16", "topk", "dgc"))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_shape_dtype_and_bytes(method, shape):
    torch.manual_seed(1)
    compressor = make_compressor(method)
    x = torch.randn(shape)
    for density in (0.01, 0.3, 1.0):
        payload = compressor.compress(x, density)
        y = compressor.decompress(payload)
        assert y.shape == x.shape and y.dtype == torch.float32
        assert torch.isfinite(y).all()
        assert payload.nbytes == tensor_bytes(payload)
        assert payload.nbytes == expected_bytes(method, compressor, payload, x.numel(), density)
        if method != "dgc":
            assert compressor.nominal_bytes(x.numel(), density) == payload.nbytes


def test_payload_dtypes():
    x = torch.randn(100)
    values, indices = TopK().compress(x, 0.1).tensors
    assert values.dtype == torch.float32 and indices.dtype == torch.int32
    values, seed = RandK().compress(x, 0.1).tensors
    assert values.dtype == torch.float32 and values.numel() == 10 and seed.dtype == torch.int32 and seed.numel() == 1
    values, indices = DGC().compress(x, 0.1).tensors
    assert values.dtype == torch.float32 and indices.dtype == torch.int32
    (half,) = FP16().compress(x, 0.1).tensors
    assert half.dtype == torch.float16 and half.numel() == 100
    norms, packed = QSGD().compress(x, 0.1).tensors
    assert norms.dtype == torch.float32 and norms.numel() == 1 and packed.dtype == torch.uint8 and packed.numel() == 100


@HYP
@given(numel=st.integers(1, 5000), density=st.floats(0.001, 1.0), method=st.sampled_from(["fp16", "topk", "randk", "qsgd"]))
def test_nominal_bytes_match_payload(numel, density, method):
    compressor = make_compressor(method)
    payload = compressor.compress(torch.randn(numel), density)
    assert compressor.nominal_bytes(numel, density) == payload.nbytes == tensor_bytes(payload)


@HYP
@given(numel=st.integers(1, 3000), levels=st.integers(1, 40_000 // 2), bucket=st.sampled_from([None, 1, 7, 64, 512]))
def test_qsgd_bytes_and_levels(numel, levels, bucket):
    compressor = QSGD(levels=levels, bucket_size=bucket)
    x = torch.randn(numel)
    payload = compressor.compress(x, 0.5)
    d = numel if bucket is None else min(bucket, numel)
    bits = math.ceil(math.log2(2 * levels + 1))
    assert compressor.bits == bits
    assert payload.nbytes == tensor_bytes(payload) == 4 * math.ceil(numel / d) + math.ceil(numel * bits / 8)
    assert payload.nbytes == compressor.nominal_bytes(numel, 0.5)
    y = compressor.decompress(payload)
    # every value is a level of its bucket: |y| / norm * s is an integer in [0, s], sign kept
    norms = payload.tensors[0].repeat_interleave(d)[:numel]
    level = y.abs() / torch.where(norms > 0, norms, 1) * levels
    assert torch.allclose(level, level.round(), atol=1e-3 * max(1, levels) ** 0.5)
    assert (level <= levels + 1e-3 * max(1, levels) ** 0.5).all()  # float32 rounding grows with the level
    assert ((y == 0) | (torch.sign(y) == torch.sign(x))).all()
    # stochastic rounding moves each value by less than one level step
    assert ((y - x).abs() <= norms / levels * (1 + 1e-4) + 1e-6).all()


@HYP
@given(bits=st.integers(1, 16), count=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_pack_unpack_bits(bits, count, seed):
    symbols = torch.randint(0, 2**bits, (count,), generator=torch.Generator().manual_seed(seed))
    packed = pack_bits(symbols, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(count * bits / 8)
    assert torch.equal(unpack_bits(packed, count, bits), symbols)


def test_level_bits():
    assert [level_bits(s) for s in (1, 2, 3, 7, 8, 15, 16, 127, 128)] == [2, 3, 3, 4, 5, 5, 6, 8, 9]


def test_fp16_round_trip_and_clamp():
    x = torch.tensor([1.0, -2.5, 1e-3, 1e6, -1e6, 0.0])
    y = FP16().decompress(FP16().compress(x, 0.1))
    assert torch.equal(y[:3], x[:3].half().float())
    assert y[3] == 65504.0 and y[4] == -65504.0 and y[5] == 0
    z = torch.randn(10_000)
    rel = (FP16().decompress(FP16().compress(z, 1.0)) - z).abs() / z.abs().clamp_min(1e-4)
    assert rel.max() < 2**-10


# -- unbiasedness ---------------------------------------------------------------


def assert_unbiased(samples: torch.Tensor, x: torch.Tensor, variance: torch.Tensor, sigmas: float = 5.0) -> None:
    """The mean of ``samples`` (trials x numel) is within ``sigmas`` standard errors of ``x``, per value."""
    trials = samples.shape[0]
    se = (variance / trials).sqrt()
    error = (samples.mean(0) - x).abs()
    assert (error <= sigmas * se + 1e-6).all(), float((error / (se + 1e-12)).max())
    # and the errors look like noise, not a systematic shift
    assert abs(float((samples.mean(0) - x).sum())) <= sigmas * float(variance.sum().sqrt() / math.sqrt(trials)) + 1e-5


@pytest.mark.parametrize("density", [0.1, 0.6], ids=["sparse-draw", "permutation"])
def test_randk_unbiased(density):
    torch.manual_seed(3)
    x = torch.randn(50)
    compressor = RandK(seed=7)
    k = keep_count(50, density)
    samples = torch.stack([compressor.decompress(compressor.compress(x, density)) for _ in range(3000)])
    # each value is kept with probability k/n and then scaled by n/k
    variance = x**2 * (50 / k - 1)
    assert_unbiased(samples, x, variance)
    kept = (samples != 0).float().mean(0)
    assert torch.allclose(kept, torch.full_like(kept, k / 50), atol=5 * math.sqrt(k / 50 * (1 - k / 50) / 3000))


@pytest.mark.parametrize("levels,bucket", [(2, None), (127, 512), (3, 16)])
def test_qsgd_unbiased(levels, bucket):
    torch.manual_seed(4)
    x = torch.randn(64) * torch.linspace(0.1, 3, 64)
    compressor = QSGD(levels=levels, bucket_size=bucket, seed=11)
    samples = torch.stack([compressor.decompress(compressor.compress(x, 1.0)) for _ in range(3000)])
    d = 64 if bucket is None else min(bucket, 64)
    norms = x.view(-1, d).norm(dim=1).repeat_interleave(d)
    scaled = x.abs() / norms * levels
    p = scaled - scaled.floor()
    variance = (norms / levels) ** 2 * p * (1 - p)
    assert_unbiased(samples, x, variance)


def test_topk_is_biased_and_detected():
    """The unbiasedness check is able to fail: top-k's mean is not the input."""
    x = torch.randn(50)
    samples = torch.stack([TopK().decompress(TopK().compress(x, 0.1)) for _ in range(10)])
    with pytest.raises(AssertionError):
        assert_unbiased(samples, x, torch.full_like(x, 1e-4))


def test_seeded_reproducibility():
    x = torch.randn(20_000)
    for cls in (RandK, DGC, QSGD):
        a, b, c = cls(seed=5), cls(seed=5), cls(seed=6)
        for _ in range(2):
            pa, pb, pc = a.compress(x, 0.01), b.compress(x, 0.01), c.compress(x, 0.01)
            assert all(torch.equal(s, t) for s, t in zip(pa.tensors, pb.tensors, strict=True))
            assert any(s.shape != t.shape or not torch.equal(s, t) for s, t in zip(pa.tensors, pc.tensors, strict=True))


@HYP
@given(numel=st.integers(1, 100_000), k_frac=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 2))
def test_random_indices_distinct_and_in_range(numel, k_frac, seed):
    k = max(1, min(numel, round(k_frac * numel)))
    indices = random_indices(numel, k, seed)
    assert indices.numel() == k == torch.unique(indices).numel()
    assert 0 <= int(indices.min()) and int(indices.max()) < numel
    assert torch.equal(indices, random_indices(numel, k, seed))


# -- error feedback ---------------------------------------------------------------


def layout() -> list[TensorSlot]:
    shapes = {"fc1.weight": (40, 30), "fc1.bias": (40,), "conv.weight": (4, 3, 3, 3), "fc2.bias": (1,)}
    slots, offset = [], 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        slots.append(TensorSlot(name, shape, offset, numel))
        offset += numel
    return slots


@pytest.mark.parametrize("compressor", [TopK(), RandK(), RandK(scale=False), DGC(), QSGD(), QSGD(levels=4), FP16()],
                         ids=["topk", "randk", "randk-unscaled", "dgc", "qsgd", "qsgd-4", "fp16"])
def test_error_feedback_never_loses_mass(compressor):
    slots = layout()
    total = sum(s.numel for s in slots)
    codec = GradientCodec(compressor, slots, error_feedback=True)
    gen = torch.Generator().manual_seed(0)
    inputs = torch.zeros(total, dtype=torch.float64)
    sent = torch.zeros(total, dtype=torch.float64)
    nbytes_total = 0
    for _ in range(6):
        grad = torch.randn(total, generator=gen)
        received, nbytes = codec.encode(grad, 0.05)
        assert received.shape == grad.shape and received.dtype == torch.float32
        inputs += grad.double()
        sent += received.double()
        nbytes_total += nbytes
    residual = torch.cat([codec.memory.residuals[s.name].reshape(-1) for s in slots]).double()
    scale = max(1.0, float(sent.abs().max()), float(residual.abs().max()))
    assert torch.allclose(sent + residual, inputs, rtol=0, atol=1e-5 * scale)
    assert nbytes_total == 6 * codec.nominal_bytes(0.05) or isinstance(compressor, DGC)


def test_without_error_feedback_the_rest_is_dropped():
    slots = layout()
    codec = GradientCodec(TopK(), slots, error_feedback=False)
    grad = torch.randn(sum(s.numel for s in slots))
    received, nbytes = codec.encode(grad, 0.1)
    assert nbytes == sum(8 * keep_count(s.numel, 0.1) for s in slots)
    assert (received != 0).sum() == sum(keep_count(s.numel, 0.1) for s in slots)


# -- selection ----------------------------------------------------------------------


def distinct_magnitudes(numel: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.randperm(numel, generator=gen).float() + 1
    sign = torch.where(torch.rand(numel, generator=gen) < 0.5, -1.0, 1.0)
    return magnitude * sign


@HYP
@given(numel=st.integers(1, 4000), density=st.floats(0.0005, 1.0), seed=st.integers(0, 1000))
def test_topk_keeps_exactly_the_largest(numel, density, seed):
    x = distinct_magnitudes(numel, seed)
    k = keep_count(numel, density)
    values, indices = TopK().compress(x, density).tensors
    assert set(indices.tolist()) == set(torch.topk(x.abs(), k).indices.tolist())
    assert torch.equal(values, x[indices.long()])
    y = TopK().decompress(TopK().compress(x, density))
    assert torch.equal(y[indices.long()], values) and int((y != 0).sum()) == k


@HYP
@given(numel=st.integers(1, 60_000), density=st.floats(0.001, 0.5), seed=st.integers(0, 1000))
def test_dgc_selects_a_top_set(numel, density, seed):
    x = distinct_magnitudes(numel, seed)
    k = keep_count(numel, density)
    compressor = DGC(seed=seed)
    values, indices = compressor.compress(x, density).tensors
    count = indices.numel()
    assert 1 <= count <= max(k, math.floor(1.3 * k))
    assert torch.unique(indices).numel() == count
    assert torch.equal(values, x[indices.long()])
    # a threshold selection: everything kept is larger than everything dropped,
    # so it is a superset (or subset) of the exact top-k
    kept = torch.zeros(numel, dtype=torch.bool)
    kept[indices.long()] = True
    if count < numel:
        assert x[kept].abs().min() > x[~kept].abs().max()
    top = set(torch.topk(x.abs(), k).indices.tolist())
    chosen = set(indices.tolist())
    assert chosen >= top if count >= k else chosen <= top
    if numel <= compressor.num_samples(numel, density):
        assert count == k  # small tensors: exact top-k


def test_dgc_count_near_density_on_large_tensors():
    compressor = DGC(seed=1)
    gen = torch.Generator().manual_seed(2)
    ratios = []
    for i in range(12):
        x = torch.randn(100_000, generator=gen) * (1 + 9 * (i % 3))
        if i % 2:
            x = x**3  # heavy tails
        density = (0.01, 0.001, 0.05)[i % 3]
        values, _ = compressor.compress(x, density).tensors
        ratios.append(values.numel() / keep_count(x.numel(), density))
    assert all(0.5 <= r <= 1.3 + 1e-9 for r in ratios), ratios
    assert 0.8 <= sum(ratios) / len(ratios) <= 1.2, ratios
    assert compressor.nominal_bytes(100_000, 0.01) == 8 * 1000


def test_dgc_ties_and_zeros():
    """All-equal magnitudes select everything above the threshold: the hierarchical step cuts it to k."""
    for x in (torch.zeros(50_000), torch.ones(50_000)):
        payload = DGC().compress(x, 0.01)
        assert payload.tensors[0].numel() == 500 and payload.nbytes == 8 * 500
        assert torch.equal(DGC().decompress(payload).sum(), x[:500].sum())


# -- PowerSGD ---------------------------------------------------------------------------------


def test_powersgd_recovers_a_low_rank_matrix_and_counts_its_factors():
    from shoal.compress.lowrank import PowerSGD

    compressor = PowerSGD(rank=2, seed=0)
    m = torch.randn(20, 2) @ torch.randn(2, 30)
    payload = compressor.compress_named(m.reshape(-1), 1.0, "w", (20, 30))
    assert payload.nbytes == 4 * (20 + 30) * 2 == compressor.nominal_named_bytes((20, 30), 1.0)
    assert torch.allclose(compressor.decompress(payload), m.reshape(-1), atol=1e-4)
    bias = torch.randn(30)  # a vector has no useful factors: it travels as it is
    assert torch.equal(compressor.decompress(compressor.compress_named(bias, 1.0, "b", (30,))), bias)
    assert compressor.nominal_named_bytes((30,), 1.0) == 120


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation():
    from shoal.compress.lowrank import PowerSGD

    torch.manual_seed(0)
    m = torch.randn(40, 25)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    best = float(s[2:].norm())  # the error of the truncated SVD of rank 2
    compressor = PowerSGD(rank=2, seed=1)
    errors = []
    for _ in range(30):
        y = compressor.decompress(compressor.compress_named(m.reshape(-1), 1.0, "w", (40, 25)))
        errors.append(float((y - m.reshape(-1)).norm()))
    assert errors[-1] < errors[0]
    assert errors[-1] == pytest.approx(best, rel=0.02)


def test_powersgd_trains_with_error_feedback_and_sends_less(fast_config):
    from shoal.backends.sim import SimBackend
    from shoal.compress.codec import worker_codec
    from shoal.engine.metrics import RunRecorder
    from shoal.engine.setup import build_setup

    cfg = fast_config("compression.method=powersgd", "compression.rank=2", "model.hidden=[64]",
                      "run.stop_at_target=false")
    setup = build_setup(cfg)
    codec = worker_codec(cfg.compression, 0, 0, setup.engine.layout)
    assert codec is not None and codec.memory.__class__.__name__ == "ResidualMemory"
    summary = SimBackend(setup, RunRecorder()).run()
    assert summary["final_accuracy"] > 0.85
    assert summary["bytes_up"] < 0.2 * summary["iterations"] * 4 * summary["params"]


def test_dgc_momentum_correction_and_factor_masking_by_hand():
    """u = m u + g, v = v + u; the sent values clear u and v (DGC, Algorithm 1 with masking)."""
    from shoal.compress.base import MomentumMemory

    memory, m = MomentumMemory(0.5), 0.5
    g1, g2 = torch.tensor([4.0, 1.0, -2.0]), torch.tensor([2.0, 2.0, 2.0])
    v = memory.compensate("w", g1)  # u = g1, v = g1
    assert torch.equal(v, g1)
    memory.update("w", v, torch.tensor([4.0, 0.0, 0.0]))  # top-1 sent: index 0
    v = memory.compensate("w", g2)  # u = m * [0, 1, -2] + g2 = [2, 2.5, 1]; v = [0, 1, -2] + u
    assert torch.equal(v, torch.tensor([2.0, 3.5, -1.0]))
    memory.update("w", v, torch.tensor([0.0, 3.5, 0.0]))
    assert torch.equal(memory.velocities["w"], torch.tensor([2.0, 0.0, 1.0]))
    assert torch.equal(memory.accumulations["w"], torch.tensor([2.0, 0.0, -1.0]))
    assert m == memory.momentum


def test_dgc_moves_momentum_to_the_workers(fast_config, tmp_path):
    from shoal.compress.codec import server_optimizer, worker_codec
    from shoal.compress.base import MomentumMemory
    from shoal.runner import train

    cfg = fast_config("compression.method=dgc", "compression.density=0.05", "run.max_time_s=3",
                      "run.stop_at_target=false")
    assert server_optimizer(cfg.compression, cfg.optimizer).momentum == 0.0
    layout = [TensorSlot("w", (4,), 0, 4)]
    assert isinstance(worker_codec(cfg.compression, 0, 0, layout, opt=cfg.optimizer).memory, MomentumMemory)
    off = cfg.model_copy(update={"compression": cfg.compression.model_copy(update={"momentum_correction": False})})
    assert server_optimizer(off.compression, off.optimizer).momentum == cfg.optimizer.momentum
    assert train(cfg, tmp_path / "r")["final_accuracy"] > 0.8
