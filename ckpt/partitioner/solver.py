"""Exact save-or-recompute planning under a memory budget.

The budgeted problem (least time with saved bytes <= budget) is solved in
three steps, all on min cuts from :mod:`ckpt.partitioner.min_cut`:

1. **Lexicographic costs.**  A plan's key is ``time * M + bytes`` with ``M``
   larger than any plan's bytes, so equal-time plans are told apart by memory
   and every comparison is an exact integer comparison.  This also makes the
   answer monotone: a smaller budget never gets a plan with more bytes.
2. **Price search.**  With a price ``beta/alpha`` per byte, one min cut gives
   the plan minimising ``alpha * key + beta * bytes``, a point on the lower
   convex hull of the (bytes, time) trade-off.  Starting from the fastest plan
   and the leanest plan, the search walks the hull (Eisner-Severance) until it
   finds the two adjacent hull points around the budget; the line between them
   gives a Lagrangian lower bound at the budget.
3. **Repair.**  The optimum can lie strictly above the hull (a budget
   between "save half" and "recompute everything" on a conv net).  First the
   two hull points are mixed part by part (:mod:`ckpt.partitioner.repair`),
   which fills the budget on stacks of similar layers.  Where the budget is
   less than one hull step below the fastest plan, a dive forces the step's
   value in every identical layer at once and relaxes again, so that the next
   step gives up something smaller off the hull (:meth:`_Cutter.dive`).  Then
   best-first branch and bound closes the remaining gap: branch on a value that
   the two hull points treat differently (force it saved / forbid saving it),
   bound every branch with its own price search, and prune by the bound.  On
   small graphs it finishes and proves optimality; on large ones it stops at
   its work limit with the best plan found, which is always within budget.

The work limit counts flow-network edges processed by the min cuts, never
seconds, so the same graph gets the same plan on a fast machine and a slow
one: every rank of a distributed job must make the same decisions.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from ckpt.partitioner.min_cut import CutNetwork
from ckpt.partitioner.plan import Plan, make_plan
from ckpt.partitioner.problem import NearbyPlans, Problem, cost_signature, evaluate, largest_value
from ckpt.partitioner.repair import mix_plans

__all__ = ["WORK_PER_EFFORT", "solve"]

# Min-cut work that effort 1.0 buys the repair search, counted as the whole network's edges per
# cut (however the cut is computed: contracted, warm-started or remembered): 0.1 to 0.3 s of
# Python on one CPU core on the benchmark models, whatever the graph's size.
WORK_PER_EFFORT = 200_000
# Relaxations the repair's dive (:meth:`_Cutter.dive`) may take before the branch and bound.
DIVE_STEPS = 4
DIVE_WORK = 0.25  # the dive's work limit, as a share of the branch and bound's

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Point:
    saved: frozenset[int]
    recomputed: frozenset[int]
    time: int
    bytes: int
    key: int


@dataclass(frozen=True)
class _Relaxation:
    """The price search's answer for one set of constraints."""

    status: str  # "optimal", "infeasible" or "gap"
    fast: _Point | None = None  # over budget (gap) or the optimum (optimal)
    lean: _Point | None = None  # within budget (gap), or the leanest (infeasible)
    bound: int = 0  # lower bound on the key of any plan within budget


class _Cutter:
    """Runs priced min cuts on one problem and counts them.

    The same cut comes back within one solve (the slack step starts with the
    price search's first cuts again), so answers are remembered by price and
    constraints.  A remembered cut still counts as a cut and as its work: the
    work limit, and so the plan, stays what it was without the memo.
    """

    def __init__(self, problem: Problem, network: CutNetwork | None = None) -> None:
        if network is not None and network.problem is not problem:
            raise ValueError("solve: network= is the network of another problem; pass CutNetwork(problem) or None")
        self.problem = problem
        self.network = CutNetwork(problem) if network is None else network
        self.scale = problem.total_bytes + 1
        self.cuts = 0
        self.work = 0
        self._answers: dict[tuple[int, int, frozenset[int], frozenset[int]], _Point | None] = {}
        m = self.scale
        self._save_key = [t * m + b for t, b in zip(problem.save_time, problem.save_bytes)]
        self._recompute_key = [t * m + b for t, b in zip(problem.recompute_time, problem.recompute_bytes)]
        self.big = sum(self._save_key) + sum(self._recompute_key) + 1

    def point(self, saved: frozenset[int]) -> _Point:
        time, memory, recomputed = evaluate(self.problem, saved)
        return _Point(saved, recomputed, time, memory, time * self.scale + memory)

    def cut(self, alpha: int, beta: int, force: frozenset[int], forbid: frozenset[int]) -> _Point | None:
        self.cuts += 1
        self.work += self.network.num_edges
        key = (alpha, beta, force, forbid)
        if key not in self._answers:
            problem = self.problem
            save_cost = [alpha * k + beta * b for k, b in zip(self._save_key, problem.save_bytes)]
            recompute_cost = [alpha * k + beta * b for k, b in zip(self._recompute_key, problem.recompute_bytes)]
            saved = self.network.saved_set(
                save_cost, recompute_cost, force_saved=force, forbid_saved=forbid, price=(alpha, beta)
            )
            self._answers[key] = None if saved is None else self.point(saved)
        return self._answers[key]

    def mix(self, relaxation: _Relaxation, budget: int) -> _Point | None:
        """The repair step: a mixed plan between the two hull points, if it beats ``lean``.

        The mixed plans are ``lean`` with parts switched, so they are evaluated
        from ``lean``'s closure (:class:`NearbyPlans`), not each from scratch.
        """
        fast, lean = relaxation.fast, relaxation.lean
        assert fast is not None and lean is not None
        nearby = NearbyPlans(self.problem, lean.saved)

        def key_and_bytes(saved: frozenset[int]) -> tuple[int, int]:
            time, memory = nearby.cost(saved)
            return time * self.scale + memory, memory

        mixed = mix_plans(
            self.problem, (fast.saved, fast.recomputed), (lean.saved, lean.recomputed), budget, key_and_bytes
        )
        return None if mixed is None else self.point(mixed)

    def dive(
        self, root: _Relaxation, incumbent: _Point, budget: int, pinned: _Pinned, settled: int, work_limit: float
    ) -> _Point:
        """The repair step across the hull's step: ``incumbent`` or a faster plan within the budget.

        Where ``fast`` is over the budget by less than one hull step (one of a
        stack's identical layers recomputed), the best plan often keeps that
        step's value saved and gives up something small off the hull instead
        (the deep MLP's loss: its shifted logits recomputed from their row
        statistics, where the hull and the mixes recompute a whole layer).
        The branch and bound finds it only after forcing the step's value in
        each of the stack's layers, one branch at a time.

        Each dive step takes the largest value that the best plan so far
        gives up from ``fast``; if it has twins (values ``fast`` saves with the
        same bytes and times: the other layers' copies), it forces them all
        saved and relaxes again, so that the next hull step is something
        else; if no plan within the budget keeps them all, it forces the value
        and the twins that the best plan keeps.  A value without twins is left
        to the branch and bound, whose first branch forces it anyway.  Up to
        :data:`DIVE_STEPS` steps, each of which must find a better plan, while
        the best plan is not yet within ``settled`` of the root's bound (the
        search would then stop anyway) and the work stays under
        ``work_limit``.
        """
        problem = self.problem
        force = pinned.force
        relaxation, kept = root, incumbent
        best = incumbent
        for _ in range(DIVE_STEPS):
            if best.key - settled <= root.bound or self.work >= work_limit:
                break
            assert relaxation.fast is not None
            fast = relaxation.fast
            given_up = fast.saved - kept.saved
            if not given_up:
                break
            value = largest_value(problem, given_up)
            signature = cost_signature(problem, value)
            twins = frozenset(i for i in fast.saved if cost_signature(problem, i) == signature)
            if len(twins) < 2:
                break  # forcing the value alone is the branch and bound's own first branch
            # All of them kept first; if no plan within the budget keeps them all, those the best plan keeps.
            for more in (twins, (twins & kept.saved) | {value}):
                child = self.relax(budget, force | more, pinned.forbid, work_limit)
                if child is None:
                    return best  # out of work
                if child.status != "infeasible":
                    force = force | more
                    break
            else:
                break
            if child.status == "optimal":
                assert child.fast is not None
                return _better(best, child.fast)
            assert child.lean is not None
            relaxation, kept = child, _better(child.lean, self.mix(child, budget))
            if kept.key >= best.key:
                break  # no nearer the budget than the plan so far: the dive has lost its way
            best = kept
        return best

    def walk(
        self,
        fast: _Point,
        lean: _Point,
        on_fast_side: Callable[[_Point], bool],
        force: frozenset[int] = frozenset(),
        forbid: frozenset[int] = frozenset(),
        work_limit: float = math.inf,
    ) -> tuple[_Point, _Point] | None:
        """Narrow two hull points to the adjacent pair that ``on_fast_side`` tells apart (Eisner-Severance).

        Each cut at the slope between ``fast`` and ``lean`` either finds no
        hull point below that line (they are adjacent) or a new one, which
        replaces the end on its side.  None if the work reached ``work_limit``.
        """
        while True:
            if self.work >= work_limit:
                return None
            alpha = fast.bytes - lean.bytes
            beta = lean.key - fast.key
            candidate = self.cut(alpha, beta, force, forbid)
            assert candidate is not None  # the same constraints gave `fast` and `lean`
            if alpha * candidate.key + beta * candidate.bytes >= alpha * fast.key + beta * fast.bytes:
                return fast, lean
            if on_fast_side(candidate):
                fast = candidate
            else:
                lean = candidate

    def relax(
        self, budget: int | None, force: frozenset[int], forbid: frozenset[int], work_limit: float = math.inf
    ) -> _Relaxation | None:
        """The price search under constraints; None if the work reached ``work_limit`` before it finished."""
        fast = self.cut(1, 0, force, forbid)
        if fast is None:
            return _Relaxation("infeasible")
        if budget is None or fast.bytes <= budget:
            return _Relaxation("optimal", fast=fast, bound=fast.key)
        lean = self.cut(1, self.big, force, forbid)
        assert lean is not None  # same constraints as `fast`, which was feasible
        if lean.bytes > budget:
            return _Relaxation("infeasible", lean=lean)
        ends = self.walk(fast, lean, lambda point: point.bytes > budget, force, forbid, work_limit)
        if ends is None:
            return None
        fast, lean = ends
        # Lagrangian bound: the hull line between `fast` and `lean`, read at the budget.
        numerator = (lean.key - fast.key) * (fast.bytes - budget)
        denominator = fast.bytes - lean.bytes
        bound = fast.key + -(-numerator // denominator)
        return _Relaxation("gap", fast=fast, lean=lean, bound=bound)


def _leanest_within(cutter: _Cutter, max_time: int, force: frozenset[int], forbid: frozenset[int]) -> _Point:
    """The hull plan with the fewest bytes among those taking at most ``max_time``."""
    fast = cutter.cut(1, 0, force, forbid)
    lean = cutter.cut(1, cutter.big, force, forbid)
    assert fast is not None and lean is not None
    if lean.time <= max_time:
        return lean
    ends = cutter.walk(fast, lean, lambda point: point.time <= max_time, force, forbid)
    assert ends is not None  # no work limit
    return ends[0]


def _to_plan(point: _Point, solver: str, cutter: _Cutter, **extra: object) -> Plan:
    return make_plan(cutter.problem, point.saved, solver, cuts=cutter.cuts, **extra)


def _branch_value(problem: Problem, fast: _Point, lean: _Point) -> int:
    return largest_value(problem, fast.saved.symmetric_difference(lean.saved))


def solve(
    problem: Problem,
    budget_bytes: int | None,
    *,
    effort: float = 1.0,
    tolerance_ps: int = 0,
    slack_ps: int = 0,
    force_saved: frozenset[int] = frozenset(),
    forbid_saved: frozenset[int] = frozenset(),
    network: CutNetwork | None = None,
) -> Plan:
    """The least-time plan with saved bytes <= ``budget_bytes`` (None: no cap).

    If no plan fits the budget, returns the plan with the fewest bytes (and
    the least time among those), with ``over_budget`` true and
    ``minimum_bytes`` set.  ``effort`` bounds the repair search's work
    (``effort * WORK_PER_EFFORT`` edges processed by min cuts for the branch
    and bound, and :data:`DIVE_WORK` of that for the dive before it; 0 skips
    both); the price search at the root always runs to completion.  The
    plan depends on the problem and these arguments only, never on the
    machine's speed.  The repair search
    stops early once no branch can beat the plan by more than
    ``tolerance_ps`` picoseconds; ``lower_bound`` stays a proven bound either
    way, and ``optimal`` means the plan reaches it.

    ``slack_ps`` trades a little predicted time for memory: the result is
    the leanest hull plan whose time is within ``slack_ps`` of the best plan
    under the budget, if that is leaner (differences that small are below the
    cost model's accuracy).  The same rule with and without a cap keeps the
    saved bytes monotone in the budget (when the search finishes): a cap
    above the no-cap plan's bytes never gives a plan that saves more.

    ``force_saved`` values are saved and ``forbid_saved`` values are not, in
    every plan considered (the peak search pins values this way).

    ``network``: a :class:`CutNetwork` of ``problem`` to cut on, kept by a
    caller that solves the problem again (with other budgets or pins): its
    cuts then start from the flows of earlier solves' cuts.  Plans are the
    same with or without it.
    """
    if effort < 0:
        raise ValueError(f"solve: effort={effort!r} must be >= 0")
    cutter = _Cutter(problem, network)
    pinned = _Pinned(frozenset(force_saved), frozenset(forbid_saved))
    root = cutter.relax(budget_bytes, pinned.force, pinned.forbid)
    assert root is not None  # no work limit at the root
    if root.status == "infeasible":
        if root.lean is None:
            raise ValueError(
                "the problem has no feasible plan at all: some needed value can be neither saved nor recomputed"
            )
        return _to_plan(
            root.lean, "min-cut", cutter, optimal=True, budget_bytes=budget_bytes, minimum_bytes=root.lean.bytes
        )
    if root.status == "optimal":
        assert root.fast is not None
        best, optimal = _leaner_within_slack(cutter, root.fast, True, slack_ps, pinned)
        return _to_plan(best, "min-cut", cutter, optimal=optimal, lower_bound=root.fast.time, budget_bytes=budget_bytes)
    assert root.fast is not None and root.lean is not None and budget_bytes is not None
    work = effort * WORK_PER_EFFORT
    search = _branch_and_bound(cutter, root, budget_bytes, work, tolerance_ps * cutter.scale, pinned)
    best, optimal = _leaner_within_slack(cutter, search.incumbent, search.optimal, slack_ps, pinned)
    return _to_plan(
        best,
        "min-cut+branch-and-bound",
        cutter,
        optimal=optimal,
        lower_bound=search.lower_key // cutter.scale,
        budget_bytes=budget_bytes,
        price=(root.fast.bytes - root.lean.bytes, root.lean.key - root.fast.key),
        price_per_byte=(root.lean.key - root.fast.key) / (root.fast.bytes - root.lean.bytes) / cutter.scale,
        search_nodes=search.nodes,
    )


@dataclass(frozen=True)
class _Pinned:
    """Values every plan of one solve must save (``force``) or must not save (``forbid``)."""

    force: frozenset[int]
    forbid: frozenset[int]


def _leaner_within_slack(
    cutter: _Cutter, best: _Point, optimal: bool, slack_ps: int, pinned: _Pinned
) -> tuple[_Point, bool]:
    """The leanest hull plan within ``slack_ps`` of ``best``'s time, if it saves less than ``best``.

    A leaner plan saves fewer bytes than ``best``, so it keeps any budget ``best`` keeps.
    """
    if slack_ps <= 0:
        return best, optimal
    lean = _leanest_within(cutter, best.time + slack_ps, pinned.force, pinned.forbid)
    return (lean, False) if lean.bytes < best.bytes else (best, optimal)


@dataclass(frozen=True)
class _Search:
    incumbent: _Point  # the best plan within budget found
    lower_key: int  # proven lower bound on the key of any plan within budget
    nodes: int  # branches evaluated

    @property
    def optimal(self) -> bool:
        return self.lower_key >= self.incumbent.key


def _branch_and_bound(
    cutter: _Cutter, root: _Relaxation, budget: int, work: float, tolerance: int, pinned: _Pinned
) -> _Search:
    """Best-first branch and bound from the root relaxation, until ``work`` more edges are processed."""
    assert root.lean is not None
    incumbent = _better(root.lean, cutter.mix(root, budget))
    # The dive's work is its own: the branch and bound that follows keeps all of ``work``.
    incumbent = cutter.dive(root, incumbent, budget, pinned, tolerance, cutter.work + work * DIVE_WORK)
    work_limit = cutter.work + work
    counter = itertools.count()
    heap: list[tuple[int, int, frozenset[int], frozenset[int], _Relaxation]] = [
        (root.bound, next(counter), pinned.force, pinned.forbid, root)
    ]
    nodes = 0
    out_of_work = False
    settled = incumbent.key  # least bound among branches dropped as within tolerance
    while heap and not out_of_work and cutter.work < work_limit:
        bound, _, force, forbid, relaxation = heapq.heappop(heap)
        if bound >= incumbent.key - tolerance:
            settled = min(settled, bound)
            continue
        assert relaxation.fast is not None and relaxation.lean is not None
        value = _branch_value(cutter.problem, relaxation.fast, relaxation.lean)
        for child_force, child_forbid in ((force | {value}, forbid), (force, forbid | {value})):
            nodes += 1
            child = cutter.relax(budget, child_force, child_forbid, work_limit)
            if child is None:
                # Out of work: this branch stays open with its parent's bound.
                heapq.heappush(heap, (bound, next(counter), force, forbid, relaxation))
                out_of_work = True
                break
            if child.status == "infeasible":
                continue
            if child.status == "optimal":
                incumbent = _better(incumbent, child.fast)
                continue
            incumbent = _better(_better(incumbent, child.lean), cutter.mix(child, budget))
            if child.bound < incumbent.key - tolerance:
                heapq.heappush(heap, (child.bound, next(counter), child_force, child_forbid, child))
            else:
                settled = min(settled, child.bound)
    open_bounds = [entry[0] for entry in heap if entry[0] < incumbent.key]
    search = _Search(incumbent, min([settled, incumbent.key, *open_bounds]), nodes)
    if out_of_work:
        log.debug(
            "repair search stopped at its work limit after %d cuts and %d nodes; gap %.3g%%",
            cutter.cuts,
            nodes,
            100.0 * (incumbent.key - search.lower_key) / max(incumbent.key, 1),
        )
    return search


def _better(incumbent: _Point, candidate: _Point | None) -> _Point:
    """``candidate`` if it has a strictly smaller key than ``incumbent``."""
    return candidate if candidate is not None and candidate.key < incumbent.key else incumbent
