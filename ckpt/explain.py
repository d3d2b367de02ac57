"""Tell users what the partitioner saved and recomputed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt.backend import PartitionRecord

__all__ = ["emit_explain", "summary_line"]

log = logging.getLogger("ckpt")


def summary_line(record: PartitionRecord) -> str:
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


def emit_explain(record: PartitionRecord, target: str) -> None:
    log.info("ckpt: %s", summary_line(record))
