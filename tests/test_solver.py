"""The exact solver against brute force, on tiny named graphs and random ones."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.partitioner import Plan, Problem, ProblemError, evaluate, solve, solve_exhaustive
from ckpt.partitioner.maxflow import INFINITE, FlowNetwork
from ckpt.partitioner.min_cut import CutNetwork
from ckpt.partitioner.plan import make_plan
from ckpt.partitioner.problem import NearbyPlans, recompute_closure


def problem(spec: list[tuple], needed: set[str]) -> Problem:
    """spec rows: (name, inputs, save_bytes, save_time, recompute_time, can_save, can_recompute)."""
    names = [row[0] for row in spec]
    index = {name: i for i, name in enumerate(names)}
    return Problem(
        names=tuple(names),
        inputs=tuple(tuple(index[p] for p in row[1]) for row in spec),
        needed=tuple(name in needed for name in names),
        save_bytes=tuple(row[2] for row in spec),
        save_time=tuple(row[3] for row in spec),
        recompute_time=tuple(row[4] for row in spec),
        can_save=tuple(row[5] for row in spec),
        can_recompute=tuple(row[6] for row in spec),
    )


# x -> a -> b -> c, backward reads a, b and c. a is a cheap pointwise op, b an expensive matmul.
CHAIN = problem(
    [
        ("x", [], 0, 10, 0, True, False),
        ("a", ["x"], 100, 20, 1, True, True),
        ("b", ["a"], 100, 20, 500, True, True),
        ("c", ["b"], 100, 20, 1, True, True),
    ],
    {"a", "b", "c"},
)
# x -> a; a -> b, a -> c; (b, c) -> d. The backward reads b, c and d.
DIAMOND = problem(
    [
        ("x", [], 0, 10, 0, True, False),
        ("a", ["x"], 400, 40, 300, True, True),
        ("b", ["a"], 100, 20, 2, True, True),
        ("c", ["a"], 100, 20, 2, True, True),
        ("d", ["b", "c"], 100, 20, 2, True, True),
    ],
    {"b", "c", "d"},
)
# qkv projection, scores (large), softmax probabilities (large), attention output.
ATTENTION = problem(
    [
        ("x", [], 0, 10, 0, True, False),
        ("w", [], 0, 5, 0, True, False),
        ("qkv", ["x", "w"], 300, 30, 900, True, True),
        ("scores", ["qkv"], 1600, 160, 700, True, True),
        ("probs", ["scores"], 1600, 160, 20, True, True),
        ("out", ["probs", "qkv"], 100, 10, 600, True, True),
    ],
    {"qkv", "probs", "out"},
)
# A dropout mask that cannot be recomputed, and a value that cannot be saved.
RANDOM = problem(
    [
        ("x", [], 0, 10, 0, True, False),
        ("mask", ["x"], 25, 5, 0, True, False),
        ("h", ["x"], 100, 20, 3, False, True),
        ("y", ["h", "mask"], 100, 20, 3, True, True),
    ],
    {"y", "mask", "h"},
)
NAMED = {"chain": CHAIN, "diamond": DIAMOND, "attention": ATTENTION, "random": RANDOM}


# Every solver keeps one contract; each is checked against the brute-force oracle by the same tests.
SOLVERS = {"min-cut": lambda p, budget: solve(p, budget, effort=1000.0), "exhaustive": solve_exhaustive}


def _oracle_agrees(p: Problem, budget: int | None, got: Plan) -> None:
    want = solve_exhaustive(p, budget)
    if want.over_budget:
        assert got.over_budget and got.bytes == got.minimum_bytes == want.minimum_bytes == _minimum_bytes(p)
        assert got.time == want.time  # the least time among the leanest plans
        return
    assert (got.time, got.bytes) == (want.time, want.bytes), budget
    assert got.optimal and not got.over_budget
    assert got.bytes <= (budget if budget is not None else got.bytes)


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_graphs_match_brute_force_across_budgets(name, solver):
    p = NAMED[name]
    for budget in [None, *range(0, p.total_save_bytes + 50, 25)]:
        _oracle_agrees(p, budget, SOLVERS[solver](p, budget))


def test_chain_recomputes_the_cheap_op_and_saves_the_matmul():
    plan = solve(CHAIN, 200, effort=1000.0)
    names = {CHAIN.names[i] for i in plan.saved}
    assert "b" in names and "a" not in names


def _stack_and_loss(layers: int) -> Problem:
    """``layers`` identical values (1000 bytes, 1300 to recompute) and a small one (200 bytes, 300).

    The small one costs more per byte, so every price walk drops layers
    first: a budget 150 bytes below saving everything has the hull (and any
    mix of its plans) recompute a layer, where the best plan recomputes the
    small value alone.
    """
    spec: list[tuple] = [("x", [], 0, 10, 0, True, False)]
    spec += [(f"h{k}", ["x"], 1000, 20, 1300, True, True) for k in range(layers)]
    spec.append(("loss", ["x"], 200, 20, 300, True, True))
    return problem(spec, {name for name, *_ in spec[1:]})


@pytest.mark.parametrize("layers", [12, 18])
def test_a_budget_just_below_a_stack_gives_up_the_small_value_not_a_layer(layers):
    p = _stack_and_loss(layers)
    budget = p.total_save_bytes - 150
    # A search too short to branch on each layer in turn (it then recomputes a layer): the dive finds it.
    plan = solve(p, budget, effort=0.01)
    assert {p.names[i] for i in plan.recomputed} == {"loss"}
    best = solve_exhaustive(p, budget)
    assert (plan.time, plan.bytes) == (best.time, best.bytes)


def test_budget_below_minimum_returns_the_leanest_plan():
    plan = solve(RANDOM, 0, effort=1000.0)
    assert plan.over_budget
    assert plan.minimum_bytes == 25  # only the mask has to stay
    assert {RANDOM.names[i] for i in plan.saved} == {"x", "mask"}


def test_a_plan_keeps_no_saved_value_the_backward_never_reads():
    # Nothing is recomputed when a, b and c are saved, so nothing reads x: the compiled step would not keep it.
    plan = make_plan(CHAIN, {0, 1, 2, 3}, "test", optimal=False)
    assert plan.saved == (1, 2, 3) and plan.time == 60
    plan = make_plan(DIAMOND, {1, 2, 3, 4}, "test", optimal=False)
    assert plan.saved == (2, 3, 4)  # a is read by no recomputed value
    assert (plan.time, plan.bytes) == evaluate(DIAMOND, {2, 3, 4})[:2]
    plan = make_plan(DIAMOND, {1, 4}, "test", optimal=False)
    assert plan.saved == (1, 4) and plan.recomputed == (2, 3)  # b and c recomputed from a


def test_evaluate_rejects_plans_that_break_constraints():
    with pytest.raises(ProblemError, match="cannot be saved"):
        evaluate(RANDOM, [RANDOM.names.index("h")])
    with pytest.raises(ProblemError, match="cannot be recomputed"):
        evaluate(RANDOM, [0])


def test_problem_rejects_inputs_out_of_topological_order():
    with pytest.raises(ProblemError, match="earlier in topological order"):
        problem([("a", ["b"], 1, 1, 1, True, True), ("b", [], 1, 1, 1, True, True)], {"a"})


def test_max_flow_small_network():
    network = FlowNetwork(4)
    for tail, head in [(0, 1), (0, 2), (1, 3), (2, 3), (1, 2)]:
        network.add_edge(tail, head)
    # Two minimum cuts of value 5; the source side returned is the smallest one.
    side = network.min_cut([3, 2, 2, 3, 5], 0, 3)
    assert side == [True, False, False, False]
    side = network.min_cut([3, INFINITE, 2, 3, 5], 0, 3)
    assert side is not None and side[2]
    assert network.min_cut([INFINITE, INFINITE, INFINITE, INFINITE, 0], 0, 3) is None


@settings(max_examples=300, deadline=None)  # an equivalence: worth more examples than the default
@given(
    edges=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 9)), min_size=1, max_size=14),
    shrink=st.lists(st.integers(0, 9), min_size=14, max_size=14),
)
def test_max_flow_from_a_feasible_flow_finds_the_same_cut(edges, shrink):
    """Any maximum flow leaves the same vertices reachable: a start flow never changes the cut."""
    network = FlowNetwork(6)
    for tail, head, _ in edges:
        network.add_edge(tail, head)
    capacities = [c for _, _, c in edges]
    lower = [min(c, s) for c, s in zip(capacities, shrink)]  # a flow for these is feasible for `capacities`
    _, start = network.max_flow(lower, 0, 5)
    cold, flow = network.max_flow(capacities, 0, 5)
    warm, _ = network.max_flow(capacities, 0, 5, start)
    assert cold == warm == network.min_cut(capacities, 0, 5)
    assert all(0 <= f <= c for f, c in zip(flow, capacities))
    # scaled capacities: the same cut, and the start flow scaled with them stays feasible
    scaled, scaled_flow = network.max_flow(capacities, 0, 5, [3 * f for f in start], scale=3)
    assert scaled == cold
    assert all(0 <= f <= 3 * c for f, c in zip(scaled_flow, capacities))


def test_max_flow_rejects_a_scale_below_one():
    network = FlowNetwork(2)
    network.add_edge(0, 1)
    with pytest.raises(ValueError, match="scale=0"):
        network.max_flow([1], 0, 1, scale=0)


@st.composite
def problems(draw, max_values: int = 12):
    n = draw(st.integers(2, max_values))
    inputs, needed, sizes, saves, recomputes, can_save, can_recompute = [], [], [], [], [], [], []
    recompute_bytes = []
    num_inputs = draw(st.integers(1, min(3, n - 1)))
    for i in range(n):
        is_input = i < num_inputs
        preds = () if is_input else tuple(sorted(draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=3))))
        inputs.append(preds)
        needed.append(draw(st.booleans()))
        sizes.append(0 if is_input else draw(st.sampled_from([0, 64, 128, 512, 2048, 8192])))
        saves.append(draw(st.integers(0, 60)))
        recomputes.append(0 if is_input else draw(st.sampled_from([0, 1, 5, 40, 300, 2000])))
        can_save.append(True if is_input else draw(st.booleans() | st.just(True)))
        can_recompute.append(False if is_input else draw(st.booleans() | st.just(True)))
        recompute_bytes.append(0 if is_input else draw(st.sampled_from([0, 0, 0, 96])))
    return Problem(
        names=tuple(f"v{i}" for i in range(n)),
        inputs=tuple(inputs),
        needed=tuple(needed),
        save_bytes=tuple(sizes),
        save_time=tuple(saves),
        recompute_time=tuple(recomputes),
        can_save=tuple(can_save),
        can_recompute=tuple(can_recompute),
        recompute_bytes=tuple(recompute_bytes),
    )


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@given(p=problems(), fraction=st.floats(0.0, 1.0))
def test_random_problems_match_brute_force(solver, p, fraction):
    if not _feasible(p):
        with pytest.raises(ValueError, match="no feasible plan"):
            SOLVERS[solver](p, None)
        return
    budget = int(fraction * p.total_bytes)
    _oracle_agrees(p, budget, SOLVERS[solver](p, budget))


def _feasible(p: Problem) -> bool:
    try:
        solve_exhaustive(p, None)
    except ValueError:
        return False
    return True


def _minimum_bytes(p: Problem) -> int:
    best = None
    candidates = [i for i in range(len(p)) if p.can_save[i]]
    for mask in range(1 << len(candidates)):
        saved = [c for k, c in enumerate(candidates) if mask >> k & 1]
        try:
            _, memory, _ = evaluate(p, saved)
        except ProblemError:
            continue
        best = memory if best is None else min(best, memory)
    assert best is not None
    return best


@given(problems())
def test_smaller_budget_never_saves_more(p):
    if not _feasible(p):
        return
    previous = None
    for fraction in (1.0, 0.75, 0.5, 0.25, 0.1, 0.0):
        plan = solve(p, int(fraction * p.total_save_bytes), effort=1000.0)
        if previous is not None:
            assert plan.bytes <= previous
        previous = plan.bytes


@given(problems())
def test_plans_are_deterministic(p):
    if not _feasible(p):
        return
    budget = p.total_save_bytes // 3
    first, second = solve(p, budget, effort=1000.0), solve(p, budget, effort=1000.0)
    assert first.saved == second.saved and first.fingerprint(p) == second.fingerprint(p)


def test_no_cap_slack_takes_the_leanest_plan_within_it():
    fastest = solve(CHAIN, None)
    # Recomputing a (cost 1) instead of saving it (cost 20) is faster; saving nothing costs more.
    lean = solve(CHAIN, None, slack_ps=10_000)
    assert lean.bytes <= fastest.bytes
    assert lean.time <= fastest.time + 10_000
    assert solve(CHAIN, None, slack_ps=0) == fastest
    everything = solve(CHAIN, None, slack_ps=10**9)
    assert everything.bytes == min(p.bytes for p in [solve(CHAIN, b, effort=1000.0) for b in range(0, 400, 10)])


@given(problems(), st.sampled_from([1, 50, 400]))
def test_slack_keeps_the_budget_and_saved_bytes_monotone(p, slack):
    """With slack, a budget never saves more than a larger one, nor more than no cap (when above it)."""
    if not _feasible(p):
        return
    no_cap = solve(p, None, slack_ps=slack)
    previous = None
    for fraction in (1.0, 0.75, 0.5, 0.25, 0.1, 0.0):
        budget = int(fraction * p.total_save_bytes)
        best = solve(p, budget, effort=1000.0)
        plan = solve(p, budget, effort=1000.0, slack_ps=slack)
        if best.over_budget:
            assert plan.bytes == best.bytes
        else:
            assert plan.bytes <= budget
            assert plan.time <= best.time + slack
        if budget >= no_cap.bytes:
            assert plan.bytes <= no_cap.bytes
        if previous is not None:
            assert plan.bytes <= previous
        previous = plan.bytes


def _plain_saved_set(p: Problem, save_cost, recompute_cost, force, forbid) -> frozenset[int] | None:
    """The saved set from the whole network, as first built: two vertices and three edges per value."""
    n = len(p)
    network, capacities = FlowNetwork(2 + 2 * n), []
    for i in range(n):
        v_in, v_out = 2 + 2 * i, 3 + 2 * i
        network.add_edge(v_in, v_out)
        capacities.append(INFINITE if not p.can_save[i] or i in forbid else save_cost[i])
        network.add_edge(0, v_in)
        capacities.append(INFINITE if not p.can_recompute[i] or i in force else recompute_cost[i])
        network.add_edge(v_out, 1)
        capacities.append(INFINITE if p.needed[i] or i in force else 0)
    for i in range(n):
        for u in p.inputs[i]:
            network.add_edge(3 + 2 * u, 2 + 2 * i)
            capacities.append(INFINITE)
    side = network.min_cut(capacities, 0, 1)
    return None if side is None else frozenset(i for i in range(n) if side[2 + 2 * i] and not side[3 + 2 * i])


def _keys(p: Problem) -> tuple[list[int], list[int]]:
    """Each value's save and recompute key as the solvers price it: time, then bytes."""
    m = p.total_bytes + 1
    return (
        [t * m + b for t, b in zip(p.save_time, p.save_bytes)],
        [t * m + b for t, b in zip(p.recompute_time, p.recompute_bytes)],
    )


@settings(max_examples=300, deadline=None)  # an equivalence: worth more examples than the default
@given(
    p=problems(),
    constraints=st.lists(st.tuples(st.sets(st.integers(0, 11)), st.sets(st.integers(0, 11))), min_size=1, max_size=3),
    prices=st.lists(st.tuples(st.integers(1, 60), st.integers(0, 10**5), st.integers(0, 2)), min_size=1, max_size=12),
)
def test_contracted_warm_started_cuts_match_the_whole_network(p, constraints, prices):
    """Contraction and warm starts from earlier cuts leave every cut as the whole network gives it."""
    network = CutNetwork(p)
    save_key, recompute_key = _keys(p)
    for alpha, beta, which in prices:
        force, forbid = constraints[which % len(constraints)]
        force = frozenset(i for i in force if i < len(p))
        forbid = frozenset(i for i in forbid if i < len(p)) - force
        save_cost = [alpha * k + beta * b for k, b in zip(save_key, p.save_bytes)]
        recompute_cost = [alpha * k + beta * b for k, b in zip(recompute_key, p.recompute_bytes)]
        expected = _plain_saved_set(p, save_cost, recompute_cost, force, forbid)
        got = network.saved_set(save_cost, recompute_cost, force_saved=force, forbid_saved=forbid, price=(alpha, beta))
        assert got == expected


@settings(max_examples=300, deadline=None)  # an equivalence: worth more examples than the default
@given(
    p=problems(),
    caps=st.lists(st.sets(st.integers(0, 11)), min_size=1, max_size=3),
    constraints=st.lists(st.tuples(st.sets(st.integers(0, 11)), st.sets(st.integers(0, 11))), min_size=1, max_size=3),
    prices=st.lists(
        st.tuples(st.integers(1, 4), st.lists(st.integers(0, 8), min_size=3, max_size=3), st.integers(0, 2)),
        min_size=1,
        max_size=12,
    ),
)
def test_cuts_with_a_price_per_cap_match_the_whole_network(p, caps, constraints, prices):
    """Warm starts between cuts priced per cap (per-module budgets) leave every cut as the whole network gives it."""
    network = CutNetwork(p)
    save_key, recompute_key = _keys(p)
    for alpha, betas, which in prices:
        betas = betas[: len(caps)]
        force, forbid = constraints[which % len(constraints)]
        force = frozenset(i for i in force if i < len(p))
        forbid = frozenset(i for i in forbid if i < len(p)) - force
        # Coarse prices, so that later cuts often raise one cap's price and lower another's.
        betas = [beta * 10**4 for beta in betas]
        per_value = [sum(beta for beta, members in zip(betas, caps) if i in members) for i in range(len(p))]
        save_cost = [alpha * k + q * b for k, q, b in zip(save_key, per_value, p.save_bytes)]
        recompute_cost = [alpha * k + q * b for k, q, b in zip(recompute_key, per_value, p.recompute_bytes)]
        expected = _plain_saved_set(p, save_cost, recompute_cost, force, forbid)
        got = network.saved_set(
            save_cost, recompute_cost, force_saved=force, forbid_saved=forbid, price=(alpha, *betas)
        )
        assert got == expected


def test_a_price_of_another_form_is_an_error_naming_it():
    """A price without alpha > 0 and non-negative betas is refused, not cut as if unpriced."""
    p = _stack_and_loss(3)
    network = CutNetwork(p)
    save_key, recompute_key = _keys(p)
    for price in [(), (0, 1), (-1,), (1, -2), (2, 1, -1)]:
        with pytest.raises(ValueError, match=re.escape(f"price={price!r}")):
            network.saved_set(save_key, recompute_key, price=price)
    # Only alpha: every cost is alpha * key, which is the cut with no price at all.
    unpriced = network.saved_set([2 * k for k in save_key], [2 * k for k in recompute_key])
    assert network.saved_set([2 * k for k in save_key], [2 * k for k in recompute_key], price=(2,)) == unpriced


@settings(max_examples=300, deadline=None)  # an equivalence: worth more examples than the default
@given(p=problems(), base=st.sets(st.integers(0, 11)), changes=st.lists(st.sets(st.integers(0, 11)), max_size=6))
def test_nearby_plans_cost_what_evaluate_gives(p, base, changes):
    """Plans near a base set, evaluated by updating its closure: evaluate's numbers, or its error."""
    base = frozenset(i for i in base if i < len(p) and p.can_save[i])
    try:
        evaluate(p, base)
    except ProblemError:
        return
    nearby = NearbyPlans(p, base)
    closure = recompute_closure(p, base)
    for change in changes:
        saved = base.symmetric_difference(i for i in change if i < len(p))
        more, fewer = nearby.recompute_changes(saved)
        assert (closure - fewer) | more == recompute_closure(p, saved)
        try:
            time, memory, _ = evaluate(p, saved)
        except ProblemError as error:
            with pytest.raises(ProblemError, match=re.escape(str(error))):
                nearby.cost(saved)
        else:
            assert nearby.cost(saved) == (time, memory)
    assert nearby.cost(base) == evaluate(p, base)[:2]


@given(p=problems(), pins=st.lists(st.sets(st.integers(0, 11), max_size=3), min_size=1, max_size=4))
def test_a_network_kept_across_solves_changes_no_plan(p, pins):
    """Solves that share a network (and start from each other's flows) plan what lone solves do."""
    if not _feasible(p):
        return
    network = CutNetwork(p)
    for pinned in pins:
        force = frozenset(i for i in pinned if i < len(p) and p.can_save[i])
        for fraction in (None, 0.5, 0.1):
            budget = None if fraction is None else int(fraction * p.total_save_bytes)
            assert _outcome(p, budget, force, network) == _outcome(p, budget, force, None)


def _outcome(p: Problem, budget: int | None, force: frozenset[int], network: CutNetwork | None) -> Plan | str:
    try:
        return solve(p, budget, effort=0.5, slack_ps=40, force_saved=force, network=network)
    except ValueError as error:
        return str(error)


def test_a_network_must_be_the_problems_own():
    with pytest.raises(ValueError, match="network of another problem"):
        solve(CHAIN, None, network=CutNetwork(DIAMOND))
