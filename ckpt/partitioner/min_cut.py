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
The cut's value is exactly the plan's priced cost.  The network is built once
per problem and reused for every price and constraint set.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ckpt.partitioner.maxflow import INFINITE, FlowNetwork
from ckpt.partitioner.problem import Problem

__all__ = ["CutNetwork"]

_SOURCE, _SINK = 0, 1


class CutNetwork:
    """The flow network of one :class:`Problem`, ready for priced cuts."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        n = len(problem)
        network = FlowNetwork(2 + 2 * n)
        # Edge k for value i: 3 * i (save), 3 * i + 1 (recompute), 3 * i + 2 (needed);
        # then the dependency edges, all uncuttable.
        for i in range(n):
            v_in, v_out = 2 + 2 * i, 3 + 2 * i
            network.add_edge(v_in, v_out)
            network.add_edge(_SOURCE, v_in)
            network.add_edge(v_out, _SINK)
        for i in range(n):
            for u in problem.inputs[i]:
                network.add_edge(3 + 2 * u, 2 + 2 * i)
        self._network = network
        self._dependency_edges = network.num_edges - 3 * n

    @property
    def num_edges(self) -> int:
        return self._network.num_edges

    def saved_set(
        self,
        save_cost: Sequence[int],
        recompute_cost: Sequence[int],
        *,
        force_saved: Collection[int] = (),
        forbid_saved: Collection[int] = (),
    ) -> frozenset[int] | None:
        """The saved set of a minimum-cost plan under the given per-value costs.

        ``force_saved`` values must be saved; ``forbid_saved`` values must not be.
        Returns None when no plan satisfies the constraints.
        """
        problem = self.problem
        n = len(problem)
        capacities: list[int] = []
        for i in range(n):
            forced = i in force_saved
            capacities.append(INFINITE if not problem.can_save[i] or i in forbid_saved else save_cost[i])
            capacities.append(INFINITE if not problem.can_recompute[i] or forced else recompute_cost[i])
            capacities.append(INFINITE if problem.needed[i] or forced else 0)
        capacities.extend([INFINITE] * self._dependency_edges)
        reachable = self._network.min_cut(capacities, _SOURCE, _SINK)
        if reachable is None:
            return None
        return frozenset(i for i in range(n) if reachable[2 + 2 * i] and not reachable[3 + 2 * i])
