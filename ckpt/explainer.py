"""Tell users what the partitioner saved and recomputed, and what it costs.

:func:`explain` compiles a deep copy of the model with ``backend="ckpt"``,
runs one forward and backward, and returns an :class:`ExplainReport`: per
compiled graph, the saved tensors (with shape, bytes and the user's source
line), the recomputed values (with their estimated cost), the predicted
totals next to the no-recompute plan and torch's default partition, and the
solver's facts; and for the whole step, the measured activation bytes next to
the prediction.

The backend calls :func:`emit_explain` for each graph when ``CKPT_EXPLAIN`` is
set: ``1`` logs :func:`summary_line` at INFO on the ``"ckpt"`` logger; a
directory path writes the graph's report there as JSON and Markdown.  Those
reports hold predictions only, since the backend never runs a step.

The report data lives in :mod:`ckpt.report`; this module runs the step and
writes the outputs.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckpt.report import ExplainReport, GraphReport, graph_report

if TYPE_CHECKING:
    from ckpt.backend import PartitionRecord

__all__ = [
    "ExplainReport",
    "GraphReport",
    "clone_inputs",
    "emit_explain",
    "explain",
    "fresh_entry",
    "loss_of",
    "summary_line",
]

log = logging.getLogger("ckpt")

LOSS_RULE = "the output itself if it is a scalar tensor, else the sum of .sum() over its floating-point tensors"


def summary_line(record: PartitionRecord) -> str:
    """One line per graph: saved and recomputed counts, bytes, predicted time, solver."""
    if record.plan is None or record.analysis is None:
        return f"graph {record.graph}: fell back to torch's partition ({record.fallback_reason})"
    plan, analysis = record.plan, record.analysis
    mib = 1024 * 1024
    return (
        f"graph {record.graph}: saved {len(plan.saved)} values, {plan.bytes / mib:.2f} MiB "
        f"(no-recompute plan {analysis.no_recompute_bytes / mib:.2f} MiB, budget {record.budget}); "
        f"recomputed {len(plan.recomputed)} values; predicted extra time {plan.time / 1e6:.3f} us; "
        f"solver {plan.solver} in {record.solve_seconds * 1e3:.1f} ms"
    )


def _file_stem(graph: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", graph) or "graph"


def emit_explain(record: PartitionRecord, target: str) -> None:
    """Log the summary of one graph; if ``target`` is a directory path, write its full report there.

    Never raises for an unwritable directory: the report is a side channel and
    must not change how the graph compiles.
    """
    log.info("ckpt: %s", summary_line(record))
    if target == "log":
        return
    try:
        report = ExplainReport(graphs=(graph_report(record),), budget=str(record.budget), measured_bytes=None)
    except Exception as error:  # a report bug must not change how the graph compiles
        log.warning("ckpt: could not build the explain report for graph %r: %s", record.graph, error, exc_info=True)
        return
    directory = Path(target)
    stem = _file_stem(record.graph)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{stem}.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        (directory / f"{stem}.md").write_text(report.to_markdown(max_rows=None) + "\n")
    except OSError as error:
        log.warning("ckpt: could not write the explain report for graph %r to %s: %s", record.graph, directory, error)
        return
    log.info("ckpt: wrote %s.json and %s.md to %s", stem, stem, directory)


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
    return [
        x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs
    ]


def _step(model: torch.nn.Module, *inputs: Any) -> Any:
    return model(*inputs)


def fresh_entry(label: str) -> types.FunctionType:
    """A function ``f(model, *inputs) -> model(*inputs)`` with a code object of its own.

    Dynamo caches compiled code per code object, and parameters are graph
    inputs: compiling through this keeps the cache entry off the model class's
    ``forward``, so a later ``torch.compile`` of the user's model never reuses it,
    and two budgets compiled in one process never share a graph.
    """
    code = _step.__code__.replace(co_name=f"ckpt_step_{label}")
    return types.FunctionType(code, _step.__globals__, code.co_name)


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


def explain(
    model: torch.nn.Module,
    *example_inputs: Any,
    budget: Any = None,
    options: Mapping[str, Any] | None = None,
) -> ExplainReport:
    """Compile ``model`` with ``backend="ckpt"``, run one step, and report what was saved and recomputed.

    ``budget`` takes the forms of ``CKPT_MEMORY_BUDGET`` (``"none"``, a fraction
    such as ``0.3``, or a size such as ``"800MB"``); None reads the environment
    as the backend does.  ``options`` passes other ckpt options (``device``,
    ``solver_effort``).  The model is deep-copied and the inputs cloned, so
    neither is changed.  Dynamo is reset first.  The step differentiates
    :data:`LOSS_RULE`.
    """
    from ckpt import _torch_compat as compat
    from ckpt.backend import record_partitions
    from ckpt.config import CkptConfig
    from ckpt.measure import saved_activations

    check_model(model)
    compile_kwargs = compile_options(budget, options)
    config = CkptConfig.from_sources(compile_kwargs)
    if config.explain is None:
        compile_kwargs["explain"] = "log"  # the backend then also evaluates torch's default partition
    model = copy.deepcopy(model)
    inputs = clone_inputs(example_inputs)
    torch.compiler.reset()
    compiled = torch.compile(fresh_entry("explain"), backend="ckpt", options=compile_kwargs)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    with compat.compile_caches_disabled(), record_partitions() as records:
        with saved_activations(model, *tensors) as saved:
            loss = loss_of(compiled(model, *inputs))
        loss.backward()
    if not records:
        raise RuntimeError(
            "no graph was partitioned: the compiled model produced no training graph "
            "(is every parameter frozen and every input without requires_grad?)"
        )
    return ExplainReport(
        graphs=tuple(graph_report(r) for r in records),
        budget=str(config.budget),
        measured_bytes=saved.bytes,
        loss=LOSS_RULE,
    )
