"""ckpt: automatic activation checkpointing inside torch.compile.

Use it with ``torch.compile(model, backend="ckpt")``; no import is needed once
the package is installed.  See the README for the environment variables.
Code that drives AOTAutograd itself passes ``partition_fn=ckpt.partition_fn(...)``.
``ckpt.set_budget(module, budget)`` gives modules budgets of their own.

Layout, with imports pointing down only: ``cost_model`` prices values,
``partitioner`` plans and extracts, ``backend`` plugs both into Inductor and
publishes a :class:`ckpt.records.PartitionRecord` per graph, and ``tools``
(explain, the Pareto curve, validate, the demo) read those records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckpt import records as _records
from ckpt._version import __version__

if TYPE_CHECKING:
    from ckpt.records import PartitionRecord


__all__ = ["__version__", "clear_budgets", "explain", "pareto", "partition_fn", "set_budget"]

_LAZY = {
    "explain": "ckpt.tools.explainer",
    "pareto": "ckpt.tools.tradeoff",
    "partition_fn": "ckpt.aot_partition",
    "set_budget": "ckpt.module_budgets",
    "clear_budgets": "ckpt.module_budgets",
}


def __getattr__(name: str) -> Any:
    """The public functions load on first use, so ``import ckpt`` stays light (no torch)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ckpt' has no attribute {name!r}")


def _explain_subscriber(record: PartitionRecord) -> None:
    """``CKPT_EXPLAIN``: the summary (and, for a directory, the full report) of each graph."""
    if record.explain is not None:
        from ckpt.tools.explainer import emit_explain

        emit_explain(record, record.explain)


_records.subscribe(_explain_subscriber)
