"""Segment boundaries of the forward: Chen's sqrt(n) checkpoints, found on any graph.

On a chain, saving the activation between two segments lets the backward
recompute each segment on its own, so the recompute working set is one
segment (Chen et al. 2016, "Training deep nets with sublinear memory cost").
A general graph has no single activation between two parts, but every
position of the forward's topological order has a *frontier*: the values
computed at or before it that the forward reads after it.  Saving a frontier
cuts the graph there: what follows is recomputed from the frontier, never
from what came before it.  On a stack of blocks the cheapest frontiers are
the block outputs (the residual stream); with long skip connections (a
U-Net) they also hold the skips that are still open.

:func:`segment_pins` splits the forward into ``k`` segments of about equal
activation bytes, each cut at the cheapest frontier near its place.  The peak
search (:mod:`ckpt.partitioner.peak_search`) offers such pins for a few ``k``
to the solver, which fills the rest of the budget as usual: the greedy pin
walk adds one value at a time, and under a tight budget it cannot see that
several boundaries together cut the working set.

Plain data: a :class:`~ckpt.partitioner.problem.Problem` and the
:class:`~ckpt.partitioner.peak.PeakGraph` that says which of its values the
forward computes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ckpt.partitioner.peak import PeakGraph
from ckpt.partitioner.problem import Problem

__all__ = ["SEGMENT_COUNTS", "ForwardCuts", "Frontier", "forward_frontiers", "segment_pin_sets", "segment_pins"]

# Segment counts offered to the solver: about sqrt(2) apart, up to 32 segments (a coarser
# ladder misses the best cut of small stacks).  Each is one solve; the search stops at the
# first plan within its cap, or over its budget.
SEGMENT_COUNTS = (2, 3, 4, 6, 8, 11, 16, 23, 32)


@dataclass(frozen=True)
class Frontier:
    """A cut of the forward after ``position``: the values it must save, and where it falls."""

    position: int  # a problem value; the cut is just after it
    before: int  # activation bytes the forward computes up to and including ``position``
    cost: int  # bytes of ``values``
    values: frozenset[int]  # savable values computed up to ``position`` and read after it


@dataclass(frozen=True)
class ForwardCuts:
    """The forward's non-empty frontiers in topological order, and its activation bytes in all."""

    frontiers: tuple[Frontier, ...]
    total_bytes: int


def forward_frontiers(problem: Problem, graph: PeakGraph) -> ForwardCuts:
    """The frontier after every forward value, in topological order (empty frontiers left out).

    Only forward reads count: the backward's formulas read forward values too,
    but the plan decides separately where those run.  Values that cannot be
    saved, cannot be recomputed, or take no bytes (graph inputs) are left out
    of the frontier: pinning them is impossible, useless or free.
    """
    index = graph.problem_index
    forward = [graph.required[index[i]] and not graph.backward[index[i]] for i in range(len(problem))]
    last_read = list(range(len(problem)))
    for i, is_forward in enumerate(forward):
        if is_forward:
            for p in problem.inputs[i]:
                last_read[p] = max(last_read[p], i)
    frontiers: list[Frontier] = []
    open_values: set[int] = set()
    before = 0
    for t, is_forward in enumerate(forward):
        if not is_forward:
            continue
        before += problem.save_bytes[t]
        open_values.add(t)
        open_values = {u for u in open_values if last_read[u] > t}
        values = frozenset(
            u for u in open_values if problem.can_save[u] and problem.can_recompute[u] and problem.save_bytes[u] > 0
        )
        if values:
            frontiers.append(Frontier(t, before, sum(problem.save_bytes[u] for u in values), values))
    return ForwardCuts(tuple(frontiers), before)


def segment_pins(cuts: ForwardCuts, segments: int) -> frozenset[int]:
    """The values that cut the forward into ``segments`` parts of about equal activation bytes.

    Cut ``j`` is the cheapest frontier within half a segment of ``j / segments``
    of the forward's bytes (ties: the one nearest that point, then the
    earliest).
    """
    frontiers, total = cuts.frontiers, cuts.total_bytes
    if segments < 2 or not frontiers:
        return frozenset()
    before = [f.before for f in frontiers]
    pins: set[int] = set()
    for j in range(1, segments):
        target = j * total / segments
        low = bisect.bisect_left(before, target - total / (2 * segments))
        high = bisect.bisect_right(before, target + total / (2 * segments))
        if low < high:
            cut = min(frontiers[low:high], key=lambda f: (f.cost, abs(f.before - target), f.position))
            pins |= cut.values
    return frozenset(pins)


def segment_pin_sets(problem: Problem, graph: PeakGraph) -> tuple[frozenset[int], ...]:
    """Distinct pin sets for :data:`SEGMENT_COUNTS`, in that order (more segments, more pins)."""
    cuts = forward_frontiers(problem, graph)
    sets: list[frozenset[int]] = []
    for count in SEGMENT_COUNTS:
        pins = segment_pins(cuts, count)
        if pins and pins not in sets:
            sets.append(pins)
    return tuple(sets)
