"""Property: random layer stacks compiled with ckpt at random budgets match eager and keep the budget.

Each example compiles with Inductor, so the CI profile runs a handful; run
``CKPT_PROPERTY_EXAMPLES=200 pytest tests/test_property.py`` for more.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import assert_close_grads, compiled_step, eager_step

pytestmark = pytest.mark.compile

B, T, D, HEADS = 2, 8, 16, 2
LAYERS = (
    "linear",
    "conv2d",
    "layernorm",
    "batchnorm",
    "gelu",
    "silu",
    "softmax",
    "attention",
    "residual",
    "matmul",
    "transpose",
    "sum",
    "mean",
)


class Layer(nn.Module):
    """One step on a [B, T, D] activation."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind in ("linear", "residual", "attention"):
            self.proj = nn.Linear(D, D)
        if kind == "conv2d":
            self.conv = nn.Conv2d(D, D, kernel_size=3, padding=1)
        if kind == "layernorm":
            self.norm = nn.LayerNorm(D)
        if kind == "batchnorm":
            self.norm = nn.BatchNorm1d(D)
        if kind == "matmul":
            self.weight = nn.Parameter(torch.randn(D, D) / D**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.kind
        if kind == "linear":
            return self.proj(x)
        if kind == "conv2d":  # T = 8 laid out as a 2x4 image
            image = x.transpose(1, 2).reshape(B, D, 2, T // 2)
            return self.conv(image).reshape(B, D, T).transpose(1, 2)
        if kind == "layernorm":
            return self.norm(x)
        if kind == "batchnorm":
            return self.norm(x.reshape(B * T, D)).reshape(B, T, D)
        if kind == "gelu":
            return F.gelu(x)
        if kind == "silu":
            return F.silu(x)
        if kind == "softmax":
            return torch.softmax(x, dim=-1)
        if kind == "attention":
            q = self.proj(x).view(B, T, HEADS, D // HEADS).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(B, T, D)
        if kind == "residual":
            return x + torch.tanh(self.proj(x))
        if kind == "matmul":
            return x @ self.weight
        if kind == "transpose":
            return x.transpose(1, 2).contiguous().view(B, D, T).transpose(1, 2) * 1.5
        if kind == "sum":
            return x + x.sum(dim=1, keepdim=True) / T
        if kind == "mean":
            return x - x.mean(dim=-1, keepdim=True)
        raise ValueError(f"unknown layer kind {kind!r}; expected one of {LAYERS}")


class Stack(nn.Module):
    def __init__(self, kinds: list[str]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(kind) for kind in kinds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.float().square().mean()


@settings(
    max_examples=int(os.environ.get("CKPT_PROPERTY_EXAMPLES", "4")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    kinds=st.lists(st.sampled_from(LAYERS), min_size=2, max_size=6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    budget=st.sampled_from(["none", "0.0", "0.1", "0.25", "0.5", "0.75", "1.0"]),
    seed=st.integers(0, 2**16),
)
def test_random_stacks_match_eager_within_budget(kinds, dtype, budget, seed):
    torch.manual_seed(seed)
    model = Stack(kinds).to(dtype)
    x = torch.randn(B, T, D, dtype=dtype, requires_grad=True)
    want = eager_step(model, [x])
    got = compiled_step(model, [x], budget)
    tolerance = {"rtol": 1e-3, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 6e-2, "atol": 6e-2}
    assert_close_grads(got, want, **tolerance)
    caps = [r.budget_bytes for r in got.records]
    if got.records and None not in caps:
        over = [r for r in got.records if r.plan.over_budget]
        allowed = sum(r.plan.minimum_bytes if r.plan.over_budget else r.budget_bytes for r in got.records)
        assert got.saved_bytes <= allowed, (kinds, budget, over)
    for record in got.records:
        assert got.saved_bytes == sum(r.plan.bytes for r in got.records)
        assert record.fallback_reason is None
