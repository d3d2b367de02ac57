"""Several graphs per model: an explicit graph break, and a data-dependent branch.

The budget applies to each compiled graph on its own: each graph's plan keeps
its own cap, and the bytes measured over the whole step keep the sum of the
caps.  An activation handed from one graph to the next (an input of the
second graph that requires grad and is not a leaf) is charged to the graph
that saves it, like any saved value.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.robustness.helpers import (
    BUDGETS,
    assert_runs_close,
    assert_within_budget,
    ckpt_compile,
    floor_fraction,
    run_steps,
)

pytestmark = pytest.mark.compile

DIM = 16


class Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)).square())


class GraphBreakNet(nn.Module):
    """Two stages with ``torch._dynamo.graph_break()`` between them."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Stage()
        self.second = Stage()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h).sin().sum()


class BranchNet(nn.Module):
    """A Python branch on a tensor value: Dynamo compiles the code before it, and the branch taken, separately."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Stage()
        self.positive = Stage()
        self.negative = Stage()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        branch = self.positive if h.sum() > 0 else self.negative
        return branch(h).cos().sum()


def _input(sign: float = 1.0) -> torch.Tensor:
    x = torch.randn(8, DIM, generator=torch.Generator().manual_seed(6)) + sign * 2.0
    return x.requires_grad_(True)


@pytest.mark.parametrize("model_class", [GraphBreakNet, BranchNet])
def test_gradients_and_plans_per_graph(model_class):
    """Each graph is planned against its own no-recompute bytes and keeps its own cap; gradients equal eager's."""
    torch.manual_seed(0)
    model = model_class()
    batches = [[_input()]]
    want, _ = run_steps(model, batches)
    measured = {}
    for budget in BUDGETS:
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget))
        assert_runs_close(got, want)
        records = assert_within_budget(got[0], graphs=2, total=False)
        assert len({record.graph for record in records}) == 2
        for record in records:
            if record.budget_bytes is not None:
                assert record.budget_bytes == floor_fraction(float(budget), record.analysis.reference_bytes)
        measured[budget] = got[0].saved_bytes
    assert measured["0.0"] < measured["none"], "the budget must change what the graphs save"


@pytest.mark.parametrize("model_class", [GraphBreakNet, BranchNet])
def test_measured_bytes_keep_the_sum_of_the_caps(model_class):
    """The bytes saved over the whole step keep the sum of the graphs' caps."""
    torch.manual_seed(0)
    model = model_class()
    for budget in BUDGETS:
        got, _ = run_steps(model, [[_input()]], compile_fn=lambda m: ckpt_compile(m, budget))
        assert_within_budget(got[0], graphs=2)


@pytest.mark.compat
def test_both_branches_of_a_data_dependent_branch():
    """Each side of the branch is its own graph, planned and correct when it is first taken."""
    torch.manual_seed(0)
    model = BranchNet()
    batches = [[_input(1.0)], [_input(-1.0)]]
    want, _ = run_steps(model, batches)
    assert (want[0].loss != want[1].loss).item()
    got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, "0.5"))
    assert_runs_close(got, want)
    assert_within_budget(got[0], graphs=2, total=False)
    assert_within_budget(got[1], graphs=1, total=False)
