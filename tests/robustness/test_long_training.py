"""Long training: 50 SGD steps in float64 at budget 0.25 follow eager's loss curve to 1e-9."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.robustness.helpers import assert_within_budget, ckpt_compile, run_steps

pytestmark = pytest.mark.compile

STEPS = 50


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.ln(self.fc1(x)))
        h = h + F.gelu(self.fc2(h))
        return F.mse_loss(self.fc3(h), y)


def test_loss_curve_matches_eager_for_fifty_steps():
    torch.manual_seed(0)
    model = Regressor().double()
    generator = torch.Generator().manual_seed(9)
    target_weights = torch.randn(8, 1, generator=generator, dtype=torch.float64)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(16, 8, generator=generator, dtype=torch.float64)
        batches.append([x, torch.sin(x @ target_weights)])
    want, _ = run_steps(model, batches, lr=0.05)
    got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, "0.25"), lr=0.05)
    want_curve = torch.stack([step.loss for step in want])
    got_curve = torch.stack([step.loss for step in got])
    assert want_curve[-1] < 0.75 * want_curve[0], "the model must actually train"
    torch.testing.assert_close(got_curve, want_curve, rtol=1e-9, atol=0.0)
    (record,) = assert_within_budget(got[0], graphs=1)
    assert record.plan.recomputed, "at 0.25 the plan must recompute something"
    assert all(not step.records for step in got[1:]), "one compile serves all steps"
