"""Dynamic shapes: one plan serves every batch and sequence length, adds no guard, and keeps its budget.

The partitioner reads sizes through the shape environment's hints, which
never adds a guard.  So a graph compiled with symbolic batch and sequence
sizes is partitioned once, at the sizes of the compile (the hints), and the
same forward and backward run at every later size.

**What "within budget at every size" means here.**  A fractional budget is a
fraction of the bytes autograd saves, and that changes with the sizes.
The faithful reference at a size is that plan *at that size*:
the record's ``analysis.reference_saved`` values with their symbolic
storage sizes evaluated at the size (:func:`bytes_at_sizes`).  Compiling
again at each size would plan again and so test something else.
The measured bytes (saved_tensors_hooks) at
each size must keep ``floor(fraction * reference(size))``.  At the hint
size that is the bound the solver was given; at other sizes it holds because
the partitioner also checks the plan's ratio at sizes from 1/4 to 8 times the
hints (``ckpt.partitioner.symbolic``), so the test sizes stay in that range.

**Absolute budgets** are read at the hints: ``budget_bytes`` is the given
number of bytes, compared with the plan's bytes at the sizes of the compile.
The same plan then serves larger sizes without a guard, so its bytes grow
with the sizes past an absolute cap (``test_absolute_budget_is_read_at_the_compile_sizes``).

Sizes are kept small (at most 4096 elements per reduction), because above
that Inductor's CPU code generator adds a guard of its own
(``need_use_acc_helper``) and recompiles, with or without ckpt.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ckpt import _torch_compat as compat
from tests.robustness.helpers import (
    BUDGETS,
    assert_runs_close,
    assert_within_budget,
    bytes_at_sizes,
    ckpt_compile,
    run_steps,
)

pytestmark = pytest.mark.compile

DIM = 8
HINT_BATCH, HINT_SEQ = 2, 5  # the first size compiles the graph; distinct from DIM and each other
SIZES = [(HINT_BATCH, HINT_SEQ), (3, 7), (4, 12)]


class RowsModel(nn.Module):
    """LayerNorm, a GELU MLP, a residual and a softmax: every activation is (batch, seq, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 2 * DIM)
        self.fc2 = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.fc2(F.gelu(self.fc1(self.ln(x))))
        return (torch.softmax(h, dim=-1) * h).sum()


class ScoresModel(nn.Module):
    """A (batch, seq, seq) score matrix beside a (batch, seq, features) MLP: the two grow at different rates."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(-1, -2)
        h = self.fc(x)
        return scores.sin().sum() + (torch.tanh(h) * h).sum()


def _batches(sizes: list[tuple[int, int]]) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [[torch.randn(b, t, DIM, generator=generator, requires_grad=True)] for b, t in sizes]


def _mark_batch_and_seq(inputs: list[torch.Tensor]) -> None:
    torch._dynamo.mark_dynamic(inputs[0], 0)
    torch._dynamo.mark_dynamic(inputs[0], 1)


def _check_one_plan_at_every_size(model: nn.Module, budget: str, mode: str, sizes: list[tuple[int, int]]) -> None:
    """Gradients equal eager's at every size, one graph and one plan serve them all, and bytes keep the budget."""
    batches = _batches(sizes)
    want, _ = run_steps(model, batches)
    counters = compat.dynamo_counters()
    counters.clear()
    if mode == "dynamic_true":
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget, dynamic=True))
    else:
        got, _ = run_steps(
            model, batches, compile_fn=lambda m: ckpt_compile(m, budget), prepare_inputs=_mark_batch_and_seq
        )
    assert_runs_close(got, want)
    # One Dynamo graph and one partition for all sizes: the plan added no guard that forces a recompile.
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1, f"budget {budget}: Dynamo compiled {graphs} graphs"
    (record,) = assert_within_budget(got[0], graphs=1)
    assert all(not step.records for step in got[1:]), f"budget {budget}: a later size was partitioned again"
    fraction = None if budget == "none" else float(budget)
    hint_batch, hint_seq = sizes[0]
    assert len({hint_batch, hint_seq, DIM}) == 3, "symbols are told apart by their hints"
    for (batch, seq), step in zip(sizes, got):
        size_for_hint = {hint_batch: batch, hint_seq: seq}
        assert step.saved_bytes == bytes_at_sizes(record, record.plan.saved, size_for_hint), (
            f"budget {budget}, size {(batch, seq)}: measured bytes differ from the plan's bytes at this size"
        )
        if fraction is not None:
            cap = math.floor(fraction * bytes_at_sizes(record, record.analysis.reference_saved, size_for_hint))
            assert step.saved_bytes <= cap, f"budget {budget}, size {(batch, seq)}: {step.saved_bytes} B > {cap} B"


@pytest.mark.parametrize("mode", ["dynamic_true", pytest.param("mark_dynamic", marks=pytest.mark.compat)])
def test_one_plan_serves_every_size_within_budget(mode):
    torch.manual_seed(0)
    model = RowsModel()
    for budget in BUDGETS:
        _check_one_plan_at_every_size(model, budget, mode, SIZES)


def test_fraction_holds_at_sizes_where_saved_values_grow_faster():
    """Scores grow with seq squared: a plan fitted only at the hints (seq 3) keeps 3072 B against 2560 B at seq 16."""
    torch.manual_seed(0)
    sizes = [(HINT_BATCH, 3), (HINT_BATCH, 16), (3, 24)]
    for budget in ("0.5", "0.25"):
        _check_one_plan_at_every_size(ScoresModel(), budget, "dynamic_true", sizes)


@pytest.mark.compat
def test_absolute_budget_is_read_at_the_compile_sizes():
    """An absolute budget is the cap at the sizes of the compile; the one plan then serves every size."""
    torch.manual_seed(0)
    model = RowsModel()
    budget_bytes = 1024
    batches = _batches(SIZES)
    want, _ = run_steps(model, batches)
    got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, f"{budget_bytes}B", dynamic=True))
    assert_runs_close(got, want)
    (record,) = assert_within_budget(got[0], graphs=1)
    assert record.budget_bytes == budget_bytes
    assert not record.plan.over_budget
    assert record.analysis.reference_bytes > budget_bytes, "the cap must bind at the compile sizes"
    for (batch, seq), step in zip(SIZES, got):
        expected = bytes_at_sizes(record, record.plan.saved, {HINT_BATCH: batch, HINT_SEQ: seq})
        assert step.saved_bytes == expected


class ScoresInside(nn.Module):
    """The score-and-MLP model as a submodule, so a per-module budget covers every value of the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ScoresModel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_per_module_fraction_holds_at_every_size():
    from ckpt.module_budgets import clear_budgets, set_budget

    torch.manual_seed(0)
    sizes = [(HINT_BATCH, 3), (HINT_BATCH, 16), (3, 24)]
    model = ScoresInside()
    batches = _batches(sizes)
    want, _ = run_steps(model, batches)
    set_budget(model.inner, 0.5)
    try:
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, "none", dynamic=True))
    finally:
        clear_budgets()
    assert_runs_close(got, want)
    (record,) = got[0].records
    (cap,) = record.region_caps
    assert cap.fraction == 0.5 and len(cap.members) == len(record.analysis.problem)
    for (batch, seq), step in zip(sizes, got):
        size_for_hint = {HINT_BATCH: batch, 3: seq}
        assert step.saved_bytes == bytes_at_sizes(record, record.plan.saved, size_for_hint)
        limit = math.floor(0.5 * bytes_at_sizes(record, record.analysis.reference_saved, size_for_hint))
        assert step.saved_bytes <= limit, f"size {(batch, seq)}: {step.saved_bytes} B > {limit} B"
