"""Maximum flow / minimum s-t cut with exact integer capacities (Dinic's algorithm).

Dinic's algorithm suits these networks: they are nearly layered DAGs with
short augmenting paths, so few phases are needed.  Capacities are Python
integers, so cut values are exact and the result is deterministic: edges are
visited in insertion order.

A :class:`FlowNetwork` holds the edge structure only; each :meth:`min_cut`
call takes a fresh list of capacities, so one network serves many prices.
An ``INFINITE`` capacity is replaced by one more than the sum of the finite
capacities, so a cut of that value or more means no finite cut exists.

Two things save phases without changing the answer.  A call may start from
a feasible flow (:meth:`max_flow`'s ``start``, say the flow of a cut at a
lower price), so only what is missing is pushed.  And before the phases, one
depth-first pass saturates paths along edges that go up the vertex numbering
(the priced networks number vertices in topological order, so that is most
of a blocking flow of the whole network, not only of its shortest paths);
the phases then find the paths that need to cancel flow.  Every maximum flow
leaves the same vertices reachable from the source in its residual network
(the source side of the minimum cut with the fewest vertices), so the cut
returned is the same whatever flow the phases start from.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["INFINITE", "FlowNetwork"]

INFINITE = -1  # marker for an uncuttable edge


class FlowNetwork:
    """A directed network over vertices ``0 .. num_vertices - 1``."""

    def __init__(self, num_vertices: int) -> None:
        self.num_vertices = num_vertices
        self._adjacency: list[list[int]] = [[] for _ in range(num_vertices)]
        self._head: list[int] = []
        self._upward: list[list[int]] | None = None  # per vertex: its edges up the numbering, built on first use

    @property
    def num_edges(self) -> int:
        return len(self._head) // 2

    def add_edge(self, tail: int, head: int) -> int:
        """Add ``tail -> head`` and return its index into the capacity list."""
        edge = len(self._head)
        self._adjacency[tail].append(edge)
        self._head.append(head)
        self._adjacency[head].append(edge + 1)
        self._head.append(tail)
        self._upward = None
        return edge // 2

    def min_cut(self, capacities: Sequence[int], source: int, sink: int) -> list[bool] | None:
        """The source side of a minimum cut, or None if every cut is infinite.

        ``capacities[k]`` is the capacity of edge ``k``: an int >= 0 or ``INFINITE``.
        """
        return self.max_flow(capacities, source, sink)[0]

    def max_flow(
        self,
        capacities: Sequence[int],
        source: int,
        sink: int,
        start: Sequence[int] | None = None,
        scale: int = 1,
    ) -> tuple[list[bool] | None, list[int]]:
        """:meth:`min_cut`'s answer, and the flow on each edge of a maximum flow.

        ``start``, if given, is a feasible flow to start from: per edge, at
        most its capacity (any amount on an ``INFINITE`` edge), and conserved
        at every vertex but the source and the sink.  ``scale`` multiplies
        every finite capacity (``start`` is already in scaled units).
        """
        if len(capacities) != self.num_edges:
            raise ValueError(f"capacities has {len(capacities)} entries, expected {self.num_edges}")
        if scale < 1:
            raise ValueError(f"scale={scale!r} must be a positive integer")
        capacities = capacities if isinstance(capacities, list) else list(capacities)
        uncuttable = capacities.count(INFINITE)
        # Any value above the finite capacities' sum tells a finite cut from none; above the
        # start's amounts too, it leaves an uncuttable edge room for the flow it starts with.
        infinity = (sum(capacities) + uncuttable) * scale + 1 + (max(start, default=0) if start is not None else 0)
        cap = [0] * (2 * len(capacities))
        if uncuttable:
            cap[0::2] = [infinity if c == INFINITE else c * scale for c in capacities]
        else:
            cap[0::2] = [c * scale for c in capacities] if scale != 1 else capacities
        flow = 0
        if start is not None:
            if len(start) != len(capacities):
                raise ValueError(f"start has {len(start)} entries, expected {self.num_edges}")
            cap[0::2] = [c - amount for c, amount in zip(cap[0::2], start)]
            cap[1::2] = start
            head = self._head
            flow = sum(cap[e ^ 1] for e in self._adjacency[source] if not e & 1)
            flow -= sum(cap[e] for e in self._adjacency[source] if e & 1 and head[e] != source)
        flow += self._upward_flow(cap, source, sink)
        while flow < infinity:
            level = self._levels(cap, source, sink)
            if level[sink] < 0:
                break
            flow += self._blocking_flow(cap, source, sink, level, self._adjacency)
        if flow >= infinity:
            return None, cap[1::2]
        return self._reachable(cap, source), cap[1::2]

    def _upward_flow(self, cap: list[int], source: int, sink: int) -> int:
        """A blocking flow over the edges that go up the vertex numbering or into the sink.

        Those edges form an acyclic network, so the depth-first search needs
        no levels; a vertex with no way on is dead for the rest of the pass.
        """
        if self._upward is None:
            head = self._head
            self._upward = [
                [e for e in edges if not e & 1 and (head[e] == sink or head[e] > tail)]
                for tail, edges in enumerate(self._adjacency)
            ]
        alive = [0] * self.num_vertices  # the blocking flow's "level" test: every vertex qualifies until dead
        return self._blocking_flow(cap, source, sink, alive, self._upward, step=0)

    def _levels(self, cap: list[int], source: int, sink: int) -> list[int]:
        """BFS levels from the source, up to the sink's level (no shortest path goes further)."""
        head = self._head
        adjacency = self._adjacency
        level = [-1] * self.num_vertices
        level[source] = 0
        queue = [source]
        for u in queue:  # the list grows while it is read: a FIFO queue without popping
            next_level = level[u] + 1
            if level[sink] >= 0 and next_level > level[sink]:
                break
            for edge in adjacency[u]:
                if cap[edge] > 0:
                    v = head[edge]
                    if level[v] < 0:
                        level[v] = next_level
                        queue.append(v)
        return level

    def _blocking_flow(
        self, cap: list[int], source: int, sink: int, level: list[int], adjacency: list[list[int]], step: int = 1
    ) -> int:
        """Saturate paths whose levels rise by ``step`` per edge, along ``adjacency``; the flow pushed.

        A vertex found to be a dead end gets level -1, which no edge leads to.
        """
        head = self._head
        position = [0] * self.num_vertices
        pushed = 0
        path: list[int] = []
        u = source
        while True:
            if u == sink:
                residual = [cap[e] for e in path]
                amount = min(residual)
                cut_at = residual.index(amount)  # the first edge the push saturates
                for edge in path:
                    cap[edge] -= amount
                    cap[edge ^ 1] += amount
                pushed += amount
                del path[cut_at:]
                u = head[path[-1]] if path else source
                continue
            edges = adjacency[u]
            i = position[u]
            want = level[u] + step
            count = len(edges)
            while i < count:
                edge = edges[i]
                if cap[edge] > 0 and level[head[edge]] == want:
                    break
                i += 1
            position[u] = i
            if i < count:
                edge = edges[i]
                path.append(edge)
                u = head[edge]
                continue
            level[u] = -1  # dead end for this phase
            if not path:
                return pushed
            edge = path.pop()
            u = head[edge ^ 1]
            position[u] += 1

    def _reachable(self, cap: list[int], source: int) -> list[bool]:
        seen = [False] * self.num_vertices
        seen[source] = True
        stack = [source]
        head = self._head
        adjacency = self._adjacency
        while stack:
            u = stack.pop()
            for edge in adjacency[u]:
                if cap[edge] > 0:
                    v = head[edge]
                    if not seen[v]:
                        seen[v] = True
                        stack.append(v)
        return seen
