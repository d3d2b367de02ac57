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
The cut's value is exactly the plan's priced cost.

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
vertices and edges.  The contraction depends on the forced and forbidden
values only, so it is built once per constraint set and reused for every
price.

**Warm starts.**  The solvers' costs are ``alpha * key + beta * bytes`` per
value; given that price, a cut starts from the flow of an earlier cut under
the same constraints at a price per byte ``beta / alpha`` no higher.  Every
capacity is then at least ``alpha / alpha'`` times what it was, so that flow,
scaled up, is feasible: the cut runs on the capacities times ``alpha'`` from
the earlier flow times ``alpha`` (exact integers, and the same minimum cuts).
The hull walk always cuts at a price above its fast end's, so most of its cuts
start from nearly all of their flow.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ckpt.partitioner.maxflow import INFINITE, FlowNetwork
from ckpt.partitioner.problem import Problem

__all__ = ["CutNetwork"]

_SOURCE, _SINK = 0, 1
_RECOMPUTE, _SAVE, _UNCUTTABLE = 0, 1, 2  # what sets a contracted edge's capacity
_CONTRACTIONS = 16  # constraint sets remembered per problem (a branch and bound visits a handful at a time)
_FLOWS = 8  # flows kept per constraint set for warm starts
# A warm start multiplies the capacities by the earlier flow's scale; past this many bits the
# arithmetic slows more than the warm start saves, and the cut starts from nothing instead.
_MAX_SCALE_BITS = 256


@dataclass(frozen=True)
class _Contraction:
    """The network for one constraint set, fixed vertices merged into the source and the sink.

    ``vertex_in[i]`` and ``vertex_out[i]`` are the contracted vertices of
    ``in_i`` and ``out_i`` (``_SOURCE`` or ``_SINK`` when fixed); edge ``k`` of
    ``network`` costs recomputing or saving ``edge_value[k]``, or is uncuttable,
    as ``edge_kind[k]`` says.
    """

    network: FlowNetwork
    vertex_in: list[int]
    vertex_out: list[int]
    edge_kind: list[int]
    edge_value: list[int]
    flows: list[_Flow] = field(default_factory=list)  # recent maximum flows, oldest first


@dataclass(frozen=True)
class _Flow:
    """A maximum flow of the contracted network for capacities ``scale * (alpha * key + beta * bytes)``."""

    alpha: int
    beta: int
    scale: int
    amounts: list[int]


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
        self._contractions: dict[tuple[frozenset[int], frozenset[int]], _Contraction | None] = {}

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
        price: tuple[int, int] | None = None,
    ) -> frozenset[int] | None:
        """The saved set of a minimum-cost plan under the given per-value costs.

        ``force_saved`` values must be saved; ``forbid_saved`` values must not be.
        Returns None when no plan satisfies the constraints.  ``price``:
        ``(alpha, beta)`` with ``alpha > 0`` and ``beta >= 0`` when every cost is
        ``alpha * key + beta * bytes`` for keys and bytes >= 0 that are the same
        in every call that gives a price; the cut may then start from an
        earlier one's flow (same answer, less work).
        """
        contraction = self._contraction(frozenset(force_saved), frozenset(forbid_saved))
        if contraction is None:
            return None
        capacities = [
            recompute_cost[i] if kind == _RECOMPUTE else save_cost[i] if kind == _SAVE else INFINITE
            for kind, i in zip(contraction.edge_kind, contraction.edge_value)
        ]
        if price is None or price[0] <= 0 or price[1] < 0:
            reachable, _ = contraction.network.max_flow(capacities, _SOURCE, _SINK)
        else:
            reachable = self._warm_cut(contraction, capacities, *price)
        assert reachable is not None  # the source's own edges are finite: a finite cut exists
        vertex_in, vertex_out = contraction.vertex_in, contraction.vertex_out
        return frozenset(i for i in range(len(vertex_in)) if reachable[vertex_in[i]] and not reachable[vertex_out[i]])

    @staticmethod
    def _warm_cut(contraction: _Contraction, capacities: list[int], alpha: int, beta: int) -> list[bool] | None:
        """The cut at price ``(alpha, beta)``, from the kept flow at the highest price per byte not above it."""
        base: _Flow | None = None
        for flow in contraction.flows:
            if flow.beta * alpha <= beta * flow.alpha and flow.scale.bit_length() <= _MAX_SCALE_BITS:
                if base is None or flow.beta * base.alpha > base.beta * flow.alpha:
                    base = flow
        if base is None:
            reachable, amounts = contraction.network.max_flow(capacities, _SOURCE, _SINK)
            scale = 1
        else:
            # capacity >= alpha / (scale * base.alpha) * base's flow, edge by edge: scale both to integers.
            grow, scale = alpha, base.scale * base.alpha
            common = math.gcd(grow, scale)
            grow, scale = grow // common, scale // common
            scaled = [c if c == INFINITE else c * scale for c in capacities]
            start = [grow * amount for amount in base.amounts]
            reachable, amounts = contraction.network.max_flow(scaled, _SOURCE, _SINK, start)
        contraction.flows.append(_Flow(alpha, beta, scale, amounts))
        if len(contraction.flows) > _FLOWS:
            del contraction.flows[0]
        return reachable

    def _contraction(self, force: frozenset[int], forbid: frozenset[int]) -> _Contraction | None:
        key = (force, forbid)
        if key in self._contractions:
            contraction = self._contractions.pop(key)
        else:
            contraction = self._contract(force, forbid)
            if len(self._contractions) >= _CONTRACTIONS:
                del self._contractions[next(iter(self._contractions))]
        self._contractions[key] = contraction  # most recently used last
        return contraction

    def _fixed_sides(
        self, force: frozenset[int], forbid: frozenset[int]
    ) -> tuple[bytearray, bytearray, bytearray] | None:
        """Vertices (``in_i`` at ``2 * i``, ``out_i`` at ``2 * i + 1``) on the source side, on the sink side.

        Also whether each value's save edge is uncuttable.  None if some vertex
        is on both: every cut is then infinite.
        """
        problem = self.problem
        n = len(problem)
        uncuttable_save = bytearray(not problem.can_save[i] or i in forbid for i in range(n))
        source_side = bytearray(2 * n)
        stack = [2 * i for i in range(n) if not problem.can_recompute[i] or i in force]
        while stack:
            v = stack.pop()
            if source_side[v]:
                continue
            source_side[v] = 1
            i = v >> 1
            if v & 1:
                stack.extend(2 * r for r in self._readers[i])
            elif uncuttable_save[i]:
                stack.append(v + 1)
        sink_side = bytearray(2 * n)
        stack = [2 * i + 1 for i in range(n) if problem.needed[i] or i in force]
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
            elif uncuttable_save[i]:
                stack.append(v - 1)
        return source_side, sink_side, uncuttable_save

    def _contract(self, force: frozenset[int], forbid: frozenset[int]) -> _Contraction | None:
        sides = self._fixed_sides(force, forbid)
        if sides is None:
            return None
        source_side, sink_side, uncuttable_save = sides
        problem = self.problem
        n = len(problem)
        vertex = [_SOURCE if source_side[v] else _SINK if sink_side[v] else -1 for v in range(2 * n)]
        free = 2
        for v in range(2 * n):
            if vertex[v] < 0:
                vertex[v] = free
                free += 1
        network = FlowNetwork(free)
        edge_kind: list[int] = []
        edge_value: list[int] = []

        def add(tail: int, head: int, kind: int, i: int) -> None:
            # Edges out of the sink, into the source, or within a fixed side carry no flow in a maximum
            # flow; one from the source to the sink is cut whatever the rest does.
            if tail != head and tail != _SINK and head != _SOURCE and (tail, head) != (_SOURCE, _SINK):
                network.add_edge(tail, head)
                edge_kind.append(kind)
                edge_value.append(i)

        for i in range(n):
            v_in, v_out = vertex[2 * i], vertex[2 * i + 1]
            if problem.can_recompute[i] and i not in force:
                add(_SOURCE, v_in, _RECOMPUTE, i)
            add(v_in, v_out, _UNCUTTABLE if uncuttable_save[i] else _SAVE, i)
        for i in range(n):
            for u in problem.inputs[i]:
                add(vertex[2 * u + 1], vertex[2 * i], _UNCUTTABLE, i)
        return _Contraction(network, vertex[0::2], vertex[1::2], edge_kind, edge_value)
