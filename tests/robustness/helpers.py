"""Helpers for the robustness suite: multi-step runs, budget checks, error chains.

``tests.conftest`` runs one step on a deep copy of a model.  Robustness cases
also need several steps on one model (buffers, the RNG stream, training),
losses computed outside the compiled region (tuple and dict outputs), a seed,
and the partition records every time, so :func:`run_steps` generalises it.
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import sympy
import torch

from ckpt import _torch_compat as compat
from ckpt.cost_model.node_cost import storage_bytes_expr
from ckpt.measure import saved_activations
from ckpt.records import PartitionRecord, record_partitions
from tests.conftest import StepResult, assert_close_grads

__all__ = [
    "BUDGETS",
    "assert_runs_close",
    "assert_within_budget",
    "bytes_at_sizes",
    "ckpt_compile",
    "error_chain",
    "floor_fraction",
    "run_steps",
]

# The budgets every robustness case is checked at: no cap, half, and everything recomputable recomputed.
BUDGETS: tuple[str, ...] = ("none", "0.5", "0.0")

Loss = Callable[[Any], torch.Tensor]


def ckpt_compile(fn: Callable[..., Any], budget: str | None, **compile_kwargs: Any) -> Callable[..., Any]:
    """``torch.compile(fn, backend="ckpt")`` at ``budget`` (None: the environment's)."""
    options = dict(compile_kwargs.pop("options", {}))
    if budget is not None:
        options["memory_budget"] = budget
    return torch.compile(fn, backend="ckpt", options=options, **compile_kwargs)


def _fresh_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs]


def run_steps(
    model: torch.nn.Module,
    batches: Sequence[Sequence[Any]],
    *,
    compile_fn: Callable[[torch.nn.Module], Callable[..., Any]] | None = None,
    loss_fn: Loss | None = None,
    seed: int | None = None,
    lr: float = 0.0,
    used_inputs: list[list[Any]] | None = None,
    prepare_inputs: Callable[[list[Any]], None] | None = None,
) -> tuple[list[StepResult], torch.nn.Module]:
    """One forward and backward per batch on a deep copy of ``model``; returns the steps and the copy.

    * ``compile_fn`` turns the copy into the callable to run (None: eager).
    * ``loss_fn`` reduces the callable's outputs to the loss, outside the
      compiled region and outside the byte measurement (None: the callable
      returns the loss).
    * ``seed`` seeds the global RNG once, before the first step, so later steps
      see whatever state the earlier ones left.
    * With ``lr > 0`` each step ends with plain SGD on the parameters.
    * Inputs are fresh clones, so an input the model mutates starts equal for
      every run.  ``prepare_inputs`` is called on them first (for
      ``torch._dynamo.mark_dynamic``, which a clone does not carry over);
      ``used_inputs`` receives them, so a test can read what the model wrote.

    Gradients are reset before each step.  The compile caches are off, so each
    compile runs the partitioner and leaves a record.
    """
    torch.compiler.reset()
    model = copy.deepcopy(model)
    fn = model if compile_fn is None else compile_fn(model)
    if seed is not None:
        torch.manual_seed(seed)
    steps: list[StepResult] = []
    with compat.compile_caches_disabled():
        for batch in batches:
            inputs = _fresh_inputs(batch)
            if prepare_inputs is not None:
                prepare_inputs(inputs)
            if used_inputs is not None:
                used_inputs.append(inputs)
            for parameter in model.parameters():
                parameter.grad = None
            tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
            with record_partitions() as records:
                with saved_activations(model, *tensors) as saved:
                    outputs = fn(*inputs)
                loss = outputs if loss_fn is None else loss_fn(outputs)
            loss.backward()
            grads = [p.grad for p in model.parameters()] + [x.grad for x in tensors if x.requires_grad]
            grads = [g.clone() if g is not None else None for g in grads]
            steps.append(StepResult(loss.detach(), grads, saved.bytes, records))
            if lr > 0:
                with torch.no_grad():
                    for parameter in model.parameters():
                        if parameter.grad is not None:
                            parameter.sub_(lr * parameter.grad)
    return steps, model


def assert_runs_close(got: Sequence[StepResult], want: Sequence[StepResult], **tolerances: float) -> None:
    """Every step's loss and gradients agree (``assert_close_grads`` tolerances)."""
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want)):
        try:
            assert_close_grads(a, b, **tolerances)
        except AssertionError as error:
            raise AssertionError(f"step {index}: {error}") from error


def byte_cap(record: PartitionRecord) -> int | None:
    """The most bytes the record's graph may save: its budget, or the minimum when that is unreachable."""
    assert record.fallback_reason is None, f"graph {record.graph} fell back: {record.fallback_reason}"
    assert record.plan is not None
    if record.budget_bytes is None:
        return None
    if record.plan.over_budget:
        assert record.plan.minimum_bytes is not None
        assert record.plan.bytes <= record.plan.minimum_bytes, (
            f"graph {record.graph}: over budget, but the plan ({record.plan.bytes} B) is not the minimum "
            f"({record.plan.minimum_bytes} B)"
        )
        return record.plan.bytes
    assert record.plan.bytes <= record.budget_bytes
    return record.budget_bytes


def assert_within_budget(
    step: StepResult, graphs: int | None = None, *, total: bool = True, calls: int = 1
) -> list[PartitionRecord]:
    """The step's graphs were all planned by ckpt within their caps; with ``total``, so were the measured bytes.

    ``graphs``: how many joint graphs the step must have partitioned (None:
    at least one).  The measured bytes of the whole step must keep the sum of
    the graphs' caps, times ``calls`` when each graph ran that many times
    before the backward (a cap holds per call).
    """
    records = list(step.records)
    if graphs is None:
        assert records, "the ckpt partitioner did not run"
    else:
        assert len(records) == graphs, f"expected {graphs} partitioned graphs, got {[r.graph for r in records]}"
    caps = [byte_cap(record) for record in records]
    if total and all(cap is not None for cap in caps):
        cap_sum = calls * sum(cap for cap in caps if cap is not None)
        assert step.saved_bytes <= cap_sum, f"measured {step.saved_bytes} B saved, budget {cap_sum} B"
    return records


def bytes_at_sizes(record: PartitionRecord, indices: Iterable[int], size_for_hint: dict[int, int]) -> int:
    """Storage bytes of the record's values ``indices`` at other sizes of a graph with symbolic sizes.

    The record's byte counts are evaluated at the size hints of the compile.
    Here each backed symbol is replaced by ``size_for_hint[its hint]`` (its
    hint where absent), so the hints of the varying sizes must be distinct.
    Graph inputs count zero, as in the plan.
    """
    assert record.analysis is not None
    nodes = record.analysis.nodes
    hints = compat.symbol_hints(compat.shape_env_of(node.meta.get("val") for node in nodes))
    substitution = {symbol: size_for_hint.get(int(hint), hint) for symbol, hint in hints.items()}
    total = 0
    for index in indices:
        node = nodes[index]
        value = node.meta.get("val")
        if node.op == "placeholder" or not isinstance(value, torch.Tensor):
            continue
        total += int(sympy.sympify(storage_bytes_expr(value)).xreplace(substitution))
    return total


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def floor_fraction(fraction: float, total: int) -> int:
    """The byte cap of a fractional budget, as ``ckpt.config.Budget.resolve`` computes it."""
    return math.floor(fraction * total)


def inductor_kernels(code: str) -> dict[str, str]:
    """Generated C++ kernels of one Inductor module, by name."""
    pattern = r"(\w+) = async_compile\.cpp_pybinding\(.*?r?'''(.*?)'''\)"  # torch 2.9: a plain string
    return dict(re.findall(pattern, code, re.S))


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, env: dict[str, str] | None = None, timeout: int = 600) -> str:
    """Run ``code`` in a fresh Python process from the repository root; its stdout (fails on a non-zero exit)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
