"""Random DAG programs (``tests.robustness.programs``) at random budgets: eager's gradients, bytes within budget.

Each example compiles with Inductor, so the CI run keeps a handful; the
``slow`` variant runs many more by hand (``pytest -m slow``).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from ckpt.backend import BudgetWarning
from tests.robustness.helpers import assert_runs_close, assert_within_budget, ckpt_compile, run_steps
from tests.robustness.programs import Program, ProgramModule, Step, budgets, program_inputs, programs

# By hand: CKPT_RANDOM_PROGRAMS=300 python -m pytest -m slow tests/robustness/test_random_programs.py
SLOW_EXAMPLES = int(os.environ.get("CKPT_RANDOM_PROGRAMS", "2000"))


def check_program(program: Program, budget: str) -> None:
    """The compiled program matches eager in float64 and its measured bytes keep the cap."""
    torch.manual_seed(0)
    model = ProgramModule(program)
    batches = [program_inputs(program, seed=1)]
    want, _ = run_steps(model, batches)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BudgetWarning)
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget))
    assert_runs_close(got, want, rtol=1e-7, atol=1e-9)
    (record,) = assert_within_budget(got[0], graphs=1)
    budget_warnings = [w for w in caught if issubclass(w.category, BudgetWarning)]
    assert bool(budget_warnings) == record.plan.over_budget, "a BudgetWarning exactly when the budget is unreachable"


@pytest.mark.compile
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), budget=budgets())
def test_random_programs_match_eager_within_budget(program, budget):
    check_program(program, budget)


@pytest.mark.slow
@pytest.mark.compile
@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(max_steps=24), budget=budgets())
def test_many_random_programs_match_eager_within_budget(program, budget):
    check_program(program, budget)


def test_programs_without_a_gradient_are_not_drawn():
    """A loss that reaches no parameter and no grad-requiring input has no backward: the strategy skips it."""
    detached = Program(
        inputs=2,
        input_requires_grad=(True, False),
        steps=(
            Step("linear", (0,), ("linear0",)),
            Step("unary", (1,), ("affine",)),
            Step("detach_scale", (3, 2)),
            Step("unary", (1,), ("affine",)),
        ),
    )
    assert not detached.loss_requires_grad()
    assert not ProgramModule(detached)(*program_inputs(detached, seed=0)).requires_grad
    reaching = Program(2, (True, False), detached.steps + (Step("binary", (2, 5), ("add",)),))
    assert reaching.loss_requires_grad()
    assert ProgramModule(reaching)(*program_inputs(reaching, seed=0)).requires_grad
