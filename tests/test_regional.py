"""The per-region solver against brute force, and its contract."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.partitioner import Problem, evaluate, solve, solve_exhaustive
from ckpt.partitioner.problem import RegionCap, region_bytes
from ckpt.partitioner.regional import _RegionCutter, solve_regions
from tests.test_solver import _feasible, problem, problems


def _usage(p: Problem, saved, cap: RegionCap) -> int:
    _, _, recomputed = evaluate(p, saved)
    return region_bytes(p, tuple(saved), tuple(recomputed), cap.members)


@st.composite
def capped_problems(draw):
    p = draw(problems(max_values=11))
    num_regions = draw(st.integers(1, 3))
    region_of = [draw(st.integers(0, num_regions - 1)) for _ in range(len(p))]
    caps = []
    for r in range(num_regions):
        members = frozenset(i for i in range(len(p)) if region_of[i] == r)
        total = sum(p.save_bytes[i] + p.recompute_bytes[i] for i in members)
        fraction = draw(st.floats(0.0, 1.0))
        caps.append(RegionCap(f"r{r}", members, int(fraction * total)))
    return p, caps


@settings(max_examples=150, deadline=None)
@given(capped_problems())
def test_random_region_caps_match_brute_force(case):
    p, caps = case
    if not _feasible(p):
        return
    got = solve_regions(p, caps, effort=50.0)
    oracle = solve_exhaustive(p, None, caps)
    kept = all(_usage(p, oracle.saved, cap) <= cap.max_bytes for cap in caps)
    if not kept:  # no plan keeps every cap: the answer says which it exceeds
        assert got.over_budget and got.over_regions
        return
    assert not got.over_budget
    for cap in caps:
        assert _usage(p, got.saved, cap) <= cap.max_bytes, cap.label
    assert got.optimal, "the search finished, so it must prove its plan optimal"
    assert got.time == oracle.time
    assert got.lower_bound is not None and got.lower_bound <= oracle.time


def test_one_cap_over_everything_is_the_budget_problem():
    p = problem(
        [
            ("x", (), 0, 0, 0, True, False),
            ("a", ("x",), 512, 5, 40, True, True),
            ("b", ("a",), 512, 5, 300, True, True),
            ("c", ("b",), 512, 5, 40, True, True),
        ],
        needed={"a", "b", "c"},
    )
    everything = frozenset(range(len(p)))
    for budget in (0, 512, 1024, 1536):
        regional = solve_regions(p, [RegionCap("all", everything, budget)])
        single = solve(p, budget)
        assert (regional.time, regional.bytes) == (single.time, single.bytes)


def test_each_region_keeps_its_own_cap_where_one_budget_would_not():
    # Two identical chains; one region may keep everything, the other nothing.
    p = problem(
        [
            ("x", (), 0, 0, 0, True, False),
            ("a1", ("x",), 1000, 5, 300, True, True),
            ("a2", ("a1",), 1000, 5, 300, True, True),
            ("b1", ("x",), 1000, 5, 300, True, True),
            ("b2", ("b1",), 1000, 5, 300, True, True),
        ],
        needed={"a1", "a2", "b1", "b2"},
    )
    names = p.names
    region_a = frozenset(i for i, n in enumerate(names) if n.startswith("a"))
    region_b = frozenset(i for i, n in enumerate(names) if n.startswith("b"))
    plan = solve_regions(p, [RegionCap("a", region_a, 2000), RegionCap("b", region_b, 0)])
    saved = {names[i] for i in plan.saved}
    assert {"a1", "a2"} <= saved and not saved & {"b1", "b2"}
    assert plan.optimal and not plan.over_budget
    # The same total as one budget would save the two costliest-to-recompute values anywhere.
    assert solve(p, 2000).bytes == 2000


def test_a_cap_no_plan_keeps_is_named():
    # `a` cannot be recomputed, and the backward reads it: it is saved whatever the cap.
    p = problem([("x", (), 0, 0, 0, True, False), ("a", ("x",), 1000, 5, 300, True, False)], needed={"a"})
    plan = solve_regions(p, [RegionCap("mlp", frozenset({1}), 10)])
    assert plan.over_budget and plan.over_regions == ("mlp",)


def test_a_region_s_fraction_is_fitted_at_every_size_under_dynamic_shapes():
    import sympy

    from ckpt.partitioner.symbolic import fit_region_fractions

    # `scores` grows with s*s, `h` with s; at the hint s=3 saving the costly scores keeps half of
    # what autograd saves (36 of 132 bytes), at s=24 three quarters.
    s = sympy.Symbol("s", positive=True, integer=True)
    exprs = [0, 4 * s * s, 32 * s]
    hints = {s: 3}
    p = problem(
        [
            ("x", (), 0, 0, 0, True, False),
            ("scores", ("x",), 36, 5, 900, True, True),
            ("h", ("x",), 96, 5, 40, True, True),
        ],
        needed={"scores", "h"},
    )
    members = frozenset({1, 2})
    cap = RegionCap("attn", members, 66, "0.5", 132, 0.5)
    reference = frozenset({1, 2})

    def resolve(caps):
        return solve_regions(p, caps)

    first = resolve((cap,))
    assert [p.names[i] for i in first.saved] == ["x", "scores"]
    plan, caps = fit_region_fractions(first, (cap,), p, reference, exprs, hints, resolve)
    assert caps[0].max_bytes < 36 and "scores" not in {p.names[i] for i in plan.saved}
    # Without symbols nothing changes.
    same, kept = fit_region_fractions(first, (cap,), p, reference, [0, 36, 96], hints, resolve)
    assert same == first and kept == (cap,)


def _normed_stack(blocks: int, widths: tuple[int, ...] = ()) -> tuple[Problem, list[RegionCap]]:
    """A stack of normalised blocks, each under a cap that holds its matmul output and one statistic.

    Block k (``widths[k]`` times as wide, 1 by default): a matmul ``m`` (1000 bytes, 1300 to recompute), its statistics
    ``mean`` and ``rstd`` (20 bytes each) from one reduction that cannot be
    saved (100 to recompute), and the normalised output (1000 bytes, 5). The
    best plan keeps each matmul output and recomputes the statistics; no
    price does that (any price that drops 40 bytes for 100 drops 1000 bytes
    for 1300), so the prices alone recompute every matmul but one.
    """
    spec: list[tuple] = [("x0", [], 0, 10, 0, True, False)]
    members: list[set[str]] = []
    width = widths or (1,) * blocks
    for k in range(blocks):
        w = width[k]
        rows = [
            (f"m{k}", [f"x{k}"], 1000 * w, 20 * w, 1300 * w, True, True),
            (f"v{k}", [f"m{k}"], 0, 0, 100 * w, False, True),
            (f"mean{k}", [f"v{k}"], 20 * w, w, 0, True, True),
            (f"rstd{k}", [f"v{k}"], 20 * w, w, 0, True, True),
            (f"x{k + 1}", [f"m{k}", f"mean{k}", f"rstd{k}"], 1000 * w, 20 * w, 5 * w, True, True),
        ]
        spec += rows
        members.append({row[0] for row in rows})
    names = [row[0] for row in spec]
    p = problem(spec, {name for name in names[1:] if not name.startswith("v")})
    caps = [
        RegionCap(f"block{k}", frozenset(names.index(n) for n in m), 1020 * width[k]) for k, m in enumerate(members)
    ]
    return p, caps


def test_a_stack_of_capped_blocks_keeps_every_matmul_output():
    # A search too short to branch on each block in turn: the dive forces the blocks' matmul outputs together.
    p, caps = _normed_stack(3)
    plan = solve_regions(p, caps, effort=0.01)
    best = solve_exhaustive(p, None, caps)
    assert (plan.time, plan.bytes) == (best.time, best.bytes)
    p, caps = _normed_stack(8)
    plan = solve_regions(p, caps)
    assert not plan.over_regions
    assert not {p.names[i] for i in plan.recomputed} & {f"m{k}" for k in range(8)}


def test_capped_blocks_of_different_widths_keep_every_matmul_output():
    # No twins: the dive forces one block's matmul output at a time, the costliest first.
    p, caps = _normed_stack(3, widths=(1, 2, 3))
    plan = solve_regions(p, caps, effort=0.01)
    best = solve_exhaustive(p, None, caps)
    assert (plan.time, plan.bytes) == (best.time, best.bytes)
    assert not {p.names[i] for i in plan.recomputed} & {"m0", "m1", "m2"}


def _attention_stack(blocks: int) -> tuple[Problem, list[RegionCap], frozenset[int]]:
    """A stack whose query projections ``q{k}`` (1000 bytes, with their weight ``w{k}``) are capped at 0 bytes.

    Block k: a norm ``n{k}`` of ``x{k}``, the projection, a rotation ``r{k}``,
    attention ``a{k}`` (500 to recompute), a projection ``h{k}`` (300) and the
    residual ``x{k+1}``; everything else is under one cap of 3000 bytes per
    block. Returns the problem, the caps and the projections.
    """
    spec: list[tuple] = [("x0", [], 0, 10, 0, True, False)]
    for k in range(blocks):
        spec += [
            (f"w{k}", [], 0, 0, 0, True, False),
            (f"n{k}", [f"x{k}"], 1000, 20, 30, True, True),
            (f"q{k}", [f"n{k}", f"w{k}"], 1000, 20, 300, True, True),
            (f"r{k}", [f"q{k}"], 1000, 20, 10, True, True),
            (f"a{k}", [f"r{k}", f"n{k}"], 1000, 20, 500, True, True),
            (f"h{k}", [f"a{k}"], 1000, 20, 300, True, True),
            (f"x{k + 1}", [f"h{k}", f"x{k}"], 1000, 20, 5, True, True),
        ]
    names = [row[0] for row in spec]
    p = problem(spec, {name for name in names[1:] if not name.startswith("w")})
    blocks_q = [frozenset({names.index(f"q{k}"), names.index(f"w{k}")}) for k in range(blocks)]
    rest = frozenset(range(len(names))) - frozenset().union(*blocks_q)
    caps = [RegionCap(f"block{k}.q", m, 0) for k, m in enumerate(blocks_q)]
    caps.append(RegionCap("(rest of the graph)", rest, 3000 * blocks))
    return p, caps, frozenset(names.index(f"q{k}") for k in range(blocks))


def test_values_larger_than_their_cap_are_left_out_before_the_prices():
    # A short search that had to find each projection's price missed the best plan (2280 against 2260);
    # values larger than their cap are ruled out first, and one price is left to find.
    p, caps, projections = _attention_stack(6)
    plan = solve_regions(p, caps, effort=0.05)
    best = solve(p, caps[-1].max_bytes, forbid_saved=projections)  # no plan that keeps the caps saves one
    assert best.optimal and not plan.over_regions
    assert plan.time == best.time
    assert projections <= frozenset(plan.recomputed)


def test_a_cap_no_plan_keeps_is_held_to_its_least_and_the_others_kept():
    # A seed (8 bytes, cannot be recomputed) under a cap of 0: no plan keeps it. The rest's cap still holds.
    p = problem(
        [
            ("x", (), 0, 0, 0, True, False),
            ("seed", (), 8, 1, 0, True, False),
            ("a", ("x", "seed"), 100, 5, 40, True, True),
            ("b", ("a",), 100, 5, 300, True, True),
            ("c", ("b",), 100, 5, 40, True, True),
        ],
        {"seed", "a", "b", "c"},
    )
    index = {name: i for i, name in enumerate(p.names)}
    caps = [
        RegionCap("seeds", frozenset({index["seed"]}), 0),
        RegionCap("(rest of the graph)", frozenset({index[n] for n in ("x", "a", "b", "c")}), 100),
    ]
    plan = solve_regions(p, caps)
    assert plan.over_regions == ("seeds",)
    assert _usage(p, plan.saved, caps[0]) == 8  # the least any plan keeps there
    assert _usage(p, plan.saved, caps[1]) <= 100
    assert {p.names[i] for i in plan.saved} >= {"seed", "b"}  # b, the costly one, is the one kept


def test_raising_the_exceeded_caps_prices_reaches_a_plan_that_keeps_them_near_the_optimum():
    # The step after a price search that keeps no cap set at once: from the plan without prices, the
    # exceeded caps' prices rise until every cap holds, well before the plan that recomputes everything.
    p, caps, projections = _attention_stack(4)
    cutter = _RegionCutter(p, caps)
    free = cutter.cut([Fraction(0)] * len(caps), frozenset(), frozenset())
    assert free is not None and not cutter.keeps(free)
    found = cutter.escalate(free, None, frozenset(), frozenset(), work_limit=float("inf"))
    leanest = cutter.cut([cutter.big] * len(caps), frozenset(), frozenset())
    best = solve(p, caps[-1].max_bytes, forbid_saved=projections)
    assert found is not None and cutter.keeps(found)
    assert best.time <= found.time < leanest.time
    assert found.time <= 1.1 * best.time
