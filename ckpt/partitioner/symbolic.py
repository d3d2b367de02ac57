"""Keep a fractional budget at every size when sizes are symbolic.

Under dynamic shapes one plan serves every size, but it is chosen at the size
hints.  Saved values can grow faster than what autograd saves (attention
scores grow with the square of the sequence), so a plan that keeps 50% at the
hints can keep more at other sizes.  :func:`fit_fraction` checks the plan's
ratio ``saved bytes / bytes autograd saves`` at sample sizes around the hints
(each symbol and all together scaled from 1/4 to 8 times) and, while the ratio
exceeds the fraction somewhere, re-solves with a cap at the hints below the
plan's bytes, scaled by fraction / ratio.  :func:`fit_region_fractions` does
the same for per-module budgets, region by region: each fractional region's
ratio is its saved bytes over what autograd saves among its values.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

import sympy

from ckpt.partitioner.plan import Plan
from ckpt.partitioner.problem import Problem, RegionCap, region_bytes

__all__ = ["fit_fraction", "fit_region_fractions", "sample_points", "worst_ratio"]

log = logging.getLogger(__name__)

_FACTORS = (0.25, 0.5, 2.0, 4.0, 8.0)
_ROUNDS = 6


def sample_points(hints: dict[Any, int], symbols: set[Any]) -> list[dict[Any, int]]:
    """Size assignments around the hints: all symbols scaled together, and each alone."""
    ordered = sorted(symbols, key=str)
    base = {s: int(hints.get(s, 4096)) for s in ordered}
    points = [base]
    for factor in _FACTORS:
        points.append({s: max(2, round(v * factor)) for s, v in base.items()})
    if len(ordered) > 1:
        for s, factor in itertools.product(ordered, (0.25, 4.0)):
            point = dict(base)
            point[s] = max(2, round(base[s] * factor))
            points.append(point)
    return points


def _total(exprs: Sequence[Any], indices: Sequence[int], point: dict[Any, int]) -> int:
    total = 0
    for i in indices:
        expr = exprs[i]
        total += expr if isinstance(expr, int) else int(sympy.sympify(expr).xreplace(point))
    return total


def worst_ratio(
    saved: Sequence[int],
    baseline: Sequence[int],
    exprs: Sequence[Any],
    points: list[dict[Any, int]],
    extra: int = 0,
    baseline_extra: int = 0,
) -> float:
    """The largest ``bytes(saved) / bytes(baseline)`` over the sample points.

    ``extra`` and ``baseline_extra`` are size-independent bytes each plan keeps
    besides its saved values (RNG states for replayed random ops).
    """
    worst = 0.0
    for point in points:
        denominator = _total(exprs, baseline, point) + baseline_extra
        numerator = _total(exprs, saved, point) + extra
        if denominator > 0:
            worst = max(worst, numerator / denominator)
        elif numerator > 0:
            return float("inf")
    return worst


def fit_fraction(
    plan: Plan,
    fraction: float,
    budget_at_hints: int,
    baseline: Plan,
    exprs: Sequence[Any],
    hints: dict[Any, int],
    resolve: Callable[[int], Plan],
) -> Plan:
    """A plan whose saved/reference ratio stays within ``fraction`` at every sample size.

    ``resolve(cap)`` solves again with a byte cap at the hints.  Gives up after
    a few rounds with the last (leanest) plan tried, and warns with the ratio it reached.
    """
    symbols = _symbols(exprs)
    if not symbols or plan.over_budget:
        return plan
    points = sample_points(hints, symbols)

    def ratio_of(candidate: Plan) -> float:
        return worst_ratio(
            candidate.saved,
            baseline.saved,
            exprs,
            points,
            extra=_constant_bytes(candidate, exprs, hints),
            baseline_extra=_constant_bytes(baseline, exprs, hints),
        )

    cap = budget_at_hints
    for _ in range(_ROUNDS):
        ratio = ratio_of(plan)
        if ratio <= fraction + 1e-12:
            return plan
        # Scale the plan's own bytes, not the cap: a plan far below the cap at the hints can
        # still exceed the fraction at larger sizes, and only a cap below it changes the plan.
        cap = min(cap - 1, int(plan.bytes * fraction / ratio))
        if cap < 0:
            break
        log.debug("plan keeps %.3f of what autograd saves at some size; re-solving with cap %d", ratio, cap)
        plan = resolve(cap)
        if plan.over_budget:
            break
    log.warning(
        "ckpt: under dynamic shapes the plan keeps up to %.3f of what autograd saves at some sizes (budget %g)",
        ratio_of(plan),
        fraction,
    )
    return plan


def _symbols(exprs: Sequence[Any]) -> set[Any]:
    symbols: set[Any] = set()
    for expr in exprs:
        if not isinstance(expr, int):
            symbols |= sympy.sympify(expr).free_symbols
    return symbols


def fit_region_fractions(
    plan: Plan,
    caps: Sequence[RegionCap],
    problem: Problem,
    reference_saved: Collection[int],
    exprs: Sequence[Any],
    hints: dict[Any, int],
    resolve: Callable[[tuple[RegionCap, ...]], Plan],
) -> tuple[Plan, tuple[RegionCap, ...]]:
    """:func:`fit_fraction` for per-module caps: each fractional region keeps its fraction at every size.

    ``resolve(caps)`` solves again under the given caps.  Returns the plan
    and the caps it was solved under (a region's cap at the hints is lowered
    where its ratio exceeded its fraction at some size).
    """
    caps = tuple(caps)
    symbols = _symbols(exprs)
    if not symbols or plan.over_budget or all(cap.fraction is None for cap in caps):
        return plan, caps
    points = sample_points(hints, symbols)

    def ratio(candidate: Plan, cap: RegionCap) -> float:
        saved = [i for i in candidate.saved if i in cap.members]
        baseline = [i for i in reference_saved if i in cap.members]
        used = region_bytes(problem, candidate.saved, candidate.recomputed, cap.members)
        return worst_ratio(saved, baseline, exprs, points, extra=used - _total(exprs, saved, hints))

    for _ in range(_ROUNDS):
        tightened = list(caps)
        for k, cap in enumerate(caps):
            if cap.fraction is None or (r := ratio(plan, cap)) <= cap.fraction + 1e-12:
                continue
            used = region_bytes(problem, plan.saved, plan.recomputed, cap.members)
            log.debug("region %s keeps %.3f of what autograd saves at some size; lowering its cap", cap.label, r)
            tightened[k] = dataclasses.replace(
                cap, max_bytes=max(0, min(cap.max_bytes - 1, int(used * cap.fraction / r)))
            )
        if tightened == list(caps):
            return plan, caps
        caps = tuple(tightened)
        plan = resolve(caps)
        if plan.over_budget:
            break
    worst = [(cap.label, ratio(plan, cap), cap.fraction) for cap in caps if cap.fraction is not None]
    log.warning(
        "ckpt: under dynamic shapes some per-module budgets are exceeded at some sizes: %s",
        ", ".join(f"{label} keeps {r:.3f} (budget {f:g})" for label, r, f in worst if f is not None and r > f),
    )
    return plan, caps


def _constant_bytes(plan: Plan, exprs: Sequence[Any], hints: dict[Any, int]) -> int:
    """The plan's bytes beyond its saved values, which do not depend on sizes."""
    return plan.bytes - _total(exprs, plan.saved, hints)
