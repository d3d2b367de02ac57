"""The backend as users meet it: registration, options, caches, and fused recompute code."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ckpt.records import record_partitions
from tests.robustness.helpers import inductor_kernels, run_python

pytestmark = pytest.mark.compile


@pytest.mark.compat
def test_backend_name_works_without_importing_ckpt():
    out = run_python(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        compiled = torch.compile(model, backend="ckpt")
        compiled(torch.randn(4, 8)).sum().backward()
        print("ckpt.backend" in sys.modules, model[0].weight.grad is not None)
        """
    )
    assert out.split() == ["True", "True"]


_CACHE_SCRIPT = """
import torch
from ckpt.measure import saved_activations
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)
)
x = torch.randn(16, 32)
compiled = torch.compile(model, backend="ckpt")
with saved_activations(model, x) as saved:
    loss = compiled(x).sum()
loss.backward()
print(saved.bytes)
"""


def test_fx_graph_cache_never_serves_a_plan_made_for_another_budget(tmp_path):
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    full = int(run_python(_CACHE_SCRIPT, {**env, "CKPT_MEMORY_BUDGET": "none"}))
    lean = int(run_python(_CACHE_SCRIPT, {**env, "CKPT_MEMORY_BUDGET": "0"}))
    full_again = int(run_python(_CACHE_SCRIPT, {**env, "CKPT_MEMORY_BUDGET": "none"}))
    assert lean < full
    assert full_again == full


@pytest.mark.compat
@pytest.mark.parametrize(("key", "value"), [("memory_budget", "lots"), ("memory_budjet", "0.5")])
def test_bad_options_fail_at_compile_time(key, value):
    model = nn.Linear(4, 4)
    compiled = torch.compile(model, backend="ckpt", options={key: value})
    with pytest.raises(Exception) as info:
        compiled(torch.randn(2, 4))
    text = str(info.value)
    assert value in text or key in text
    assert "memory_budget" in text


def test_bad_environment_budget_fails_at_compile_time(monkeypatch):
    monkeypatch.setenv("CKPT_MEMORY_BUDGET", "12XB")
    compiled = torch.compile(nn.Linear(4, 4), backend="ckpt")
    with pytest.raises(Exception, match="CKPT_MEMORY_BUDGET='12XB'"):
        compiled(torch.randn(2, 4))


class PointwiseChain(nn.Module):
    """h = linear(x); y = sin(h) * 2 + h * h; loss = (y * y).sum(): the backward needs y."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        h = self.linear(x)
        y = torch.sin(h) * 2 + h * h
        return (y * y).sum()


@pytest.mark.compat
def test_recomputed_pointwise_chain_fuses_into_the_consuming_backward_kernel():
    from ckpt._torch_compat import compile_caches_disabled, run_and_get_code

    torch.manual_seed(0)
    model, x = PointwiseChain(), torch.randn(8, 16)
    # Budget 0 saves nothing, so the chain is recomputed whatever the device's rates.
    compiled = torch.compile(model, backend="ckpt", options={"memory_budget": "0"})

    def step():
        compiled(x).backward()

    with compile_caches_disabled(), record_partitions() as records:
        _, codes = run_and_get_code(step)
    (record,) = records
    names = record.analysis.problem.names
    recomputed = {names[i] for i in record.plan.recomputed}
    assert "sin" in recomputed, recomputed
    backward_kernels = inductor_kernels(codes[-1])
    with_sin = [body for body in backward_kernels.values() if ".sin()" in body or "std::sin" in body]
    # The recomputation lives in exactly one kernel, which also computes the gradient (cos of h):
    # it adds no kernel of its own...
    assert len(with_sin) == 1, list(backward_kernels)
    assert ".cos()" in with_sin[0] or "std::cos" in with_sin[0]
    # ...and no buffer round trip: that kernel stores only its final result.
    assert with_sin[0].count(".store(") + with_sin[0].count("out_ptr0[") <= 1
