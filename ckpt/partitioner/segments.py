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

:func:`equal_pins` splits the forward into ``k`` segments of about equal
activation bytes, each cut at the cheapest frontier near its place: Chen's
segments.  They suit a graph whose backward holds little besides the
recomputed segment.  But the weight gradients stay alive from where the
backward makes them to its end, so an early segment is recomputed beside the
gradients of everything after it.  :func:`balanced_pins` cuts for that: while
the backward runs segment ``[s, e)`` it holds the segment's recomputed
values, ``H(e) - H(s)`` (``H``: the bytes of the values the backward reads,
summed along the forward), the cuts saved up to ``s``, and the gradients
made from ``s`` on, ``G(s)``; the cuts make the largest of these loads as
small as the search finds (:func:`segment_loads`), so the segments grow
towards the end, and cheap frontiers are preferred.  Where the gradients are
a large share of what the backward reads (:data:`BALANCED_SHARE`), both are
offered: on the benchmarks' deep MLP (gradients half of what its backward
reads; segments about 1.5x the one before) the plan at a budget of 0.1 is
predicted 20.29 MiB against 22.28 with equal segments alone.

The peak search (:mod:`ckpt.partitioner.peak_search`) offers such pins for a
few ``k`` to the solver, which fills the rest of the budget as usual: the
greedy pin walk adds one value at a time, and under a tight budget it cannot
see that several boundaries together cut the working set.

Plain data: a :class:`~ckpt.partitioner.problem.Problem` and the
:class:`~ckpt.partitioner.peak.PeakGraph` that says which of its values the
forward computes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckpt.partitioner.peak import PeakGraph
from ckpt.partitioner.problem import Problem

__all__ = [
    "BALANCED_SHARE",
    "SEGMENT_COUNTS",
    "ForwardCuts",
    "Frontier",
    "equal_pins",
    "forward_frontiers",
    "segment_loads",
    "segment_pin_sets",
    "balanced_pins",
]

# Segment counts offered to the solver: about sqrt(2) apart, up to 32 segments (a coarser
# ladder misses the best cut of small stacks).  Each is one solve; the search stops at the
# first plan within its cap, or over its budget.
SEGMENT_COUNTS = (2, 3, 4, 6, 8, 11, 16, 23, 32)
# The balanced segments are offered beside the equal ones where the weight gradients are at least this
# share of the bytes the backward reads.  Each set is one more solve.  On the benchmark models the
# balanced segments alone lowered the measured peak of the deep MLP (share 0.51: at budget 0.1, 21.28
# MiB against 23.28) and raised it on Llama (0.18) and ViT (0.30) at 0.25, where the equal ones
# found plans the peak model preferred; offered beside them on every graph they doubled the planning
# time of a 28-layer transformer.
BALANCED_SHARE = 0.4
BISECTIONS = 40  # steps of the search for the smallest load: to 2**-40 of its range


@dataclass(frozen=True)
class Frontier:
    """A cut of the forward after ``position``: the values it must save, and where it falls."""

    position: int  # a problem value; the cut is just after it
    before: int  # activation bytes the forward computes up to and including ``position``
    cost: int  # bytes of ``values``
    values: frozenset[int]  # savable values computed up to ``position`` and read after it
    held: int = 0  # of ``before``, the bytes of values the backward reads


@dataclass(frozen=True)
class ForwardCuts:
    """The forward's non-empty frontiers in topological order, its bytes, and its gradients.

    ``total_bytes``: the activation bytes the forward computes;
    ``total_held``: of those, the values the backward reads.  ``gradients``:
    ``(place, bytes)`` for each gradient the backward returns, ``place`` the
    held bytes before the earliest value the forward computes that the
    gradient reads (directly, or through the backward's own values): the
    backward makes a weight's gradient when it reaches the layer that reads
    the weight, and keeps it to the end.  A gradient that reads no such value
    is placed at ``total_held`` (made at the backward's start).
    """

    frontiers: tuple[Frontier, ...]
    total_bytes: int
    total_held: int = 0
    gradients: tuple[tuple[int, int], ...] = ()


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
    before = held = 0
    place: dict[int, int] = {}  # graph value -> the held bytes before it
    for t, is_forward in enumerate(forward):
        if not is_forward:
            continue
        if problem.can_recompute[t]:  # computed by the forward (graph inputs, the weights, are not placed)
            place[index[t]] = held
        before += problem.save_bytes[t]
        held += problem.save_bytes[t] if problem.needed[t] else 0
        open_values.add(t)
        open_values = {u for u in open_values if last_read[u] > t}
        values = frozenset(
            u for u in open_values if problem.can_save[u] and problem.can_recompute[u] and problem.save_bytes[u] > 0
        )
        if values:
            frontiers.append(Frontier(t, before, sum(problem.save_bytes[u] for u in values), values, held))
    return ForwardCuts(tuple(frontiers), before, held, _gradient_places(graph, place, held))


def _gradient_places(graph: PeakGraph, place: dict[int, int], total: int) -> tuple[tuple[int, int], ...]:
    """``(place, bytes)`` of each gradient: the earliest place it reads, through the backward's values."""
    earliest: list[int] = []
    for v, preds in enumerate(graph.inputs):
        own = place.get(v)
        earliest.append(own if own is not None else min((earliest[p] for p in preds), default=total))
    return tuple(sorted((min(earliest[g], total), graph.bytes[g]) for g in graph.gradients))


def _later_gradients(gradients: Sequence[tuple[int, int]]) -> Callable[[float], int]:
    """``G(s)``: the gradient bytes placed at or after ``s``."""
    places = [p for p, _ in gradients]
    suffix = [0] * (len(gradients) + 1)  # suffix[i]: gradient bytes of gradients[i:]
    for i in range(len(gradients) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + gradients[i][1]
    return lambda s: suffix[bisect.bisect_left(places, s)]


def segment_loads(cuts: ForwardCuts, chosen: Sequence[Frontier]) -> list[int]:
    """What the backward holds while it runs each segment between ``chosen`` cuts (in order).

    Segment ``[s, e)``: its recomputed values, ``e - s`` held bytes; the
    gradients made from ``s`` on, ``G(s)``; and the saved cuts up to ``s``.
    """
    later = _later_gradients(cuts.gradients)
    loads, start, kept = [], 0, 0
    for end, cost in [(f.held, f.cost) for f in chosen] + [(cuts.total_held, 0)]:
        loads.append(end - start + later(start) + kept)
        start, kept = end, kept + cost
    return loads


def _cuts_within(cuts: ForwardCuts, load: float, segments: int, later: Callable[[float], int]) -> list[Frontier] | None:
    """Cuts into at most ``segments`` parts, each holding at most ``load`` (:func:`segment_loads`), or None.

    Greedy from the forward's start: each cut is the cheapest frontier in the
    far half of those that keep its segment within ``load`` (ties: the
    furthest).  A further cut is never worse for what follows (the next
    segment starts later, beside fewer gradients); a cheaper one keeps less
    saved for every later segment.
    """
    frontiers, total = cuts.frontiers, cuts.total_held
    held = [f.held for f in frontiers]
    chosen: list[Frontier] = []
    start, kept = 0, 0
    while total - start + later(start) + kept > load:
        if len(chosen) == segments - 1:
            return None
        first = bisect.bisect_right(held, start)
        stop = bisect.bisect_right(held, load - later(start) - kept + start)  # frontiers that keep the segment
        if first >= stop:
            return None
        far = bisect.bisect_left(held, start + (held[stop - 1] - start) / 2, first, stop)
        cut = frontiers[min(range(far, stop), key=lambda i: (frontiers[i].cost, -held[i]))]
        chosen.append(cut)
        start, kept = cut.held, kept + cut.cost
    return chosen


def balanced_pins(cuts: ForwardCuts, segments: int) -> frozenset[int]:
    """The values that cut the forward into at most ``segments`` parts, the most any holds as small as found.

    The smallest ``load`` for which :func:`_cuts_within` finds cuts, by
    bisection.  Where every frontier costs the same (a chain), the greedy
    cuts are optimal: no ``segments`` parts hold less at their largest.
    """
    frontiers, total = cuts.frontiers, cuts.total_held
    if segments < 2 or not frontiers:
        return frozenset()
    later = _later_gradients(cuts.gradients)
    low, high = 0.0, float(total + later(0) + sum(f.cost for f in frontiers))  # no cut, every cut: within high
    best: list[Frontier] = []
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        found = _cuts_within(cuts, middle, segments, later)
        if found is None:
            low = middle
        else:
            high, best = middle, found
    return frozenset(v for cut in best for v in cut.values)


def equal_pins(cuts: ForwardCuts, segments: int) -> frozenset[int]:
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
    """Distinct pin sets for :data:`SEGMENT_COUNTS`, in that order (more segments, more pins).

    For each count the equal segments (:func:`equal_pins`), and, where the
    weight gradients are at least :data:`BALANCED_SHARE` of what the backward
    reads, the balanced ones (:func:`balanced_pins`) after them.
    """
    cuts = forward_frontiers(problem, graph)
    balanced = sum(b for _, b in cuts.gradients) >= BALANCED_SHARE * cuts.total_held
    sets: list[frozenset[int]] = []
    for count in SEGMENT_COUNTS:
        for pins in (equal_pins(cuts, count), balanced_pins(cuts, count) if balanced else frozenset()):
            if pins and pins not in sets:
                sets.append(pins)
    return tuple(sets)
