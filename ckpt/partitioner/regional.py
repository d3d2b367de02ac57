"""Exact planning with a cap per region: per-module memory budgets.

A :class:`RegionCap` is a set of values (those one module computes, see
:mod:`ckpt.partitioner.regions`) and a cap on the bytes that the plan's
saved values among them keep alive.  :func:`solve_regions` finds the
least-time plan that keeps every cap, with the same contract as
:func:`ckpt.partitioner.solver.solve`:

* **Presolve.**  A value whose saved bytes alone exceed a cap it counts
  towards is saved by no plan that keeps the cap: it is forbidden before
  any price is sought (and allowed again only where no plan found without it
  keeps the caps).  A cap that no plan keeps is held to the least bytes any
  plan leaves it, and the others are kept.
* **One price per cap.**  A min cut in which each value's bytes cost the sum
  of the prices of the caps that contain it gives the plan minimising
  ``key + sum(price_c * bytes_c)``; for any prices, that minimum less
  ``sum(price_c * cap_c)`` is a lower bound on the key of every plan that
  keeps the caps (Lagrangian duality).
* **Price search.**  Coordinate ascent: raise the price of the cap the
  current plan exceeds most, with the others fixed, to the breakpoint where
  the cap is kept (the one-dimensional hull walk of the budget solver), and
  repeat.  Every price vector met tightens the bound; every plan met that
  keeps all caps is a candidate.  Caps with the same budget (the MLP of every
  layer) first get one common price, walked on their summed bytes: on a stack
  of similar layers that leaves little for the per-cap walks.
* **Repair.**  The plans on both sides of the last breakpoint are mixed part
  by part (:mod:`ckpt.partitioner.repair`); where no plan met keeps every cap
  at once, the exceeded caps' prices rise a tenth at a time until one does
  (:meth:`_RegionCutter.escalate`); a dive forces the values costliest
  to recompute saved, with their copies in the other layers, and prices
  again (:meth:`_RegionCutter.dive`: no price may keep a block's large value
  and drop its small one); then best-first branch and bound (force a value
  saved / forbid saving it, warm-started prices, pruned by the bound) closes
  the gap, up to the same deterministic work limit as the budget solver.
  ``optimal`` on the plan means the bound was reached.

Keys are ``time * M + bytes`` as in the budget solver, so equal-time plans
are told apart by memory and every comparison is exact (prices are
fractions; each cut scales them to integers).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from ckpt.partitioner.min_cut import CutNetwork
from ckpt.partitioner.plan import Plan, make_plan
from ckpt.partitioner.problem import (
    Problem,
    ProblemError,
    RegionCap,
    cost_signature,
    evaluate,
    largest_value,
    region_bytes,
)
from ckpt.partitioner.repair import mix_plans
from ckpt.partitioner.solver import WORK_PER_EFFORT

__all__ = ["solve_regions"]

log = logging.getLogger(__name__)

# The dive before the branch and bound (:meth:`_RegionCutter.dive`): relaxations it may take, and
# its work, as a share of the branch and bound's.  Caps of different sizes leave few twins, so it
# forces one value at a time more often than the budget solver's: on the benchmark ResNet under
# 0.5 per block it took 5 steps and the branch and bound's share of work to reach 1.78 ms from
# 12.13 (bound 1.29); it stops at the first step that finds nothing better.
DIVE_STEPS = 8
DIVE_WORK = 1.0
# The feasibility step after a price search that keeps no cap set at once (:meth:`_RegionCutter.escalate`):
# each step raises the exceeded caps' prices by this factor, up to this many steps (1.1**64: 445 times).
ESCALATION = Fraction(11, 10)
ESCALATION_STEPS = 64


@dataclass(frozen=True)
class _Point:
    saved: frozenset[int]
    recomputed: frozenset[int]
    time: int
    bytes: int
    key: int
    usage: tuple[int, ...]  # bytes under each cap


@dataclass(frozen=True)
class _Relaxation:
    status: str  # "optimal", "infeasible" or "gap"
    bound: Fraction = Fraction(0)
    best: _Point | None = None  # the best plan met that keeps every cap
    fast: _Point | None = None  # a plan that exceeds a cap (gap): one side of the branching pair
    lean: _Point | None = None  # the plan at the final prices: the other side
    prices: tuple[Fraction, ...] = ()
    free: _Point | None = None  # the least-time plan under the constraints, caps ignored (gap)


class _RegionCutter:
    """Priced min cuts with one price per cap."""

    def __init__(self, problem: Problem, caps: Sequence[RegionCap]) -> None:
        self.problem = problem
        self.caps = tuple(caps)
        self.network = CutNetwork(problem)
        self.scale = problem.total_bytes + 1
        self.cuts = 0
        self.work = 0
        m = self.scale
        self._save_key = [t * m + b for t, b in zip(problem.save_time, problem.save_bytes)]
        self._recompute_key = [t * m + b for t, b in zip(problem.recompute_time, problem.recompute_bytes)]
        # A price at which a cap's bytes outweigh every time: a cut at it keeps that cap first.
        self.big = Fraction(sum(self._save_key) + sum(self._recompute_key) + 1)
        self._caps_of: list[list[int]] = [[] for _ in range(len(problem))]
        for c, cap in enumerate(self.caps):
            for i in cap.members:
                self._caps_of[i].append(c)

    def point(self, saved: frozenset[int]) -> _Point:
        time, memory, recomputed = evaluate(self.problem, saved)
        # Each cap's bytes (``region_bytes`` per cap) in one pass over the plan's values.
        usage = [0] * len(self.caps)
        caps_of, save_bytes, recompute_bytes = self._caps_of, self.problem.save_bytes, self.problem.recompute_bytes
        for values, nbytes in ((saved, save_bytes), (recomputed, recompute_bytes)):
            for i in values:
                for c in caps_of[i]:
                    usage[c] += nbytes[i]
        return _Point(saved, recomputed, time, memory, time * self.scale + memory, tuple(usage))

    def excess(self, point: _Point) -> int:
        return sum(max(0, used - cap.max_bytes) for used, cap in zip(point.usage, self.caps))

    def keeps(self, point: _Point) -> bool:
        return all(used <= cap.max_bytes for used, cap in zip(point.usage, self.caps))

    def cut(self, prices: Sequence[Fraction], force: frozenset[int], forbid: frozenset[int]) -> _Point | None:
        self.cuts += 1
        self.work += self.network.num_edges
        scale = math.lcm(*(p.denominator for p in prices)) if prices else 1
        scaled = [p.numerator * (scale // p.denominator) for p in prices]  # exact: scale is a common denominator
        per_value = [sum(scaled[c] for c in caps) for caps in self._caps_of]
        problem = self.problem
        save_cost = [scale * k + p * b for k, p, b in zip(self._save_key, per_value, problem.save_bytes, strict=True)]
        recompute_cost = [
            scale * k + p * b for k, p, b in zip(self._recompute_key, per_value, problem.recompute_bytes, strict=True)
        ]
        saved = self.network.saved_set(
            save_cost, recompute_cost, force_saved=force, forbid_saved=forbid, price=(scale, *scaled)
        )
        return None if saved is None else self.point(saved)

    def lagrangian(self, prices: Sequence[Fraction], point: _Point) -> Fraction:
        """The lower bound that ``point``, a minimiser at ``prices``, proves."""
        return point.key + sum(
            (p * (used - cap.max_bytes) for p, used, cap in zip(prices, point.usage, self.caps)), Fraction(0)
        )

    def walk_price(
        self,
        prices: list[Fraction],
        group: Sequence[int],
        fast: _Point,
        force: frozenset[int],
        forbid: frozenset[int],
        work_limit: float,
    ) -> tuple[Fraction, _Point, _Point] | str:
        """The breakpoint of one common price for the caps ``group``, the others fixed.

        The price at which the group's summed bytes drop within its summed
        caps.  Returns (price, the minimiser just above, the one within),
        ``"unreachable"`` if no price for the group alone gets there, or
        ``"work"`` if the work limit was reached.
        """
        members = set(group)
        cap = sum(self.caps[c].max_bytes for c in group)

        def used(point: _Point) -> int:
            return sum(point.usage[c] for c in group)

        def priced(price: Fraction) -> list[Fraction]:
            return [price if s in members else p for s, p in enumerate(prices)]

        lean = self.cut(priced(self.big), force, forbid)
        assert lean is not None  # same constraints as `fast`
        if used(lean) > cap:
            return "unreachable"

        def rest(point: _Point) -> Fraction:
            return point.key + sum(
                (p * u for s, (p, u) in enumerate(zip(prices, point.usage)) if s not in members), Fraction(0)
            )

        while True:
            if self.work >= work_limit:
                return "work"
            price = (rest(lean) - rest(fast)) / (used(fast) - used(lean))
            candidate = self.cut(priced(price), force, forbid)
            assert candidate is not None
            if rest(candidate) + price * used(candidate) >= rest(fast) + price * used(fast):
                return price, fast, lean
            if used(candidate) > cap:
                fast = candidate
            else:
                lean = candidate

    def groups(self) -> list[list[int]]:
        """Caps given the same budget (the same kind of module in every layer), two or more of them."""
        by_budget: dict[str, list[int]] = {}
        for c, cap in enumerate(self.caps):
            by_budget.setdefault(cap.budget, []).append(c)
        return [group for _, group in sorted(by_budget.items()) if len(group) > 1]

    def relax(
        self,
        force: frozenset[int],
        forbid: frozenset[int],
        start: Sequence[Fraction],
        work_limit: float = math.inf,
    ) -> _Relaxation | None:
        """The price search under constraints; None if the work limit was reached first."""
        free = self.cut([Fraction(0)] * len(self.caps), force, forbid)
        if free is None:
            return _Relaxation("infeasible")
        if self.keeps(free):
            return _Relaxation("optimal", bound=Fraction(free.key), best=free, lean=free)
        prices = list(start)
        point = self.cut(prices, force, forbid) if any(prices) else free
        assert point is not None
        bound = self.lagrangian(prices, point)
        best = point if self.keeps(point) else None
        fast = free
        if not any(prices):
            # Start from one price per group of caps with the same budget: on a stack of similar
            # layers their prices are nearly equal, so one walk per group replaces one per cap.
            for group in self.groups():
                total = sum(self.caps[c].max_bytes for c in group)
                if sum(point.usage[c] for c in group) <= total:
                    continue
                step = self.walk_price(prices, group, point, force, forbid, work_limit)
                if step == "work":
                    return None
                if isinstance(step, str):  # unreachable together: the caps are walked one by one below
                    continue
                price, fast, point = step
                for c in group:
                    prices[c] = price
                bound = max(bound, self.lagrangian(prices, point))
                if self.keeps(point) and (best is None or point.key < best.key):
                    best = point
        for _ in range(4 * len(self.caps) + 4):
            violated = [c for c, cap in enumerate(self.caps) if point.usage[c] > cap.max_bytes]
            if not violated:
                break
            usage = point.usage
            c = max(violated, key=lambda c: (Fraction(usage[c] - self.caps[c].max_bytes, usage[c]), -c))
            step = self.walk_price(prices, [c], point, force, forbid, work_limit)
            if step == "work":
                return None
            if step == "unreachable":
                alone = [Fraction(0)] * len(self.caps)
                alone[c] = self.big
                leanest = self.cut(alone, force, forbid)
                assert leanest is not None
                if leanest.usage[c] > self.caps[c].max_bytes:
                    return _Relaxation("infeasible", lean=leanest)  # no plan keeps this cap
                prices = alone  # the other prices pushed bytes into this region; start again from it
                point = leanest
                continue
            assert not isinstance(step, str)
            prices[c], fast, point = step
            bound = max(bound, self.lagrangian(prices, point))
            if self.keeps(point) and (best is None or point.key < best.key):
                best = point
        slack_free = all(p * (cap.max_bytes - used) == 0 for p, used, cap in zip(prices, point.usage, self.caps))
        if self.keeps(point) and slack_free:  # complementary slackness: the bound is reached
            return _Relaxation("optimal", bound=Fraction(point.key), best=point, lean=point, prices=tuple(prices))
        return _Relaxation("gap", bound=bound, best=best, fast=fast, lean=point, prices=tuple(prices), free=free)

    def escalate(
        self,
        point: _Point,
        prices: Sequence[Fraction] | None,
        force: frozenset[int],
        forbid: frozenset[int],
        work_limit: float,
    ) -> _Point | None:
        """A plan that keeps every cap, reached from ``point`` at ``prices``, or None.

        Each step raises the price of every cap ``point`` exceeds by a tenth
        (a cap not priced yet starts at the least price given, or at one
        picosecond a byte) and cuts again,
        up to :data:`ESCALATION_STEPS` steps and the work limit. Where the
        price search ends with every cap it walked kept in turn and none kept
        all at once (bytes one price pushes out of a region land in another),
        this finds a plan near those prices: on GPT-2 with each block's MLP
        capped at 1 MiB and the rest at 20 MiB, 64.7 ms of recompute in seven
        steps, where the search's fallback recomputed everything (103.8 ms).
        """
        current = list(prices) if prices is not None else [Fraction(0)] * len(self.caps)
        for _ in range(ESCALATION_STEPS):
            violated = [used > cap.max_bytes for used, cap in zip(point.usage, self.caps)]
            if not any(violated):
                return point
            if self.work >= work_limit:
                return None
            least = min((price for price in current if price), default=Fraction(self.scale))  # 1 ps a byte
            current = [
                (price * ESCALATION if price else least) if over else price for price, over in zip(current, violated)
            ]
            cut = self.cut(current, force, forbid)
            assert cut is not None  # the same constraints gave ``point``
            point = cut
        return point if self.keeps(point) else None

    def mix(self, fast: _Point, lean: _Point) -> _Point | None:
        """``lean`` with parts of ``fast`` that keep every cap, greedily by time saved per byte."""
        weight = self.problem.total_bytes + 1

        def key_and_weight(saved: frozenset[int]) -> tuple[int, int]:
            point = self.point(saved)
            return point.key, self.excess(point) * weight + point.bytes

        try:
            base_key, base_weight = key_and_weight(lean.saved)
        except ProblemError:
            return None
        if base_weight >= weight:  # `lean` itself exceeds a cap
            return None
        mixed = mix_plans(
            self.problem,
            (fast.saved, fast.recomputed),
            (lean.saved, lean.recomputed),
            weight - 1,
            key_and_weight,
        )
        return None if mixed is None else self.point(mixed)

    def _fitting(self, force: frozenset[int], candidates: frozenset[int]) -> frozenset[int]:
        """The candidates (in index order) whose save bytes fit every cap beside those of ``force``."""
        save_bytes = self.problem.save_bytes
        used = [0] * len(self.caps)
        for i in force:
            for c in self._caps_of[i]:
                used[c] += save_bytes[i]
        chosen = []
        for i in sorted(candidates):
            if all(used[c] + save_bytes[i] <= self.caps[c].max_bytes for c in self._caps_of[i]):
                for c in self._caps_of[i]:
                    used[c] += save_bytes[i]
                chosen.append(i)
        return frozenset(chosen)

    def dive(
        self,
        root: _Relaxation,
        incumbent: _Point | None,
        force: frozenset[int],
        forbid: frozenset[int],
        tolerance: int,
        work_limit: float,
    ) -> _Point | None:
        """``incumbent``, or a faster plan that keeps every cap, found by forcing values saved.

        Under caps no set of prices may make the best plan a minimiser: on
        the deep MLP with a cap of 0.5 per block, a block keeps its matmul
        output only if it drops one of its norm's two statistics, and any
        price that drops a statistic (2 KiB) drops the matmul output (1 MiB)
        too.  The root's plans then recompute every block's matmul (22.6 ms)
        against a bound of 0.6 ms, and the branch and bound, best first on
        that bound, wins one block per branch.  Each dive step takes the
        value costliest to recompute that the relaxation's ``fast`` plan or
        its least-time plan (``free``) saves and the best plan so far does
        not, and forces it saved with its twins (values of its cost
        signature, :func:`~ckpt.partitioner.problem.cost_signature`: the
        other blocks' copies) that fit their caps beside what is forced
        already; if no plan keeps them, those the best plan keeps and the
        value.  Then it prices again.  Up to :data:`DIVE_STEPS` steps, each
        of which must find a better plan, while the best plan is not within
        ``tolerance`` of the root's bound and the work stays under
        ``work_limit``.
        """
        problem = self.problem
        relaxation, best = root, incumbent
        for _ in range(DIVE_STEPS):
            if self.work >= work_limit or (best is not None and best.key - tolerance <= root.bound):
                break
            kept = best.saved if best is not None else frozenset()
            given_up = frozenset().union(*(p.saved for p in (relaxation.fast, relaxation.free) if p is not None))
            given_up -= kept | force
            if not given_up:
                break
            # The costliest to recompute: what a cap's slack is best spent on.
            value = max(given_up, key=lambda i: (problem.recompute_time[i], problem.save_bytes[i], -i))
            signature = cost_signature(problem, value)
            twins = frozenset(
                i
                for i in range(len(problem))
                if problem.can_save[i] and i not in forbid and cost_signature(problem, i) == signature
            )
            # A fresh price search (its one price per group of caps suits a stack's forced copies);
            # the twins that fit their caps beside what is forced first, then those the best plan
            # keeps and the value (the value alone where it has no twins).
            zero = tuple(Fraction(0) for _ in self.caps)
            fitting = self._fitting(force, twins)
            for more in ([fitting] if len(fitting) > 1 else []) + [(twins & kept) | {value}]:
                child = self.relax(force | more, forbid, zero, work_limit)
                if child is None:
                    return best  # out of work
                if child.status != "infeasible":
                    force = force | more
                    break
            else:
                break
            found = child.best
            if child.status == "gap" and child.fast is not None and child.lean is not None:
                found = _better(found, self.mix(child.fast, child.lean))
            if found is None or (best is not None and found.key >= best.key):
                break  # no better than the plan so far: the dive has lost its way
            best = found
            if child.status == "optimal":
                break
            relaxation = child
        return best


def _better(incumbent: _Point | None, candidate: _Point | None) -> _Point | None:
    if candidate is None:
        return incumbent
    if incumbent is None or candidate.key < incumbent.key:
        return candidate
    return incumbent


def _branch_value(problem: Problem, fast: _Point, lean: _Point) -> int | None:
    differing = fast.saved.symmetric_difference(lean.saved)
    return largest_value(problem, differing) if differing else None


def solve_regions(
    problem: Problem,
    caps: Sequence[RegionCap],
    *,
    effort: float = 1.0,
    tolerance_ps: int = 0,
    force_saved: frozenset[int] = frozenset(),
    forbid_saved: frozenset[int] = frozenset(),
) -> Plan:
    """The least-time plan whose bytes within each cap's members are at most its ``max_bytes``.

    If the search finds no plan that keeps every cap, returns the plan that
    exceeds them least (the leanest in the capped values, least time among
    those), with ``over_regions`` naming the caps it exceeds.  ``effort``,
    ``tolerance_ps``, ``force_saved`` and ``forbid_saved`` mean what they mean
    for :func:`ckpt.partitioner.solver.solve`; the plan depends on the
    arguments only, never on the machine's speed.
    """
    if effort < 0:
        raise ValueError(f"solve_regions: effort={effort!r} must be >= 0")
    if not caps:
        raise ValueError("solve_regions: no caps given; use ckpt.partitioner.solve for a single budget")
    cutter = _RegionCutter(problem, caps)
    force, forbid = frozenset(force_saved), frozenset(forbid_saved)
    zero = tuple(Fraction(0) for _ in caps)
    # A value larger than a cap it counts towards is saved by no plan that keeps the cap.
    # Forbidding it up front spares the prices the work of finding that out. On a Llama stack
    # whose query projections were capped at 0, the search ran out of work with every value
    # recomputed, 20 times the least time. Where no plan found without those values keeps the
    # caps, the search runs again without the restriction, for the plan that exceeds them least.
    oversized = _oversized(problem, caps, force) - forbid
    if oversized:
        root = cutter.relax(force, forbid | oversized, zero)
        assert root is not None  # no work limit at the root
        if root.status != "infeasible":
            plan = _search(cutter, root, force, forbid | oversized, effort, tolerance_ps)
            if not plan.over_regions:
                return plan
    root = cutter.relax(force, forbid, zero)
    assert root is not None  # no work limit at the root
    if root.status == "infeasible" and root.lean is not None:
        # Some cap no plan keeps: hold it to the least any plan reaches, keep the others, and say
        # which it exceeds. Falling back to the plan leanest in that cap alone saved everything
        # else: on GPT-2 with its first block capped at 0 (its dropout seeds take 16 bytes) and the
        # rest at 0.3, the plan saved 102 MiB against the rest's 28.
        lifted = _lifted(cutter, force, forbid)
        if lifted is not None:
            plan = solve_regions(
                problem, lifted, effort=effort, tolerance_ps=tolerance_ps, force_saved=force, forbid_saved=forbid
            )
            if not plan.over_regions:
                over = tuple(
                    cap.label
                    for cap in caps
                    if region_bytes(problem, plan.saved, plan.recomputed, cap.members) > cap.max_bytes
                )
                return replace(plan, over_regions=over)
    return _search(cutter, root, force, forbid, effort, tolerance_ps)


def _lifted(cutter: _RegionCutter, force: frozenset[int], forbid: frozenset[int]) -> tuple[RegionCap, ...] | None:
    """The caps, each that no plan keeps raised to the least bytes a plan leaves it; None if every cap is reachable."""
    lifted = []
    for c, cap in enumerate(cutter.caps):
        alone = [Fraction(0)] * len(cutter.caps)
        alone[c] = cutter.big
        leanest = cutter.cut(alone, force, forbid)
        assert leanest is not None  # the constraints admit a plan: the root found one
        least = leanest.usage[c]
        lifted.append(cap if least <= cap.max_bytes else replace(cap, max_bytes=least))
    return None if all(new is old for new, old in zip(lifted, cutter.caps)) else tuple(lifted)


def _search(
    cutter: _RegionCutter,
    root: _Relaxation,
    force: frozenset[int],
    forbid: frozenset[int],
    effort: float,
    tolerance_ps: int,
) -> Plan:
    """:func:`solve_regions` from its root relaxation: the repair steps, then the branch and bound."""
    problem, caps = cutter.problem, cutter.caps
    zero = tuple(Fraction(0) for _ in caps)
    if root.status == "infeasible":
        fallback = root.lean or cutter.cut([cutter.big] * len(caps), force, forbid)
        if fallback is None:
            raise ValueError(
                "the problem has no feasible plan at all: some needed value can be neither saved nor recomputed"
            )
        return _to_plan(cutter, fallback, "min-cut", optimal=True)
    if root.status == "optimal":
        assert root.best is not None
        return _to_plan(cutter, root.best, "min-cut", optimal=True, lower_bound=root.best.time)
    tolerance = tolerance_ps * cutter.scale
    # The escalation and the dive each get this much work of their own, counted from when they start.
    side_work = effort * WORK_PER_EFFORT * DIVE_WORK
    incumbent = root.best
    if root.fast is not None and root.lean is not None:
        incumbent = _better(incumbent, cutter.mix(root.fast, root.lean))
    if incumbent is None and root.fast is not None and root.lean is not None:
        found = cutter.escalate(root.lean, root.prices, force, forbid, cutter.work + side_work)
        incumbent = _better(found, cutter.mix(root.fast, found)) if found is not None else None
    if incumbent is None:
        # No plan met keeps every cap: the leanest in the capped values is the fallback.
        leanest = cutter.cut([cutter.big] * len(caps), force, forbid)
        assert leanest is not None
        incumbent = leanest if cutter.keeps(leanest) else None
    # The branch and bound that follows keeps all of its own work.
    incumbent = cutter.dive(root, incumbent, force, forbid, tolerance, cutter.work + side_work)
    counter = itertools.count()
    heap: list[tuple[Fraction, int, frozenset[int], frozenset[int], _Relaxation]] = [
        (root.bound, next(counter), force, forbid, root)
    ]
    nodes = 0
    work_limit = cutter.work + effort * WORK_PER_EFFORT
    out_of_work = False
    settled: Fraction | None = None  # least bound among branches dropped as within tolerance

    def cutoff() -> Fraction | None:
        return None if incumbent is None else Fraction(incumbent.key - tolerance)

    while heap and not out_of_work and cutter.work < work_limit:
        bound, _, node_force, node_forbid, relaxation = heapq.heappop(heap)
        limit = cutoff()
        if limit is not None and bound >= limit:
            settled = bound if settled is None else min(settled, bound)
            continue
        assert relaxation.fast is not None and relaxation.lean is not None
        value = _branch_value(problem, relaxation.fast, relaxation.lean)
        if value is None:  # nothing to branch on: the node's bound stays a bound
            settled = bound if settled is None else min(settled, bound)
            continue
        for child_force, child_forbid in ((node_force | {value}, node_forbid), (node_force, node_forbid | {value})):
            nodes += 1
            child = cutter.relax(child_force, child_forbid, relaxation.prices or zero, work_limit)
            if child is None:
                heapq.heappush(heap, (bound, next(counter), node_force, node_forbid, relaxation))
                out_of_work = True
                break
            if child.status == "infeasible":
                continue
            incumbent = _better(incumbent, child.best)
            if child.status == "optimal":
                continue
            assert child.fast is not None and child.lean is not None
            incumbent = _better(incumbent, cutter.mix(child.fast, child.lean))
            limit = cutoff()
            if limit is None or child.bound < limit:
                heapq.heappush(heap, (child.bound, next(counter), child_force, child_forbid, child))
            else:
                settled = child.bound if settled is None else min(settled, child.bound)
    if incumbent is None:
        leanest = cutter.cut([cutter.big] * len(caps), force, forbid)
        assert leanest is not None
        return _to_plan(cutter, leanest, "min-cut+branch-and-bound", optimal=False, search_nodes=nodes)
    open_bounds = [entry[0] for entry in heap if entry[0] < incumbent.key]
    lower = min([Fraction(incumbent.key), *open_bounds, *([settled] if settled is not None else [])])
    lower_key = math.ceil(lower)
    if out_of_work:
        log.debug(
            "regional repair search stopped at its work limit after %d cuts and %d nodes; gap %.3g%%",
            cutter.cuts,
            nodes,
            100.0 * (incumbent.key - lower_key) / max(incumbent.key, 1),
        )
    return _to_plan(
        cutter,
        incumbent,
        "min-cut+branch-and-bound",
        optimal=lower_key >= incumbent.key,
        lower_bound=lower_key // cutter.scale,
        search_nodes=nodes,
    )


def _oversized(problem: Problem, caps: Sequence[RegionCap], force: frozenset[int]) -> frozenset[int]:
    """Values that alone take more bytes saved than a cap they count towards allows (``force`` left out)."""
    return frozenset(i for cap in caps for i in cap.members if problem.save_bytes[i] > cap.max_bytes and i not in force)


def _to_plan(cutter: _RegionCutter, point: _Point, solver: str, **extra: object) -> Plan:
    over = tuple(cap.label for used, cap in zip(point.usage, cutter.caps) if used > cap.max_bytes)
    return make_plan(cutter.problem, point.saved, solver, cuts=cutter.cuts, over_regions=over, **extra)
