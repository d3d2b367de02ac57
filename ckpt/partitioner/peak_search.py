"""Plans that bound the step's peak: segment cuts and a greedy repair walk over the exact solver.

The solver minimises time under a cap on *saved* bytes; what runs out of
memory is the *peak* (:mod:`ckpt.partitioner.peak`).  The two are related but
not monotone: below a certain budget no block boundary is saved, so
recomputing the last block recomputes every block before it, and each stays
alive for its own backward.  On a chain, saving segment boundaries lets each
segment be recomputed alone (Chen's sqrt(n) schedule); the walk finds such
boundaries itself:

1. solve under the budget; simulate the plan's peak;
2. among the recomputed values alive at the peak (the working set), pick the
   one whose saving lowers the simulated peak most per byte saved (ties by
   index), and pin it saved;
3. re-solve under the budget with every pinned value saved (the solver
   chooses what else to drop to stay within the budget), and repeat.

Each step pins one more value, so the walk is a fixed sequence of plans for a
given problem and budget.  Under a tight budget one pin at a time is not
enough: a single boundary barely lowers the peak while the others are missing,
so the walk prefers a large value instead.  The segment plans fill that gap:
the forward cut into 2, 3, 4, ... segments at its cheapest frontiers
(:mod:`ckpt.partitioner.segments`), each set of cuts pinned at once.

:func:`cap_peak` takes the fastest plan within the cap among the segment
plans and the walks' (from the solver's own plan, and from the best segment
plan when no segment plan is within the cap; each walk stops at its first
plan within the cap, since its plans only get slower).  A smaller cap
searches further, so the predicted peak falls with the cap.
:func:`lowest_peak_within` is the tie-break without a peak cap (a budget, or none): among the
walk's plans within the budget and a time limit (the 1% slack), the lowest
peak; :func:`budget_peak` continues it from the segment plans, and adds the
guard that makes a smaller budget not raise the peak while it can avoid it:
if the tie-break's plan peaks above the plans at larger budgets (a fixed
ladder of them, and no budget), the first plan of the capped search that
does not.  A walk stops when no alive value
lowers the peak, when the peak is in the forward (saving more cannot lower
it), when pinned values alone exceed the budget, or after ``max_steps``.

Plain data only: the solver is passed in as a function.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from ckpt.partitioner.peak import PeakGraph, PeakPrediction, backward_peak, forward_peak, predict_plan
from ckpt.partitioner.plan import Plan
from ckpt.partitioner.problem import NearbyPlans, Problem
from ckpt.partitioner.segments import segment_pin_sets

__all__ = [
    "BudgetPeakResult",
    "PeakSearchResult",
    "REFERENCE_RUNGS",
    "SolveFn",
    "budget_peak",
    "cap_peak",
    "lowest_peak_within",
    "peak_walk",
    "segment_plans",
]

log = logging.getLogger(__name__)

# (budget_bytes, force_saved) -> plan
SolveFn = Callable[[int | None, frozenset[int]], Plan]

MAX_STEPS = 64  # pinned values per graph; each step costs one solve
# Steps of the walk the tie-break under a budget alone may take.  It runs on every
# graph, so it is kept to a fixed, small amount of work (each step is a full solve):
# on the benchmark models the first step or two give most of its gain.
TIE_BREAK_STEPS = 2
# A relative difference in predicted peak the tie-break treats as no difference.
PEAK_RESOLUTION = 0.01
MAX_CANDIDATES = 16  # values tried per step, largest first; each costs one peak simulation
# Values tried per step of the tie-break under a budget alone, which runs on every graph: on the
# benchmark models half of MAX_CANDIDATES gave the same plans (one lower peak) in less time.
TIE_BREAK_CANDIDATES = 8
# A cap this close below the solver's plan's peak (a share of it) is walked to from that
# plan first; a cap further below, from the best segment plan.
NEAR_CAP = 0.1
# Segment plans in a row that do not lower the lowest peak among them, after which a search for the
# lowest peak stops cutting the forward into more segments (:func:`segment_plans`).
PATIENCE = 2


@dataclass(frozen=True)
class PeakSearchResult:
    """The chosen plan, its predicted peak, and how the search went."""

    plan: Plan
    prediction: PeakPrediction
    within_cap: bool  # the peak is within the cap (always true without a cap)
    start_peak: int  # predicted peak of the solver's plan before any pinning
    lowest_peak: int  # the lowest predicted peak the walk reached
    steps: int  # plans the walk produced after the first


def _best_pin(
    problem: Problem, graph: PeakGraph, plan: Plan, prediction: PeakPrediction, max_candidates: int = MAX_CANDIDATES
) -> int | None:
    """The recomputed value alive at the peak whose saving lowers the peak most per byte."""
    if prediction.phase != "backward":
        return None
    back = {v: i for i, v in enumerate(graph.problem_index)}
    recomputed = set(plan.recomputed)
    alive = [back[v] for v in prediction.alive_values if v in back]
    candidates = [i for i in alive if i in recomputed and problem.can_save[i]]
    candidates.sort(key=lambda i: (-problem.save_bytes[i], i))
    best: tuple[float, int] | None = None
    mapping = graph.problem_index
    # Each trial saves one more value: its closure is the plan's less what that value alone needed.
    nearby = NearbyPlans(problem, frozenset(plan.saved))
    saved = frozenset(mapping[j] for j in plan.saved)
    recomputed_values = frozenset(mapping[j] for j in plan.recomputed)
    for i in candidates[:max_candidates]:
        more, fewer = nearby.recompute_changes(nearby.base | {i})
        trial_saved = saved | {mapping[i]}
        rest = recomputed_values.difference(mapping[j] for j in fewer).union(mapping[j] for j in more)
        # The trial's peak is at least its backward's: simulate the forward only if the gain that
        # bound leaves could still be positive and beat the best score so far.
        backward = backward_peak(graph, trial_saved, rest)
        most = prediction.peak_bytes - backward
        if most <= 0 or (best is not None and most / max(problem.save_bytes[i], 1) <= best[0]):
            continue
        gain = prediction.peak_bytes - max(backward, forward_peak(graph, trial_saved))
        if gain <= 0:
            continue
        score = gain / max(problem.save_bytes[i], 1)
        if best is None or score > best[0]:
            best = (score, i)
    return None if best is None else best[1]


def peak_walk(
    problem: Problem,
    graph: PeakGraph,
    solve_fn: SolveFn,
    budget_bytes: int | None,
    peak_cap: int | None = None,
    max_steps: int = MAX_STEPS,
    pinned: frozenset[int] = frozenset(),
    max_candidates: int = MAX_CANDIDATES,
) -> Iterator[tuple[Plan, PeakPrediction]]:
    """The walk's plans and their predicted peaks, starting with the solver's own plan (``pinned`` saved).

    With ``peak_cap``, a plan whose peak no pin lowers (it is in the forward,
    or what is alive there is saved) is answered by a tighter byte budget,
    pinned values kept: its saved bytes less the excess over the cap when the
    peak is in the forward, less a quarter of it when in the backward (where
    dropping a saved value may add recompute working set, so step gently).
    """
    budget = budget_bytes
    plan = solve_fn(budget, pinned)
    prediction = predict_plan(graph, plan)
    yield plan, prediction
    for _ in range(max_steps):
        if plan.over_budget:
            return
        if peak_cap is not None and prediction.peak_bytes <= peak_cap:
            return
        pin = _best_pin(problem, graph, plan, prediction, max_candidates)
        if pin is not None:
            pinned = pinned | {pin}
            log.debug("peak walk: pinned %s", problem.names[pin])
        elif peak_cap is not None and plan.bytes > 0:
            # The forward holds every saved byte, so a forward peak needs the whole excess dropped.
            # A step drops at most a quarter of the peak, so that under any cap far below the
            # plans' peaks the walk takes the same steps: the lowest peak it finds, used when
            # the cap cannot be reached, is then the same for every such cap.
            excess = min(prediction.peak_bytes - peak_cap, prediction.peak_bytes // 4)
            excess = excess if prediction.phase == "forward" else excess // 4
            budget = max(0, plan.bytes - max(1, excess))
        else:
            return
        plan = solve_fn(budget, pinned)
        prediction = predict_plan(graph, plan)
        log.debug(
            "peak walk: peak %d bytes in the %s, %d saved bytes", prediction.peak_bytes, prediction.phase, plan.bytes
        )
        yield plan, prediction


def _within_budget(plan: Plan, budget_bytes: int | None) -> bool:
    """Within the byte budget and every per-module cap the solver was given."""
    return not plan.over_regions and (budget_bytes is None or plan.bytes <= budget_bytes)


@dataclass(frozen=True)
class _Candidate:
    plan: Plan
    prediction: PeakPrediction
    pins: frozenset[int]  # what the plan was solved with


def segment_plans(
    problem: Problem,
    graph: PeakGraph,
    solve_fn: SolveFn,
    budget_bytes: int | None,
    max_time: int | None = None,
    pin_sets: Sequence[frozenset[int]] | None = None,
    stop_when_slower: bool = False,
    peak_below: float | None = None,
    patience: int | None = None,
) -> list[_Candidate]:
    """The solver's plans with the forward cut into segments (:mod:`ckpt.partitioner.segments`), fewest cuts first.

    A pin set whose bytes alone exceed the budget is skipped, and so is one
    that the solver's own plan under the budget already saves: that plan
    keeps those boundaries already, so their segments are already recomputed
    apart, and the callers weigh it on its own (on a 28-layer transformer
    every boundary is saved down to a budget of 0.25, and these solves were
    most of its planning time).  The first plan over the budget (pins and
    what must be saved anyway) ends the list, as more segments only pin more.
    With ``max_time``, plans slower than it are left out before their peak is
    simulated; with ``stop_when_slower`` too, the first such plan ends the
    list (more segments pin more, and so usually recompute more: a cheaper
    list, for a bound rather than a choice).  With
    ``peak_below``, for callers that want only plans peaking below it, plans
    whose forward alone peaks at or above it are left out before their
    backward is simulated (a plan's peak is the larger of the two; without a
    budget the forward holds every saved value at its end, so on a
    transformer stack it rules out the segment plans at the cost of the
    forward's simulation).  With ``patience``, for callers that want the
    lowest peak, the list ends once that many solved plans in a row have not
    lowered the lowest peak among them (a plan left out for its time counts
    as one): more segments lower the peak while each segment's working set
    is what the backward holds, and once the boundaries and the gradients
    are what it holds, more of them only add solves (on a 28-layer
    transformer at a budget of 0.1, eight solves that each peaked as the
    first did; on the benchmark models the plans are the same as without
    it).  ``pin_sets``: the graph's
    :func:`~ckpt.partitioner.segments.segment_pin_sets`, if the caller has them.
    """
    plans: list[_Candidate] = []
    mapping = graph.problem_index
    saved = frozenset(solve_fn(budget_bytes, frozenset()).saved)
    lowest = math.inf
    stale = 0
    for pins in segment_pin_sets(problem, graph) if pin_sets is None else pin_sets:
        if patience is not None and stale >= patience:
            break
        if budget_bytes is not None and sum(problem.save_bytes[i] for i in pins) > budget_bytes:
            continue
        if pins <= saved:
            continue
        plan = solve_fn(budget_bytes, pins)
        if not _within_budget(plan, budget_bytes):
            break
        if max_time is not None and plan.time > max_time:
            if stop_when_slower:
                break
            stale += 1
            continue
        left_out = False
        if peak_below is not None:
            forward = forward_peak(graph, (mapping[i] for i in plan.saved))
            left_out = forward >= peak_below
            # A plan left out by its forward counts towards the patience as it would without
            # ``peak_below``: its peak is simulated if its forward leaves it a chance to be the lowest.
            if left_out and (patience is None or forward >= lowest):
                stale += 1
                continue
        candidate = _Candidate(plan, predict_plan(graph, plan), pins)
        if candidate.prediction.peak_bytes < lowest:
            lowest, stale = candidate.prediction.peak_bytes, 0
        else:
            stale += 1
        if not left_out:
            plans.append(candidate)
    return plans


def cap_peak(
    problem: Problem,
    graph: PeakGraph,
    solve_fn: SolveFn,
    budget_bytes: int | None,
    peak_cap: int,
    *,
    fastest: bool = True,
    pin_sets: Sequence[frozenset[int]] | None = None,
    resolution: float = 0.0,
) -> PeakSearchResult:
    """The fastest plan found whose predicted peak is within ``peak_cap`` (and the budget).

    First the segment plans (a few boundaries saved at once,
    :func:`segment_plans`).  Then the walk (one pin at a time), from the
    solver's own plan, the fastest start; it stops once its plans are no
    faster than the fastest candidate within the cap (a walk only adds
    constraints).  If no segment plan is within the cap, a second walk
    starts from the segment plan with the lowest peak (its boundaries kept
    pinned), and the nearer start goes first: the solver's plan when the cap
    is within :data:`NEAR_CAP` of its peak (a few pins meet it), else the
    segment plan (on a 28-layer transformer at budget 0.1, one step where
    the walk from the solver's plan takes eleven).  The second walk runs if
    the first ends without reaching the cap, and, with ``fastest``, also
    after it did, for as long as its plans are faster; ``fastest=False``
    takes the first plan found within the cap.

    A walk stops at its first plan within the cap.  If no plan is within the
    cap, the plan with the lowest peak (the fastest among equals) among those
    within the budget, if any is, with ``within_cap`` false: the budget is
    kept before the peak is lowered.  With a ``resolution``, peaks within that
    fraction of the lowest count as equal there, and the fastest of them is
    taken: on the deep MLP at a budget of 0.25 the guard took a plan that
    peaks 0.004 MiB lower (20.28 MiB predicted) but saves 8.00 MiB with 20.2
    ms of recompute, over one that saves 7.00 MiB with 17.5 ms.
    """
    candidates = segment_plans(problem, graph, solve_fn, budget_bytes, pin_sets=pin_sets)
    fits = [c for c in candidates if c.prediction.peak_bytes <= peak_cap]
    best = min(fits, key=lambda c: (c.plan.time, c.prediction.peak_bytes)) if fits else None
    start_peak = predict_plan(graph, solve_fn(budget_bytes, frozenset())).peak_bytes
    walks: list[frozenset[int]] = [frozenset()]
    if best is None and candidates:
        segment = min(candidates, key=lambda c: (c.prediction.peak_bytes, c.plan.time)).pins
        near = start_peak - peak_cap <= NEAR_CAP * start_peak
        walks = [frozenset(), segment] if near else [segment, frozenset()]
    steps = -1
    for start, pins in enumerate(walks):
        if start > 0 and best is not None and not fastest:
            break
        for plan, prediction in peak_walk(problem, graph, solve_fn, budget_bytes, peak_cap, pinned=pins):
            steps += 1
            if best is not None and plan.time >= best.plan.time:
                break
            candidate = _Candidate(plan, prediction, pins)
            if prediction.peak_bytes <= peak_cap and _within_budget(plan, budget_bytes):
                best = candidate
                break
            candidates.append(candidate)
    if best is not None:
        low = min([best.prediction.peak_bytes] + [c.prediction.peak_bytes for c in candidates])
        return PeakSearchResult(_under(best.plan, budget_bytes), best.prediction, True, start_peak, low, steps)
    # Within the budget beats over it; then the lowest peak, within the resolution; then the fastest.
    within = any(_within_budget(c.plan, budget_bytes) for c in candidates)
    eligible = [c for c in candidates if _within_budget(c.plan, budget_bytes) == within]
    low = min(c.prediction.peak_bytes for c in eligible)
    lowest = min(
        (c for c in eligible if c.prediction.peak_bytes <= low * (1 + resolution)),
        key=lambda c: (c.plan.time, c.prediction.peak_bytes),
    )
    plan = _under(lowest.plan, budget_bytes)
    return PeakSearchResult(plan, lowest.prediction, False, start_peak, low, steps)


def _under(plan: Plan, budget_bytes: int | None) -> Plan:
    """``plan`` as a plan under the caller's budget: a walk's tighter budget is the search's own.

    A walk step solves under a budget below the caller's (:func:`peak_walk`),
    possibly below the smallest plan; the plan it returns is within the
    caller's budget all the same, and must not report the step's budget as
    the one it exceeds.
    """
    return plan if plan.budget_bytes == budget_bytes else replace(plan, budget_bytes=budget_bytes)


def lowest_peak_within(
    problem: Problem,
    graph: PeakGraph,
    solve_fn: SolveFn,
    budget_bytes: int | None,
    max_time: int,
    max_steps: int = TIE_BREAK_STEPS,
    pinned: frozenset[int] = frozenset(),
) -> PeakSearchResult:
    """Among the walk's plans within the budget and ``max_time``, the one with the lowest peak.

    The walk's first plan is the solver's (``pinned`` saved); the walk stops
    at the first plan slower than ``max_time`` (pinning more only adds
    constraints), or after ``max_steps`` pins.  Each step tries the
    :data:`TIE_BREAK_CANDIDATES` largest values alive at the peak (the capped
    search tries :data:`MAX_CANDIDATES`): this runs on every graph.  A later
    plan replaces the best one only if it lowers the predicted peak by more
    than ``PEAK_RESOLUTION`` of it: smaller differences are below the peak
    model's accuracy, and they can cost saved bytes.
    """
    best: tuple[Plan, PeakPrediction] | None = None
    steps = -1
    walk = peak_walk(
        problem, graph, solve_fn, budget_bytes, max_steps=max_steps, pinned=pinned, max_candidates=TIE_BREAK_CANDIDATES
    )
    for plan, prediction in walk:
        steps += 1
        if best is None:  # the solver's own plan
            best = (plan, prediction)
            start = prediction.peak_bytes
            continue
        if plan.time > max_time:
            break
        lower = prediction.peak_bytes < best[1].peak_bytes * (1 - PEAK_RESOLUTION)
        if _within_budget(plan, budget_bytes) and lower:
            best = (plan, prediction)
    assert best is not None
    return PeakSearchResult(best[0], best[1], True, start, best[1].peak_bytes, steps)


def _segment_tie_break(
    problem: Problem,
    graph: PeakGraph,
    solve_fn: SolveFn,
    budget_bytes: int | None,
    max_time: int,
    result: PeakSearchResult,
    pin_sets: Sequence[frozenset[int]],
) -> PeakSearchResult:
    """The tie-break continued from the segment plans: ``result`` or a lower peak within ``max_time``.

    The walk pins one value at a time, and a single boundary barely lowers
    the peak while the others are missing; the segment plans save several at
    once.  The one with the lowest peak within the budget and ``max_time``
    (more segments are tried until :data:`PATIENCE` plans in a row lower
    the peak no further) is walked from, boundaries kept, for the
    tie-break's steps.  The solves are the capped search's own, so a caching
    ``solve_fn`` shares them with the guard.
    """
    below = result.prediction.peak_bytes * (1 - PEAK_RESOLUTION)
    fits = [
        c
        for c in segment_plans(
            problem, graph, solve_fn, budget_bytes, max_time, pin_sets, peak_below=below, patience=PATIENCE
        )
        if c.prediction.peak_bytes < below
    ]
    if not fits:
        return result
    start = min(fits, key=lambda c: (c.prediction.peak_bytes, c.plan.time))
    walked = lowest_peak_within(problem, graph, solve_fn, budget_bytes, max_time, pinned=start.pins)
    return PeakSearchResult(
        walked.plan,
        walked.prediction,
        True,
        result.start_peak,
        walked.prediction.peak_bytes,
        result.steps + walked.steps,
    )


def _one_plan(problem: Problem, budget_bytes: int) -> bool:
    """The budget is below every value that takes bytes: every plan within it saves none of them.

    Values that take no bytes are graph inputs, never recomputed, or empty
    tensors, which hold nothing: all such plans keep the same bytes, and a
    budget of 0 admits one plan, the solver's.  Searching among plans within
    it (the tie-break, the guard) solves and simulates plans only to find
    that one again: on a 7B Llama shape of 32 layers, about 1 s of the 6 s
    its planning took (most of the rest computes the reference that the
    warning reports, the plans at larger budgets).
    """
    return all(b > budget_bytes for b, can in zip(problem.save_bytes, problem.can_save) if can and b > 0)


@dataclass(frozen=True)
class BudgetPeakResult:
    """The plan under a budget alone, and the peak it is held to."""

    search: PeakSearchResult
    reference_peak: int  # the lowest predicted peak of the plans at larger budgets (no budget included)
    raises_peak: bool  # no plan found within the budget peaks at or below ``reference_peak``


# The larger budgets a budget's peak is compared with: these fractions of what the plan
# without a budget saves (each is one solve and one peak simulation, and only budgets
# below them pay for them).
REFERENCE_RUNGS = (0.5, 0.25, 0.125, 0.0625)


def budget_peak(
    problem: Problem,
    graph: PeakGraph,
    solve_fn: SolveFn,
    budget_bytes: int | None,
    slack: int,
    bound_solve_fn: SolveFn | None = None,
) -> BudgetPeakResult:
    """The budget-alone rule: a smaller budget lowers saved bytes without raising the peak, where it can.

    1. The tie-break: among the walk's plans within the budget and within
       ``slack`` picoseconds of the fastest, the lowest peak; then, if a
       segment plan within both peaks lower, the walk from the lowest of
       them (:func:`_segment_tie_break`).  Without a budget this is the
       plan, and so it is under a budget that this plan keeps (a budget
       only makes the fastest plan slower, so it is within the slack too).
    2. The reference: the lowest predicted peak among the plan without a
       budget (its tie-break applied) and, at each larger budget of a fixed
       ladder (:data:`REFERENCE_RUNGS` of what the plan without a budget
       saves), the solver's plan and the segment plans within the slack of
       that budget's fastest plan, tried until :data:`PATIENCE` in a row
       lower the peak no further: that budget's own tie-break would weigh
       them, so its plan peaks no higher than the lowest of them.  Where
       they all peak above the reference so far (that budget's guard may
       act), the peak of that budget's own plan under this rule counts
       instead: on a U-Net whose budget of 0.25 the guard had taken far
       below the plan without a budget, 0.1 was held to that plan (27 MiB
       predicted) and not to 0.25's (20.5 MiB).  Not where the budget admits
       one plan (below): there the reference only feeds the warning, and the
       rungs' plans and segment plans are real plans at larger budgets, so
       the warning stays true; the rungs' own capped searches were 60% of
       the deep MLP's planning at a budget of 0 (2.3 s).  The ladder is the
       same for every budget, so a smaller budget with a choice is held to a
       reference no higher than a larger one's.  ``bound_solve_fn``, if
       given, solves those segment plans (they only bound the reference, so
       a cheaper solve will do).
    3. The guard: if the plan of step 1 peaks above the reference (by more
       than ``PEAK_RESOLUTION``), the first plan the capped search
       (:func:`cap_peak`) finds within the budget and within
       ``PEAK_RESOLUTION`` of the reference (the difference the guard does
       not act on) replaces it, whatever its time.  Aiming at the reference
       itself walked on for differences below the peak model's accuracy: on
       a 7B Llama shape of 32 layers at budget 0.05, the guard of the
       ladder's 1/8 rung took 30 pins (8 s) from 13.51 to 13.23 GiB against
       a reference of 13.22; it now stops after 2 pins (0.2 s) at 13.28.  If
       there is none, the capped search's plan replaces it only if it
       peaks lower by more than ``PEAK_RESOLUTION`` (a slower plan for a
       difference below the model's accuracy is no trade), and
       ``raises_peak`` says so.  Below the
       smallest plan (no plan is within the budget), or where the budget is
       below every value that takes bytes (a budget of 0: one plan), there is
       nothing to choose: the solver's plan is the answer (no tie-break, no
       guard), and ``raises_peak`` says whether it rises above the reference;
       below the smallest plan the reference counts the solver's plans at the
       rungs only.
    """

    def time_limit(budget: int | None) -> int:
        return solve_fn(budget, frozenset()).time + slack  # the fastest plan's time, plus the slack

    pin_sets = segment_pin_sets(problem, graph)  # the same for every budget: computed once

    def tie_break(budget: int | None) -> PeakSearchResult:
        max_time = time_limit(budget)
        result = lowest_peak_within(problem, graph, solve_fn, budget, max_time)
        return _segment_tie_break(problem, graph, solve_fn, budget, max_time, result, pin_sets)

    free = tie_break(None)
    if budget_bytes is None or _within_budget(free.plan, budget_bytes):
        # A budget the plan without one keeps changes nothing: that plan is within the budget's
        # slack too (a budget only makes the fastest plan slower).
        return BudgetPeakResult(free, free.prediction.peak_bytes, False)

    def tolerated(reference: int) -> int:
        """The highest peak the guard does not act on."""
        return int(reference * (1 + PEAK_RESOLUTION))

    def above(peak: int, reference: int) -> bool:
        return peak > tolerated(reference)

    def guard(budget: int, result: PeakSearchResult, reference: int) -> BudgetPeakResult:
        """Step 3: ``result``, or the capped search's first plan within ``PEAK_RESOLUTION`` of ``reference``."""
        if not above(result.prediction.peak_bytes, reference):
            return BudgetPeakResult(result, reference, False)
        capped = cap_peak(
            problem,
            graph,
            solve_fn,
            budget,
            tolerated(reference),
            fastest=False,
            pin_sets=pin_sets,
            resolution=PEAK_RESOLUTION,
        )
        log.debug(
            "budget %d raised the peak to %d bytes above %d; capped search reached %d",
            budget,
            result.prediction.peak_bytes,
            reference,
            capped.prediction.peak_bytes,
        )
        if capped.within_cap:
            return BudgetPeakResult(capped, reference, False)
        # Below the reference or not, a slower plan replaces the tie-break's only for a lower peak
        # the guard would act on: the deep MLP's capped search at 15.2 MiB found one 0.16% lower
        # whose recompute took 16.1 ms against the tie-break's 2.2.
        lower = _within_budget(capped.plan, budget) and capped.prediction.peak_bytes < result.prediction.peak_bytes * (
            1 - PEAK_RESOLUTION
        )
        best = capped if lower else result
        return BudgetPeakResult(best, reference, above(best.prediction.peak_bytes, reference))

    one_plan = _one_plan(problem, budget_bytes)
    if one_plan:
        plan = solve_fn(budget_bytes, frozenset())
        prediction = predict_plan(graph, plan)
        result = PeakSearchResult(plan, prediction, True, prediction.peak_bytes, prediction.peak_bytes, 0)
    else:
        result = tie_break(budget_bytes)
    # Below the smallest plan, or where the budget admits one plan only, there is nothing to
    # choose: that plan is the answer, and the reference only says (in the warning) what it
    # rises above.  Below the smallest plan the reference counts the rungs' solver plans only.
    choice = not result.plan.over_budget
    reference = free.prediction.peak_bytes
    for fraction in REFERENCE_RUNGS:
        rung = int(free.plan.bytes * fraction)
        if rung <= budget_bytes:
            break
        rung_peak = predict_plan(graph, solve_fn(rung, frozenset())).peak_bytes
        if choice:
            for candidate in segment_plans(
                problem,
                graph,
                bound_solve_fn or solve_fn,
                rung,
                time_limit(rung),
                pin_sets,
                stop_when_slower=True,
                peak_below=rung_peak,
                patience=PATIENCE,
            ):
                rung_peak = min(rung_peak, candidate.prediction.peak_bytes)
            if above(rung_peak, reference) and not one_plan:
                # That budget's own guard may act: its plan is the rule's, as if it were the budget.
                rung_peak = guard(rung, tie_break(rung), reference).search.prediction.peak_bytes
                log.debug(
                    "budget %d: the plan at the larger budget %d peaks at %d bytes", budget_bytes, rung, rung_peak
                )
        reference = min(reference, rung_peak)
    if not choice or one_plan:
        return BudgetPeakResult(result, reference, above(result.prediction.peak_bytes, reference))
    return guard(budget_bytes, result, reference)
