"""The peak simulator as first written: plain sets and dicts, rebuilt for every plan.

:mod:`ckpt.partitioner.peak` computes the same predictions on per-graph
tables (:mod:`ckpt.partitioner.peak_order`); this straightforward version is
the specification the tests hold it to, value for value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ckpt.partitioner.peak import Materialise, PeakGraph, PeakPrediction

__all__ = ["simulate_peak"]

_INLINED = (Materialise.FUSIBLE, Materialise.RANDOM)


@dataclass
class _Phase:
    peak: int = 0
    node: str = ""
    alive: tuple[tuple[str, int], ...] = ()
    values: tuple[int, ...] = ()


def _forward_order(graph: PeakGraph, saved: frozenset[int]) -> list[int]:
    """Forward values the forward graph computes: ancestors of what it must produce or save."""
    keep = bytearray(len(graph))
    stack = [i for i in range(len(graph)) if not graph.backward[i] and (graph.required[i] or i in saved)]
    stack += [i for i in graph.outputs if not graph.backward[i]]
    while stack:
        i = stack.pop()
        if keep[i] or graph.backward[i]:
            continue
        keep[i] = 1
        stack.extend(graph.inputs[i])
    return [i for i in range(len(graph)) if keep[i]]


def _backward_order(graph: PeakGraph, recomputed: frozenset[int]) -> list[int]:
    """The backward's values in the order torch's ``reordering_to_mimic_autograd_engine`` gives.

    From the first value that reads a tangent on, each value in graph order
    brings in everything it needs that is not there yet (recomputed values
    and backward values before it), in graph order.
    """
    members = {i for i in range(len(graph)) if graph.backward[i] and i not in graph.tangents} | set(recomputed)
    readers = [i for i in sorted(members) if any(p in graph.tangents for p in graph.inputs[i])]
    if not readers:
        return sorted(members)
    order: list[int] = []
    placed: set[int] = set()
    for i in range(readers[0], len(graph)):
        if i not in members or i in placed:
            continue
        needed: set[int] = set()
        stack = [i]
        while stack:
            value = stack.pop()
            if value in needed or value in placed:
                continue
            needed.add(value)
            stack.extend(p for p in graph.inputs[value] if p in members)
        order.extend(sorted(needed))
        placed |= needed
    return order


# Inductor realises a pointwise value that several kernels read when its inlined body loads
# more than realize_reads_threshold (4) buffers or has more than realize_opcount_threshold (30)
# ops; otherwise each consumer recomputes it inline.
_REALIZE_READS = 4
_REALIZE_OPS = 30


def _heavy(graph: PeakGraph, i: int, members: set[int], realised: set[int]) -> bool:
    """Whether the pointwise chain ending at ``i`` is too big to inline twice (it loads realised values)."""
    ops: set[int] = set()
    leaves: set[int] = set()
    stack = [i]
    while stack:
        value = stack.pop()
        if value in ops:
            continue
        ops.add(value)
        for p in graph.inputs[value]:
            if p in members and graph.kinds[p] is Materialise.FUSIBLE and p not in realised:
                stack.append(p)
            elif graph.kinds[p] is not Materialise.FREE:
                leaves.add(p)
        if len(ops) > _REALIZE_OPS or len(leaves) > _REALIZE_READS:
            return True
    return False


def _inputs_read(
    graph: PeakGraph,
    i: int,
    inlined: Callable[[int], bool],
    reads_of: Callable[[int], set[int]],
    seeds: bool = False,
) -> set[int]:
    """The buffers ``i``'s kernel reads: inputs that allocate (parameters with bytes too) as themselves,
    a pointwise input that is ``inlined`` through what it reads (``reads_of``), an inlined random draw
    through its seed with ``seeds`` (as Inductor counts reads to realise), else as nothing.
    """
    found: set[int] = set()
    for p in graph.inputs[i]:
        kind = graph.kinds[p]
        if kind is Materialise.FREE:
            if graph.bytes[p] > 0:
                found.add(p)
        elif kind not in _INLINED or not inlined(p):
            found.add(p)
        elif kind is Materialise.FUSIBLE or seeds:
            found |= reads_of(p)
    return found


def _reads(graph: PeakGraph, order: Sequence[int]) -> tuple[set[int], dict[int, set[int]]]:
    """Pointwise values realised for several readers, and the buffers each pointwise value or reduction reads.

    ``order`` is in dependency order.  A value's reads are its inputs that
    allocate (or come from the other phase, or are parameters), and the reads
    of the pointwise inputs inlined into it; a pointwise value that more than
    one value of the phase reads is realised (it becomes its readers' only
    read) when it would read more than ``_REALIZE_READS`` buffers, or computes
    one of ``graph.heavy_ops`` inline.
    """
    members = set(order)
    realised: set[int] = set()
    reads: dict[int, set[int]] = {}
    heavy = set(graph.heavy_ops)  # values that compute a heavy op inline
    for i in order:
        kind = graph.kinds[i]
        if kind not in (Materialise.FUSIBLE, Materialise.REDUCTION, Materialise.RANDOM):
            continue
        found = _inputs_read(graph, i, lambda p: p in members and p not in realised, reads.__getitem__, seeds=True)
        inlined = [p for p in graph.inputs[i] if graph.kinds[p] is Materialise.FUSIBLE and p in members]
        if any(p in heavy and p not in realised for p in inlined):
            heavy.add(i)
        users = sum(1 for r in order if i in graph.inputs[r])
        if kind is Materialise.FUSIBLE and (len(found) > _REALIZE_READS or i in heavy) and users > 1:
            realised.add(i)
            found = {i}
        reads[i] = found
    return realised, reads


def _materialised(graph: PeakGraph, order: Sequence[int], kept: Iterable[int], kernels: dict[int, int]) -> set[int]:
    """The values of ``order`` that allocate in this phase (``kernels``: joined values -> their kernel)."""
    members = set(order)
    readers: dict[int, list[int]] = {}
    for i in order:
        for p in graph.inputs[i]:
            readers.setdefault(p, []).append(i)
    result = {i for i in kept if graph.kinds[i] is not Materialise.FREE}
    reused = _reads(graph, order)[0]
    for i in order:
        kind = graph.kinds[i]
        if kind is Materialise.BUFFER or kind is Materialise.REDUCTION:
            result.add(i)
        for p in graph.inputs[i]:
            if p not in members or graph.kinds[p] not in _INLINED:
                continue
            library_input = kind is Materialise.BUFFER
            realised = kind is Materialise.REDUCTION and len(readers[p]) > 1 and _heavy(graph, p, members, reused)
            if library_input or realised:
                result.add(p)
    for i in order:
        shared = graph.kinds[i] is Materialise.RANDOM or i in reused
        if shared and i not in result and _read_by_two_kernels(graph, i, readers, result | reused, kernels):
            result.add(i)
    return result


def _read_by_two_kernels(
    graph: PeakGraph, i: int, readers: dict[int, list[int]], kernels_at: set[int], joined: dict[int, int]
) -> bool:
    """Whether two kernels read ``i``: two of ``kernels_at`` (buffers, realised values) downstream, through inlined.

    The values of a joined kernel (``joined``) are one kernel.
    """
    kernels: set[object] = set()
    seen: set[int] = set()
    stack = list(readers.get(i, ()))
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        if graph.kinds[value] in _INLINED and value not in kernels_at:
            stack.extend(readers.get(value, ()))
        else:
            kernels.add(("kernel", joined[value]) if value in joined else value)
            if len(kernels) > 1:
                return True
    return False


def _sources(graph: PeakGraph, reads: set[int]) -> set[int]:
    """The largest buffers among a reduction's ``reads``, parameters left out.

    Only the largest count: small operands (scalars, statistics) are shared by
    unrelated kernels.
    """
    found = {v for v in reads if graph.kinds[v] is not Materialise.FREE}
    largest = max((graph.bytes[v] for v in found), default=0)
    return {v for v in found if graph.bytes[v] == largest and largest > 0}


def _join_sibling_reductions(graph: PeakGraph, order: list[int]) -> list[int]:
    """Move each reduction to its last sibling (a reduction that reads one of its largest buffers).

    Inductor fuses reductions that read a common buffer into one kernel, so
    the earlier ones wait for the later ones' inputs.  A reduction never moves
    past a value that reads it.
    """
    reads = _reads(graph, order)[1]
    position = {v: k for k, v in enumerate(order)}
    readers: dict[int, int] = {}
    for k, v in enumerate(order):
        for p in graph.inputs[v]:
            readers.setdefault(p, k)
    reductions = [v for v in order if graph.kinds[v] is Materialise.REDUCTION]
    sources = {r: _sources(graph, reads[r]) for r in reductions}
    last_reader: dict[int, int] = {}  # source -> position of the last reduction over it
    for r in reductions:
        for s in sources[r]:
            last_reader[s] = max(last_reader.get(s, -1), position[r])
    target: dict[int, int] = {}
    for r in reductions:
        last = max((last_reader[s] for s in sources[r]), default=position[r])
        limit = readers.get(r, len(order)) - 1
        target[r] = max(position[r], min(last, limit))
    return sorted(order, key=lambda v: (target.get(v, position[v]), v not in target, position[v]))


def _fuse_into_consumers(graph: PeakGraph, order: Sequence[int]) -> list[int]:
    """``order`` with each pointwise value moved to just before its first consumer in the phase.

    Inductor computes a pointwise value inside the kernel of its consumer, so
    it runs (and its inputs stay alive) until that kernel, not at its own place
    in the graph.  Chains of pointwise values move together, in graph order.
    A value realised for several readers runs at its own place.
    """
    realised = _reads(graph, sorted(order))[0]
    order = _join_sibling_reductions(graph, list(order))
    members = set(order)
    position = {v: k for k, v in enumerate(order)}
    consumed: set[int] = set()
    for i in order:
        consumed.update(p for p in graph.inputs[i] if p in members)
    deferred = {i for i in order if graph.kinds[i] in _INLINED and i in consumed and i not in realised}
    result: list[int] = []
    placed: set[int] = set()
    for i in order:
        if i in deferred:
            continue
        pending: set[int] = set()
        stack = [p for p in graph.inputs[i] if p in deferred and p not in placed]
        while stack:
            value = stack.pop()
            if value in pending:
                continue
            pending.add(value)
            stack.extend(p for p in graph.inputs[value] if p in deferred and p not in placed)
        result.extend(sorted(pending, key=position.__getitem__))
        placed |= pending
        result.append(i)
        placed.add(i)
    result.extend(v for v in order if v in deferred and v not in placed)
    return result


def _join_sibling_pointwise(
    graph: PeakGraph, order: list[int]
) -> tuple[list[int], dict[int, int], dict[int, set[int]]]:
    """Run each pointwise value a library call reads with its last sibling; what depends on it waits.

    On the fused order.  Siblings are such values that read one of its largest
    buffers; a moved value goes right after its last sibling, and the values
    that depend on moved values, up to where those went, follow in their
    order.  Returns the order, for each value of a joined kernel its kernel
    (the position, in ``order``, of the sibling it joined), and for each such
    value the buffers no other value of its kernel reads.
    """
    realised, reads = _reads(graph, sorted(order))  # what a value reads depends on the phase's values alone
    position = {v: k for k, v in enumerate(order)}
    members = set(order)
    candidates = [
        v
        for v in order
        if graph.kinds[v] is Materialise.FUSIBLE
        and any(v in graph.inputs[r] and graph.kinds[r] is Materialise.BUFFER for r in members)
    ]

    # a realised value is its readers' only read; its own kernel reads what it is computed from
    def own_reads(v: int) -> set[int]:
        return _inputs_read(graph, v, lambda p: p in members and p not in realised, own_reads)

    own = {v: own_reads(v) if v in realised else reads[v] for v in candidates}
    for v in candidates:  # a value runs in the kernel of a realised value of its size that it reads
        own[v] = own[v].union(
            *(own_reads(p) for p in own[v] if p != v and p in realised and graph.bytes[p] == graph.bytes[v])
        )
    sources = {v: _sources(graph, own[v]) for v in candidates}
    target: dict[int, int] = {}
    moves: dict[int, int] = {}  # the values that move: those of target, and a row kernel's values on the way
    for v in candidates:
        siblings = [position[u] for u in candidates if sources[u] & sources[v]]
        last = max(siblings, default=-1)
        if last > position[v]:
            # Not if the sibling depends on it (a fused kernel cannot wait for itself), unless only through
            # pointwise values and row reductions: then all of them are one kernel, at the sibling's place.
            depends = {v}
            for u in order[position[v] + 1 : last + 1]:
                if any(p in depends for p in graph.inputs[u]):
                    depends.add(u)
            if order[last] not in depends:
                target[v] = moves[v] = last
                continue
            between = {order[last]}
            for u in reversed(order[position[v] + 1 : last + 1]):
                if u in between:
                    between.update(p for p in graph.inputs[u] if p in depends and p != v)
            between.discard(order[last])
            kinds = [graph.kinds[u] for u in between]
            rows = [u for u in between if graph.kinds[u] is Materialise.REDUCTION and u in graph.row_reductions]
            if (
                graph.bytes[v] == graph.bytes[order[last]]
                and rows
                and all(k is Materialise.FUSIBLE or u in rows for k, u in zip(kinds, between))
            ):
                target[v] = last
                kernel = between | {order[last]}
                shared = sources[v] | sources[order[last]]
                later, inline = _row_kernel_sums(graph, v, kernel, depends, shared, order, realised)
                end = max([last] + [position[c] for c in later])
                moves[v] = end
                moves.update((u, end) for u in kernel | set(later) | inline)
    if not target:
        return order, {}, {}
    anchor: dict[int, int] = {}
    for v in order:
        waits = max((anchor[p] for p in graph.inputs[v] if p in anchor), default=-1)
        if v in moves and moves[v] >= waits:
            anchor[v] = moves[v]
        elif waits >= position[v]:  # (a sibling that depends on a moved value follows it)
            anchor[v] = waits
    # What follows a position: the moved values, then those that wait, each in their order, but never
    # before a value they read there (a moved value may read one that waits).
    rank: dict[int, int] = {}  # a following value's place among those that follow its position
    for k in set(anchor.values()):
        group = [v for v in order if anchor.get(v) == k]
        while group:
            ready = [v for v in group if not any(p in group for p in graph.inputs[v])]
            pick = min(ready, key=lambda v: (v not in moves, position[v]))
            rank[pick] = len(rank)
            group.remove(pick)
    result = sorted(order, key=lambda v: (anchor.get(v, position[v]), v in anchor, rank.get(v, 0)))
    kernels = {v: t for v, t in target.items()}
    kernels.update({order[t]: t for t in target.values()})

    def inlined(p: int) -> bool:  # a joined value is read as itself, as its kernel writes it
        return p in members and p not in realised and p not in kernels

    def kernel_reads(v: int) -> set[int]:
        return _inputs_read(graph, v, inlined, kernel_reads)

    own = {v: kernel_reads(v) for v in kernels}
    sole = {
        v: {b for b in own[v] if sum(1 for u in kernels if kernels[u] == kernels[v] and b in own[u]) == 1}
        for v in kernels
    }
    return result, kernels, sole


def _row_kernel_sums(
    graph: PeakGraph,
    v: int,
    kernel: set[int],
    descendants: set[int],
    shared: set[int],
    order: list[int],
    realised: set[int],
) -> tuple[list[int], set[int]]:
    """The later reductions that the row kernel of ``v`` and ``kernel`` computes too, and what they inline.

    Those that read ``v`` or a ``shared`` buffer through pointwise values,
    come after the kernel's last value, and read (through pointwise values)
    no reduction of the kernel nor a value that depends on one (every value
    of the kernel, if ``v`` is computed from a value that the phase computes),
    no value computed after the kernel and no ``descendants`` of ``v`` outside
    it.
    """
    in_phase = set(order)
    position = {u: k for k, u in enumerate(order)}
    members = kernel | {v}

    def inlined(p: int) -> bool:
        return graph.kinds[p] is Materialise.FUSIBLE and p in in_phase and p not in realised

    computed_from = {v}
    for u in reversed(order):
        if u in computed_from:
            computed_from.update(p for p in graph.inputs[u] if inlined(p))
    leaves = {p for u in computed_from for p in graph.inputs[u] if p in in_phase and not inlined(p)}
    if any(graph.kinds[p] is not Materialise.FREE for p in leaves):
        after = set(members)
    else:
        after = {u for u in kernel if graph.kinds[u] is Materialise.REDUCTION}
        for u in order:
            if u in kernel and any(p in after for p in graph.inputs[u]):
                after.add(u)
    end = max(position[u] for u in kernel)
    reach = {v} | shared
    for u in order:
        if inlined(u) and any(p in reach for p in graph.inputs[u]):
            reach.add(u)
    found = [
        u
        for u in order
        if graph.kinds[u] is Materialise.REDUCTION
        and position[u] > end
        and u not in members
        and any(p in reach for p in graph.inputs[u])
    ]
    later: list[int] = []
    inline: set[int] = set()
    for c in found:
        chain: set[int] = set()
        fits = True
        stack = [c]
        while stack:
            for p in graph.inputs[stack.pop()]:
                if p not in in_phase or p in chain:
                    continue
                if p in after:
                    fits = False
                elif graph.kinds[p] is Materialise.FUSIBLE and p not in realised and p != v:
                    chain.add(p)
                    if p not in members:
                        stack.append(p)
                elif p not in members and (position[p] > end or p in descendants):
                    fits = False
        if fits:
            later.append(c)
            inline |= chain - members
    return later, inline


def _in_place_reads(
    graph: PeakGraph, order: Sequence[int], kernels: dict[int, int], sole: dict[int, set[int]]
) -> dict[int, set[int]]:
    """For a value that loads a realised value of its size read by no other kernel: the reads up to it.

    Its kernel's loads in order (operands first to last, depth first through
    inlined values); Inductor writes the output in place of the first that
    qualifies, and such a realised value does (allocating for the output), so
    only reads loaded before it can give their storage.
    """
    members = set(order)
    realised, reads = _reads(graph, sorted(order))
    readers: dict[int, list[int]] = {}
    for v in order:
        for q in graph.inputs[v]:
            readers.setdefault(q, []).append(v)

    def loads(v: int, seen: set[int], out: list[int]) -> list[int]:
        for q in graph.inputs[v]:
            kind = graph.kinds[q]
            if kind is Materialise.FREE and not graph.bytes[q]:
                continue
            if q in kernels or q not in members or kind not in _INLINED or q in realised:
                if q not in out:
                    out.append(q)
            elif kind is Materialise.FUSIBLE and q not in seen:
                seen.add(q)
                loads(q, seen, out)
        return out

    def only_into(x: int, v: int) -> bool:  # every path from x through its readers ends at v
        if x == v:
            return True
        if graph.kinds[x] is not Materialise.FUSIBLE or x in realised or not readers.get(x):
            return False
        return all(only_into(y, v) for y in readers[x])

    result: dict[int, set[int]] = {}
    for v in order:
        if graph.kinds[v] not in (Materialise.FUSIBLE, Materialise.REDUCTION) or v in realised or not graph.bytes[v]:
            continue
        found = loads(v, {v}, [])
        for k, r in enumerate(found):
            if r == v or r not in realised or graph.bytes[r] != graph.bytes[v]:
                continue
            if (v not in kernels or r in sole[v]) and all(only_into(y, v) for y in readers[r]):
                result[v] = set(found[: k + 1])
                break
    return result


def _buffer_reads(
    graph: PeakGraph, order: Sequence[int], buffers: set[int], available: set[int]
) -> dict[int, set[int]]:
    """For each value of ``order``: the buffers its kernel reads, looking through fused values."""
    reads: dict[int, set[int]] = {}
    for i in order:
        found: set[int] = set()
        for p in graph.inputs[i]:
            if p in buffers or p in available:
                found.add(p)
            elif p in reads:
                found |= reads[p]
        reads[i] = found
    return reads


def _run(
    graph: PeakGraph,
    order: Sequence[int],
    buffers: set[int],
    start: Iterable[int],
    keep: set[int],
    reads: dict[int, set[int]],
    kernels: dict[int, int],
    sole: dict[int, set[int]],
    loaded: dict[int, set[int]],
) -> tuple[_Phase, set[int]]:
    """Allocate and free along ``order``; the phase's peak and what is alive at its end.

    The first pass finds the peak's position; a second, up to it, recovers
    what is alive there (cheaper than copying the alive set at every new high).
    A joined kernel (``kernels``) reads its inputs until its last value.
    """
    where = {v: k for k, v in enumerate(order)}
    kernel_end: dict[int, int] = {}
    for v, kernel in kernels.items():
        kernel_end[kernel] = max(kernel_end.get(kernel, -1), where[v])
    last_use: dict[int, int] = {}
    for position, i in enumerate(order):
        until = kernel_end[kernels[i]] if i in kernels else position
        for b in reads[i]:
            last_use[b] = max(last_use.get(b, -1), until)
    due: dict[int, set[int]] = {}
    for b, position in last_use.items():
        due.setdefault(position, set()).add(b)
    nbytes = list(graph.bytes)
    names = list(graph.names)
    scratch = list(graph.scratch or (0,) * len(graph))

    takes = [
        kind in (Materialise.FUSIBLE, Materialise.REDUCTION, Materialise.RANDOM) or i in graph.out_buffers
        for i, kind in enumerate(graph.kinds)
    ]
    # A call's pooled input copies: buffers numbered after the graph's values, allocated where the
    # call runs (before its output), freed after it like any buffer Inductor allocates.
    copies: dict[int, list[int]] = {}
    for call, size in graph.pooled_copies:
        copies.setdefault(call, []).append(len(nbytes))
        nbytes.append(size)
        names.append(f"{graph.names[call]} (input copy)")
        takes.append(True)
        scratch[call] -= size
    start_set = set(start)
    calls: dict[int, list[int]] = {}  # a library call -> the outputs it allocates while it runs
    for output, call in graph.call_outputs:
        calls.setdefault(call, []).append(output)

    # Values Inductor realises for several readers that one kernel reads: no storage, but its own
    # estimate counts them where that kernel runs (at a joined kernel's last value); a reader
    # inlined into its own readers is no kernel: the kernel is where the inlined chain ends.
    reused = _reads(graph, order)[0]
    in_phase = set(order)
    local: dict[int, int] = {}  # position -> bytes
    for i in order:
        if (graph.kinds[i] is Materialise.RANDOM or i in reused) and i not in buffers and nbytes[i]:
            ends: list[int] = []
            seen: set[int] = set()
            stack = [r for r in order if i in graph.inputs[r]]
            while stack:
                value = stack.pop()
                if value in seen:
                    continue
                seen.add(value)
                ran = graph.kinds[value] is Materialise.RANDOM or value in reused
                if graph.kinds[value] in _INLINED and value not in buffers and not ran:
                    stack.extend(r for r in order if value in graph.inputs[r] and r in in_phase)
                else:
                    ends.append(kernel_end[kernels[value]] if value in kernels else where[value])
            if ends:
                at = min(ends)
                local[at] = local.get(at, 0) + nbytes[i]
    # A concatenation's inputs are copied into its buffer by kernels of their own; the estimate counts
    # the last copy, a buffer of its input's size, while the concatenation runs.
    for position, i in enumerate(order):
        if i in graph.concats and graph.inputs[i]:
            local[position] = local.get(position, 0) + nbytes[graph.inputs[i][-1]]

    def walk(
        stop: int, holds: dict[int, int], events: list[tuple[int, str, int]], estimate: list[int] | None = None
    ) -> tuple[int, int, set[int]]:
        """Replay the phase; with ``estimate``, as Inductor's own estimate sees it (no storage shared),
        writing the bytes alive at each position into it and each allocation into ``events``."""
        alive = {b for b in start if b in keep or b in last_use}
        born = dict.fromkeys(alive, 0)
        held: dict[int, list[int]] = {}  # position -> freed buffers held for the buffer allocated there
        total = sum(nbytes[b] for b in alive)
        peak, at = sum(nbytes[b] for b in start), -1
        pending: set[int] = set()  # outputs a call has allocated, not yet picked out
        for position, i in enumerate(order):
            for output in calls.get(i, ()):
                if output in buffers and output not in start_set and where.get(output, -1) > position:
                    pending.add(output)
            pending.discard(i)
            for copy in copies.get(i, ()):
                for b in held.pop(position, ()):  # a held buffer passes to the copy
                    alive.discard(b)
                    total -= nbytes[b]
                events.append((position, "take", copy))
                if estimate is not None:
                    events.append((position, "alloc", copy))
                alive.add(copy)
                born[copy] = position
                total += nbytes[copy]
            if i in buffers and i not in alive:
                in_place = False
                if estimate is not None and i not in start_set and nbytes[i]:
                    events.append((position, "alloc", i))
                if estimate is None and graph.kinds[i] not in (Materialise.BUFFER, Materialise.FREE) and nbytes[i]:
                    # Inductor's kernel writes in place of an input of its size that dies here (in a
                    # kernel of siblings: that dies at its end, and that no other value of it reads).
                    dies = kernel_end[kernels[i]] if i in kernels else position
                    donors = [
                        b
                        for b in alive
                        if b not in keep
                        and b not in graph.concats
                        and nbytes[b] == nbytes[i]
                        and last_use.get(b) == dies
                        and born[b] < position
                        and (i not in kernels or b in sole[i])
                        and (i not in loaded or b in loaded[i])
                    ]
                    if donors:
                        alive.discard(min(donors))
                        total -= nbytes[i]
                        in_place = True
                        events.append((position, "in place", min(donors)))
                for b in held.pop(position, ()):  # a held buffer passes to this one
                    alive.discard(b)
                    total -= nbytes[b]
                if not in_place and i not in start_set and nbytes[i] and takes[i]:
                    events.append((position, "take", i))
                alive.add(i)
                born[i] = position
                total += nbytes[i]
            # a library call's own working memory while it runs, and the outputs it allocated
            running = total + scratch[i] + sum(nbytes[b] for b in pending)
            if estimate is not None:
                estimate.append(total + sum(nbytes[b] for b in pending) + local.get(position, 0))
            if running > peak or at < 0:
                peak, at = running, position
            if position == stop:
                alive |= pending
                break
            freed = reads[i] | due.get(position, set()) | ({i} if i in buffers else set()) | set(copies.get(i, ()))
            for b in sorted(freed):
                if b in alive and b not in keep and last_use.get(b, position) <= position:
                    if b in holds:
                        held.setdefault(holds[b], []).append(b)
                        continue
                    alive.discard(b)
                    total -= nbytes[b]
                    if b not in start_set and nbytes[b] and position < len(order) - 1:
                        events.append((position, "free", b))
        return peak, at, alive

    # The outputs of aten's own kernels that read a graph input or such an output: unaligned, never pooled.
    unaligned: set[int] = set()
    for i in order:
        if i in graph.fallback_calls and (
            i in graph.unaligned_calls or any(p in start_set or p in unaligned for p in graph.inputs[i])
        ):
            unaligned.update(calls[i])

    def pool(events: list[tuple[int, str, int]]) -> dict[int, int]:
        """Which freed buffer each allocation takes over: the latest freed of its size, unless holding
        it from where it was freed would take Inductor's own estimate above that estimate's peak (the
        held bytes then count in the estimate); no kernel that allocates in between, and it always does."""
        estimate: list[int] = []
        allocations: list[tuple[int, str, int]] = []
        walk(len(order), {}, allocations, estimate)
        allocating = sorted({position for position, kind, _ in allocations if kind == "alloc"})
        overall = max(estimate, default=0)
        # an output written in place of a buffer the phase starts with (a graph input) keeps its storage
        inputs_storage = set(unaligned)
        for position, kind, b in events:
            if kind == "in place" and (b in start_set or b in inputs_storage):
                inputs_storage.add(order[position])
        gave = {b for _, kind, b in events if kind == "in place"} | inputs_storage
        freed: dict[int, list[tuple[int, int]]] = {}  # bytes -> (buffer, where freed), latest last
        holds: dict[int, int] = {}
        for position, kind, b in events:
            if kind == "take" and freed.get(nbytes[b]):
                held, after = freed[nbytes[b]][-1]
                between = [k for k in allocating if after < k < position]
                if between and nbytes[b] + max(estimate[k] for k in between) > overall:
                    continue  # declined: it stays in the pool
                for k in between:
                    estimate[k] += nbytes[b]
                freed[nbytes[b]].pop()
                holds[held] = position
            elif kind == "free" and b not in gave:
                freed.setdefault(nbytes[b], []).append((b, position))
        return holds

    events: list[tuple[int, str, int]] = []
    walk(len(order), {}, events)
    holds = pool(events)

    peak, at, alive = walk(len(order), holds, [])
    if at < 0:  # an empty phase
        return _Phase(peak, "", ()), alive
    _, _, there = walk(at, holds, [])
    items = [(-nbytes[b], b, names[b]) for b in there]
    if scratch[order[at]]:
        items.append((-scratch[order[at]], -1, f"{graph.names[order[at]]} (scratch)"))
    named = tuple((name, -negative) for negative, _, name in sorted(items)[:8])
    values = tuple(sorted(b for b in there if b < len(graph)))
    return _Phase(peak, graph.names[order[at]], named, values), {b for b in alive if b < len(graph)}


def _backward_phase(graph: PeakGraph, saved: frozenset[int], recomputed: frozenset[int]) -> _Phase:
    backward, kernels, sole = _join_sibling_pointwise(
        graph, _fuse_into_consumers(graph, _backward_order(graph, recomputed))
    )
    start = {i for i in saved if graph.kinds[i] is not Materialise.FREE}
    start |= {i for i in graph.tangents if graph.kinds[i] is not Materialise.FREE}
    b_buffers = _materialised(graph, backward, graph.gradients, kernels)
    b_reads = _buffer_reads(graph, backward, b_buffers, start)
    loaded = _in_place_reads(graph, backward, kernels, sole)
    phase, _ = _run(graph, backward, b_buffers, start, set(graph.gradients), b_reads, kernels, sole, loaded)
    return phase


def simulate_peak(graph: PeakGraph, saved: Iterable[int], recomputed: Iterable[int]) -> PeakPrediction:
    """The forward and backward peaks of the plan that saves ``saved`` and recomputes ``recomputed``.

    Indices are values of ``graph``.  Bytes are above what is resident before
    the forward starts.  Concatenations' inputs written into their buffers
    (``PeakGraph.concat_inputs``) are not replayed here.
    """
    if graph.concat_inputs:
        raise NotImplementedError("the reference does not write concatenations' inputs into their buffers")
    saved_set = frozenset(saved)
    recomputed_set = frozenset(recomputed)
    forward, kernels, sole = _join_sibling_pointwise(
        graph, _fuse_into_consumers(graph, _forward_order(graph, saved_set))
    )
    forward_kept = saved_set | {i for i in graph.outputs if not graph.backward[i]}
    f_buffers = _materialised(graph, forward, forward_kept, kernels)
    f_reads = _buffer_reads(graph, forward, f_buffers, set())
    loaded = _in_place_reads(graph, forward, kernels, sole)
    f_phase, _ = _run(graph, forward, f_buffers, (), set(forward_kept), f_reads, kernels, sole, loaded)
    b_phase = _backward_phase(graph, saved_set, recomputed_set)

    if b_phase.peak > f_phase.peak:
        phase_name, top = "backward", b_phase
    else:
        phase_name, top = "forward", f_phase
    return PeakPrediction(
        forward_bytes=f_phase.peak,
        backward_bytes=b_phase.peak,
        phase=phase_name,
        node=top.node,
        alive=top.alive,
        saved_bytes=sum(graph.bytes[i] for i in saved_set if graph.kinds[i] is not Materialise.FREE),
        alive_values=top.values,
    )
