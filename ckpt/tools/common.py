"""Helpers shared by the user tools: one step's loss, fresh entry points, checked options.

``explain``, ``pareto``, ``validate`` and the budget sweep all compile a copy
of the user's model and run steps on it; the benchmarks and tests do the same.
They share these pieces so that every one of them differentiates the same
loss and gives each compile its own code object.
"""

from __future__ import annotations

import statistics
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

__all__ = [
    "LOSS_RULE",
    "PLOT_EXTRA",
    "STATISTICS",
    "check_model",
    "check_statistic",
    "clone_inputs",
    "compile_options",
    "fresh_entry",
    "fresh_function",
    "loss_of",
    "require_matplotlib",
    "rotation",
    "summarise",
]

LOSS_RULE = "the output itself if it is a scalar tensor, else the sum of .sum() over its floating-point tensors"
PLOT_EXTRA = "pip install 'torch-ckpt[plot]'"

T = TypeVar("T")

_STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {"median": statistics.median, "min": min}
STATISTICS = tuple(_STATISTICS)


def check_statistic(statistic: str) -> str:
    """``statistic`` if it names a known summary of step times, else a ValueError listing them."""
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic={statistic!r} is not known; use one of {', '.join(map(repr, _STATISTICS))}")
    return statistic


def summarise(statistic: str, values: Sequence[float]) -> float:
    """The ``statistic`` (``"median"`` or ``"min"``) of ``values``."""
    return _STATISTICS[check_statistic(statistic)](values)


def require_matplotlib() -> Any:
    """matplotlib's ``Figure``, or an ImportError that says which extra installs it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            f"the Pareto plot needs matplotlib, which is not installed; install the plot extra: {PLOT_EXTRA}"
        ) from error
    return Figure


def loss_of(output: Any) -> torch.Tensor:
    """The loss one explain step differentiates: see :data:`LOSS_RULE`."""
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        if not output.requires_grad:
            raise ValueError(
                "the model's output does not require grad, so there is no backward to plan; "
                "give the model parameters or inputs with requires_grad=True"
            )
        return output
    leaves = torch.utils._pytree.tree_leaves(output)
    terms = [t.sum() for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    if not terms:
        raise ValueError(
            f"the model returned {type(output).__name__} with no floating-point tensor that requires grad, "
            f"so there is no backward to plan; explain differentiates {LOSS_RULE}"
        )
    return torch.stack(terms).sum() if len(terms) > 1 else terms[0]


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Fresh copies of the tensors in ``inputs`` (same ``requires_grad``), other values as given."""
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs]


def _step(model: torch.nn.Module, *inputs: Any) -> Any:
    return model(*inputs)


def fresh_function(fn: Callable[..., Any], name: str) -> types.FunctionType:
    """A copy of ``fn`` (same globals, defaults and closure) with a code object of its own, named ``name``.

    Dynamo caches compiled code per code object, and parameters are graph
    inputs: two settings compiled through one code object would share the
    first one's graph.
    """
    code = fn.__code__.replace(co_name=name)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def fresh_entry(label: str) -> types.FunctionType:
    """A function ``f(model, *inputs) -> model(*inputs)`` with a code object of its own.

    Compiling through this keeps the cache entry off the model class's
    ``forward``, so a later ``torch.compile`` of the user's model never reuses
    it, and two budgets compiled in one process never share a graph.
    """
    return fresh_function(_step, f"ckpt_step_{label}")


def rotation(items: Sequence[T], round_index: int) -> list[T]:
    """The order of one round-robin round: every item once, starting one later each round.

    Timing settings in rotated rounds lets a shared machine's drift hit all of them alike.
    """
    if not items:
        return []
    offset = round_index % len(items)
    return [*items[offset:], *items[:offset]]


def check_model(model: Any) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def compile_options(budget: Any, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``options`` for ``torch.compile(backend="ckpt")``, checked before any compile."""
    from ckpt.config import CkptConfig, parse_budget

    merged = dict(options or {})
    if budget is not None:
        parse_budget(budget, "budget")
        merged["memory_budget"] = budget
    CkptConfig.from_sources(merged)  # raises on unknown keys and bad values, naming them
    return merged
