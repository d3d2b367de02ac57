"""One priced save-or-recompute decision as an s-t minimum cut.

With a price on memory, choosing what to save is a project-selection problem.
Each value ``i`` becomes two vertices, ``in_i`` and ``out_i``:

* ``in_i -> out_i`` costs saving ``i`` (its time plus the price of its bytes);
  it is uncuttable if ``i`` cannot be saved;
* ``source -> in_i`` costs recomputing ``i``; uncuttable if it cannot be
  recomputed;
* ``out_u -> in_i`` is uncuttable for each input ``u`` of ``i``: recomputing
  ``i`` needs ``u`` in the backward;
* ``out_i -> sink`` is uncuttable if the backward reads ``i``.

In a minimum cut, ``in_i`` on the sink side means "recompute ``i``", and
``in_i`` on the source side with ``out_i`` on the sink side means "save ``i``".
The cut's value is exactly the plan's priced cost.  A value forced saved gets
uncuttable recompute and sink edges, one forbidden an uncuttable save edge.

**Contraction.**  Uncuttable edges fix many vertices' sides before any price
is known: whatever an uncuttable edge leaves from the source side is on the
source side too (``in_i`` of a value that cannot be recomputed, and what it
must make available), and whatever reaches the sink side by one is on the
sink side (``out_i`` of a value the backward reads, and what it needs).  Those
vertices are merged into the source and the sink, and edges that can carry
no flow are dropped (into the source, out of the sink, the zero-capacity
edges of values the backward does not read).  The cuts of the smaller network
are the finite cuts of the full one with the fixed vertices on their sides,
so its minimum cut with the smallest source side is the full network's,
vertex for vertex; on the benchmark transformers it has about a third fewer
vertices and edges.  It is built once, from the problem alone; forcing and
forbidding make edges uncuttable (a forced value gets its sink edge when
first forced), or contradict a fixed side, which leaves no plan.

**Warm starts.**  The solvers' costs are ``alpha * key + beta * bytes`` per
value, or with one price per cap, ``alpha * key + sum(beta_c * bytes_c)``
(``bytes_c``: the value's bytes where it counts towards cap ``c``, else 0);
given that price, a cut starts from the flow of an earlier cut at prices per
byte ``beta_c / alpha`` no higher, each of them, under constraints it
includes (the branch and bound's parent, the peak walk's previous pins).
Every capacity is then at least ``alpha / alpha'`` times what it was, so that
flow, scaled up, is feasible: the cut runs on the capacities times
``alpha'`` from the earlier flow times ``alpha`` (exact integers, and the
same minimum cuts).  The hull
walk always cuts at a price above its fast end's, so most cuts start from
nearly all of their flow.  A network can serve several solves of one problem
(:func:`ckpt.partitioner.solver.solve`'s ``network``), and then also answers a
cut it has made before from memory.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ckpt.partitioner.maxflow import INFINITE, FlowNetwork
from ckpt.partitioner.problem import Problem

__all__ = ["CutNetwork"]

_SOURCE, _SINK = 0, 1
# What sets a contracted edge's capacity: its offset in a cut's table of costs is kind * n + value
# for the first two, 2 * n + kind - 2 for the others (a forced value's sink edge: 0 until forced).
_RECOMPUTE, _SAVE, _NEEDED, _UNCUTTABLE = 0, 1, 2, 3
_FLOWS = 64  # flows kept for warm starts
_ANSWERS = 1024  # priced cuts remembered
# A warm start multiplies the capacities by the earlier flow's scale; past this many bits the
# arithmetic slows more than the warm start saves, and the cut starts from nothing instead.
_MAX_SCALE_BITS = 256


@dataclass(frozen=True)
class _Contraction:
    """The network with fixed vertices merged into the source and the sink.

    ``vertex_in[i]`` and ``vertex_out[i]`` are the contracted vertices of
    ``in_i`` and ``out_i`` (``_SOURCE`` or ``_SINK`` when fixed); edge ``k`` of
    ``network`` has capacity ``costs[edge_cost[k]]`` in the table ``costs``
    of a cut: the recompute costs of the ``n`` values, their save costs, 0
    (an edge that leads a value to the sink, until it is forced) and
    ``INFINITE``.
    ``recompute_edge``, ``save_edge`` and ``sink_edge`` index each value's
    edges (-1 where dropped; ``sink_edge`` grows as values are forced).
    """

    network: FlowNetwork
    vertex_in: list[int]
    vertex_out: list[int]
    edge_cost: list[int]
    recompute_edge: list[int]
    save_edge: list[int]
    sink_edge: dict[int, int]


@dataclass(frozen=True)
class _Flow:
    """A maximum flow for capacities ``scale * (alpha * key + sum(beta_c * bytes_c))`` under the constraints."""

    alpha: int
    betas: tuple[int, ...]
    force: frozenset[int]
    forbid: frozenset[int]
    scale: int
    amounts: list[int]  # per edge, as many as the network had then (later edges carry none)


class CutNetwork:
    """The flow network of one :class:`Problem`, ready for priced cuts."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        n = len(problem)
        self._readers: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for u in problem.inputs[i]:
                self._readers[u].append(i)
        # Three edges per value and one per dependency: the size of the uncontracted network,
        # which is the unit the solvers count their work in.
        self._num_edges = 3 * n + sum(len(preds) for preds in problem.inputs)
        self._contraction: _Contraction | None = None
        self._contracted = False
        self._flows: list[_Flow] = []  # oldest first
        self._answers: dict[tuple[tuple[int, ...], frozenset[int], frozenset[int]], frozenset[int] | None] = {}

    @property
    def num_edges(self) -> int:
        return self._num_edges

    def saved_set(
        self,
        save_cost: Sequence[int],
        recompute_cost: Sequence[int],
        *,
        force_saved: Collection[int] = (),
        forbid_saved: Collection[int] = (),
        price: tuple[int, ...] | None = None,
    ) -> frozenset[int] | None:
        """The saved set of a minimum-cost plan under the given per-value costs.

        ``force_saved`` values must be saved; ``forbid_saved`` values must not be.
        Returns None when no plan satisfies the constraints.  ``price``:
        ``(alpha, beta)`` with ``alpha > 0`` and ``beta >= 0`` when every cost is
        ``alpha * key + beta * bytes``, or ``(alpha, beta_1, ..., beta_k)`` when it is
        ``alpha * key + sum(beta_c * bytes_c)``, for keys and bytes >= 0 that are the same
        in every call that gives a price; the cut may then start from an
        earlier one's flow, or be an earlier one's answer (same answer, less work).
        A price of any other form is a ``ValueError``.
        """
        force, forbid = frozenset(force_saved), frozenset(forbid_saved)
        if price is None:
            return self._cut(save_cost, recompute_cost, force, forbid, None)
        if not price or price[0] <= 0 or any(beta < 0 for beta in price[1:]):
            raise ValueError(
                f"price={price!r}: expected (alpha, beta_1, ..., beta_k) with alpha > 0 and every beta >= 0, or None"
            )
        key = (price, force, forbid)
        if key not in self._answers:
            if len(self._answers) >= _ANSWERS:
                del self._answers[next(iter(self._answers))]
            self._answers[key] = self._cut(save_cost, recompute_cost, force, forbid, price)
        return self._answers[key]

    def _cut(
        self,
        save_cost: Sequence[int],
        recompute_cost: Sequence[int],
        force: frozenset[int],
        forbid: frozenset[int],
        price: tuple[int, ...] | None,
    ) -> frozenset[int] | None:
        contraction = self._contract()
        if contraction is None or _contradicts(contraction, force, forbid):
            return None
        for i in force:
            if i not in contraction.sink_edge and contraction.vertex_out[i] != _SINK:
                contraction.sink_edge[i] = contraction.network.add_edge(contraction.vertex_out[i], _SINK)
                contraction.edge_cost.append(2 * len(contraction.vertex_in))  # the table's 0
        costs = [*recompute_cost, *save_cost, 0, INFINITE]
        capacities = list(map(costs.__getitem__, contraction.edge_cost))
        for i in force:
            for edge in (contraction.recompute_edge[i], contraction.sink_edge.get(i, -1)):
                if edge >= 0:
                    capacities[edge] = INFINITE
        for i in forbid:
            if contraction.save_edge[i] >= 0:
                capacities[contraction.save_edge[i]] = INFINITE
        if price is None:
            reachable, _ = contraction.network.max_flow(capacities, _SOURCE, _SINK)
        else:
            reachable = self._warm_cut(contraction, capacities, price, force, forbid)
        if reachable is None:
            return None
        vertex_in, vertex_out = contraction.vertex_in, contraction.vertex_out
        return frozenset(i for i in range(len(vertex_in)) if reachable[vertex_in[i]] and not reachable[vertex_out[i]])

    def _warm_cut(
        self,
        contraction: _Contraction,
        capacities: list[int],
        price: tuple[int, ...],
        force: frozenset[int],
        forbid: frozenset[int],
    ) -> list[bool] | None:
        """The cut from the kept flow under the most of these constraints, then at the highest prices not above."""
        alpha, betas = price[0], price[1:]
        base: _Flow | None = None
        for flow in self._flows:
            usable = (
                len(flow.betas) == len(betas)
                and flow.force <= force
                and flow.forbid <= forbid
                and all(old * alpha <= new * flow.alpha for old, new in zip(flow.betas, betas))
            )
            if usable and flow.scale.bit_length() <= _MAX_SCALE_BITS and (base is None or _closer(flow, base)):
                base = flow
        if base is None:
            reachable, amounts = contraction.network.max_flow(capacities, _SOURCE, _SINK)
            scale = 1
        else:
            # capacity >= alpha / (scale * base.alpha) * base's flow, edge by edge: scale both to integers.
            grow, scale = alpha, base.scale * base.alpha
            common = math.gcd(grow, scale)
            grow, scale = grow // common, scale // common
            start = [grow * amount for amount in base.amounts] if grow != 1 else list(base.amounts)
            start += [0] * (len(capacities) - len(start))
            reachable, amounts = contraction.network.max_flow(capacities, _SOURCE, _SINK, start, scale)
        if reachable is not None:
            self._flows.append(_Flow(alpha, betas, force, forbid, scale, amounts))
            if len(self._flows) > _FLOWS:
                # Every solve starts at price 0, and only a flow at price 0 can start that cut: those go last.
                priced = [k for k, flow in enumerate(self._flows) if any(flow.betas)]
                del self._flows[priced[0] if priced else 0]
        return reachable

    def _contract(self) -> _Contraction | None:
        """The contracted network, built on first use (None if the problem alone leaves every cut infinite)."""
        if not self._contracted:
            self._contracted = True
            sides = self._fixed_sides()
            self._contraction = None if sides is None else self._build(*sides)
        return self._contraction

    def _fixed_sides(self) -> tuple[bytearray, bytearray] | None:
        """Vertices (``in_i`` at ``2 * i``, ``out_i`` at ``2 * i + 1``) on the source side, on the sink side.

        None if some vertex is on both: every cut is then infinite.
        """
        problem = self.problem
        n = len(problem)
        source_side = bytearray(2 * n)
        stack = [2 * i for i in range(n) if not problem.can_recompute[i]]
        while stack:
            v = stack.pop()
            if source_side[v]:
                continue
            source_side[v] = 1
            i = v >> 1
            if v & 1:
                stack.extend(2 * r for r in self._readers[i])
            elif not problem.can_save[i]:
                stack.append(v + 1)
        sink_side = bytearray(2 * n)
        stack = [2 * i + 1 for i in range(n) if problem.needed[i]]
        while stack:
            v = stack.pop()
            if sink_side[v]:
                continue
            if source_side[v]:
                return None
            sink_side[v] = 1
            i = v >> 1
            if not v & 1:
                stack.extend(2 * u + 1 for u in problem.inputs[i])
            elif not problem.can_save[i]:
                stack.append(v - 1)
        return source_side, sink_side

    def _build(self, source_side: bytearray, sink_side: bytearray) -> _Contraction:
        problem = self.problem
        n = len(problem)
        vertex = [_SOURCE if source_side[v] else _SINK if sink_side[v] else -1 for v in range(2 * n)]
        free = 2
        for v in range(2 * n):
            if vertex[v] < 0:
                vertex[v] = free
                free += 1
        network = FlowNetwork(free)
        edge_cost: list[int] = []

        def add(tail: int, head: int, kind: int, i: int) -> int:
            # Edges out of the sink, into the source, or within a fixed side carry no flow in a maximum
            # flow; one from the source to the sink is cut whatever the rest does.
            if tail == head or tail == _SINK or head == _SOURCE or (tail, head) == (_SOURCE, _SINK):
                return -1
            edge_cost.append(kind * n + i if kind <= _SAVE else 2 * n + kind - _NEEDED)
            return network.add_edge(tail, head)

        recompute_edge, save_edge = [-1] * n, [-1] * n
        for i in range(n):
            v_in, v_out = vertex[2 * i], vertex[2 * i + 1]
            if problem.can_recompute[i]:
                recompute_edge[i] = add(_SOURCE, v_in, _RECOMPUTE, i)
            save_edge[i] = add(v_in, v_out, _SAVE if problem.can_save[i] else _UNCUTTABLE, i)
        for i in range(n):
            for u in problem.inputs[i]:
                add(vertex[2 * u + 1], vertex[2 * i], _UNCUTTABLE, i)
        return _Contraction(network, vertex[0::2], vertex[1::2], edge_cost, recompute_edge, save_edge, {})


def _contradicts(contraction: _Contraction, force: frozenset[int], forbid: frozenset[int]) -> bool:
    """Whether a constraint makes an edge between the fixed sides uncuttable: no plan then."""
    vertex_in, vertex_out = contraction.vertex_in, contraction.vertex_out
    if any(vertex_in[i] == _SINK or vertex_out[i] == _SOURCE for i in force):
        return True
    return any(vertex_in[i] == _SOURCE and vertex_out[i] == _SINK for i in forbid)


def _closer(flow: _Flow, other: _Flow) -> bool:
    """Whether ``flow`` is a better start than ``other``: more constraints in common, then a higher summed price."""
    constraints, others = len(flow.force) + len(flow.forbid), len(other.force) + len(other.forbid)
    if constraints != others:
        return constraints > others
    return sum(flow.betas) * other.alpha > sum(other.betas) * flow.alpha
