"""Segment boundaries: the frontiers of the forward, and the pins that cut it into equal or balanced parts."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.partitioner import peak_search
from ckpt.partitioner.peak import Materialise, PeakGraph, simulate_peak
from ckpt.partitioner.peak_search import budget_peak, cap_peak
from ckpt.partitioner.problem import Problem
from ckpt.partitioner.segments import (
    SEGMENT_COUNTS,
    balanced_pins,
    equal_pins,
    forward_frontiers,
    segment_loads,
    segment_pin_sets,
)
from ckpt.partitioner.solver import solve
from tests.test_peak import chain_problem, predicted, solver_for

B, X = Materialise.BUFFER, Materialise.FREE


def skip_problem() -> tuple[Problem, PeakGraph]:
    """``x -> a -> b -> c -> d = c + a``: a skip connection from ``a`` over ``b`` and ``c``.

    The forward values are x (an input), a, b, c, d; the backward reads a, b,
    c and d.  Value 5 is a backward value (it reads d), so it is no frontier.
    """
    names = ("x", "a", "b", "c", "d", "g")
    inputs: tuple[tuple[int, ...], ...] = ((), (0,), (1,), (2,), (3, 1), (4,))
    graph = PeakGraph(
        names=names,
        bytes=(0, 10, 20, 30, 40, 5),
        kinds=(X, B, B, B, B, B),
        inputs=inputs,
        backward=(False,) * 5 + (True,),
        required=(True,) * 5 + (False,),
        outputs=frozenset({4}),
        gradients=frozenset({5}),
        tangents=frozenset(),
        problem_index=tuple(range(6)),
    )
    problem = Problem(
        names=names,
        inputs=inputs,
        needed=(False, True, True, True, True, False),
        save_bytes=(0, 10, 20, 30, 40, 5),
        save_time=(0,) * 6,
        recompute_time=(0, 1, 1, 1, 1, 1),
        can_save=(True,) * 6,
        can_recompute=(False,) + (True,) * 5,
    )
    return problem, graph


def test_a_chain_s_frontiers_are_its_activations() -> None:
    problem, graph = chain_problem(5)
    cuts = forward_frontiers(problem, graph)
    frontiers = cuts.frontiers
    assert cuts.total_held == 50
    # after h_k only h_k is read later (x is a graph input, free to keep); h5 is read by no forward value
    assert [sorted(f.values) for f in frontiers] == [[1], [2], [3], [4]]
    assert [f.held for f in frontiers] == [10, 20, 30, 40]
    assert all(f.cost == 10 for f in frontiers)


def test_a_skip_connection_stays_in_the_frontier_until_it_is_read() -> None:
    problem, graph = skip_problem()
    frontiers = {
        problem.names[f.position]: sorted(problem.names[v] for v in f.values)
        for f in forward_frontiers(problem, graph).frontiers
    }
    assert frontiers == {"a": ["a"], "b": ["a", "b"], "c": ["a", "c"]}


def test_equal_pins_cut_at_equal_shares_of_the_forward() -> None:
    problem, graph = chain_problem(9)
    frontiers = forward_frontiers(problem, graph)
    assert equal_pins(frontiers, 1) == frozenset()
    assert equal_pins(frontiers, 3) == frozenset({3, 6})  # 30 and 60 of 90 bytes
    assert equal_pins(frontiers, 2) == frozenset({4})  # 45 bytes: h4 (40) and h5 (50) are as near; h4 is earlier
    sets = segment_pin_sets(problem, graph)  # the gradients are a tenth of the chain's bytes: equal segments only
    assert len(sets) == len(set(sets)) and sets[0] == frozenset({4})
    assert all(
        balanced_pins(frontiers, k) not in sets
        for k in (2, 3)
        if balanced_pins(frontiers, k) != equal_pins(frontiers, k)
    )


def test_without_gradients_the_balanced_segments_are_equal_but_for_the_cuts_saved_before_them() -> None:
    # Nine layers of 10 bytes: the backward runs the last segment beside every saved cut, so it is
    # shorter by the cuts' bytes.
    problem, graph = chain_problem(9)
    cuts = replace(forward_frontiers(problem, graph), gradients=())
    assert balanced_pins(cuts, 1) == frozenset()
    assert balanced_pins(cuts, 2) == frozenset({5})  # 50 | 40 + the cut's 10
    assert balanced_pins(cuts, 3) == frozenset({4, 7})  # 40 | 30 + 10 | 20 + 20


def stack_problem(layers: int, boundary: int = 10, inner: int = 40, weight: int = 1) -> tuple[Problem, PeakGraph]:
    """A stack of blocks ``h_{k-1} -> m_k -> h_k``: a large, costly inner value and a small boundary.

    Like a transformer's MLP hidden state and residual stream: the backward
    reads both, and ``m_k`` costs 100 to recompute against 1 for ``h_k``, so
    the fastest plan under a tight budget saves inner values and recomputes
    the boundaries.  Each layer's backward makes ``gh_k`` (reads ``h_k``),
    ``gm_k`` (reads ``m_k``) and a weight gradient ``w_k`` of ``weight`` bytes.
    """
    names, sizes, kinds = ["x"], [0], [X]
    inputs: list[tuple[int, ...]] = [()]
    recompute = [0]
    for k in range(1, layers + 1):
        names += [f"m{k}", f"h{k}"]
        sizes += [inner, boundary]
        kinds += [B, B]
        inputs += [(len(names) - 3,), (len(names) - 2,)]
        recompute += [100, 1]
    n = len(names)
    names += ["loss", "tangent"]
    sizes += [1, 1]
    kinds += [B, B]
    inputs += [(n - 1,), ()]
    backward = [False] * (n + 1) + [True]
    gradients = []
    gradient = n + 1  # the tangent
    for k in range(layers, 0, -1):
        m, h = 2 * k - 1, 2 * k
        names += [f"gh{k}", f"gm{k}", f"w{k}"]
        sizes += [boundary, inner, weight]
        kinds += [B, B, B]
        inputs += [(h, gradient), (m, len(names) - 3), (m - 1, len(names) - 2)]
        backward += [True, True, True]
        gradient = len(names) - 2
        gradients.append(len(names) - 1)
    graph = PeakGraph(
        names=tuple(names),
        bytes=tuple(sizes),
        kinds=tuple(kinds),
        inputs=tuple(inputs),
        backward=tuple(backward),
        required=tuple(i <= n for i in range(len(names))),
        outputs=frozenset({n}),
        gradients=frozenset(gradients),
        tangents=frozenset({n + 1}),
        problem_index=tuple(range(n)),
    )
    problem = Problem(
        names=tuple(names[:n]),
        inputs=tuple(inputs[:n]),
        needed=(False,) + (True,) * (n - 1),
        save_bytes=tuple(sizes[:n]),
        save_time=(0,) * n,
        recompute_time=tuple(recompute),
        can_save=(True,) * n,
        can_recompute=(False,) + (True,) * (n - 1),
    )
    return problem, graph


def test_the_stack_s_frontiers_are_its_boundaries() -> None:
    problem, graph = stack_problem(4)
    frontiers = forward_frontiers(problem, graph)
    assert [problem.names[f.position] for f in frontiers.frontiers] == ["m1", "h1", "m2", "h2", "m3", "h3", "m4"]
    assert equal_pins(frontiers, 2) == frozenset({problem.names.index("h2")})


def test_segment_cuts_lower_the_peak_where_one_pin_at_a_time_cannot() -> None:
    # Under a budget of two inner values, the fastest plan saves inner values and recomputes the
    # residual chain: the backward holds the whole stack again.  Pinning one boundary at a time
    # barely helps while the others are missing; several boundaries at once cut it to a segment.
    problem, graph = stack_problem(8)
    solve_pinned = solver_for(problem)
    fastest = predicted(graph, solve(problem, 80))
    result = budget_peak(problem, graph, solve_pinned, 80, slack=0)
    assert result.search.plan.bytes <= 80
    assert not result.raises_peak
    assert result.search.prediction.peak_bytes <= fastest // 2
    capped = cap_peak(problem, graph, solve_pinned, 80, peak_cap=fastest // 2)
    assert capped.within_cap and capped.plan.bytes <= 80
    assert capped.prediction.peak_bytes == simulate_peak(graph, capped.plan.saved, capped.plan.recomputed).peak_bytes


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(2, 9),
    segments=st.integers(2, 5),
    weight=st.integers(0, 12),
    size=st.integers(1, 12),
)
def test_on_a_chain_the_segments_hold_no_more_at_their_largest_than_any_other_cuts(
    layers: int, segments: int, weight: int, size: int
) -> None:
    # Every frontier of a chain costs the same: the greedy cuts are optimal.  Brute force over every
    # set of at most ``segments - 1`` cuts.
    problem, graph = chain_problem(layers, size)
    graph = replace(graph, bytes=tuple(weight if v in graph.gradients else b for v, b in enumerate(graph.bytes)))
    cuts = forward_frontiers(problem, graph)
    pins = balanced_pins(cuts, segments)
    chosen = [f for f in cuts.frontiers if f.values <= pins]
    assert len(chosen) <= segments - 1 and pins == frozenset(v for f in chosen for v in f.values)
    best = min(
        max(segment_loads(cuts, subset))
        for count in range(segments)
        for subset in itertools.combinations(cuts.frontiers, count)
    )
    assert max(segment_loads(cuts, chosen)) == best


def test_a_stack_s_balanced_segments_grow_towards_its_end() -> None:
    problem, graph = stack_problem(16, weight=25)
    cuts = forward_frontiers(problem, graph)
    assert cuts.total_held == 16 * 50 and sum(b for _, b in cuts.gradients) == 16 * 25
    cut = sorted(int(problem.names[v][1:]) for v in balanced_pins(cuts, 4))  # boundary h_k of layer k
    assert all(problem.names[v].startswith("h") for v in balanced_pins(cuts, 4))
    lengths = [b - a for a, b in zip([0, *cut], [*cut, 16])]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    equal = sorted(int(problem.names[v][1:]) for v in equal_pins(cuts, 4))
    assert equal == [4, 8, 12]
    assert balanced_pins(cuts, 4) in segment_pin_sets(problem, graph)  # the gradients are half the held bytes


def test_segments_balanced_against_the_weight_gradients_keep_a_cap_equal_ones_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each layer's weight gradient is half what its backward reads (as on a deep MLP): an early
    # segment is recomputed beside the gradients of every later layer, so equal segments peak
    # in the first one.  Under a budget of two boundaries, balanced segments keep a cap of 520;
    # with equal segments only, the lowest peak the search finds is 540.
    problem, graph = stack_problem(16, weight=25)
    capped = cap_peak(problem, graph, solver_for(problem), 20, peak_cap=520)
    assert capped.within_cap and capped.plan.bytes <= 20
    assert capped.prediction.peak_bytes == simulate_peak(graph, capped.plan.saved, capped.plan.recomputed).peak_bytes

    def equal_only(problem: Problem, graph: PeakGraph) -> tuple[frozenset[int], ...]:
        cuts = forward_frontiers(problem, graph)
        return tuple(dict.fromkeys(p for p in (equal_pins(cuts, k) for k in SEGMENT_COUNTS) if p))

    monkeypatch.setattr(peak_search, "segment_pin_sets", equal_only)
    without = cap_peak(problem, graph, solver_for(problem), 20, peak_cap=520)
    assert not without.within_cap and without.lowest_peak == 540
