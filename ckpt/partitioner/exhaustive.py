"""Brute force over every saved set: the oracle for small problems.

It enumerates all subsets of the values that can be saved, so it is only for
problems with a handful of such values (the tests use it up to 14).
"""

from __future__ import annotations

import itertools

from ckpt.partitioner.plan import Plan
from ckpt.partitioner.problem import Problem, ProblemError, evaluate

__all__ = ["MAX_EXHAUSTIVE", "solve_exhaustive"]

MAX_EXHAUSTIVE = 20


def solve_exhaustive(problem: Problem, budget_bytes: int | None) -> Plan | None:
    """The least (time, bytes) plan within ``budget_bytes``, or None if none fits."""
    candidates = [i for i in range(len(problem)) if problem.can_save[i]]
    if len(candidates) > MAX_EXHAUSTIVE:
        raise ValueError(
            f"solve_exhaustive: {len(candidates)} saveable values is too many; at most {MAX_EXHAUSTIVE} are allowed"
        )
    best: tuple[int, int, frozenset[int], frozenset[int]] | None = None
    for r in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, r):
            try:
                time, memory, recomputed = evaluate(problem, subset)
            except ProblemError:
                continue
            if budget_bytes is not None and memory > budget_bytes:
                continue
            if best is None or (time, memory) < (best[0], best[1]):
                best = (time, memory, frozenset(subset), recomputed)
    if best is None:
        return None
    time, memory, saved, recomputed = best
    return Plan(
        saved=tuple(sorted(saved)),
        recomputed=tuple(sorted(recomputed)),
        time=time,
        bytes=memory,
        solver="exhaustive",
        optimal=True,
        lower_bound=time,
        budget_bytes=budget_bytes,
    )
