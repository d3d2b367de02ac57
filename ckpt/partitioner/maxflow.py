"""Maximum flow / minimum s-t cut with exact integer capacities (Dinic's algorithm).

Dinic's algorithm suits these networks: they are nearly layered DAGs with
short augmenting paths, so few phases are needed.  Capacities are Python
integers, so cut values are exact and the result is deterministic: edges are
visited in insertion order.

A :class:`FlowNetwork` holds the edge structure only; each :meth:`min_cut`
call takes a fresh list of capacities, so one network serves many prices.
An ``INFINITE`` capacity is replaced by one more than the sum of the finite
capacities, so a cut of that value or more means no finite cut exists.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["INFINITE", "FlowNetwork"]

INFINITE = -1  # marker for an uncuttable edge


class FlowNetwork:
    """A directed network over vertices ``0 .. num_vertices - 1``."""

    def __init__(self, num_vertices: int) -> None:
        self.num_vertices = num_vertices
        self._adjacency: list[list[int]] = [[] for _ in range(num_vertices)]
        self._head: list[int] = []

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
        return edge // 2

    def min_cut(self, capacities: Sequence[int], source: int, sink: int) -> list[bool] | None:
        """The source side of a minimum cut, or None if every cut is infinite.

        ``capacities[k]`` is the capacity of edge ``k``: an int >= 0 or ``INFINITE``.
        """
        if len(capacities) != self.num_edges:
            raise ValueError(f"capacities has {len(capacities)} entries, expected {self.num_edges}")
        finite_total = sum(c for c in capacities if c > 0)
        infinity = finite_total + 1
        cap = [0] * (2 * len(capacities))
        for k, c in enumerate(capacities):
            cap[2 * k] = infinity if c == INFINITE else c
        flow = 0
        while flow < infinity:
            level = self._levels(cap, source, sink)
            if level[sink] < 0:
                break
            flow += self._blocking_flow(cap, source, sink, level)
        if flow >= infinity:
            return None
        return self._reachable(cap, source)

    def _levels(self, cap: list[int], source: int, sink: int) -> list[int]:
        """BFS levels from the source, up to the sink's level (no shortest path goes further)."""
        head = self._head
        adjacency = self._adjacency
        level = [-1] * self.num_vertices
        level[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            if level[sink] >= 0 and level[u] >= level[sink]:
                break
            next_level = level[u] + 1
            for edge in adjacency[u]:
                if cap[edge] > 0:
                    v = head[edge]
                    if level[v] < 0:
                        level[v] = next_level
                        queue.append(v)
        return level

    def _blocking_flow(self, cap: list[int], source: int, sink: int, level: list[int]) -> int:
        head = self._head
        adjacency = self._adjacency
        position = [0] * self.num_vertices
        pushed = 0
        path: list[int] = []
        u = source
        while True:
            if u == sink:
                amount = min(cap[e] for e in path)
                cut_at = -1
                for k, edge in enumerate(path):
                    cap[edge] -= amount
                    cap[edge ^ 1] += amount
                    if cut_at < 0 and cap[edge] == 0:
                        cut_at = k
                pushed += amount
                del path[cut_at:]
                u = head[path[-1]] if path else source
                continue
            edges = adjacency[u]
            i = position[u]
            want = level[u] + 1
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
