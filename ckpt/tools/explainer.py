"""Tell users what the partitioner saved and recomputed, and what it costs.

:func:`explain` compiles a deep copy of the model with ``backend="ckpt"``,
runs one forward and backward, and returns an :class:`ExplainReport`: per
compiled graph, the saved tensors (with shape, bytes and the user's source
line), the recomputed values (with their estimated cost), the predicted
totals next to the no-recompute plan and torch's default partition, and the
solver's facts; and for the whole step, the measured activation bytes next to
the prediction.

Each graph compiled with ``CKPT_EXPLAIN`` set reaches :func:`emit_explain`
through a subscriber to the partition records (registered in ``ckpt``'s
``__init__``): ``1`` logs :func:`summary_line` at INFO on the ``"ckpt"``
logger; a directory path writes the graph's report there as JSON and
Markdown.  Those
reports hold predictions only, since the backend never runs a step.

The report data lives in :mod:`ckpt.tools.report`; this module runs the step and
writes the outputs.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckpt.tools.common import LOSS_RULE, check_model, clone_inputs, compile_options, fresh_entry, loss_of
from ckpt.tools.report import ExplainReport, GraphReport, graph_report

if TYPE_CHECKING:
    from ckpt.records import PartitionRecord

__all__ = [
    "ExplainReport",
    "GraphReport",
    "emit_explain",
    "explain",
    "summary_line",
]

log = logging.getLogger("ckpt")


def summary_line(record: PartitionRecord) -> str:
    """One line per graph: saved and recomputed counts, bytes, predicted time, solver."""
    if record.plan is None or record.analysis is None:
        return f"graph {record.graph}: fell back to torch's partition ({record.fallback_reason})"
    plan, analysis = record.plan, record.analysis
    mib = 1024 * 1024
    regions = ""
    if record.region_caps:
        over = ", ".join(plan.over_regions)
        regions = f"; {len(record.region_caps)} per-module caps, " + (f"exceeded: {over}" if over else "all kept")
    return (
        f"graph {record.graph}: saved {len(plan.saved)} values, {plan.bytes / mib:.2f} MiB "
        f"(autograd saves {analysis.reference_bytes / mib:.2f} MiB, budget {record.budget}{regions}); "
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
    from ckpt.config import CkptConfig
    from ckpt.measure import saved_activations
    from ckpt.records import record_partitions

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
        measured_peak_bytes=_measured_peak(compiled, model, inputs),
    )


def _measured_peak(compiled: Any, model: torch.nn.Module, inputs: list[Any]) -> int | None:
    """The peak of a second step (the first one compiled), gradients cleared first; None off CPU and CUDA."""
    from ckpt.measure import peak_memory

    device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    if device.type not in ("cpu", "cuda"):
        return None
    model.zero_grad(set_to_none=True)
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x.grad = None
    return peak_memory(lambda: loss_of(compiled(model, *inputs)).backward(), device).bytes
