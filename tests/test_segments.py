"""Segment boundaries: the frontiers of the forward, and the pins that cut it into equal parts."""

from __future__ import annotations

from ckpt.partitioner.peak import Materialise, PeakGraph, simulate_peak
from ckpt.partitioner.peak_search import budget_peak, cap_peak
from ckpt.partitioner.problem import Problem
from ckpt.partitioner.segments import forward_frontiers, segment_pin_sets, segment_pins
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
    assert cuts.total_bytes == 50
    # after h_k only h_k is read later (x is a graph input, free to keep); h5 is read by no forward value
    assert [sorted(f.values) for f in frontiers] == [[1], [2], [3], [4]]
    assert [f.before for f in frontiers] == [10, 20, 30, 40]
    assert all(f.cost == 10 for f in frontiers)


def test_a_skip_connection_stays_in_the_frontier_until_it_is_read() -> None:
    problem, graph = skip_problem()
    frontiers = {
        problem.names[f.position]: sorted(problem.names[v] for v in f.values)
        for f in forward_frontiers(problem, graph).frontiers
    }
    assert frontiers == {"a": ["a"], "b": ["a", "b"], "c": ["a", "c"]}


def test_segment_pins_cut_at_equal_shares_of_the_forward() -> None:
    problem, graph = chain_problem(9)
    frontiers = forward_frontiers(problem, graph)
    assert segment_pins(frontiers, 1) == frozenset()
    assert segment_pins(frontiers, 3) == frozenset({3, 6})  # 30 and 60 of 90 bytes
    assert segment_pins(frontiers, 2) == frozenset({4})  # 45 bytes: h4 (40) and h5 (50) are as near; h4 is earlier
    sets = segment_pin_sets(problem, graph)
    assert len(sets) == len(set(sets)) and sets[0] == frozenset({4})


def stack_problem(layers: int, boundary: int = 10, inner: int = 40) -> tuple[Problem, PeakGraph]:
    """A stack of blocks ``h_{k-1} -> m_k -> h_k``: a large, costly inner value and a small boundary.

    Like a transformer's MLP hidden state and residual stream: the backward
    reads both, and ``m_k`` costs 100 to recompute against 1 for ``h_k``, so
    the fastest plan under a tight budget saves inner values and recomputes
    the boundaries.  Each layer's backward makes ``gh_k`` (reads ``h_k``),
    ``gm_k`` (reads ``m_k``) and a 1-byte weight gradient ``w_k``.
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
        sizes += [boundary, inner, 1]
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
    assert segment_pins(frontiers, 2) == frozenset({problem.names.index("h2")})


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
