"""Brute force over every saved set: the oracle for small problems.

It enumerates all subsets of the values that can be saved, so it is only for
problems with a handful of such values (the tests use it up to 14).  It keeps
the contract of :func:`ckpt.partitioner.solver.solve`, so one test runs the
oracle against every solver.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ckpt.partitioner.plan import Plan, make_plan
from ckpt.partitioner.problem import Problem, ProblemError, RegionCap, evaluate, region_bytes

__all__ = ["MAX_EXHAUSTIVE", "solve_exhaustive"]

MAX_EXHAUSTIVE = 20


def solve_exhaustive(problem: Problem, budget_bytes: int | None, caps: Sequence[RegionCap] = ()) -> Plan:
    """The least (time, bytes) plan with saved bytes <= ``budget_bytes`` (None: no cap) that keeps ``caps``.

    As :func:`~ckpt.partitioner.solver.solve`: if no plan fits the budget,
    the plan with the fewest bytes (least time among those), with
    ``over_budget`` true and ``minimum_bytes`` set; a ValueError if the
    problem has no feasible plan at all.  If no plan keeps every cap, that
    leanest plan too, with ``over_regions`` naming the caps it exceeds.
    """
    candidates = [i for i in range(len(problem)) if problem.can_save[i]]
    if len(candidates) > MAX_EXHAUSTIVE:
        raise ValueError(
            f"solve_exhaustive: {len(candidates)} saveable values is too many; at most {MAX_EXHAUSTIVE} are allowed"
        )
    best: tuple[int, int, tuple[int, ...]] | None = None  # (time, bytes, saved) within budget
    leanest: tuple[int, int, tuple[int, ...]] | None = None  # (bytes, time, saved) of any valid plan
    for r in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, r):
            try:
                time, memory, recomputed = evaluate(problem, subset)
            except ProblemError:
                continue
            if leanest is None or (memory, time) < leanest[:2]:
                leanest = (memory, time, subset)
            keeps = all(region_bytes(problem, subset, recomputed, cap.members) <= cap.max_bytes for cap in caps)
            if (
                keeps
                and (budget_bytes is None or memory <= budget_bytes)
                and (best is None or (time, memory) < best[:2])
            ):
                best = (time, memory, subset)
    if leanest is None:
        raise ValueError(
            "the problem has no feasible plan at all: some needed value can be neither saved nor recomputed"
        )
    if best is None:
        _, _, recomputed = evaluate(problem, leanest[2])
        over = tuple(
            cap.label for cap in caps if region_bytes(problem, leanest[2], recomputed, cap.members) > cap.max_bytes
        )
        return make_plan(
            problem,
            set(leanest[2]),
            "exhaustive",
            optimal=True,
            budget_bytes=budget_bytes,
            minimum_bytes=leanest[0],
            over_regions=over,
        )
    return make_plan(problem, set(best[2]), "exhaustive", optimal=True, lower_bound=best[0], budget_bytes=budget_bytes)
