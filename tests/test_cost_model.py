"""The cost model against hand-computed FLOPs, bytes and roofline times."""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ckpt.cost_model import DeviceProfile, OpKind, SizeEvaluator, estimate_node, kernel_seconds
from ckpt.cost_model.profiles import GPU_PROFILES, gpu_profile_for_name

F32 = 4


def _estimates(fn, *args, mode: str = "fake"):
    graph = make_fx(fn, tracing_mode=mode)(*args).graph
    sizes = SizeEvaluator.for_graph(graph)
    return [
        (node, estimate_node(node, sizes))
        for node in graph.nodes
        if node.op == "call_function" and node.target is not __import__("operator").getitem
    ]


def _only(fn, *args, mode: str = "fake"):
    (pair,) = _estimates(fn, *args, mode=mode)
    return pair[1]


def test_mm():
    est = _only(torch.mm, torch.randn(8, 16), torch.randn(16, 32))
    assert est.kind is OpKind.EXTERN
    assert est.flops == 2 * 8 * 16 * 32
    assert est.bytes_read == (8 * 16 + 16 * 32) * F32
    assert est.bytes_written == 8 * 32 * F32


def test_bmm():
    est = _only(torch.bmm, torch.randn(3, 8, 16), torch.randn(3, 16, 4))
    assert est.flops == 2 * 3 * 8 * 16 * 4
    assert est.bytes_written == 3 * 8 * 4 * F32


def test_conv2d():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    est = _only(lambda a, b: torch.conv2d(a, b), x, w)
    out_pixels = 6 * 6
    assert est.flops == 2 * 2 * 5 * out_pixels * 3 * 3 * 3
    assert est.bytes_read == (x.numel() + w.numel()) * F32
    assert est.bytes_written == 2 * 5 * out_pixels * F32


def test_scaled_dot_product_attention():
    q, k, v = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    ests = _estimates(F.scaled_dot_product_attention, q, k, v)
    attention = [e for n, e in ests if e.kind is OpKind.EXTERN]
    (est,) = attention
    # Two batched matmuls of [B*H, S, D] x [B*H, D, S] and [B*H, S, S] x [B*H, S, D].
    assert est.flops == 2 * (2 * 2 * 4 * 16 * 16 * 8)
    assert est.bytes_read == 3 * q.numel() * F32


def test_pointwise_and_reduction():
    x = torch.randn(6, 10)
    est = _only(lambda a: a * 2.0, x)
    assert est.kind is OpKind.FUSIBLE
    assert (est.flops, est.bytes_read, est.bytes_written) == (60, 60 * F32, 60 * F32)
    est = _only(lambda a: a.sum(1), x)
    assert est.kind is OpKind.FUSIBLE
    assert (est.flops, est.bytes_read, est.bytes_written) == (60, 60 * F32, 6 * F32)


def test_views_are_free():
    est = _only(lambda a: a.t(), torch.randn(4, 5))
    assert est.kind is OpKind.VIEW
    assert (est.flops, est.bytes_read, est.bytes_written) == (0, 0, 0)


def test_symbolic_sizes_stay_symbolic_and_evaluate_with_hints():
    est = _only(torch.mm, torch.randn(8, 16), torch.randn(16, 32), mode="symbolic")
    assert isinstance(est.flops_expr, sympy.Expr) and est.flops_expr.free_symbols
    assert est.flops == 2 * 8 * 16 * 32


def test_bf16_matmul_uses_the_bf16_rate():
    est = _only(torch.mm, torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16))
    assert est.dtype_class == "bf16"
    assert est.bytes_written == 8 * 32 * 2


def test_roofline():
    profile = DeviceProfile("test", (("fp32", 1e12),), bandwidth=1e11, kernel_overhead=2e-6, source="test")
    # Compute-bound: 1e9 flops at 1e12 = 1 ms; 1e6 bytes at 1e11 = 10 us.
    assert kernel_seconds(profile, 10**9, 10**6) == pytest.approx(1e-3 + 2e-6)
    # Memory-bound: 1e3 flops, 1e9 bytes = 10 ms.
    assert kernel_seconds(profile, 10**3, 10**9) == pytest.approx(1e-2 + 2e-6)
    # An unknown dtype class falls back to fp32.
    assert profile.flops_per_second("fp8") == 1e12


def test_gpu_profiles():
    assert gpu_profile_for_name("NVIDIA H200").flops_per_second("bf16") == pytest.approx(790e12)
    assert gpu_profile_for_name("NVIDIA H200").bandwidth == pytest.approx(4.3e12)
    assert gpu_profile_for_name("NVIDIA A100-SXM4-80GB") is GPU_PROFILES["a100"]
    assert gpu_profile_for_name("NVIDIA H100 80GB HBM3") is GPU_PROFILES["h100"]
    for profile in GPU_PROFILES.values():
        assert profile.source


def test_cpu_calibration_is_cached(tmp_path, monkeypatch):
    from ckpt.cost_model import calibrate

    monkeypatch.setenv("CKPT_CACHE_DIR", str(tmp_path))
    calls = []
    real = calibrate.calibrate_cpu

    def counting(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    def no_fused_kernels(threads):
        raise AssertionError("the first use must not compile fused kernels")

    monkeypatch.setattr(calibrate, "calibrate_cpu", counting)
    monkeypatch.setattr(calibrate, "measure_fused_costs", no_fused_kernels)
    monkeypatch.setattr(calibrate, "_eager_transcendental", lambda threads: 7e-10)
    first = calibrate.cpu_profile()
    second = calibrate.cpu_profile()
    assert first == second and calls == [{"fused": False}]
    assert first.peak_flops[0][1] > 1e8 and first.bandwidth > 1e8
    assert "measured on this machine" in first.source and "scaled from the reference machine" in first.source
    fp32 = first.peak_flops[0][1]
    assert first.transcendental_seconds == pytest.approx(7e-10)  # measured from an eager erf at first use
    assert first.random_seconds == pytest.approx(calibrate.FUSED_DEFAULTS["random"] / fp32, rel=0.01)


def test_first_use_measures_the_transcendental_rate_from_an_eager_erf():
    """An erf costs more than a multiply, and no more than a microsecond per element on any CPU."""
    from ckpt.cost_model import calibrate

    seconds = calibrate._eager_transcendental(torch.get_num_threads())
    assert 1e-12 < seconds < 1e-6


def test_calibrate_command_times_fused_kernels_and_replaces_the_cache(tmp_path, monkeypatch):
    from ckpt.cost_model import calibrate

    monkeypatch.setenv("CKPT_CACHE_DIR", str(tmp_path))
    measured = {"simple": 1e-12, "transcendental": 2e-9, "random": 5e-9, "byte_store": 3e-9, "byte_load": 4e-9}
    monkeypatch.setattr(calibrate, "measure_fused_costs", lambda threads: measured)
    quick = calibrate.cpu_profile()
    full = calibrate.cpu_profile(recalibrate=True)
    assert "fused Inductor kernels" in full.source and full.byte_store_seconds == pytest.approx(3e-9)
    assert full.random_seconds == pytest.approx(5e-9)
    assert calibrate.cpu_profile() == full != quick  # later processes read the measured profile


def test_transcendental_ops_are_priced_per_element_at_their_own_rate():
    from ckpt.cost_model import elementwise_seconds

    x = torch.randn(6, 10)
    erf = _only(torch.erf, x)
    mul = _only(lambda a: a * 3.0, x)
    total = _only(lambda a: a.sum(), x)
    assert erf.transcendental and not mul.transcendental
    assert erf.elements == mul.elements == 60
    assert total.elements == 60  # a reduction works on its input's elements
    profile = DeviceProfile(
        "test", (("fp32", 1e12),), bandwidth=1e11, kernel_overhead=0.0, source="test",
        element_seconds=1e-10, transcendental_seconds=6e-10,
    )  # fmt: skip
    assert elementwise_seconds(profile, erf.elements, erf.transcendental) == pytest.approx(60 * 6e-10)
    assert elementwise_seconds(profile, mul.elements, mul.transcendental) == pytest.approx(60 * 1e-10)


def test_random_draws_are_priced_at_the_profiles_rate_for_a_draw():
    """Inductor's CPU generator costs several transcendentals per element: a dropout mask drawn again is not cheap."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.inductor_random)

    from ckpt.cost_model import elementwise_seconds

    def draw(seeds):
        seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
        return torch.ops.prims.inductor_random.default([6, 10], seed, "rand")

    estimates = dict((node.target, est) for node, est in _estimates(draw, torch.zeros(2, dtype=torch.int64)))
    random = estimates[torch.ops.prims.inductor_random.default]
    assert random.random and random.elements == 60  # a pure function of its seed: it fuses like pointwise work
    rates = dict(element_seconds=1e-10, transcendental_seconds=6e-10)
    profile = DeviceProfile("test", (("fp32", 1e12),), 1e11, 0.0, "test", random_seconds=3e-9, **rates)
    assert elementwise_seconds(profile, random.elements, random.transcendental, random.random) == pytest.approx(
        60 * 3e-9
    )
    # Without a measured rate for draws (the GPU profiles), a draw costs a transcendental.
    plain = DeviceProfile("test", (("fp32", 1e12),), 1e11, 0.0, "test", **rates)
    assert elementwise_seconds(plain, random.elements, random.transcendental, random.random) == pytest.approx(
        60 * 6e-10
    )
    assert profile.key() != plain.key()


def test_small_tensors_move_at_the_cache_rate():
    from ckpt.cost_model import transfer_seconds

    profile = DeviceProfile(
        "test", (("fp32", 1e12),), bandwidth=1e10, kernel_overhead=0.0, source="test",
        cache_bytes=2**20, cache_bandwidth=1e11,
    )  # fmt: skip
    assert transfer_seconds(profile, 2**20) == pytest.approx(2**20 / 1e11)
    assert transfer_seconds(profile, 2**21) == pytest.approx(2**21 / 1e10)


def test_convolutions_run_at_the_profile_efficiency():
    from ckpt.cost_model import kernel_seconds

    conv = _only(lambda a, b: torch.conv2d(a, b), torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3))
    assert conv.convolution
    profile = DeviceProfile(
        "test", (("fp32", 1e9),), bandwidth=1e15, kernel_overhead=0.0, source="test", conv_efficiency=0.5
    )
    assert kernel_seconds(profile, conv.flops, 0, efficiency=profile.conv_efficiency) == pytest.approx(
        2 * conv.flops / 1e9
    )


def test_profile_rejects_missing_rates():
    with pytest.raises(ValueError, match="fp32"):
        DeviceProfile("bad", (("bf16", 1e12),), bandwidth=1e11, kernel_overhead=0.0, source="test")
    with pytest.raises(ValueError, match="bandwidth"):
        DeviceProfile("bad", (("fp32", 1e12),), bandwidth=0.0, kernel_overhead=0.0, source="test")
