"""backend="ckpt" end to end through Inductor: gradients equal eager, bytes within budget.

Each test compiles with Inductor, which takes seconds on the CPU, so the models
are tiny and the tests few.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ckpt.tools.demo import GPTBlock
from tests.conftest import assert_close_grads, compiled_step, eager_step, run_step

pytestmark = pytest.mark.compile


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(GPTBlock(32, 4), GPTBlock(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).square().mean()


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    return TinyModel(), torch.randn(2, 16, 32, requires_grad=True)


def test_budgets_keep_gradients_and_stay_within_budget(model_and_input):
    model, x = model_and_input
    want = eager_step(model, [x])
    measured = {}
    for budget in ["none", "0.5", "0.0"]:
        got = compiled_step(model, [x], budget)
        assert_close_grads(got, want)
        (record,) = got.records
        assert record.fallback_reason is None
        # Prediction is exact: both count the same saved storages.
        assert got.saved_bytes == record.plan.bytes
        if record.budget_bytes is not None and not record.plan.over_budget:
            assert got.saved_bytes <= record.budget_bytes
        measured[budget] = got.saved_bytes
    assert measured["0.0"] <= measured["0.5"] <= measured["none"]
    assert measured["0.0"] < measured["none"]


@pytest.mark.compat
def test_absolute_budget(model_and_input):
    model, x = model_and_input
    got = compiled_step(model, [x], "8KiB")
    (record,) = got.records
    assert record.budget_bytes == 8 * 1024
    assert got.saved_bytes <= 8 * 1024 or record.plan.over_budget


@pytest.mark.compat
def test_inference_graph_passes_through(model_and_input):
    model, x = model_and_input
    compiled = torch.compile(model, backend="ckpt")
    from ckpt.records import record_partitions

    with torch.no_grad(), record_partitions() as records:
        out = compiled(x)
    torch.testing.assert_close(out, model(x))
    assert records == []


class ConvStack(nn.Module):
    """Convolutions wide enough that Inductor lays them out channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).square().mean()


@pytest.mark.compat
@pytest.mark.parametrize("budget", ["none", "0.0"])
def test_convolution_weights_are_saved_as_themselves(budget):
    """Inductor makes channels-last copies of a convolution's weight and input; the backward reads
    the parameters and the input themselves, so no copy of them stays alive between the passes."""
    torch.manual_seed(0)
    model, x = ConvStack(), torch.randn(4, 16, 16, 16)
    want = eager_step(model, [x])
    compiled = torch.compile(model, backend="ckpt", options={"memory_budget": budget})
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 4} | {tuple(x.shape)}
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    copies: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tuple(tensor.shape) in shapes and tensor.untyped_storage().data_ptr() not in storages:
            copies.append(tuple(tensor.shape))
        return tensor

    got = run_step(model, compiled, [x])
    assert_close_grads(got, want)
    (record,) = got.records
    assert record.analysis.uncopied_inputs, "Inductor should lay this net out channels-last"
    assert got.saved_bytes == record.plan.bytes
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = compiled(x)
    loss.backward()
    assert copies == []
