"""Mix two hull plans, part by part, to use the memory the hull leaves idle.

Two adjacent hull points, ``fast`` (over budget) and ``lean`` (within budget),
often differ in many independent places: in a stack of identical layers every
layer switches at the same price, so the hull jumps from "all layers save X"
to "no layer saves X".  The plans in between take ``fast``'s decisions in some
places and ``lean``'s in the others.

The places are the connected parts of the values whose decision differs.  For
each part alone we evaluate the mixed plan exactly, then choose parts like a
knapsack, greedily by time saved per byte, re-evaluating the combined plan
exactly after each choice, so the result is always a valid plan within the
budget.  It is a heuristic: exactness comes from the branch and bound that
follows.
"""

from __future__ import annotations

from collections.abc import Callable

from ckpt.partitioner.problem import Problem, ProblemError

__all__ = ["mix_plans"]

Evaluate = Callable[[frozenset[int]], tuple[int, int]]  # saved set -> (key, bytes)


def _parts(problem: Problem, differing: set[int]) -> list[list[int]]:
    parent = {i: i for i in differing}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in sorted(differing):
        for u in problem.inputs[i]:
            if u in differing:
                a, b = find(i), find(u)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in sorted(differing):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _state(i: int, saved: frozenset[int], recomputed: frozenset[int]) -> int:
    return 1 if i in saved else 2 if i in recomputed else 0


def mix_plans(
    problem: Problem,
    fast: tuple[frozenset[int], frozenset[int]],
    lean: tuple[frozenset[int], frozenset[int]],
    budget: int,
    evaluate: Evaluate,
) -> frozenset[int] | None:
    """The best mixed saved set found within ``budget``, or None if none beats ``lean``.

    ``fast`` and ``lean`` are (saved, recomputed) pairs; ``evaluate`` returns a
    saved set's (key, bytes) and raises :class:`ProblemError` for invalid sets.
    """
    fast_saved, fast_recomputed = fast
    lean_saved, lean_recomputed = lean
    differing = {
        i
        for i in range(len(problem))
        if _state(i, fast_saved, fast_recomputed) != _state(i, lean_saved, lean_recomputed)
    }
    if not differing:
        return None
    base_key, base_bytes = evaluate(lean_saved)
    items: list[tuple[float, int, frozenset[int]]] = []
    for part in _parts(problem, differing):
        members = frozenset(part)
        mixed = (lean_saved - members) | (fast_saved & members)
        try:
            key, memory = evaluate(mixed)
        except ProblemError:
            continue
        gain, extra = base_key - key, memory - base_bytes
        if gain <= 0:
            continue
        ratio = gain / extra if extra > 0 else float("inf")
        items.append((-ratio, min(part), members))
    items.sort(key=lambda item: (item[0], item[1]))
    best_saved, best_key = lean_saved, base_key
    for _, _, members in items:
        candidate = (best_saved - members) | (fast_saved & members)
        try:
            key, memory = evaluate(candidate)
        except ProblemError:
            continue
        if memory <= budget and key < best_key:
            best_saved, best_key = candidate, key
    return None if best_saved == lean_saved else best_saved
