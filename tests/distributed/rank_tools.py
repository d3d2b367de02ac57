"""Helpers that run inside each rank: plan summaries, fingerprints, saved bytes, gathered results.

**Saved bytes under FSDP2.**  :func:`saved_activation_bytes` counts what
:func:`ckpt.measure.saved_activations` counts (unique storages saved for the
backward), with one difference: it reads the parameters at the moment each
tensor is saved, not once at the start.  FSDP2 swaps a module's parameters:
between its pre-forward and post-forward hooks the module holds the
*unsharded* parameters (plain tensors all-gathered from the shards), and
otherwise the sharded ``DTensor`` parameters.  A compiled block saves its
inputs, the unsharded parameters among them, while its parameters are
unsharded, so ``module.parameters()`` read inside the pack hook names exactly
the tensors FSDP owns at that moment.  Their storages (and the local shards')
are left out: FSDP frees the unsharded storage after the forward and gathers
it again before the backward, so it is parameter memory, not activation
memory.  Matching by storage also covers views and transposes of a parameter.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ckpt.measure import live_storages
from ckpt.partitioner.problem import region_bytes
from ckpt.records import PartitionRecord

__all__ = [
    "PlanSummary",
    "fingerprint_log",
    "gather",
    "global_loss",
    "local_tensors",
    "saved_activation_bytes",
    "summarize",
]

_FINGERPRINT_LINE = re.compile(r"ckpt graph '(?P<graph>[^']*)' plan fingerprint (?P<fingerprint>\S+)")


@dataclass(frozen=True)
class PlanSummary:
    """A picklable digest of one :class:`ckpt.backend.PartitionRecord`."""

    graph: str
    fingerprint: str | None
    profile: str  # the device profile's rates (DeviceProfile.key())
    plan_bytes: int | None
    budget_bytes: int | None
    reference_bytes: int | None  # what autograd saves for this graph: a fraction's base
    minimum_bytes: int | None
    over_budget: bool
    fallback_reason: str | None
    saved: tuple[str, ...]
    recomputed: tuple[str, ...]
    reasons: dict[str, str] = field(default_factory=dict)
    regions: dict[str, tuple[int, int]] = field(default_factory=dict)  # per-module budget -> (bytes kept, cap)

    @property
    def within_budget(self) -> bool:
        """Within the cap, or at the least memory the graph allows when the cap is below it."""
        if any(kept > cap for kept, cap in self.regions.values()):
            return False
        if self.budget_bytes is None or self.plan_bytes is None:
            return True
        if self.over_budget:
            return self.plan_bytes == self.minimum_bytes
        return self.plan_bytes <= self.budget_bytes


def _regions(record: PartitionRecord) -> dict[str, tuple[int, int]]:
    if record.plan is None or record.analysis is None:
        return {}
    problem, plan = record.analysis.problem, record.plan
    return {
        cap.label: (region_bytes(problem, plan.saved, plan.recomputed, cap.members), cap.max_bytes)
        for cap in record.region_caps
    }


def summarize(records: list[PartitionRecord]) -> list[PlanSummary]:
    summaries = []
    for record in records:
        plan, analysis = record.plan, record.analysis
        names = analysis.problem.names if analysis is not None else ()
        summaries.append(
            PlanSummary(
                graph=record.graph,
                fingerprint=record.fingerprint,
                profile=record.profile.key(),
                plan_bytes=plan.bytes if plan else None,
                budget_bytes=record.budget_bytes,
                reference_bytes=analysis.reference_bytes if analysis is not None else None,
                minimum_bytes=plan.minimum_bytes if plan else None,
                over_budget=bool(plan and plan.over_budget),
                fallback_reason=record.fallback_reason,
                saved=tuple(names[i] for i in plan.saved) if plan else (),
                recomputed=tuple(names[i] for i in plan.recomputed) if plan else (),
                reasons=dict(analysis.reasons) if analysis is not None else {},
                regions=_regions(record),
            )
        )
    return summaries


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = _FINGERPRINT_LINE.search(record.getMessage())
        if match:
            self.lines.append((match["graph"], match["fingerprint"]))


@contextlib.contextmanager
def fingerprint_log() -> Iterator[list[tuple[str, str]]]:
    """The (graph, fingerprint) pairs the backend logs at DEBUG on ``ckpt.backend`` inside the block."""
    logger = logging.getLogger("ckpt.backend")
    handler = _Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def local_tensors(module: nn.Module) -> list[torch.Tensor]:
    """The module's parameters and buffers as it holds them now; a DTensor as its local shard."""
    tensors = []
    for tensor in [*module.parameters(), *module.buffers()]:
        to_local = getattr(tensor, "to_local", None)
        tensors.append(to_local() if callable(to_local) else tensor)
    return tensors


@dataclass
class _Saved:
    storages: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


@contextlib.contextmanager
def saved_activation_bytes(model: nn.Module, *inputs: torch.Tensor) -> Iterator[_Saved]:
    """Unique storages saved for the backward, leaving out the inputs and the parameters held when saving."""
    fixed = live_storages(*inputs)
    saved = _Saved()

    @torch.compiler.disable  # the hook runs inside compiled frames; Dynamo must not trace it
    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key not in fixed and key not in live_storages(local_tensors(model)):
            saved.storages[key] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved


def global_loss(loss: torch.Tensor, world_size: int) -> torch.Tensor:
    """The mean of the ranks' losses: the global batch's mean loss when the ranks' batches are equal."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total / world_size


def gather(value: Any, world_size: int) -> list[Any]:
    """``value`` from every rank, in rank order (``dist.all_gather_object``)."""
    values: list[Any] = [None] * world_size
    dist.all_gather_object(values, value)
    return values
