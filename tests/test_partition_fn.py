"""``ckpt.partition_fn``: ckpt's planner for code that drives AOTAutograd itself.

Everything here runs ``aot_function``/``aot_module`` with no-op compilers: the
joint graph is traced and partitioned, and the graphs run eagerly, with no
kernel compile.

Input mutations are the trap of this path.  With AOTAutograd's default
``keep_inference_input_mutations=False`` the runtime wrapper copies a
mutated input's new value back *after* the forward, so a plan that saves that
input, or recomputes from it in the backward, reads the new data (autograd
raises "modified by an inplace operation").  Four situations, each at the
budgets none, 0.5 and 0.0, against eager.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from functorch.compile import aot_function, aot_module, min_cut_rematerialization_partition, nop

import ckpt
from ckpt.aot_partition import CkptPartitionFn
from ckpt.backend import CkptPartitionError
from ckpt.partitioner.problem import ProblemError
from ckpt.records import record_partitions
from tests.robustness.helpers import BUDGETS, assert_runs_close, assert_within_budget, run_steps
from tests.robustness.test_mutation import BatchNormNet, MutatedBufferRead

# compat: the mutation analysis reads AOTAutograd's output descriptors, through _torch_compat.
pytestmark = pytest.mark.compat

DIM = 16


def _aot(budget: str, **options: Any) -> Callable[[nn.Module], Callable[..., Any]]:
    def compile_fn(model: nn.Module) -> Callable[..., Any]:
        partition = ckpt.partition_fn(budget, **options)
        return aot_module(model, fw_compiler=nop, bw_compiler=nop, partition_fn=partition)

    return compile_fn


def _batches(steps: int = 2) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [[torch.randn(8, DIM, generator=generator, requires_grad=True)] for _ in range(steps)]


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, 4 * DIM)
        self.fc2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)).sin()).square().mean()


# -- the API -------------------------------------------------------------------------------------------------


def test_partition_fn_is_the_lazy_public_function():
    assert ckpt.partition_fn is ckpt.partition_fn  # stays the function, not the module that defines it
    partition = ckpt.partition_fn(0.5)
    assert isinstance(partition, CkptPartitionFn)
    assert partition.config.budget.fraction == 0.5


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"memory_budget": "lots"}, ["memory_budget", "'lots'", "accepted forms", "GiB"]),
        ({"memory_budget": 1.5}, ["memory_budget", "1.5", "fraction in [0, 1]"]),
        ({"device": "tpu9"}, ["device", "'tpu9'", "cpu"]),
        ({"strict": "maybe"}, ["strict", "'maybe'", "true/false"]),
        ({"solver_effort": -1}, ["solver_effort", "-1", ">= 0"]),
    ],
)
def test_bad_options_name_the_option_the_value_and_the_accepted_forms(kwargs, words):
    with pytest.raises(ValueError) as error:
        ckpt.partition_fn(**kwargs)
    for word in words:
        assert word in str(error.value)


def test_unset_arguments_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("CKPT_MEMORY_BUDGET", "0.25")
    assert ckpt.partition_fn().config.budget.fraction == 0.25
    assert ckpt.partition_fn("none").config.budget.unlimited  # an argument overrides the variable


def test_gradients_equal_eager_and_the_plans_keep_the_budget():
    torch.manual_seed(0)
    model = Mlp()
    batches = _batches(steps=1)
    want, _ = run_steps(model, batches)
    saved = {}
    for budget in BUDGETS:
        got, _ = run_steps(model, batches, compile_fn=_aot(budget))
        assert_runs_close(got, want)
        (record,) = assert_within_budget(got[0], graphs=1)
        assert str(record.budget) == str(ckpt.partition_fn(budget).config.budget)
        saved[budget] = got[0].saved_bytes
    assert saved["0.0"] < saved["none"]


def test_device_profile_given_or_from_the_inputs():
    x = torch.randn(4, DIM, requires_grad=True)
    for device, name in (("h100", "h100"), (None, "cpu")):
        with record_partitions() as records:
            aot_function(torch.sin, nop, nop, partition_fn=ckpt.partition_fn(device=device))(x).sum().backward()
        assert [r.profile.name for r in records] == [name]


def _failing_analysis(*args: Any, **kwargs: Any) -> Any:
    raise ProblemError("no plan for this graph (injected)")


def test_failure_warns_and_falls_back_to_aotautograds_default_partition(monkeypatch, caplog):
    """Not Inductor's min cut: AOTAutograd's default partition, which gets the input mutation below right."""
    monkeypatch.setattr("ckpt.backend.analyze_joint", _failing_analysis)
    with caplog.at_level(logging.WARNING, logger="ckpt.backend"), record_partitions() as records:
        got_grads = _non_leaf_mutation_grads(ckpt.partition_fn(0.5, strict=False))
    assert "using torch's default partition instead" in caplog.text
    assert [r.fallback_reason for r in records] == ["ProblemError: no plan for this graph (injected)"]
    for got, want in zip(got_grads, _non_leaf_mutation_grads(None)):
        torch.testing.assert_close(got, want)


def test_failure_raises_under_strict(monkeypatch):
    monkeypatch.setattr("ckpt.backend.analyze_joint", _failing_analysis)
    compiled = aot_function(torch.sin, nop, nop, partition_fn=ckpt.partition_fn(strict=True))
    with pytest.raises(CkptPartitionError, match="injected"):
        compiled(torch.randn(3, requires_grad=True))


# -- input mutations ---------------------------------------------------------------------------------------------


class RunningAverage(nn.Module):
    """A buffer updated in place, running-average style, then read."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, DIM))
        self.register_buffer("average", torch.linspace(-1.0, 1.0, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.average.mul_(0.9).add_(0.1 * x.detach().mean(0))
        return ((self.w * self.average).sin() * x).sum()


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("model_class", [RunningAverage, MutatedBufferRead, BatchNormNet])
def test_buffers_mutated_after_the_forward(model_class, budget):
    """Two SGD steps through ``aot_module``: losses, gradients and buffers equal eager's."""
    torch.manual_seed(0)
    model = model_class()
    batches = _batches()
    want, eager_model = run_steps(model, batches, lr=0.1)
    got, trained = run_steps(model, batches, compile_fn=_aot(budget), lr=0.1)
    assert_runs_close(got, want)
    for (name, got_buffer), (_, want_buffer) in zip(trained.named_buffers(), eager_model.named_buffers()):
        torch.testing.assert_close(got_buffer, want_buffer, msg=lambda m: f"{name}: {m}")
    (record,) = assert_within_budget(got[0], graphs=1)
    assert record.analysis is not None
    mutated = [name for name, reason in record.analysis.reasons.items() if "mutated after the forward" in reason]
    assert mutated, "the planner did not see the buffer mutation"


def _non_leaf_update(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Reads ``a`` into a value the backward needs, then doubles ``a`` in place (``a`` is not a leaf)."""
    b = (a + w).sin()
    a.mul_(2)
    return (b * a).sum()


def _non_leaf_mutation_grads(partition: Any) -> tuple[torch.Tensor, ...]:
    """Gradients of the leaves under ``a = x * 1`` and ``w``, and ``a`` after the call (None: eager)."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(4, DIM, generator=generator, requires_grad=True)
    w = torch.randn(DIM, generator=generator, requires_grad=True)
    fn = _non_leaf_update if partition is None else aot_function(_non_leaf_update, nop, nop, partition_fn=partition)
    a = x * 1
    fn(a, w).backward()
    assert x.grad is not None and w.grad is not None
    return x.grad, w.grad, a.detach()


@pytest.mark.parametrize("budget", BUDGETS)
def test_non_leaf_input_that_requires_grad_mutated_in_place(budget):
    want = _non_leaf_mutation_grads(None)
    with record_partitions() as records:
        got = _non_leaf_mutation_grads(ckpt.partition_fn(budget))
    for got_value, want_value in zip(got, want):
        torch.testing.assert_close(got_value, want_value)
    (record,) = records
    assert record.plan is not None and record.analysis is not None
    assert record.analysis.reasons["primals_1:save"].startswith("graph input mutated after the forward")


@pytest.mark.xfail(
    strict=True,
    raises=RuntimeError,
    reason="torch's min-cut partitioner (aot_eager's, and Inductor's) saves the non-leaf input that the runtime "
    "wrapper then mutates: 'one of the variables needed for gradient computation has been modified by an "
    "inplace operation'. ckpt.partition_fn and backend='ckpt' do not save it. Passes once torch fixes it.",
)
def test_torchs_min_cut_on_a_non_leaf_input_mutated_in_place():
    _non_leaf_mutation_grads(min_cut_rematerialization_partition)


def test_the_readme_example_runs_and_plans_its_graph():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    (example,) = [block for block in blocks if "ckpt.partition_fn(" in block]
    with record_partitions() as records:
        exec(compile(example, "README.md", "exec"), {})
    assert [r.fallback_reason for r in records] == [None]
