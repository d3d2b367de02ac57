"""The peak simulator's orders and allocations, on flat per-graph tables.

:mod:`ckpt.partitioner.peak` says what a plan's simulation replays; this
module computes each phase's execution order and which of its values
allocate, the expensive part of every simulation.  The peak search simulates
dozens of plans of one graph (16 candidate pins per step), so everything that
depends on the graph alone is built once into a :class:`GraphIndex`: kind
codes, reader lists, the forward that every plan computes, the backward's own
values.  A phase is then a few linear passes over lists and bytearrays
indexed by value, instead of sets and dicts built afresh.  Every function here
gives exactly what the straightforward set-based replay gives (the peak
module's docstring is the specification); only the bookkeeping differs.

The forward's order depends on the plan only through the saved values it
does not compute anyway, which few plans have, so its orders are memoised by
those values.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["BUFFER", "FREE", "FUSIBLE", "RANDOM", "REDUCTION", "GraphIndex", "PhaseOrder"]

# Kind codes, one per ``Materialise`` member (the peak module maps them).
BUFFER, REDUCTION, FUSIBLE, RANDOM, FREE = range(5)

# Inductor realises a pointwise value that several kernels read when its inlined body loads
# more than realize_reads_threshold (4) buffers or has more than realize_opcount_threshold (30)
# ops; otherwise each consumer recomputes it inline.
_REALIZE_READS = 4
_REALIZE_OPS = 30

# How a pointwise value or a reduction reads an input (``GraphIndex._reads_of``).
_READ_ALWAYS, _READ_INLINED, _READ_RANDOM = range(3)

# Forward orders kept per graph: one per set of extra forward values, and few plans have any.
_FORWARD_MEMO = 32


@dataclass(frozen=True)
class PhaseOrder:
    """One phase's values in execution order, and what allocates whatever the plan keeps.

    ``position[v]`` is ``v``'s place in ``order``, -1 outside the phase;
    ``buffers`` flags the values that allocate before kept and shared values
    are added; ``shared`` lists, in order, the values that allocate only when
    two kernels read them: random draws, and the pointwise values Inductor
    realises for several readers (a realised value that one fused kernel
    reads stays inside it).
    """

    order: tuple[int, ...]
    position: list[int]
    buffers: bytearray
    shared: tuple[int, ...]
    # Pointwise values run in one kernel with their siblings: each one's position -> its kernel's last,
    kernel_end: dict[int, int] = dataclasses.field(default_factory=dict)
    # and each one -> the inputs that no other value of its kernel reads (it may write in place of one).
    sole_inputs: dict[int, frozenset[int]] = dataclasses.field(default_factory=dict)
    # A value whose kernel loads a realised value of its size that only it reads -> the reads it loads
    # up to that one: the inputs it may write in place of (``GraphIndex._in_place_reads``).
    in_place_reads: dict[int, frozenset[int]] = dataclasses.field(default_factory=dict)


class GraphIndex:
    """The plan-independent tables of one peak graph, built once and reused by every simulation."""

    def __init__(
        self,
        inputs: Sequence[tuple[int, ...]],
        kinds: Sequence[int],
        nbytes: Sequence[int],
        backward: Sequence[bool],
        required: Sequence[bool],
        outputs: Iterable[int],
        tangents: Iterable[int],
        heavy_ops: Iterable[int] = (),
        row_reductions: Iterable[int] = (),
    ) -> None:
        n = len(inputs)
        self.n = n
        self.row_reduction = bytearray(n)  # reductions over the trailing dimensions (PeakGraph.row_reductions)
        for i in row_reductions:
            self.row_reduction[i] = 1
        self.heavy_ops = bytearray(n)  # pointwise ops Inductor counts as heavy on the CPU
        for i in heavy_ops:
            self.heavy_ops[i] = 1
        self.inputs = inputs
        self.kinds = kinds
        self.nbytes = nbytes
        self.backward = backward
        self.inlined = bytearray(k == FUSIBLE or k == RANDOM for k in kinds)
        self.is_reduction = bytearray(k == REDUCTION for k in kinds)
        # Inputs by kind, for the passes that only follow pointwise values.
        self.inlined_inputs = [tuple(p for p in preds if self.inlined[p]) for preds in inputs]
        self.is_fusible = bytearray(k == FUSIBLE for k in kinds)
        # For each pointwise value, the library calls that read it (siblings are looked for among these).
        library_readers: list[tuple[int, ...]] = [() for _ in range(n)]
        for i, preds in enumerate(inputs):
            if kinds[i] == BUFFER:
                for p in preds:
                    if kinds[p] == FUSIBLE:
                        library_readers[p] += (i,)
        self.library_readers = library_readers
        # Inductor's own kernels, and the random draws inlined into them
        self.reads_buffers = bytearray(k == FUSIBLE or k == REDUCTION or k == RANDOM for k in kinds)
        # What a pointwise value or a reduction reads: buffers and parameters always, a pointwise or
        # random input through its own reads when it is inlined (in the phase and not realised).
        self._reads_of = [
            tuple(
                (p, _READ_INLINED if kinds[p] == FUSIBLE else _READ_RANDOM if kinds[p] == RANDOM else _READ_ALWAYS)
                for p in preds
                if kinds[p] != FREE or nbytes[p] > 0
            )
            if self.reads_buffers[i]
            else ()
            for i, preds in enumerate(inputs)
        ]
        self.allocating_inputs = [
            tuple(p for p in preds if kinds[p] != FREE) for preds in inputs
        ]  # FREE never allocates
        readers: list[list[int]] = [[] for _ in range(n)]
        for i, preds in enumerate(inputs):
            for p in preds:
                readers[p].append(i)
        self.readers = readers
        tangent_set = frozenset(tangents)
        self.reads_tangent = bytearray(any(p in tangent_set for p in preds) for preds in inputs)
        # The forward every plan computes: ancestors of what it must produce.
        seeds = [i for i in range(n) if required[i] and not backward[i]]
        self.forward_base = self._ancestors(bytearray(n), seeds + [i for i in outputs if not backward[i]])
        self.forward_base_order = tuple(i for i in range(n) if self.forward_base[i])
        self._forward_memo: dict[frozenset[int], PhaseOrder] = {}
        # The backward's own values: every plan's backward runs them.
        self.backward_base = bytearray(backward[i] and i not in tangent_set for i in range(n))
        self.backward_base_order = tuple(i for i in range(n) if self.backward_base[i])
        self.backward_first_reader = next((i for i in self.backward_base_order if self.reads_tangent[i]), n)

    def _ancestors(self, keep: bytearray, stack: list[int]) -> bytearray:
        """Mark the forward ancestors of ``stack`` in ``keep`` (backward values stop the walk)."""
        backward, inputs = self.backward, self.inputs
        while stack:
            i = stack.pop()
            if keep[i] or backward[i]:
                continue
            keep[i] = 1
            stack.extend(inputs[i])
        return keep

    def forward(self, saved: Iterable[int]) -> PhaseOrder:
        """The forward's fused order: ancestors of what it must produce or save."""
        base, backward = self.forward_base, self.backward
        extra = [i for i in saved if not base[i] and not backward[i]]
        if not extra:
            key: frozenset[int] = frozenset()
        else:
            keep = self._ancestors(bytearray(base), extra)
            key = frozenset(i for i in range(self.n) if keep[i] and not base[i])
        memo = self._forward_memo
        phase = memo.pop(key, None)
        if phase is None:
            if key:
                order = [i for i in range(self.n) if base[i] or i in key]
            else:
                order = list(self.forward_base_order)
            phase = self.phase(order)
            if len(memo) >= _FORWARD_MEMO:
                del memo[next(iter(memo))]
        memo[key] = phase  # most recently used last
        return phase

    def backward_order(self, recomputed: Iterable[int]) -> list[int]:
        """The backward's values in the order torch's ``reordering_to_mimic_autograd_engine`` gives.

        From the first value that reads a tangent on, each value in graph
        order brings in its inputs that are not there yet (recomputed values
        and backward values before it) and their own, in graph order.
        """
        member = bytearray(self.backward_base)
        extra = [i for i in recomputed if not member[i]]
        first = self.backward_first_reader
        for i in extra:
            member[i] = 1
            if self.reads_tangent[i] and i < first:
                first = i
        if first == self.n:
            return [i for i in range(self.n) if member[i]]
        inputs = self.inputs
        anchors = self.backward_base_order[self._base_from(first) :]
        later = [i for i in extra if i >= first]
        if later:
            anchors = tuple(sorted(later + list(anchors)))
        placed = bytearray(self.n)
        order: list[int] = []
        for i in anchors:
            if placed[i]:
                continue
            placed[i] = 1
            for p in inputs[i]:
                if member[p] and not placed[p]:
                    break
            else:  # most values bring nothing in: their inputs are placed or not in the backward
                order.append(i)
                continue
            needed = [i]
            stack = list(inputs[i])
            while stack:
                value = stack.pop()
                if member[value] and not placed[value]:
                    placed[value] = 1
                    needed.append(value)
                    stack.extend(inputs[value])
            needed.sort()
            order.extend(needed)
        return order

    def _base_from(self, first: int) -> int:
        """Where the backward's own values from ``first`` on start in ``backward_base_order``."""
        order = self.backward_base_order
        low, high = 0, len(order)
        while low < high:
            mid = (low + high) // 2
            if order[mid] < first:
                low = mid + 1
            else:
                high = mid
        return low

    def backward_phase(self, recomputed: Iterable[int]) -> PhaseOrder:
        """The backward's phase when ``recomputed`` are recomputed."""
        return self.phase(self.backward_order(recomputed))

    def phase(self, order: list[int]) -> PhaseOrder:
        """The phase that runs ``order`` (in graph dependency order): fused, with its plan-independent buffers."""
        position = self._positions(order)
        realised, reads = self._reads(order, position)
        joined = self._join_sibling_reductions(order, position, reads)
        if joined is not order:
            position = self._positions(joined)
        fused = self._fuse_into_consumers(joined, position, realised)
        position = self._positions(fused)
        together, groups = self._join_sibling_pointwise(fused, position, realised, reads)
        kernel_end: dict[int, int] = {}
        sole_inputs: dict[int, frozenset[int]] = {}
        if together is not fused:
            fused = together
            position = self._positions(fused)
            ends: dict[int, int] = {}
            readers_in: dict[tuple[int, int], int] = {}  # (kernel, input) -> how many of its values read it
            kernel_reads = {v: self._kernel_reads(v, groups, position, realised) for v in groups}
            for v, group in groups.items():
                ends[group] = max(ends.get(group, -1), position[v])
                for b in kernel_reads[v]:
                    readers_in[group, b] = readers_in.get((group, b), 0) + 1
            kernel_end = {position[v]: ends[group] for v, group in groups.items()}
            sole_inputs = {
                v: frozenset(b for b in kernel_reads[v] if readers_in[group, b] == 1) for v, group in groups.items()
            }
        kinds = self.kinds
        shared = tuple(v for v in fused if kinds[v] == RANDOM or realised[v])
        materialised = self._materialised(fused, position, realised)
        in_place_reads = self._in_place_reads(fused, position, realised, reads, groups, sole_inputs) if shared else {}
        return PhaseOrder(tuple(fused), position, materialised, shared, kernel_end, sole_inputs, in_place_reads)

    def _in_place_reads(
        self,
        order: Sequence[int],
        position: list[int],
        realised: bytearray,
        reads: dict[int, set[int]],
        groups: dict[int, int],
        sole_inputs: dict[int, frozenset[int]],
    ) -> dict[int, frozenset[int]]:
        """For each value that loads a realised value of its size read by no other kernel: its reads up to it.

        Inductor writes a kernel's output in place of the first of its reads,
        in the order the kernel loads them (its operands' order, depth first
        through inlined values), that dies there with the output's size
        (``SchedulerNode.decide_inplace_update``).  A realised value that only
        this kernel reads qualifies, and it is read before its own inputs, which
        its node (an ancestor) has already loaded: in SwiGLU's backward the
        gradient takes the recomputed sigmoid's storage, not the gate
        projection's.  Such a value allocates for the output and Inductor
        does not remove it, so the output takes no earlier buffer's storage;
        only reads loaded before it can give theirs.
        """
        kinds, nbytes = self.kinds, self.nbytes
        result: dict[int, frozenset[int]] = {}
        for v in order:
            kind = kinds[v]
            if (kind != FUSIBLE and kind != REDUCTION) or realised[v] or not nbytes[v]:
                continue
            found = sole_inputs[v] if v in groups else reads.get(v, ())
            if not any(realised[r] and nbytes[r] == nbytes[v] and r != v for r in found):
                continue
            loads = self._load_order(v, groups, position, realised)
            for k, r in enumerate(loads):
                if (
                    r != v
                    and realised[r]
                    and nbytes[r] == nbytes[v]
                    and (v not in groups or r in sole_inputs[v])
                    and self._only_kernel(r, v, position, realised)
                ):
                    result[v] = frozenset(loads[: k + 1])
                    break
        return result

    def _load_order(self, v: int, joined: dict[int, int], position: list[int], realised: bytearray) -> list[int]:
        """What ``v``'s kernel reads (``joined`` values as themselves), in the order it loads them.

        Operands first to last, depth first through inlined values; each read once.
        """
        reads_of = self._reads_of
        loads: dict[int, None] = {}
        visited = {v}
        stack = [iter(reads_of[v])]
        while stack:
            for p, code in stack[-1]:
                if p in joined or code == _READ_ALWAYS or position[p] < 0 or realised[p]:
                    loads.setdefault(p)
                elif code == _READ_INLINED and p not in visited:
                    visited.add(p)
                    stack.append(iter(reads_of[p]))
                    break
            else:
                stack.pop()
        return list(loads)

    def _only_kernel(self, r: int, v: int, position: list[int], realised: bytearray) -> bool:
        """Whether ``v``'s kernel is the only one that reads ``r``: every reader is ``v`` or inlined into it."""
        kinds, readers = self.kinds, self.readers
        stack = [x for x in readers[r] if position[x] >= 0]
        seen: set[int] = set()
        while stack:
            x = stack.pop()
            if x == v or x in seen:
                continue
            seen.add(x)
            if kinds[x] != FUSIBLE or realised[x]:
                return False
            later = [y for y in readers[x] if position[y] >= 0]
            if not later:
                return False
            stack.extend(later)
        return True

    def _positions(self, order: Sequence[int]) -> list[int]:
        position = [-1] * self.n
        for k, v in enumerate(order):
            position[v] = k
        return position

    def _reads(self, order: Sequence[int], position: list[int]) -> tuple[bytearray, dict[int, set[int]]]:
        """The pointwise values Inductor realises because several values read them, and what each kernel reads.

        A value's reads are the buffers and parameters its kernel loads: its
        inputs that are buffers (or come from the other phase, or are
        parameters), and the reads of the pointwise inputs inlined into it.
        Inductor inlines a pointwise value into each of its readers, unless
        more than one value of the graph reads it and it would read more than
        ``realize_reads_threshold`` buffers, or (on the CPU) it computes a
        heavy op (exp, log, sigmoid, tanh: ``heavy_ops``) inline: then it is
        realised, and its readers read it instead.  The residual stream of a recomputed stack is
        realised every few layers so.  Whether a realised value allocates
        depends on the kernels that read it (see ``PhaseOrder.shared``).
        ``reads`` holds the reads of the phase's pointwise values and
        reductions.  ``order`` is in dependency order.
        """
        readers, reads_of = self.readers, self._reads_of
        realised = bytearray(self.n)
        heavy = bytearray(self.heavy_ops)  # computes a heavy op inline
        reads: dict[int, set[int]] = {}  # never changed once made
        for i in itertools.compress(order, map(self.reads_buffers.__getitem__, order)):
            found: set[int] = set()
            for p, code in reads_of[i]:
                if code == _READ_ALWAYS or position[p] < 0 or realised[p]:
                    found.add(p)
                elif code == _READ_INLINED:
                    found.update(reads[p])
                    if heavy[p]:
                        heavy[i] = 1
                else:  # an inlined random draw loads its seed from the seeds buffer
                    found.update(reads[p])
            if (len(found) > _REALIZE_READS or heavy[i]) and self.is_fusible[i]:
                users = 0
                for r in readers[i]:
                    if position[r] >= 0:
                        users += 1
                if users > 1:
                    realised[i] = 1
                    found = {i}
            reads[i] = found
        return realised, reads

    def _sources(self, reads: set[int]) -> list[int]:
        """The largest buffers among a reduction's ``reads``, parameters left out.

        Only the largest count: small operands (scalars, statistics) are shared
        by unrelated kernels.
        """
        nbytes, kinds = self.nbytes, self.kinds
        largest = max((nbytes[v] for v in reads if kinds[v] != FREE), default=0)
        return [v for v in reads if kinds[v] != FREE and nbytes[v] == largest] if largest > 0 else []

    def _join_sibling_reductions(self, order: list[int], position: list[int], reads: dict[int, set[int]]) -> list[int]:
        """Move each reduction to its last sibling (a reduction that reads one of its largest buffers).

        Inductor fuses reductions that read a common buffer into one kernel,
        so the earlier ones wait for the later ones' inputs: in a recomputed
        stack the norms' weight gradients of the layers that read one realised
        residual are summed in one kernel, and their inputs live until then.
        A reduction never moves past a value that reads it.  ``position`` is
        ``order``'s; ``order`` itself comes back if nothing moves.
        """
        readers = self.readers
        reductions = list(itertools.compress(range(len(order)), map(self.is_reduction.__getitem__, order)))
        sources = [self._sources(reads[order[k]]) for k in reductions]
        last_reader: dict[int, int] = {}  # source -> position of the last reduction over it
        for k, found in zip(reductions, sources):
            for s in found:
                last_reader[s] = k  # positions rise, so the last write is the latest
        moved: dict[int, list[int]] = {}  # target position -> reductions moved there, in order
        stays = bytearray(b"\x01") * len(order)
        for k, found in zip(reductions, sources):
            last = max([last_reader[s] for s in found], default=k)
            if last <= k:
                continue
            first_reader = min([position[r] for r in readers[order[k]] if position[r] >= 0], default=len(order))
            target = min(last, first_reader - 1)
            if target > k:
                moved.setdefault(target, []).append(order[k])
                stays[k] = 0
        if not moved:
            return order
        result: list[int] = []
        done = 0
        for target in sorted(moved):  # the values before each target that stay, then what moves there
            result.extend(itertools.compress(order[done:target], stays[done:target]))
            result.extend(moved[target])
            done = target
        result.extend(itertools.compress(order[done:], stays[done:]))
        return result

    def _join_sibling_pointwise(
        self, order: list[int], position: list[int], realised: bytearray, reads: dict[int, set[int]]
    ) -> tuple[list[int], dict[int, int]]:
        """Run each pointwise value that a library call reads with its last sibling, and delay its readers.

        Inductor fuses pointwise kernels that read a common buffer, even where
        a library call reads the earlier one before the later one's inputs
        exist: the fused kernel runs at the later one's place, and what reads
        the earlier one waits for it.  (Run on the fused order, where each
        pointwise value sits just before its first reader: the moved values
        follow their last sibling there, and the values that wait for them
        follow those.)  In a recomputed MLP's backward the
        activation that the down projection's weight gradient reads is
        computed with the gradients of the gate and up projections, so the
        gate, the up projection, the incoming gradient and all three outputs
        are alive at once.  A value's siblings are those that read one of its
        largest buffers (``_sources``) and that a library call reads too;
        the values that depend on a moved one, up to its new place, move after
        it in their order, behind the moved values (the kernel writes all its
        outputs before their readers run).  The kernel's inputs live until its
        last output is written, and an output is written in place of an input
        only if no other value of the kernel reads that input (see ``phase``).
        A sibling that depends on the value through row reductions joins it
        in one row kernel, with the values on the way and the later sums
        that kernel also computes (``_kernel_path``, ``_row_kernel_sums``):
        they all run at the kernel's last value's place, and what else
        depends on them waits.
        Returns
        the order (``order`` itself if nothing moves; ``position`` is its)
        and each joined value's kernel, named by the position in ``order`` of
        the sibling the others join.
        """
        inputs, library_readers = self.inputs, self.library_readers
        candidates = [
            k for k, v in enumerate(order) if library_readers[v] and any(position[r] >= 0 for r in library_readers[v])
        ]
        if len(candidates) < 2:
            return order, {}
        sources = {k: self._sources(self._sibling_reads(order[k], position, realised, reads)) for k in candidates}
        last: dict[int, int] = {}  # source -> position of the last candidate that reads it
        for k in candidates:
            for b in sources[k]:
                last[b] = k
        joined: dict[int, int] = {}  # value -> its kernel, named by the position of the sibling it joins
        moves: dict[int, int] = {}  # value -> the position it moves to: joined values, and a row kernel's others
        for k in candidates:
            t = max([last[b] for b in sources[k]], default=k)
            if t <= k:
                continue
            path = self._kernel_path(order[k], t, order, position)
            if path is None:
                continue
            joined[order[k]] = t
            moves[order[k]] = t
            between, descendants = path
            if between:  # one row kernel: it runs at its last value's place, with all it computes on the way
                kernel = [*between, order[t]]
                shared = sources[k] + sources[t]
                later, inline = self._row_kernel_sums(order[k], kernel, descendants, shared, position, realised)
                end = max([t, *(position[c] for c in later)])
                moves.update((p, end) for p in itertools.chain(kernel, later, inline))
                moves[order[k]] = end
        if not joined:
            return order, {}
        joined.update([(order[t], t) for t in joined.values()])
        # Only what depends on a moved value can wait: walk its readers in order, up to where it goes.
        readers = self.readers
        anchor: dict[int, int] = {}  # moved and waiting values -> the position they follow
        pending = [(k, order[k]) for k in sorted(position[v] for v in moves)]
        heapq.heapify(pending)
        seen: set[int] = set()
        while pending:
            k, v = heapq.heappop(pending)
            if v in seen:
                continue
            seen.add(v)
            a = -1
            for p in inputs[v]:
                known = anchor.get(p, -1)
                if known > a:
                    a = known
            t = moves.get(v, -1)
            if t >= a and t >= k:  # (a row kernel's last value moves to its own place, behind the others)
                anchor[v] = t
            elif a >= k:  # (a sibling that depends on a moved value follows it)
                anchor[v] = a
            else:
                continue
            until = anchor[v]
            for r in readers[v]:
                where = position[r]
                if k < where <= until and r not in seen:
                    heapq.heappush(pending, (where, r))
        # What follows a position: the moved values first (their kernel writes them together), then the
        # values that wait for them, each group in its own order, and never before a value it reads there
        # (a moved value may read one that waits).
        follows: dict[int, list[int]] = {}
        for v, after_position in anchor.items():
            follows.setdefault(after_position, []).append(position[v])
        result: list[int] = []
        for k, v in enumerate(order):
            if v not in anchor:
                result.append(v)
            after = follows.get(k)
            if after is not None:
                result.extend(self._members_first([order[j] for j in sorted(after)], moves))
        return result, joined

    def _sibling_reads(self, v: int, position: list[int], realised: bytearray, reads: dict[int, set[int]]) -> set[int]:
        """What ``v``'s kernel reads, for finding its siblings: its reads, and those of the realised values it reads.

        A realised value is its readers' only read, and its own kernel reads
        what it is computed from.  Inductor fuses a pointwise value into the
        kernel of a realised pointwise value it reads (of the same size), so
        that kernel's reads are its reads too: in a norm's backward the
        dropout gradient that the projection's gradients read runs in the
        kernel that accumulates the residual's gradient, with the recomputed
        norm output the weight gradient reads, and both are written together.
        """
        own = self._kernel_reads(v, {}, position, realised) if realised[v] else reads[v]
        found = set(own)
        nbytes = self.nbytes
        for p in own:
            if p != v and realised[p] and nbytes[p] == nbytes[v]:
                found |= self._kernel_reads(p, {}, position, realised)
        return found

    def _members_first(self, values: list[int], members: dict[int, int]) -> list[int]:
        """``values`` (in order) with ``members`` first, each value after those of ``values`` it reads."""
        if all(v in members for v in values) or not any(v in members for v in values):
            return values
        inputs = self.inputs
        rank = {v: (v not in members, k) for k, v in enumerate(values)}
        waiting = {v: sum(1 for p in set(inputs[v]) if p in rank) for v in values}
        readers: dict[int, list[int]] = {}
        for v in values:
            for p in set(inputs[v]):
                if p in rank:
                    readers.setdefault(p, []).append(v)
        ready = [(rank[v], v) for v in values if not waiting[v]]
        heapq.heapify(ready)
        ordered: list[int] = []
        while ready:
            _, v = heapq.heappop(ready)
            ordered.append(v)
            for r in readers.get(v, ()):
                waiting[r] -= 1
                if not waiting[r]:
                    heapq.heappush(ready, (rank[r], r))
        return ordered

    def _kernel_path(self, v: int, t: int, order: list[int], position: list[int]) -> tuple[list[int], set[int]] | None:
        """Whether ``v`` may run in one kernel with its sibling at position ``t`` (after it), and what joins them.

        Returns ``([], ...)`` if the sibling does not depend on ``v``: ``v``
        waits for it.  Inductor fuses two kernels only if neither depends on
        the other through a third kernel (the fused kernel would wait for
        itself): a residual add in the forward and the dropout gradient of the
        same mask in the backward share their largest buffer, but the
        gradient depends on the add through the whole head, which must not
        wait (``None``).
        A sibling of ``v``'s size that depends on it through reductions over
        the rows (``row_reduction``) and pointwise values only is computed in
        ``v``'s kernel, row by row: in a recomputed norm's backward the kernel
        that recomputes the norm's output (and the ReLU after it) for the
        weight gradient also computes the input's gradient through the norm's
        backward sums, before the weight gradient runs.  Then the values on
        the way come back, in order, with what depends on ``v`` before the
        sibling.
        """
        readers, kinds = self.readers, self.kinds
        target = order[t]
        stack = [v]
        seen = {v}
        depends = False
        while stack:  # what depends on v up to the sibling, and whether the sibling does
            for r in readers[stack.pop()]:
                if r == target:
                    depends = True
                    continue
                where = position[r]
                if 0 <= where < t and r not in seen:
                    seen.add(r)
                    stack.append(r)
        if not depends:
            return [], seen
        if self.nbytes[v] != self.nbytes[target]:
            return None
        inputs = self.inputs
        between: set[int] = set()
        stack = [target]
        while stack:  # the values that depend on v and that the sibling depends on
            for p in inputs[stack.pop()]:
                if p in seen and p != v and p not in between:
                    between.add(p)
                    stack.append(p)
        rows = False
        for p in between:
            if kinds[p] == REDUCTION and self.row_reduction[p]:
                rows = True
            elif kinds[p] != FUSIBLE:
                return None
        # Through pointwise values alone the sibling is computed inside v's kernel already (``_sibling_reads``).
        return (sorted(between, key=position.__getitem__), seen) if rows else None

    def _row_kernel_sums(
        self,
        v: int,
        kernel: list[int],
        descendants: set[int],
        shared: list[int],
        position: list[int],
        realised: bytearray,
    ) -> tuple[list[int], list[int]]:
        """The later reductions that a row kernel (``v``, then ``kernel``) also computes, and what they inline.

        Inductor's CPU code adds to the kernel that computes a norm's output
        and its backward's row sums the sums over the other dimension that
        read the same buffers (the norm's weight and bias gradients), as a
        second loop, so they run before the weight gradient that waits for
        the kernel, and the norm's input and the incoming gradient die there.
        As seen on a deep MLP's recomputed layers, it does so only where the
        kernel recomputes the norm's output from saved values alone (its
        input and statistics); where the phase computes one of them (the
        input's projection, the statistics), the sums run later in a kernel
        of their own, as does a sum of anything the kernel computes after
        its row sums (the input's gradient, for a bias gradient).  A sum
        joins if it reads ``v`` or one of the kernel's largest buffers
        (``shared``) through pointwise values, and everything else it reads
        exists before the kernel: no value that waits for it (``descendants``
        of ``v``) and none computed after it.
        """
        kinds, inputs, readers = self.kinds, self.inputs, self.readers
        members = set(kernel)
        members.add(v)
        reductions = [p for p in kernel if kinds[p] == REDUCTION]
        # is v computed from what the phase computes (not only from saved values and parameters)?
        if any(kinds[p] != FREE for p in self._through_pointwise([v], inputs, position, realised)):
            after = members
        else:  # what depends on the row sums
            after = set(reductions)
            for p in sorted(kernel, key=position.__getitem__):
                if any(q in after for q in inputs[p]):
                    after.add(p)
        end = position[kernel[-1]]
        # the sums that read v or a shared buffer through pointwise values
        found = [
            r
            for r in self._through_pointwise([v, *shared], readers, position, realised)
            if kinds[r] == REDUCTION and position[r] > end and r not in members
        ]
        later: list[int] = []
        inline: dict[int, None] = {}
        for c in sorted(found, key=position.__getitem__):
            chain: dict[int, None] = {}
            stack, fits = [c], True
            while stack and fits:
                for p in inputs[stack.pop()]:
                    if position[p] < 0 or p in chain:
                        continue
                    if p in after:
                        fits = False
                    elif kinds[p] == FUSIBLE and not realised[p] and p != v:
                        chain[p] = None
                        if p not in members:
                            stack.append(p)
                    elif p not in members and (position[p] > end or p in descendants):
                        fits = False  # computed after the kernel, or waits for it
            if fits:
                later.append(c)
                inline.update((p, None) for p in chain if p not in members)
        return later, list(inline)

    def _through_pointwise(
        self, starts: list[int], edges: Sequence[Sequence[int]], position: list[int], realised: bytearray
    ) -> Iterator[int]:
        """The phase's values next to ``starts`` along ``edges`` (inputs or readers), through inlined pointwise ones.

        Each value is yielded once, when it is reached: one that is not
        inlined (a buffer, a reduction, a realised value, a parameter).
        """
        kinds = self.kinds
        stack, walked = list(starts), set(starts)
        while stack:
            for p in edges[stack.pop()]:
                if position[p] < 0 or p in walked:
                    continue
                walked.add(p)
                if kinds[p] == FUSIBLE and not realised[p]:
                    stack.append(p)
                else:
                    yield p

    def _kernel_reads(self, v: int, joined: dict[int, int], position: list[int], realised: bytearray) -> set[int]:
        """What ``v`` reads in a joined kernel: as ``_reads``, but a joined value is read as itself.

        A joined value is written by its kernel, so a sibling that reads it
        reads that buffer (the element it has just written), not what it is
        computed from: ReLU's gradient reads ReLU's output, not its input.
        """
        return set(self._load_order(v, joined, position, realised))

    def _fuse_into_consumers(self, order: list[int], position: list[int], realised: bytearray) -> list[int]:
        """``order`` with each pointwise value moved to just before its first consumer in the phase.

        Inductor computes a pointwise value inside the kernel of its consumer,
        so it runs (and its inputs stay alive) until that kernel, not at its
        own place in the graph.  Chains of pointwise values move together, in
        graph order.  A value realised for several readers (``realised``) is a
        buffer Inductor computes at its own place, as it does a reduction.
        ``position`` is ``order``'s.
        """
        inlined_inputs = self.inlined_inputs
        deferred = bytearray(self.n)
        for i in order:
            for p in inlined_inputs[i]:
                if position[p] >= 0 and not realised[p]:
                    deferred[p] = 1
        placed = bytearray(self.n)
        result: list[int] = []
        for i in order:
            if deferred[i]:
                continue
            for p in inlined_inputs[i]:
                if deferred[p] and not placed[p]:
                    break
            else:  # no pointwise input waits for this kernel
                result.append(i)
                continue
            pending: list[int] = []
            stack = list(inlined_inputs[i])
            while stack:
                value = stack.pop()
                if deferred[value] and not placed[value]:
                    placed[value] = 1
                    pending.append(value)
                    stack.extend(inlined_inputs[value])
            pending.sort(key=position.__getitem__)
            result.extend(pending)
            result.append(i)
        result.extend(v for v in order if deferred[v] and not placed[v])
        return result

    def _heavy(self, i: int, position: list[int], realised: bytearray) -> bool:
        """Whether the pointwise chain ending at ``i`` is too big for Inductor to inline twice.

        The chain stops at realised values: the chain loads them, as it loads
        buffers, instead of computing what they read.
        """
        inputs, kinds = self.inputs, self.kinds
        ops: set[int] = set()
        leaves: set[int] = set()
        stack = [i]
        while stack:
            value = stack.pop()
            if value in ops:
                continue
            ops.add(value)
            for p in inputs[value]:
                if position[p] >= 0 and kinds[p] == FUSIBLE and not realised[p]:
                    stack.append(p)
                elif kinds[p] != FREE:
                    leaves.add(p)
            if len(ops) > _REALIZE_OPS or len(leaves) > _REALIZE_READS:
                return True
        return False

    def _materialised(self, order: Sequence[int], position: list[int], realised: bytearray) -> bytearray:
        """The values of the phase that allocate, whatever the plan keeps (kept and shared values come later)."""
        kinds, inlined_inputs, readers = self.kinds, self.inlined_inputs, self.readers
        result = bytearray(self.n)
        heavy: dict[int, bool] = {}
        for i in order:
            kind = kinds[i]
            if kind == BUFFER:  # a library call: its pointwise inputs are materialised for it
                result[i] = 1
                for p in inlined_inputs[i]:
                    if position[p] >= 0:
                        result[p] = 1
            elif kind == REDUCTION:
                result[i] = 1
                for p in inlined_inputs[i]:
                    if position[p] >= 0 and not result[p]:
                        if p not in heavy:
                            shared = sum(1 for r in readers[p] if position[r] >= 0) > 1
                            heavy[p] = shared and self._heavy(p, position, realised)
                        if heavy[p]:
                            result[p] = 1
        return result

    def add_shared_values(self, phase: PhaseOrder, buffers: bytearray) -> None:
        """Flag in ``buffers`` the phase's shared values that two kernels read (in order: each may add one)."""
        kernels = bytearray(buffers)  # what ends an inlined chain: buffers and realised values
        kinds = self.kinds
        for i in phase.shared:
            if kinds[i] == FUSIBLE:
                kernels[i] = 1
        for i in phase.shared:
            if not buffers[i] and self._read_by_two_kernels(i, phase.position, kernels, phase.kernel_end):
                buffers[i] = kernels[i] = 1

    def _kernels_reading(self, i: int, position: list[int], kernels_at: bytearray) -> Iterator[int]:
        """The kernels that read ``i``: its readers, through those inlined into their own readers.

        A reader inlined into its readers is no kernel: the kernel is where the
        chain of inlined values ends (``kernels_at``: buffers and realised
        values, or a value that is never inlined).  Each is yielded once.
        """
        readers, inlined = self.readers, self.inlined
        seen: set[int] = set()
        stack = [r for r in readers[i] if position[r] >= 0]
        while stack:
            value = stack.pop()
            if value in seen:
                continue
            seen.add(value)
            if inlined[value] and not kernels_at[value]:
                stack.extend(r for r in readers[value] if position[r] >= 0)
            else:
                yield value

    def first_kernel(self, i: int, phase: PhaseOrder, kernels_at: bytearray) -> int:
        """The position of the first kernel that reads ``i`` (its last value, if joined), or -1 if none does.

        ``kernels_at``: the phase's buffers and the values it realises
        (:meth:`_kernels_reading`).  Inductor's memory estimate counts a value
        realised for one kernel while that kernel runs.
        """
        position, ends = phase.position, phase.kernel_end
        kernels = self._kernels_reading(i, position, kernels_at)
        return min((ends.get(position[v], position[v]) for v in kernels), default=-1)

    def _read_by_two_kernels(self, i: int, position: list[int], kernels_at: bytearray, joined: dict[int, int]) -> bool:
        """Whether two kernels read ``i``: two kernels (``kernels_at``) downstream of it through inlined values.

        Values joined in one kernel (``joined``: a value's position -> its
        kernel's last) are one kernel: a value that only they read, such as
        a recomputed SwiGLU's activation that the down projection's input and
        the up projection's gradient read, stays inside it.
        """
        kernels: set[int] = set()
        for value in self._kernels_reading(i, position, kernels_at):
            at = position[value]
            kernels.add(-1 - joined[at] if at in joined else value)
            if len(kernels) > 1:
                return True
        return False
