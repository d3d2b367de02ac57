"""The save-or-recompute problem as plain data.

A :class:`Problem` lists the values the backward may need, in topological
order.  For each value ``i``:

* ``inputs[i]``: the values it is computed from (indices below ``i``);
* ``needed[i]``: the backward reads it directly;
* ``save_bytes[i]``: activation bytes kept alive if it is saved (0 for graph
  inputs, which live anyway);
* ``save_time[i]``: time that saving costs: a write in the forward (when the
  value would otherwise stay inside a fused kernel, unread by the forward
  across a library call) and a read in the backward;
* ``recompute_time[i]``: extra time to compute it in the backward;
* ``recompute_bytes[i]``: bytes that recomputing it keeps alive (the RNG state
  saved so a checkpointed random op replays its draw; usually 0);
* ``can_save[i]`` / ``can_recompute[i]``: hard constraints (random ops,
  collectives, mutations, user policies, values that are not tensors).

Times are integers in picoseconds, so solvers compare costs exactly.

A plan is a set of saved values.  Everything the backward needs that is not
saved is recomputed, and so, recursively, are the unsaved inputs of what is
recomputed: :func:`recompute_closure`.  The plan's cost is the sum of
``save_time`` over saved values plus ``recompute_time`` over recomputed ones,
and its memory is the sum of ``save_bytes`` over saved values plus
``recompute_bytes`` over recomputed ones.

A :class:`RegionCap` bounds the memory of a subset of the values (the values
one module computes, for per-module budgets): :func:`region_bytes` is that
memory for a plan.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "NearbyPlans",
    "Problem",
    "ProblemError",
    "RegionCap",
    "cost_signature",
    "evaluate",
    "largest_value",
    "recompute_closure",
    "region_bytes",
]


class ProblemError(ValueError):
    """The problem data is inconsistent, or a plan breaks a hard constraint."""


@dataclass(frozen=True)
class Problem:
    names: tuple[str, ...]
    inputs: tuple[tuple[int, ...], ...]
    needed: tuple[bool, ...]
    save_bytes: tuple[int, ...]
    save_time: tuple[int, ...]
    recompute_time: tuple[int, ...]
    can_save: tuple[bool, ...]
    can_recompute: tuple[bool, ...]
    recompute_bytes: tuple[int, ...] = ()  # empty means all zero

    def __post_init__(self) -> None:
        n = len(self.names)
        if not self.recompute_bytes:
            object.__setattr__(self, "recompute_bytes", (0,) * n)
        for field_name in (
            "inputs",
            "needed",
            "save_bytes",
            "save_time",
            "recompute_time",
            "can_save",
            "can_recompute",
            "recompute_bytes",
        ):
            if len(getattr(self, field_name)) != n:
                raise ProblemError(f"Problem.{field_name} has {len(getattr(self, field_name))} entries, expected {n}")
        for i, preds in enumerate(self.inputs):
            for p in preds:
                if not 0 <= p < i:
                    raise ProblemError(
                        f"Problem.inputs[{i}] ({self.names[i]}) lists {p}; "
                        "inputs must come earlier in topological order"
                    )
        for i in range(n):
            costs = (self.save_bytes[i], self.save_time[i], self.recompute_time[i], self.recompute_bytes[i])
            if min(costs) < 0:
                raise ProblemError(f"Problem value {self.names[i]} has a negative cost")

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_save_bytes(self) -> int:
        return sum(self.save_bytes)

    @property
    def total_bytes(self) -> int:
        """More than any plan's bytes: every value saved and recomputed at once."""
        return sum(self.save_bytes) + sum(self.recompute_bytes)

    @functools.cached_property
    def needed_values(self) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.names)) if self.needed[i])


def largest_value(problem: Problem, values: Iterable[int]) -> int:
    """The value that saves the most bytes (the earliest among equals): what the searches branch and dive on."""
    return max(values, key=lambda i: (problem.save_bytes[i], -i))


def cost_signature(problem: Problem, i: int) -> tuple[int, int, int, int]:
    """What the solvers know of value ``i``: its save bytes and time, its recompute time and bytes.

    Values with the same signature (a stack's layers' copies of one value)
    are the searches' twins: they dive by forcing them saved together.
    """
    return problem.save_bytes[i], problem.save_time[i], problem.recompute_time[i], problem.recompute_bytes[i]


def recompute_closure(problem: Problem, saved: Iterable[int]) -> frozenset[int]:
    """The values the backward must recompute when exactly ``saved`` are saved."""
    blocked = bytearray(len(problem))  # saved, or already recomputed
    for i in saved:
        blocked[i] = 1
    inputs = problem.inputs
    recompute: list[int] = []
    stack = [i for i in problem.needed_values if not blocked[i]]
    while stack:
        i = stack.pop()
        if blocked[i]:
            continue
        blocked[i] = 1
        recompute.append(i)
        stack.extend(inputs[i])  # checked when popped: cheaper than a check per input here
    return frozenset(recompute)


def evaluate(problem: Problem, saved: Iterable[int]) -> tuple[int, int, frozenset[int]]:
    """(time, bytes, recomputed) of the plan that saves ``saved``.

    Raises :class:`ProblemError` if the plan saves a value that cannot be saved
    or has to recompute one that cannot be recomputed.
    """
    saved_set = frozenset(saved)
    # The solvers evaluate thousands of plans per graph: the checks and sums run in C (map),
    # and the offending names are sorted only when there are some.
    if not all(map(problem.can_save.__getitem__, saved_set)):
        bad_saves = [problem.names[i] for i in sorted(saved_set) if not problem.can_save[i]]
        raise ProblemError(f"plan saves values that cannot be saved: {', '.join(bad_saves)}")
    recomputed = recompute_closure(problem, saved_set)
    if not all(map(problem.can_recompute.__getitem__, recomputed)):
        bad = [problem.names[i] for i in sorted(recomputed) if not problem.can_recompute[i]]
        raise ProblemError(f"plan recomputes values that cannot be recomputed: {', '.join(bad)}")
    time = sum(map(problem.save_time.__getitem__, saved_set)) + sum(map(problem.recompute_time.__getitem__, recomputed))
    memory = sum(map(problem.save_bytes.__getitem__, saved_set)) + sum(
        map(problem.recompute_bytes.__getitem__, recomputed)
    )
    return time, memory, recomputed


class NearbyPlans:
    """Time and bytes of saved sets that differ little from one base set, without a closure each.

    The repair step evaluates hundreds of plans that are its lean hull plan
    with one part switched.  Each value keeps a count of what makes it needed
    (the backward reading it, each recomputed reader); a value is recomputed
    exactly when it is not saved and its count is positive.  The inputs graph
    is acyclic, so that rule has one solution, and a saved set near the base
    is evaluated by updating the counts from the values whose saving changed,
    readers before inputs, then undoing the updates: work in proportion to
    what changes, where :func:`evaluate` walks the whole closure.  Answers are
    :func:`evaluate`'s; a set it would reject goes to it for the error.
    """

    def __init__(self, problem: Problem, base: frozenset[int]) -> None:
        self.problem = problem
        self.base = base
        self.time, self.bytes, recomputed = evaluate(problem, base)
        n = len(problem)
        self._saved = bytearray(n)
        for i in base:
            self._saved[i] = 1
        self._recomputed = bytearray(n)
        self._count = [1 if needed else 0 for needed in problem.needed]
        for r in recomputed:
            self._recomputed[r] = 1
            for p in problem.inputs[r]:
                self._count[p] += 1

    def cost(self, saved: frozenset[int]) -> tuple[int, int]:
        """``(time, bytes)`` of the plan that saves ``saved``, as :func:`evaluate` gives them."""
        added, dropped = saved - self.base, self.base - saved
        if not added and not dropped:
            return self.time, self.bytes
        problem = self.problem
        valid = all(map(problem.can_save.__getitem__, added))
        time = sum(map(problem.save_time.__getitem__, added)) - sum(map(problem.save_time.__getitem__, dropped))
        memory = sum(map(problem.save_bytes.__getitem__, added)) - sum(map(problem.save_bytes.__getitem__, dropped))
        for i in added:
            self._saved[i] = 1
        for i in dropped:
            self._saved[i] = 0
        flipped = self._settle(sorted(added | dropped, reverse=True))
        for i in flipped:
            sign = 1 if self._recomputed[i] else -1
            time += sign * problem.recompute_time[i]
            memory += sign * problem.recompute_bytes[i]
            valid = valid and (sign < 0 or problem.can_recompute[i])
        self._undo(added, dropped, flipped)
        if not valid:
            time, memory, _ = evaluate(problem, saved)  # raises the ProblemError evaluate would
            return time, memory
        return self.time + time, self.bytes + memory

    def recompute_changes(self, saved: frozenset[int]) -> tuple[frozenset[int], frozenset[int]]:
        """The values that ``saved``'s closure recomputes and the base's does not, and the reverse.

        So ``recompute_closure(problem, saved)`` is the base's closure with the
        first added and the second taken away (no check that the plan is valid).
        """
        added, dropped = saved - self.base, self.base - saved
        for i in added:
            self._saved[i] = 1
        for i in dropped:
            self._saved[i] = 0
        flipped = self._settle(sorted(added | dropped, reverse=True))
        recomputed = self._recomputed
        changes = frozenset(i for i in flipped if recomputed[i]), frozenset(i for i in flipped if not recomputed[i])
        self._undo(added, dropped, flipped)
        return changes

    def _settle(self, stack: list[int]) -> list[int]:
        """Recompute exactly what is unsaved and needed again, from values that may have changed; the flips.

        Values are settled in decreasing index (readers before their inputs),
        so each one's count is final when it is settled and it flips at most once.
        """
        saved, recomputed, count, inputs = self._saved, self._recomputed, self._count, self.problem.inputs
        heap = [-i for i in stack]
        heapq.heapify(heap)
        flipped: list[int] = []
        while heap:
            i = -heapq.heappop(heap)
            while heap and heap[0] == -i:  # the same value queued twice
                heapq.heappop(heap)
            want = 0 if saved[i] or count[i] <= 0 else 1
            if want == recomputed[i]:
                continue
            recomputed[i] = want
            flipped.append(i)
            step = 1 if want else -1
            for p in inputs[i]:
                count[p] += step
                heapq.heappush(heap, -p)
        return flipped

    def _undo(self, added: frozenset[int], dropped: frozenset[int], flipped: list[int]) -> None:
        """Put the base back: flip the flipped values again and restore the saved flags."""
        recomputed, count, inputs = self._recomputed, self._count, self.problem.inputs
        for i in flipped:
            recomputed[i] ^= 1
            step = 1 if recomputed[i] else -1
            for p in inputs[i]:
                count[p] += step
        for i in added:
            self._saved[i] = 0
        for i in dropped:
            self._saved[i] = 1


@dataclass(frozen=True)
class RegionCap:
    """At most ``max_bytes`` of activation memory among the values ``members``.

    ``budget``, ``fraction`` and ``reference_bytes`` describe where the cap
    came from (the budget as given, its fraction if it is one, and the bytes
    the fraction is of); solvers read only ``members`` and ``max_bytes``.
    """

    label: str
    members: frozenset[int]
    max_bytes: int
    budget: str = ""
    reference_bytes: int = 0
    fraction: float | None = None

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError(f"RegionCap {self.label!r}: max_bytes={self.max_bytes!r} must be >= 0")


def region_bytes(problem: Problem, saved: Iterable[int], recomputed: Iterable[int], members: frozenset[int]) -> int:
    """Memory a plan keeps for the values in ``members``: their saved bytes and their recompute state."""
    return sum(problem.save_bytes[i] for i in saved if i in members) + sum(
        problem.recompute_bytes[i] for i in recomputed if i in members
    )
