"""Shared fixtures: strict mode, a private cache, and helpers for end-to-end steps."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

# The suite runs strict: a planner failure is an error, never a silent fallback.
os.environ.setdefault("CKPT_STRICT", "1")

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: Dynamo caches per code object across deep copies."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@dataclass
class StepResult:
    loss: torch.Tensor
    grads: list[torch.Tensor | None]
    saved_bytes: int
    records: list


def run_step(model: torch.nn.Module, fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> StepResult:
    """One forward and backward; returns the loss, gradients of params and inputs, and saved bytes.

    Compile caches are off inside, so the partitioner runs and its records are complete.
    """
    from ckpt._torch_compat import compile_caches_disabled
    from ckpt.measure import saved_activations
    from ckpt.records import record_partitions

    with compile_caches_disabled(), record_partitions() as records, saved_activations(model, *inputs) as saved:
        loss = fn(*inputs)
    loss.backward()
    grads = [p.grad for p in model.parameters()] + [x.grad for x in inputs if x.requires_grad]
    return StepResult(loss.detach(), grads, saved.bytes, records)


def compiled_step(
    model: torch.nn.Module, inputs: Sequence[torch.Tensor], budget: str | None, **compile_kwargs
) -> StepResult:
    torch.compiler.reset()  # Dynamo would reuse an earlier compile of the same forward code
    model = copy.deepcopy(model)
    inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    options = {} if budget is None else {"memory_budget": budget}
    compiled = torch.compile(model, backend="ckpt", options=options, **compile_kwargs)
    return run_step(model, compiled, inputs)


def eager_step(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> StepResult:
    model = copy.deepcopy(model)
    inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    return run_step(model, model, inputs)


def assert_close_grads(got: StepResult, want: StepResult, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    torch.testing.assert_close(got.loss, want.loss, rtol=rtol, atol=atol)
    assert len(got.grads) == len(want.grads)
    for index, (a, b) in enumerate(zip(got.grads, want.grads)):
        assert (a is None) == (b is None), f"gradient {index}: one is None"
        if a is not None:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"gradient {index}: {m}")
