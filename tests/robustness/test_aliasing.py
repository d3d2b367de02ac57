"""Aliasing and views: outputs that alias inputs or each other, ``detach``, ``no_grad``, non-float tensors.

The loss is computed outside the compiled region from the returned tuple or
dict, so the compiled backward receives a tangent for every aliased output
and AOTAutograd's view replay is exercised at every budget.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

from tests.robustness.helpers import BUDGETS, assert_runs_close, assert_within_budget, ckpt_compile, run_steps

pytestmark = pytest.mark.compile

DIM = 8
ROWS = 6


class DictOutputs(nn.Module):
    """Bool and integer inputs, a no-grad float input, ``no_grad`` and ``detach``, a dict of aliasing outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.emb = nn.Embedding(10, DIM)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor, scale: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        h = self.fc(x).masked_fill(mask, 0.0)
        h = torch.tanh(h + self.emb(ids)) * scale
        with torch.no_grad():
            norm = h.abs().amax(dim=-1, keepdim=True) + 1.0
        c = h / norm
        c = c.detach().sigmoid() * c
        positive = c > 0
        r = torch.where(positive, c, 0.1 * c)
        return {
            "r": r,
            "r_t": r.t(),
            "r_flat": r.view(-1),
            "r_row": r[1],
            "x_head": x.view(-1)[:DIM],
            "positive": positive,
            "count": positive.sum(),
        }


def dict_loss(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return (
        out["r"].mean()
        + out["r_t"].sin().sum()
        + out["r_flat"].square().sum()
        + (out["r_row"] * 3).sum()
        + out["x_head"].cos().sum()
    )


class TupleOutputs(nn.Module):
    """Returns an input itself, a view of it, an intermediate and two views of that intermediate."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.relu(self.fc1(x)) + y
        g = self.fc2(h * h.detach().mean())
        return x, x.t(), g, g.transpose(0, 1)[:, :3], g.unsqueeze(0).expand(2, -1, -1)


def tuple_loss(out: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, x_t, g, g_cols, g_twice = out
    return x.square().sum() + (x_t * 2).sum() + g.tanh().sum() + g_cols.square().sum() + g_twice[1].sin().sum()


def _run_all_budgets(model: nn.Module, batch: list[torch.Tensor], loss_fn: Any) -> None:
    eager_outputs: list[Any] = []
    want, _ = run_steps(model, [batch], loss_fn=lambda out: eager_outputs.append(out) or loss_fn(out))
    for budget in BUDGETS:
        outputs: list[Any] = []
        got, _ = run_steps(
            model,
            [batch],
            compile_fn=lambda m: ckpt_compile(m, budget),
            loss_fn=lambda out: outputs.append(out) or loss_fn(out),
        )
        assert_runs_close(got, want)
        torch.testing.assert_close(outputs[0], eager_outputs[0], msg=lambda m: f"budget {budget} outputs: {m}")
        assert_within_budget(got[0], graphs=1)


def test_dict_of_views_with_bool_int_and_no_grad_inputs():
    torch.manual_seed(0)
    model = DictOutputs()
    x = torch.randn(ROWS, DIM, requires_grad=True)
    mask = torch.rand(ROWS, DIM) < 0.25
    ids = torch.randint(0, 10, (ROWS,))
    scale = torch.full((DIM,), 1.5)  # requires_grad=False
    _run_all_budgets(model, [x, mask, ids, scale], dict_loss)


@pytest.mark.compat
def test_tuple_of_outputs_aliasing_inputs_and_each_other():
    torch.manual_seed(0)
    model = TupleOutputs()
    x = torch.randn(DIM, DIM, requires_grad=True)
    y = torch.randn(DIM, DIM)  # requires_grad=False
    _run_all_budgets(model, [x, y], tuple_loss)
