"""Predict a plan's peak memory by simulating liveness over plain data.

A training step's peak is the most bytes alive at any moment of its forward
or its backward, above what was resident before it.  Given a graph of values
(:class:`PeakGraph`) and a plan's saved and recomputed sets,
:func:`simulate_peak` replays the two graphs that extraction builds and
counts the buffers Inductor materialises:

**Forward.**  The forward computes what its outputs need and what the plan
saves, in graph order.  A value is freed after its last forward use, unless
it is saved (it lives until the backward's last use) or a forward output.

**Backward.**  The backward runs its own values in graph order from the first
that reads a tangent, and brings in each recomputed value (with its recomputed
inputs, in graph order) just before its first use, as torch's
``reordering_to_mimic_autograd_engine`` does.  The tangents are alive from
its start.  Every value is freed after its last use,
except the gradients it produces, which are outputs and stay to the end.

**What materialises.**  A ``BUFFER`` value (a library call, a graph input
that counts) and a ``REDUCTION`` always allocate their bytes.  A ``FUSIBLE``
value (pointwise) allocates only if a library call in the same phase reads
it, or it is saved, or it is an output, or a reduction and another kernel
read it and its inlined body is bigger than Inductor inlines twice (its
``realize_reads_threshold`` and ``realize_opcount_threshold``); otherwise
Inductor computes it inside its consumers, and a read of it is a read of the
buffers it is computed from.  A pointwise value that several values read and
whose inlined body would read more than ``realize_reads_threshold`` buffers
is realised (the residual stream of a recomputed stack, every few layers),
and allocates when more than one kernel reads it.
A ``RANDOM`` value (Inductor's own random draw) is realised so that all its
readers see the same numbers: it allocates when more than one kernel reads
it (through pointwise values), as in a backward that recomputes a dropout's
output and later takes its gradient; a draw that one kernel reads stays
inside that kernel.
``FREE`` values (parameters, the user's inputs, symbolic sizes) live anyway
and count nothing.  A library call that returns several tensors (attention's
output and log-sum-exp, its backward's three gradients) allocates them all
while its inputs are alive (``PeakGraph.call_outputs``): each is alive from
the call on, not only from where the graph picks it out.

**Where it runs** follows Inductor's fusion: a pointwise value runs in the
kernel of its first consumer (its inputs stay alive until then), and
reductions that read a common buffer (their largest reads) share one kernel,
placed where the last of them is: in a recomputed stack, the norms' weight
gradients of the layers that read one realised residual.  Pointwise values
that library calls read and that read a common buffer also share one kernel,
at the last of them, and what reads the earlier ones waits for it (a value
that reads a realised value of its size runs in that value's kernel, and
shares what it reads): in a
recomputed MLP's backward the activation the down projection's weight
gradient reads is written with the gradients of the gate and up
projections, so their inputs and all three outputs are alive at once.
At each value the
running total is taken after its output is allocated and before its dead
inputs are freed, since a kernel holds both; but one of Inductor's own
kernels (not a library call) writes its output in place of an input of the
same size whose last reader it is, and a library call's measured working
memory (``PeakGraph.scratch``) is alive while it runs.  A buffer whose
last reader has run is not freed if a later buffer of its size that Inductor
allocates itself (a kernel's output, or a library call it gives an ``out=``
buffer, ``PeakGraph.out_buffers``) can take its storage: Inductor's wrapper
keeps it until then (``allow_buffer_reuse``), so in a recomputed stack the
MLP's buffers of one layer stay alive through the next layer's attention,
until its MLP reuses them.  It does so only where holding the buffer keeps
its own estimate of the graph's memory within that estimate's peak
(``AllocateLine.should_reuse_buffer``), or where no kernel that allocates
runs in between.  That estimate shares no storage (a concatenation's last
input copy and an output written in place of an input count apart, a value
realised for one fused kernel counts while it runs), and sees no library
call's working memory.  A convolution's copy of its weight in the layout
it runs in is such a buffer too (``PeakGraph.pooled_copies``): allocated where
the call runs, and held after it until a later buffer of its size takes it.
Two kinds of buffer never go to the pool: an output of aten's own kernel
that Inductor marks unaligned, on the CPU because the call reads a graph
input (``PeakGraph.fallback_calls``: in a backward, attention's gradients
when it reads a saved value), and a kernel's output written in place of a
value the backward starts with (a saved value or a tangent, a graph
input): both are freed after their last reader.  A concatenation (on the CPU Inductor's
``ConcatKernel``) has a buffer of its own, and its pointwise inputs are
computed into it (``PeakGraph.concat_inputs``): the buffer is alive from
the first of them on, and no kernel writes in place of it.  An input whose
layout Inductor has fixed (a forward's saved value, or a realised 4-D value
in a graph with convolutions, ``PeakGraph.dense_4d``) keeps its own buffer
too, and the copy is written where it is computed.  The answer
names the phase and value where the peak happens and the largest buffers
alive there.  Pure data in, data out: no ``torch.fx`` here (the graph is read
by :mod:`ckpt.partitioner.peak_analysis`).

**How it is computed.**  The peak search simulates dozens of plans of one
graph, so what depends on the graph alone is built once, on first use, into
tables kept on the graph (:mod:`ckpt.partitioner.peak_order`, which also
computes the orders and allocations), and the latest predictions are
remembered by plan.  The liveness replay takes, for each buffer, the last
position whose kernel reads it (one backward pass), then walks the order once
to find the peak and once more to name what is alive there.
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ckpt.partitioner.peak_order import BUFFER, FREE, FUSIBLE, RANDOM, REDUCTION, GraphIndex, PhaseOrder
from ckpt.partitioner.plan import Plan

__all__ = [
    "Materialise",
    "PeakGraph",
    "PeakPrediction",
    "backward_peak",
    "forward_peak",
    "predict_plan",
    "simulate_peak",
]


class Materialise(enum.Enum):
    BUFFER = "buffer"  # always allocates its bytes
    REDUCTION = "reduction"  # allocates its (small) output; reductions over the same values share a kernel
    FUSIBLE = "fusible"  # allocates only when a library call reads it, or it is kept
    RANDOM = "random"  # a random draw: allocates when more than one kernel reads it
    FREE = "free"  # lives anyway (parameters, inputs) or has no storage


@dataclass(frozen=True)
class PeakGraph:
    """Values in topological order, views folded into the values they alias.

    ``inputs[i]``: the values ``i`` reads, in the order its operands name them
    (Inductor's kernels load their reads in that order); ``backward[i]``:
    computed by the backward (downstream of the tangents);
    ``required[i]``: the forward must compute it (for its outputs or side
    effects), whatever the plan; ``outputs``: forward outputs (alive to the end
    of the forward); ``gradients``: backward outputs (alive to the end of the
    backward); ``tangents``: backward inputs, alive from the backward's start.
    """

    names: tuple[str, ...]
    bytes: tuple[int, ...]
    kinds: tuple[Materialise, ...]
    inputs: tuple[tuple[int, ...], ...]
    backward: tuple[bool, ...]
    required: tuple[bool, ...]
    outputs: frozenset[int]
    gradients: frozenset[int]
    tangents: frozenset[int]
    problem_index: tuple[int, ...] = ()  # the planner's value i is value problem_index[i] here
    scratch: tuple[int, ...] = ()
    out_buffers: frozenset[int] = frozenset()  # library calls that write into a buffer Inductor allocates (mm)
    concat_inputs: tuple[tuple[int, int], ...] = ()  # (input, cat): a pointwise input written into the cat's buffer
    concats: frozenset[int] = frozenset()  # ConcatKernel outputs: no kernel writes in place of them
    # Pointwise values whose own op Inductor's CPU code counts as heavy (exp, log, sigmoid, tanh): a
    # value that computes one inline is realised once several values read it.
    heavy_ops: frozenset[int] = frozenset()
    # (output, call): a library call's outputs that it returns together (SDPA's output and
    # log-sum-exp, its backward's three gradients); the call allocates them all while it runs.
    call_outputs: tuple[tuple[int, int], ...] = ()
    # Convolutions: Inductor optimises the layout of a graph that runs one (channels-last on the CPU),
    convolutions: frozenset[int] = frozenset()
    # and fixes the layout of a dense 4-D pointwise value when it realises it for several readers: such
    # a concatenated input keeps a buffer of its own, and the cat copies it (``_concat_copies``).
    dense_4d: frozenset[int] = frozenset()
    # (call, bytes): a convolution's channels-last copy of an input the forward saves as itself (its
    # weight, the image), whose bytes are also in the call's ``scratch``.  Inductor's own kernel writes the copy
    # just before the call; after it the copy goes to the reuse pool like any buffer Inductor
    # allocates, and is held until a later buffer of its size takes its storage (``_reuse_freed``).
    # Empty: each copy counts as the call's scratch only, alive while it runs.
    pooled_copies: tuple[tuple[int, int], ...] = ()
    # Library calls with ``call_outputs`` that Inductor runs as aten's own kernel on a device where it does
    # not assume a graph input aligned (the CPU): the outputs of one that reads a graph input, or an
    # output of such a call, are marked unaligned, and Inductor's pool never hands their storage to a
    # buffer it allocates (``_unaligned_outputs``).  ``unaligned_calls``: those among them that read a
    # parameter or the user's input, whatever the plan.
    fallback_calls: frozenset[int] = frozenset()
    unaligned_calls: frozenset[int] = frozenset()
    # Reductions over the trailing dimensions of a dense input (a norm's statistics, a softmax's sums):
    # Inductor computes them row by row, in one kernel with the pointwise values of the row that they
    # read and that read them (``GraphIndex._kernel_path``).
    row_reductions: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        n = len(self.names)
        for field_name in ("bytes", "kinds", "inputs", "backward", "required"):
            if len(getattr(self, field_name)) != n:
                raise ValueError(f"PeakGraph.{field_name} has {len(getattr(self, field_name))} entries, expected {n}")
        if self.scratch and len(self.scratch) != n:
            raise ValueError(f"PeakGraph.scratch has {len(self.scratch)} entries, expected {n} (or none)")
        for i, preds in enumerate(self.inputs):
            if any(not 0 <= p < i for p in preds):
                raise ValueError(f"PeakGraph.inputs[{i}] ({self.names[i]}) must list earlier values, got {preds}")
        for source, cat in self.concat_inputs:
            if not 0 <= cat < n or source not in self.inputs[cat]:
                raise ValueError(f"PeakGraph.concat_inputs has ({source}, {cat}): {source} must be an input of {cat}")
        for field_name in ("convolutions", "dense_4d", "row_reductions"):
            outside = sorted(i for i in getattr(self, field_name) if not 0 <= i < n)
            if outside:
                raise ValueError(f"PeakGraph.{field_name} has values {outside} outside the graph's {n}")
        for call, size in self.pooled_copies:
            if not 0 <= call < n or size <= 0:
                raise ValueError(
                    f"PeakGraph.pooled_copies has ({call}, {size}): need a value of the graph's {n} and positive bytes"
                )
        for call in {call for call, _ in self.pooled_copies}:
            copied = sum(size for c, size in self.pooled_copies if c == call)
            if not self.scratch or copied > self.scratch[call]:
                raise ValueError(
                    f"PeakGraph.pooled_copies gives {self.names[call]} {copied} bytes of copies, more than its "
                    f"scratch ({self.scratch[call] if self.scratch else 0} bytes), which must include them"
                )
        calls = {call for _, call in self.call_outputs}
        if not self.fallback_calls <= calls:
            raise ValueError(
                f"PeakGraph.fallback_calls has {sorted(self.fallback_calls - calls)}, which return no "
                f"call_outputs; expected a subset of {sorted(calls)}"
            )
        not_reductions = sorted(
            self.names[i] for i in self.row_reductions if self.kinds[i] is not Materialise.REDUCTION
        )
        if not_reductions:
            raise ValueError(f"PeakGraph.row_reductions has {not_reductions}, which are not Materialise.REDUCTION")
        if not self.unaligned_calls <= self.fallback_calls:
            raise ValueError(
                f"PeakGraph.unaligned_calls has {sorted(self.unaligned_calls - self.fallback_calls)}, "
                f"which are not fallback_calls; expected a subset of {sorted(self.fallback_calls)}"
            )
        if len({output for output, _ in self.call_outputs}) != len(self.call_outputs):
            raise ValueError(f"PeakGraph.call_outputs names an output twice: {self.call_outputs}")
        for output, call in self.call_outputs:
            if not 0 <= output < n or call not in self.inputs[output]:
                raise ValueError(f"PeakGraph.call_outputs has ({output}, {call}): {call} must be an input of {output}")
            if not self.kinds[output] is self.kinds[call] is Materialise.BUFFER:
                raise ValueError(
                    f"PeakGraph.call_outputs has ({output}, {call}): both must be Materialise.BUFFER (a library "
                    f"call and its output), got {self.kinds[output].name} and {self.kinds[call].name}"
                )

    def __len__(self) -> int:
        return len(self.names)

    @functools.cached_property
    def _simulator(self) -> _Simulator:
        """The graph's tables for simulating plans, built on first use (the graph never changes)."""
        return _Simulator(self)


@dataclass(frozen=True)
class PeakPrediction:
    """The predicted peaks, where the higher one happens, and what is alive there."""

    forward_bytes: int
    backward_bytes: int
    phase: str  # "forward" or "backward"
    node: str
    alive: tuple[tuple[str, int], ...]  # the largest buffers alive at the peak, largest first
    saved_bytes: int  # materialised bytes of the saved values
    alive_values: tuple[int, ...] = ()  # every buffer alive at the peak, by value index

    @property
    def peak_bytes(self) -> int:
        return max(self.forward_bytes, self.backward_bytes)


@dataclass
class _Phase:
    peak: int = 0
    node: str = ""
    alive: tuple[tuple[str, int], ...] = ()
    values: tuple[int, ...] = ()


_KIND_CODES = {
    Materialise.BUFFER: BUFFER,
    Materialise.REDUCTION: REDUCTION,
    Materialise.FUSIBLE: FUSIBLE,
    Materialise.RANDOM: RANDOM,
    Materialise.FREE: FREE,
}

# Predictions remembered per graph: the peak search simulates the same plans again (each
# walk of the budget rule starts where another did), and a plan's prediction never changes.
_PREDICTION_MEMO = 64


class _Simulator:
    """A graph's :class:`GraphIndex` and its latest predictions, kept on the graph (see ``PeakGraph._simulator``)."""

    def __init__(self, graph: PeakGraph) -> None:
        # The graph's names and sizes, not the graph: a graph and its simulator would be a reference
        # cycle, which only the cyclic garbage collector frees.
        self.names: Sequence[str] = graph.names
        self.nbytes: Sequence[int] = graph.bytes
        self.scratch = {i: b for i, b in enumerate(graph.scratch) if b > 0}  # library calls' own working memory
        # What Inductor allocates itself, and so may hand a freed buffer of its size.
        self.takes = [
            kind in (Materialise.FUSIBLE, Materialise.REDUCTION, Materialise.RANDOM) or i in graph.out_buffers
            for i, kind in enumerate(graph.kinds)
        ]
        # Pooled input copies are buffers of their own, numbered after the graph's values.
        self.values = len(graph)
        self.input_copies: dict[int, list[int]] = {}  # call -> its copies
        if graph.pooled_copies:
            names, nbytes = list(graph.names), list(graph.bytes)
            for call, size in graph.pooled_copies:
                self.input_copies.setdefault(call, []).append(len(nbytes))
                names.append(f"{graph.names[call]} (input copy)")
                nbytes.append(size)
                self.takes.append(True)  # Inductor allocates it
                self.scratch[call] -= size
                if not self.scratch[call]:
                    del self.scratch[call]
            self.names, self.nbytes = names, nbytes
        self.index = GraphIndex(
            graph.inputs,
            [_KIND_CODES[kind] for kind in graph.kinds],
            graph.bytes,
            graph.backward,
            graph.required,
            graph.outputs,
            graph.tangents,
            graph.heavy_ops,
            graph.row_reductions,
        )
        n = len(graph)
        free = [kind is Materialise.FREE for kind in graph.kinds]
        self.free = free
        self.nothing = bytearray(n)
        self.forward_outputs = [i for i in graph.outputs if not graph.backward[i]]
        self.tangents = [i for i in graph.tangents if not free[i]]
        self.gradient_keep = bytearray(n)
        for i in graph.gradients:
            self.gradient_keep[i] = 1
        self.gradient_buffers = [i for i in graph.gradients if not free[i]]
        self.concats: dict[int, list[int]] = {}  # cat -> the inputs written into its buffer
        self.fixed = graph.concats  # buffers no kernel writes in place of
        for source, cat in graph.concat_inputs:
            self.concats.setdefault(cat, []).append(source)
        self.convolutions = tuple(graph.convolutions)
        self.dense_4d = graph.dense_4d
        self.call_outputs: dict[int, list[int]] = {}  # library call -> the outputs it allocates while it runs
        for output, call in graph.call_outputs:
            self.call_outputs.setdefault(call, []).append(output)
        self.fallback_calls = graph.fallback_calls
        self.unaligned_calls = graph.unaligned_calls
        self.inputs = graph.inputs
        self._memo: dict[tuple[frozenset[int], frozenset[int]], PeakPrediction] = {}
        self._peaks: dict[tuple[bool, frozenset[int], frozenset[int]], int] = {}  # phases simulated alone

    def predict(self, saved: frozenset[int], recomputed: frozenset[int]) -> PeakPrediction:
        key = (saved, recomputed)
        prediction = self._memo.pop(key, None)
        if prediction is None:
            prediction = self._simulate(saved, recomputed)
            if len(self._memo) >= _PREDICTION_MEMO:
                del self._memo[next(iter(self._memo))]
        self._memo[key] = prediction  # most recently used last
        return prediction

    def phase_peak(self, backward: bool, saved: frozenset[int], recomputed: frozenset[int]) -> int:
        """One phase's peak alone (the forward's depends on ``saved`` only)."""
        known = self._memo.get((saved, recomputed))
        if known is not None:
            return known.backward_bytes if backward else known.forward_bytes
        key = (backward, saved, recomputed if backward else frozenset())
        peak = self._peaks.pop(key, None)
        if peak is None:
            phase = self._backward(saved, recomputed, False) if backward else self._forward(saved, False)
            peak = phase.peak
            if len(self._peaks) >= _PREDICTION_MEMO:
                del self._peaks[next(iter(self._peaks))]
        self._peaks[key] = peak
        return peak

    def _forward(self, saved: frozenset[int], named: bool) -> _Phase:
        index, free = self.index, self.free
        forward = index.forward(saved)
        keep = bytearray(len(free))
        buffers = bytearray(forward.buffers)
        for i in itertools.chain(saved, self.forward_outputs):
            keep[i] = 1
            if not free[i]:
                buffers[i] = 1
        index.add_shared_values(forward, buffers)
        return _run(self, forward, buffers, self.nothing, (), keep, named)

    def _backward(self, saved: frozenset[int], recomputed: frozenset[int], named: bool) -> _Phase:
        index, free = self.index, self.free
        backward = index.backward_phase(recomputed)
        start = {i for i in saved if not free[i]}
        start.update(self.tangents)
        available = bytearray(len(free))
        for i in start:
            available[i] = 1
        buffers = bytearray(backward.buffers)
        for i in self.gradient_buffers:
            buffers[i] = 1
        index.add_shared_values(backward, buffers)
        return _run(self, backward, buffers, available, start, self.gradient_keep, named)

    def _simulate(self, saved: frozenset[int], recomputed: frozenset[int]) -> PeakPrediction:
        # The forward's peak may be known already (phase_peak, as a bound): it is simulated again
        # only if it is the step's peak, for where it happens and what is alive there.
        b_phase = self._backward(saved, recomputed, True)
        forward_bytes = self._peaks.get((False, saved, frozenset()))
        if forward_bytes is not None and b_phase.peak > forward_bytes:
            phase_name, top = "backward", b_phase
        else:
            f_phase = self._forward(saved, True)
            forward_bytes = f_phase.peak
            if b_phase.peak > f_phase.peak:
                phase_name, top = "backward", b_phase
            else:
                phase_name, top = "forward", f_phase
        return PeakPrediction(
            forward_bytes=forward_bytes,
            backward_bytes=b_phase.peak,
            phase=phase_name,
            node=top.node,
            alive=top.alive,
            saved_bytes=sum(self.nbytes[i] for i in saved if not self.free[i]),
            alive_values=top.values,
        )


def _last_uses(
    index: GraphIndex,
    phase: PhaseOrder,
    buffers: bytearray,
    available: bytearray,
    copied: dict[int, set[int]] | None = None,
) -> list[int]:
    """For each buffer some kernel of the phase reads: the last position whose kernel reads it (else -1).

    A kernel reads the buffers among its inputs and, through each inlined
    input, what that input's kernel reads.  One backward pass carries, for
    each value, the last position that reads through it.  ``copied``: per
    cat, the inputs it copies where they are computed (:func:`_concat_copies`),
    which the cat's own position does not read.
    """
    order, position = phase.order, phase.position
    inputs, readers = index.allocating_inputs, index.readers
    reach = [0] * len(order)  # the last position that reads through order[k] (k itself if a buffer)
    last_use = [-1] * len(buffers)
    kernel_end = phase.kernel_end
    for k in range(len(order) - 1, -1, -1):
        value = order[k]
        last = kernel_end.get(k, k)  # a kernel of several values reads its inputs until its last
        if not (buffers[value] or available[value]):
            for r in readers[value]:
                at = position[r]
                if at > k and reach[at] > last:
                    last = reach[at]
        reach[k] = last
        skip = copied.get(value) if copied else None
        for p in inputs[value]:
            if last_use[p] < last and (buffers[p] or available[p]) and not (skip and p in skip):
                last_use[p] = last
    return last_use


def _lifetimes(
    phase: PhaseOrder, buffers: bytearray, start: Iterable[int], keep: bytearray, last_use: list[int]
) -> list[tuple[int, int, int]]:
    """When each buffer is alive: ``(first, last, value)``, counted at positions ``first`` to ``last``.

    A position allocates its value if it is a buffer and not alive, takes the
    running total, then frees (unless kept) the buffers whose last reader it
    is, and its own value if nothing reads it later.  Values alive at the
    start are those of ``start`` that are kept or read.  So a buffer lives
    from its position (or the start) to its last reader (or the end, if
    kept); one freed before its own position (a start value the phase also
    computes) is allocated again there and freed at once.
    """
    end = len(phase.order) - 1
    position = phase.position
    spans: list[tuple[int, int, int]] = []
    started: set[int] = set()
    for b in set(start):
        if not keep[b] and last_use[b] < 0:
            continue  # never read: not alive
        started.add(b)
        if keep[b]:
            spans.append((0, end, b))
            continue
        last = last_use[b]
        spans.append((0, last, b))
        at = position[b] if buffers[b] else -1
        if 0 <= at and last < at:
            spans.append((at, at, b))
    for k, i in enumerate(phase.order):
        if buffers[i] and i not in started:
            last = end if keep[i] else last_use[i]
            spans.append((k, last if last > k else k, i))
    return spans


def _concat_copies(sim: _Simulator, phase: PhaseOrder, keep: bytearray) -> set[int]:
    """The concatenated inputs the phase gives a buffer of their own, which their cat copies.

    Inductor writes a pointwise input into the cat's buffer only while its
    layout is still free (``ConcatKernel.realize_into``).  It fixes the layout
    of a phase's outputs (the values a forward saves), and, in a graph that
    runs a convolution (layout optimisation), of a dense 4-D value it realises
    for several readers (``PhaseOrder.shared``): a U-Net's skip features,
    which the encoder's pooling, the decoder's cat and the backward all read.
    """
    sources = [s for inputs in sim.concats.values() for s in inputs]
    copies = {s for s in sources if keep[s]}
    position = phase.position
    if any(position[c] >= 0 for c in sim.convolutions):
        shared = set(phase.shared)
        copies.update(s for s in sources if s in sim.dense_4d and s in shared)
    return copies


def _write_into_concats(
    spans: list[tuple[int, int, int]], order: Sequence[int], concats: dict[int, list[int]], copies: set[int]
) -> None:
    """Let the pointwise inputs of a concatenation be written straight into its buffer.

    Inductor allocates a ``cat``'s output on the CPU and computes each of its
    pointwise inputs into its slice of it (``ConcatKernel``, whose inputs get a
    ``NonOwningLayout``): the input has no buffer of its own, and the cat's
    whole buffer is alive from the first such input's kernel until the last
    read of the cat or of any of them.  In a U-Net the encoder's feature that
    a skip connection concatenates is written into the decoder's buffer, so
    that buffer is alive from the encoder on.  An input in ``copies``
    (:func:`_concat_copies`) keeps its own buffer, and its kernel also writes
    the copy (the scheduler fuses it there), so the cat's buffer is alive
    from that kernel on as well, and the cat itself no longer reads it.
    Only inputs the phase computes and allocates count; the cat must
    allocate in the phase too.
    """
    where = {b: at for at, (first, _, b) in enumerate(spans) if order[first] == b}
    dropped: set[int] = set()  # (a value written into two cats has its own buffer in the second)
    for cat, sources in concats.items():
        at = where.get(cat)
        if at is None:
            continue
        first, last, _ = spans[at]
        for source in sources:
            k = where.get(source)
            if k is None or k in dropped:
                continue
            source_first, source_last, _ = spans[k]
            first = min(first, source_first)
            if source not in copies:
                last = max(last, source_last)
                dropped.add(k)
        spans[at] = (first, last, cat)
    if dropped:
        spans[:] = [span for k, span in enumerate(spans) if k not in dropped]


def _reuse_in_place(
    spans: list[tuple[int, int, int]],
    phase: PhaseOrder,
    kinds: Sequence[int],
    nbytes: Sequence[int],
    keep: bytearray,
    fixed: frozenset[int] = frozenset(),
) -> dict[int, int]:
    """Let each kernel of Inductor's write its output into an input of the same size that dies there.

    Inductor's own kernels (pointwise values, reductions, random draws; not
    library calls) store their output in place of an input buffer whose last
    reader they are, when the sizes match: the input's bytes pass to the
    output, so its span ends just before.  Among several such inputs the one
    with the lowest value index is taken; each input serves one output.  In a
    kernel that joins siblings (``phase.sole_inputs``), whose inputs die at its
    end, a value takes only an input that no other value of the kernel reads.
    A concatenation's buffer (``fixed``) is never taken: Inductor does not
    write in place of a ``ConcatKernel``'s output.  A value that loads a
    realised value of its size which only its kernel reads takes only an
    input loaded before that one (``phase.in_place_reads``).
    Returns, for each position whose output took an input's bytes, the span
    (by index) that gave them.
    """
    order, joined, loaded = phase.order, phase.sole_inputs, phase.in_place_reads
    outputs: dict[int, int] = {}  # position -> the kernel output allocated there
    members: dict[int, list[int]] = {}  # a joined kernel's end -> the positions of its outputs
    for first, _, b in spans:
        if order[first] == b and nbytes[b] and kinds[b] != BUFFER and kinds[b] != FREE:
            if b in joined:
                members.setdefault(phase.kernel_end[first], []).append(first)
            else:
                outputs[first] = b
    if not outputs and not members:
        return {}
    donors: dict[int, int] = {}  # position -> the span of the input its output takes over
    for at, (first, last, b) in enumerate(spans):
        if keep[b] or b in fixed:
            continue
        output = outputs.get(last)
        if output is not None and first < last and nbytes[b] == nbytes[output] and b in loaded.get(output, (b,)):
            known = donors.get(last)
            if known is None or b < spans[known][2]:
                donors[last] = at
        for k in members.get(last, ()):
            v = order[k]
            if first < k and nbytes[b] == nbytes[v] and b in joined[v] and b in loaded.get(v, (b,)):
                known = donors.get(k)
                if known is None or b < spans[known][2]:
                    donors[k] = at
    for k, at in donors.items():
        first, _, donor = spans[at]
        spans[at] = (first, k - 1, donor)
    return donors


def _reuse_freed(
    spans: list[tuple[int, int, int]],
    order: Sequence[int],
    nbytes: Sequence[int],
    takes: Sequence[bool],
    keep: bytearray,
    start: set[int],
    in_place: tuple[set[int], set[int]],
    values: int,
    unpooled: set[int],
    estimate: list[int],
) -> None:
    """Hold each freed buffer that a later allocation of its size takes over, until that allocation.

    Inductor's wrapper does not free a buffer whose last reader has run if
    a later buffer of the same size can take its storage: it keeps the
    buffer in a pool and hands it over then (``allow_buffer_reuse``), the
    most recently freed first, unless holding it would raise Inductor's own
    estimate of the peak (:func:`_holds_under_peak`).  Buffers the phase's kernels allocate and
    free go to the pool (not its inputs, not what it keeps); what Inductor
    allocates itself takes from it (its kernels' outputs and the library
    calls it passes an ``out=`` buffer, ``takes``).  A held buffer's span
    runs on to the position before its taker's.  Buffers numbered from
    ``values`` on are a library call's input copies (``PeakGraph.pooled_copies``),
    allocated at the call's position before its output.  ``unpooled`` buffers
    never go to the pool (unaligned outputs, :func:`_unaligned_outputs`).
    """
    taken_in_place, gave_in_place = in_place
    alloc_at: dict[int, list[int]] = {}  # position -> spans of the buffers allocated there, in order
    freed_at: dict[int, list[int]] = {}  # position -> spans whose buffer is freed after it
    end = len(order) - 1
    for s, (first, last, b) in enumerate(spans):
        copy = b >= values
        if b in start or not nbytes[b] or (not copy and order[first] != b):
            continue
        alloc_at.setdefault(first, []).append(s)
        if (copy or not keep[b]) and s not in gave_in_place and last < end and b not in unpooled:
            freed_at.setdefault(last, []).append(s)
    if not freed_at:
        return
    # Inductor's own estimate of the phase's memory at each kernel that allocates (its scheduler
    # nodes), from the lifetimes without the pool: it declines a reuse that would raise its peak.
    overall = max(estimate)
    nodes = sorted(alloc_at)
    pool: dict[int, list[int]] = {}  # bytes -> spans freed, most recent last
    for k in sorted(alloc_at.keys() | freed_at.keys()):  # at each position: allocate, then free
        takers = alloc_at.get(k, [])
        if len(takers) > 1:  # a call's copies are written by the kernel before it: they come first
            takers.sort(key=lambda t: spans[t][2] < values)
        for taker in takers:
            if not pool:
                break
            b = spans[taker][2]
            if takes[b] and (b >= values or k not in taken_in_place):
                held = pool.get(nbytes[b])
                if held:
                    first, freed_after, donor = spans[held[-1]]
                    if _holds_under_peak(estimate, overall, nodes, freed_after, k, nbytes[b]):
                        spans[held.pop()] = (first, k - 1, donor)
        freed = freed_at.get(k)
        if freed is not None:
            if len(freed) > 1:
                freed.sort(key=lambda d: spans[d][2])
            for d in freed:
                pool.setdefault(nbytes[spans[d][2]], []).append(d)


def _inductor_estimate(
    sim: _Simulator,
    phase: PhaseOrder,
    spans: list[tuple[int, int, int]],
    copy_spans: list[tuple[int, int, int]],
    buffers: bytearray,
    start: set[int],
) -> list[int]:
    """Inductor's own estimate of the bytes alive at each position, from the buffers' lifetimes ``spans``.

    Inductor estimates its graph's memory from its scheduler's buffers
    (``torch._inductor.memory.estimate_peak_memory``), which knows nothing of
    its later storage sharing: a concatenation's inputs and an output written
    in place of an input are buffers of their own, a value realised for
    several readers that one fused kernel reads counts while that kernel
    runs, and a library call's outputs are all allocated where it runs.
    ``spans`` are the lifetimes before any storage is shared, ``copy_spans``
    the library calls' pooled input copies.
    """
    nbytes, position = sim.nbytes, phase.position
    counted = spans + copy_spans
    if sim.call_outputs:
        _allocate_with_calls(counted, phase, sim.call_outputs, start)
    for cat in sim.fixed:
        at = position[cat]
        if at >= 0 and sim.inputs[cat]:  # the copy of its last input into its buffer, a buffer of its own
            counted.append((at, at, sim.inputs[cat][-1]))
    kernels_at = bytearray(buffers)  # what ends a chain of inlined values: buffers and realised values
    for v in phase.shared:
        kernels_at[v] = 1
    for v in phase.shared:
        if not buffers[v] and nbytes[v]:
            at = sim.index.first_kernel(v, phase, kernels_at)
            if at >= 0:
                counted.append((at, at, v))
    return _lifetime_totals(counted, nbytes, len(phase.order))


def _lifetime_totals(spans: list[tuple[int, int, int]], nbytes: Sequence[int], positions: int) -> list[int]:
    """The bytes alive at each position, given each buffer's span."""
    change = [0] * (positions + 1)
    for first, last, b in spans:
        change[first] += nbytes[b]
        change[last + 1] -= nbytes[b]
    return list(itertools.accumulate(change[:-1]))


def _holds_under_peak(
    estimate: list[int], overall: int, nodes: list[int], freed_after: int, taker: int, size: int
) -> bool:
    """Whether Inductor hands a buffer freed after ``freed_after`` to the one allocated at ``taker``.

    Its wrapper (``AllocateLine.should_reuse_buffer``) always does when no
    kernel that allocates runs in between; otherwise only if holding the
    buffer there keeps its own estimate (``estimate`` at the ``nodes``) within
    that estimate's peak (``overall``), and then it counts the held bytes in
    the estimate.  A declined buffer stays in the pool, freed where its last
    reader ran unless a later buffer of its size takes it.
    """
    lo, hi = bisect.bisect_right(nodes, freed_after), bisect.bisect_left(nodes, taker)
    if lo >= hi:
        return True
    between = nodes[lo:hi]
    if size + max(estimate[k] for k in between) > overall:
        return False
    for k in between:
        estimate[k] += size
    return True


def _unaligned_outputs(sim: _Simulator, phase: PhaseOrder, start: set[int]) -> set[int]:
    """The outputs of the phase's fallback calls that Inductor marks unaligned, and so never reuses.

    On the CPU Inductor does not assume a graph input aligned, and marks the
    outputs of aten's own kernel unaligned when it reads one (or reads an
    unaligned output): a graph input is a parameter or the user's input
    (``PeakGraph.unaligned_calls``), or in the backward a value it starts
    with (a saved value, a tangent).  Its pool keys buffers by alignment, so
    such an output is freed after its last reader, never held for a later
    buffer of its size: attention's gradients of a saved output in a
    backward, while a recomputed attention's are reused.
    """
    unaligned: set[int] = set()
    inputs, calls = sim.inputs, sim.call_outputs
    position = phase.position
    for call in sorted((c for c in sim.fallback_calls if position[c] >= 0), key=position.__getitem__):
        if call in sim.unaligned_calls or any(p in start or p in unaligned for p in inputs[call]):
            unaligned.update(calls[call])
    return unaligned


def _inputs_storage(
    unpooled: set[int],
    donors: dict[int, int],
    spans: list[tuple[int, int, int]],
    order: Sequence[int],
    start: set[int],
) -> None:
    """Add to ``unpooled`` the outputs written in place of a buffer the phase starts with, or of one so written.

    In the backward the values it starts with are graph inputs (the saved
    values AOTAutograd donates, the tangents).  Inductor writes a kernel's
    output in their storage as in any buffer's, but after its last reader
    frees that storage rather than hand it to a later buffer of its size:
    a dropout's mask turned into its gradient.
    """
    for k in sorted(donors):
        donor = spans[donors[k]][2]
        if donor in start or donor in unpooled:
            unpooled.add(order[k])


def _allocate_with_calls(
    spans: list[tuple[int, int, int]], phase: PhaseOrder, calls: dict[int, list[int]], start: set[int]
) -> None:
    """Let a library call's outputs be alive from the call on, not from where each is picked out.

    A call that returns several tensors (``PeakGraph.call_outputs``)
    allocates them all while its inputs are alive; the graph picks each out
    at a position of its own, after the call, and may free the call's inputs
    in between.  Each output the phase allocates after its call (not one it
    starts with) is counted from the call's position on.
    """
    order, position = phase.order, phase.position
    own = {b: s for s, (first, _, b) in enumerate(spans) if order[first] == b and b not in start}
    for call, outputs in calls.items():
        at = position[call]
        if at < 0:
            continue
        for output in outputs:
            s = own.get(output)
            if s is not None and spans[s][0] > at:
                spans.append((at, spans[s][0] - 1, output))


def _run(
    sim: _Simulator,
    phase: PhaseOrder,
    buffers: bytearray,
    available: bytearray,
    start: Iterable[int],
    keep: bytearray,
    named: bool = True,
) -> _Phase:
    """The phase's peak, and if ``named`` where it happens and what is alive there.

    The running total after each position's allocation is a prefix sum over
    the buffers' lifetimes, plus at each library call the ``scratch`` it
    allocates while it runs; the peak is its first maximum.  ``sim`` holds
    the graph's tables.
    """
    names, nbytes, index, scratch = sim.names, sim.nbytes, sim.index, sim.scratch
    order = phase.order
    if not order:  # an empty phase: what it starts with
        return _Phase(sum(nbytes[b] for b in set(start)), "", ())
    copies = _concat_copies(sim, phase, keep) if sim.concats else set()
    copied = {cat: {s for s in sources if s in copies} for cat, sources in sim.concats.items()} if copies else None
    spans = _lifetimes(phase, buffers, start, keep, _last_uses(index, phase, buffers, available, copied))
    copy_spans = [
        (k, k, copy) for call, pooled in sim.input_copies.items() if (k := phase.position[call]) >= 0 for copy in pooled
    ]
    start_set = set(start)
    estimate = _inductor_estimate(sim, phase, spans, copy_spans, buffers, start_set)
    if sim.concats:
        _write_into_concats(spans, order, sim.concats, copies)
    donors = _reuse_in_place(spans, phase, index.kinds, nbytes, keep, sim.fixed)
    in_place = (set(donors), set(donors.values()))
    spans.extend(copy_spans)
    unpooled = _unaligned_outputs(sim, phase, start_set) if sim.fallback_calls else set()
    if donors:
        _inputs_storage(unpooled, donors, spans, order, start_set)
    _reuse_freed(spans, order, nbytes, sim.takes, keep, start_set, in_place, sim.values, unpooled, estimate)
    if sim.call_outputs:
        _allocate_with_calls(spans, phase, sim.call_outputs, start_set)
    totals = _lifetime_totals(spans, nbytes, len(order))
    position = phase.position
    for value, extra in scratch.items():  # a library call's working memory, while it runs
        k = position[value]
        if k >= 0:
            totals[k] += extra
    peak = max(totals)
    if not named:
        return _Phase(peak)
    at = totals.index(peak)
    there = {b for first, last, b in spans if first <= at <= last}
    items = [(-nbytes[b], b, names[b]) for b in there]
    extra = scratch.get(order[at], 0)
    if extra:  # the call's own working memory, named after the call
        items.append((-extra, -1, f"{names[order[at]]} (scratch)"))
    top = tuple((name, -negative) for negative, _, name in sorted(items)[:8])
    return _Phase(peak, names[order[at]], top, tuple(sorted(b for b in there if b < sim.values)))


def simulate_peak(graph: PeakGraph, saved: Iterable[int], recomputed: Iterable[int]) -> PeakPrediction:
    """The forward and backward peaks of the plan that saves ``saved`` and recomputes ``recomputed``.

    Indices are values of ``graph``.  Bytes are above what is resident before
    the forward starts.
    """
    return graph._simulator.predict(frozenset(saved), frozenset(recomputed))


def backward_peak(graph: PeakGraph, saved: Iterable[int], recomputed: Iterable[int]) -> int:
    """``simulate_peak(graph, saved, recomputed).backward_bytes``, without simulating the forward."""
    return graph._simulator.phase_peak(True, frozenset(saved), frozenset(recomputed))


def forward_peak(graph: PeakGraph, saved: Iterable[int]) -> int:
    """``simulate_peak(graph, saved, recomputed).forward_bytes``: the forward depends on ``saved`` only."""
    return graph._simulator.phase_peak(False, frozenset(saved), frozenset())


def predict_plan(graph: PeakGraph, plan: Plan) -> PeakPrediction:
    """The predicted peak of ``plan``, whose indices are the problem's values (``graph.problem_index``)."""
    mapping = graph.problem_index
    return simulate_peak(graph, (mapping[i] for i in plan.saved), (mapping[i] for i in plan.recomputed))
