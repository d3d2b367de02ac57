"""A fractional budget under symbolic sizes holds at every sampled size, not only at the hints."""

from __future__ import annotations

import sympy

from ckpt.partitioner import Problem, solve
from ckpt.partitioner.plan import make_plan
from ckpt.partitioner.symbolic import fit_fraction, sample_points, worst_ratio

S = sympy.Symbol("s0", positive=True, integer=True)
HINTS = {S: 8}
# x (input) -> a (bytes 64*s, linear in s) -> b (bytes 4*s^2, quadratic); the backward reads both.
EXPRS = (0, 64 * S, 4 * S**2)


def _problem() -> Problem:
    at_hints = tuple(int(sympy.sympify(e).xreplace(HINTS)) for e in EXPRS)
    return Problem(
        names=("x", "a", "b"),
        inputs=((), (0,), (1,)),
        needed=(False, True, True),
        save_bytes=at_hints,
        save_time=(1, 10, 10),
        recompute_time=(0, 1000, 1000),
        can_save=(True, True, True),
        can_recompute=(False, True, True),
    )


def test_sample_points_scale_each_symbol_around_its_hint():
    points = sample_points(HINTS, {S})
    assert {p[S] for p in points} >= {2, 4, 8, 16, 32, 64}


def test_plan_chosen_at_the_hints_is_tightened_until_it_fits_at_every_size():
    problem = _problem()
    baseline = [1, 2]
    fraction = 0.6
    cap = int(fraction * sum(problem.save_bytes[i] for i in baseline))  # 0.6 * (512 + 256) = 460
    plan = solve(problem, cap)
    points = sample_points(HINTS, {S})
    # At the hints it saves b (256 B of 768 B), but b grows as s^2 and dominates at large s.
    assert plan.saved == (0, 2) or 2 in plan.saved
    assert worst_ratio(plan.saved, baseline, EXPRS, points) > fraction
    no_recompute = make_plan(problem, {1, 2}, "no-recompute", optimal=False)
    fitted = fit_fraction(plan, fraction, cap, no_recompute, EXPRS, HINTS, lambda c: solve(problem, c))
    assert worst_ratio(fitted.saved, baseline, EXPRS, points) <= fraction
    assert fitted.bytes <= cap


def test_static_sizes_are_left_alone():
    problem = _problem()
    plan = solve(problem, 400)
    static = tuple(problem.save_bytes)
    no_recompute = make_plan(problem, {1, 2}, "no-recompute", optimal=False)
    assert fit_fraction(plan, 0.5, 400, no_recompute, static, {}, lambda c: solve(problem, c)) is plan
