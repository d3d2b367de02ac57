"""From an AOTAutograd joint graph to a plain-data :class:`Problem`.

This is the only place that reads the FX joint graph for planning; it
returns data and changes nothing.

**Which values.**  The backward (everything downstream of the tangents)
reads some forward values.  Views are free to recompute, so a read of a view
is a read of the tensor it aliases: the *root*.  The problem holds the roots
the backward reads (``needed``) and, transitively, the roots they are computed
from, down to the graph inputs.  A saved view would keep its whole base
storage alive anyway, so this also makes the byte count exact.

**Hard constraints** come from :mod:`ckpt.partitioner.joint_graph`.

**Costs** (seconds on the device profile, stored as integer picoseconds):

* saving: the backward reads the tensor; the forward also writes it if it
  would otherwise stay inside a fused kernel (not if a library call reads it,
  nor if it is read again after a library call computed from it, as the
  residual stream is: see :func:`_read_across_calls`);
* recomputing a fusible op: its per-element arithmetic only (transcendental
  functions at their own, higher rate), because Inductor fuses it
  into the backward kernel that consumes it and the chain's inputs are read
  there (charged to those inputs); a reduction also reads its input once
  more, in a loop of its own; if a consumer is a library call (matmul,
  convolution), the value must be materialised: a write, a read and a launch;
* recomputing a library call: its time measured on the device where it was
  (:mod:`ckpt.cost_model.measured`), else its full roofline time;
* values the forward does not compute anyway (used only by the backward)
  cost nothing extra to compute in the backward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.measured import MeasuredCall, library_calls
from ckpt.cost_model.node_cost import (
    NodeEstimate,
    Size,
    SizeEvaluator,
    estimate_node,
    numel_expr,
    storage_bytes_expr,
)
from ckpt.cost_model.ops import OpKind
from ckpt.cost_model.profiles import DeviceProfile
from ckpt.cost_model.roofline import (
    elementwise_seconds,
    kernel_seconds,
    tensor_read_seconds,
    tensor_write_seconds,
    transfer_seconds,
)
from ckpt.partitioner.joint_graph import (
    JointGraph,
    classify_joint,
    read_roots,
    recompute_constraint,
    root_of,
    save_constraint,
)
from ckpt.partitioner.problem import Problem, ProblemError, evaluate

__all__ = ["JointAnalysis", "analyze_joint", "to_picoseconds"]

log = logging.getLogger(__name__)

_FUSIBLE_KINDS = (OpKind.FUSIBLE, OpKind.VIEW, OpKind.GETITEM, OpKind.RANDOM)


def to_picoseconds(seconds: float) -> int:
    return max(0, round(seconds * 1e12))


@dataclass(frozen=True)
class JointAnalysis:
    """The problem, and how its values map back to the joint graph."""

    problem: Problem
    nodes: tuple[fx.Node, ...]  # problem index -> joint graph node
    estimates: dict[str, NodeEstimate]  # by node name, for every call_function node
    no_recompute_saved: frozenset[int]  # the plan that recomputes nothing it can save
    no_recompute_bytes: int
    reference_saved: frozenset[int]  # what eager autograd saves: fractions are relative to this plan
    reference_bytes: int
    fixed_seconds: float  # estimated forward + backward time without saving or recomputing
    reasons: dict[str, str]  # why a value cannot be saved or recomputed, by "<node name>:save" or ":recompute"
    forward_names: frozenset[str]  # call_function nodes of the forward side
    root_names: dict[str, str]  # view name -> name of the value whose storage it aliases
    save_bytes_exprs: tuple[Size, ...]  # save_bytes as expressions in the size symbols
    size_hints: dict[Any, int]  # size symbol -> hint
    copied_inputs: frozenset[str] = frozenset()  # graph inputs Inductor copies to channels-last (by name)
    # Those of them the forward saves as themselves, not as their copies (see extract.save_inputs_uncopied).
    uncopied_inputs: frozenset[str] = frozenset()
    measured_seconds: dict[str, float] = field(default_factory=dict)  # library calls timed on the device, by name
    scratch_bytes: dict[str, int] = field(default_factory=dict)  # their working memory beyond their outputs, by name
    # Inductor switches this graph's convolutions to channels-last (compat.inductor_layout_optimization).
    layout_optimised: bool = False


@dataclass(frozen=True)
class _Costs:
    """One problem value's row: what saving and recomputing it cost, and whether each is allowed."""

    save_bytes: int
    save_bytes_expr: Size
    recompute_bytes: int
    save_time: int
    recompute_time: int
    save_reason: str | None
    recompute_reason: str | None


@dataclass
class _Context:
    """What pricing one value needs to know about the whole joint graph."""

    profile: DeviceProfile
    sizes: SizeEvaluator
    graph: JointGraph
    kinds: dict[fx.Node, OpKind]
    estimates: dict[fx.Node, NodeEstimate]
    users: dict[fx.Node, list[fx.Node]]  # users of each root, looking through views
    fwd_output_roots: set[fx.Node]
    charged_inputs: set[fx.Node]  # graph inputs whose saving keeps memory alive
    copied_inputs: set[fx.Node]  # graph inputs Inductor copies to channels-last for its convolutions
    uncopied_inputs: set[fx.Node]  # those of them saved as themselves
    layout_optimised: bool  # Inductor runs the graph's convolutions channels-last
    read_across_calls: set[fx.Node] = field(default_factory=set)  # see _read_across_calls
    measured: dict[str, float] = field(default_factory=dict)  # measured seconds of library calls, by node name
    scratch: dict[str, int] = field(default_factory=dict)  # their measured working memory in bytes, by node name

    def library_seconds(self, node: fx.Node, estimate: NodeEstimate) -> float:
        """A library call's time: measured on the device if it was, else its roofline."""
        measured = self.measured.get(node.name)
        return measured if measured is not None else _library_call_seconds(self.profile, estimate)


def analyze_joint(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    profile: DeviceProfile,
    activation_inputs: frozenset[int] = frozenset(),
    autograd_saved: Sequence[str] | None = None,
    measure: Callable[[Mapping[str, MeasuredCall]], Mapping[str, float]] | None = None,
) -> JointAnalysis:
    """Build the save-or-recompute problem for ``joint`` on ``profile``.

    ``autograd_saved`` names the values eager autograd saves
    (:func:`ckpt.partitioner.joint_graph.autograd_saved_names`, read before
    CSE); the plan that saves them is the reference of fractional budgets.
    Without it, the reference is the no-recompute plan.

    ``activation_inputs`` are positions among the graph's primal inputs that
    hold activations of earlier autograd work (the output of the graph before
    a graph break): saving one of those keeps it alive, so it is charged like
    any saved value.  Other inputs (parameters, buffers, the user's tensors)
    live anyway and are free to save.

    ``measure`` times library calls (:func:`ckpt.cost_model.measured.measured_costs`):
    it gets the graph's calls that can be timed, by node name, and returns
    seconds by node name; those replace the roofline time of the call.  If
    it also has a ``scratch_bytes`` method (an :class:`OpCosts` does), the
    calls' measured working memory goes to ``scratch_bytes`` for the peak
    model.
    """
    context = _context(joint, num_fwd_outputs, profile, activation_inputs)
    if measure is not None:
        calls = library_calls(
            joint.graph,
            context.kinds,
            context.estimates,
            lambda e: _library_call_seconds(profile, e),
            context.sizes,
            channels_last=context.layout_optimised,
        )
        context.measured = dict(measure(calls))
        scratch = getattr(measure, "scratch_bytes", None)  # an OpCosts also knows each call's working memory
        if scratch is not None:
            context.scratch = dict(scratch(calls))
    kinds, graph = context.kinds, context.graph
    needed, ordered = _problem_values(graph, kinds)
    index = {node: i for i, node in enumerate(ordered)}
    rows = [_price(node, context) for node in ordered]
    problem = Problem(
        names=tuple(n.name for n in ordered),
        inputs=tuple(tuple(sorted({index[r] for r in read_roots(n, kinds)})) for n in ordered),
        needed=tuple(n in needed for n in ordered),
        save_bytes=tuple(r.save_bytes for r in rows),
        save_time=tuple(r.save_time for r in rows),
        recompute_time=tuple(r.recompute_time for r in rows),
        can_save=tuple(r.save_reason is None for r in rows),
        can_recompute=tuple(r.recompute_reason is None for r in rows),
        recompute_bytes=tuple(r.recompute_bytes for r in rows),
    )
    reasons: dict[str, str] = {}
    for node, row in zip(ordered, rows):
        if row.save_reason:
            reasons[f"{node.name}:save"] = row.save_reason
        if row.recompute_reason:
            reasons[f"{node.name}:recompute"] = row.recompute_reason
    baseline = _no_recompute_plan(problem)
    root_names = {n.name: root_of(n, kinds).name for n in context.estimates if root_of(n, kinds) is not n}
    reference = baseline if autograd_saved is None else _reference_plan(problem, baseline, autograd_saved, root_names)
    return JointAnalysis(
        problem=problem,
        nodes=tuple(ordered),
        estimates={n.name: e for n, e in context.estimates.items()},
        no_recompute_saved=baseline,
        no_recompute_bytes=evaluate(problem, baseline)[1],
        reference_saved=reference,
        reference_bytes=evaluate(problem, reference)[1],
        fixed_seconds=_fixed_seconds(context),
        reasons=reasons,
        forward_names=frozenset(
            n.name for n in joint.graph.nodes if n.op == "call_function" and n not in graph.backward
        ),
        root_names=root_names,
        save_bytes_exprs=tuple(r.save_bytes_expr for r in rows),
        size_hints=context.sizes.hints,
        copied_inputs=frozenset(n.name for n in context.copied_inputs),
        uncopied_inputs=frozenset(n.name for n in context.uncopied_inputs),
        layout_optimised=context.layout_optimised,
        measured_seconds=dict(context.measured),
        scratch_bytes=dict(context.scratch),
    )


def _context(
    joint: fx.GraphModule, num_fwd_outputs: int, profile: DeviceProfile, activation_inputs: frozenset[int]
) -> _Context:
    """Estimate every node once and classify the graph."""
    sizes = SizeEvaluator.for_graph(joint.graph)
    estimates: dict[fx.Node, NodeEstimate] = {
        node: estimate_node(node, sizes) for node in joint.graph.nodes if node.op == "call_function"
    }
    kinds: dict[fx.Node, OpKind] = {node: est.kind for node, est in estimates.items()}
    for node in joint.graph.nodes:
        kinds.setdefault(node, OpKind.OTHER)
    graph = classify_joint(joint, num_fwd_outputs, kinds)
    users: dict[fx.Node, list[fx.Node]] = {}
    for node in joint.graph.nodes:
        if node.op == "output" or kinds[node] is OpKind.VIEW:
            continue
        for root in read_roots(node, kinds):
            users.setdefault(root, []).append(node)
    layout_optimised = compat.inductor_layout_optimization(joint)  # asked once per graph: ~1 ms with convolutions
    copied_inputs = _inputs_copied_for_convolution(joint, lambda n: root_of(n, kinds)) if layout_optimised else set()
    uncopied_inputs = {n for n in copied_inputs if _can_save_uncopied(n.meta.get("val"))}
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
    charged_inputs = (copied_inputs - uncopied_inputs) | {
        primals[i] for i in sorted(activation_inputs) if i < len(primals)
    }
    return _Context(
        profile=profile,
        sizes=sizes,
        graph=graph,
        kinds=kinds,
        estimates=estimates,
        users=users,
        fwd_output_roots={root_of(n, kinds) for n in graph.fwd_outputs},
        charged_inputs=charged_inputs,
        copied_inputs=copied_inputs,
        uncopied_inputs=uncopied_inputs,
        layout_optimised=layout_optimised,
        read_across_calls=_read_across_calls(joint, graph, kinds, users),
    )


def _read_across_calls(
    joint: fx.GraphModule, graph: JointGraph, kinds: dict[fx.Node, OpKind], users: dict[fx.Node, list[fx.Node]]
) -> set[fx.Node]:
    """Fused forward values that are read again after a library call computed from them.

    No one kernel can read such a value on both sides of the call, so the
    forward holds it in memory whatever the plan saves: the residual stream
    of a transformer, read by a block's first norm and again by the sum
    after the block's last matmul, which Inductor writes in place of that
    matmul's output.  A plan that does not save it leaves Inductor to
    recompute its chain of sums inline in every kernel that reads it, each
    kernel reading every term (the blocks' kernels then differ, and so does
    their source, compiled once per block).  Saving it costs the backward's
    read only, as for the inputs of a library call.
    """
    forward = [n for n in joint.graph.nodes if n.op != "output" and n not in graph.backward]
    position = {n: i for i, n in enumerate(forward)}
    first_call: dict[fx.Node, int] = {}  # the earliest library call computed from each value
    for node in reversed(forward):
        earliest = len(forward)
        for user in node.users:
            at = position.get(user)
            if at is not None:
                earliest = min(earliest, at if kinds[user] not in _FUSIBLE_KINDS else first_call[user])
        first_call[node] = earliest
    return {
        node
        for node in forward
        if node.op == "call_function"
        and kinds[node] in _FUSIBLE_KINDS
        and any(position.get(user, -1) > first_call[node] for user in users.get(node, []))
    }


def _problem_values(graph: JointGraph, kinds: dict[fx.Node, OpKind]) -> tuple[set[fx.Node], list[fx.Node]]:
    """The roots the backward reads, and those roots with everything they are computed from, in graph order."""
    needed: set[fx.Node] = set()
    for node in graph.backward:
        for root in read_roots(node, kinds):
            if root not in graph.backward:
                needed.add(root)
    for node in graph.bwd_outputs:
        if node not in graph.backward:
            needed.add(root_of(node, kinds))
    members: set[fx.Node] = set()
    stack = list(needed)
    while stack:
        node = stack.pop()
        if node in members:
            continue
        members.add(node)
        stack.extend(read_roots(node, kinds))
    return needed, sorted(members, key=graph.order.__getitem__)


def _price(node: fx.Node, context: _Context) -> _Costs:
    """Saving and recomputing ``node``: bytes, time and the hard constraints."""
    kind = context.kinds[node]
    value = node.meta.get("val")
    nbytes_expr: Size = storage_bytes_expr(value) if isinstance(value, torch.Tensor) else 0
    # A graph input is available to the backward for free (only its read costs time),
    # unless it is an activation passed in, or Inductor hands the backward a copy of it.
    is_free_input = node.op == "placeholder" and node not in context.charged_inputs
    return _Costs(
        save_bytes=0 if is_free_input else context.sizes(nbytes_expr),
        save_bytes_expr=0 if is_free_input else nbytes_expr,
        # A random op that a checkpoint region recomputes replays the forward's RNG state,
        # which torch saves for the backward.
        recompute_bytes=compat.rng_state_bytes(value) if kind is OpKind.RANDOM else 0,
        save_time=to_picoseconds(_save_seconds(node, context)),
        recompute_time=to_picoseconds(_recompute_seconds(node, context)),
        save_reason=save_constraint(node, context.graph),
        recompute_reason=recompute_constraint(node, kind, context.graph, context.kinds),
    )


def _save_seconds(node: fx.Node, context: _Context) -> float:
    """The backward reads a saved value; a value that would stay inside a fused kernel is also written."""
    value = node.meta.get("val")
    if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)) or compat.is_opaque_value(value):
        return 0.0
    kinds, profile = context.kinds, context.profile
    nbytes = elements = itemsize = 0
    if isinstance(value, torch.Tensor):
        nbytes = context.sizes(storage_bytes_expr(value))
        elements = context.sizes(numel_expr(value))
        itemsize = value.element_size()
    seconds = tensor_read_seconds(profile, nbytes, elements, itemsize)
    fusible = kinds[node] in _FUSIBLE_KINDS and node.op == "call_function"
    extern_forward_user = any(
        kinds[u] not in _FUSIBLE_KINDS for u in context.users.get(node, []) if u not in context.graph.backward
    )
    materialised = extern_forward_user or node in context.read_across_calls or node in context.fwd_output_roots
    if fusible and not materialised:
        seconds += tensor_write_seconds(profile, nbytes, elements, itemsize)
    return seconds


def _recompute_seconds(node: fx.Node, context: _Context) -> float:
    """Fused ops cost their arithmetic (and a round trip if a library call reads them); others their roofline."""
    kind, profile = context.kinds[node], context.profile
    estimate = context.estimates.get(node)
    in_forward = node in context.graph.forward_required or node.op == "placeholder"
    if not in_forward or estimate is None or kind is OpKind.GETITEM:
        return 0.0
    if not (kind in _FUSIBLE_KINDS and node.op == "call_function"):
        return context.library_seconds(node, estimate)
    seconds = elementwise_seconds(profile, estimate.elements, estimate.transcendental, estimate.random)
    if compat.is_reduction_op(node.target):
        # A reduction reads its whole input in a loop of its own, before the loop of the kernel that
        # consumes its result reads that input again: a norm's statistics recomputed in the
        # backward read the activation once more, where saving them costs a few bytes.
        seconds += transfer_seconds(profile, estimate.bytes_read)
    if any(context.kinds[u] not in _FUSIBLE_KINDS for u in context.users.get(node, [])):
        seconds += 2 * transfer_seconds(profile, estimate.bytes_written) + profile.kernel_overhead
    return seconds


def _inputs_copied_for_convolution(joint: fx.GraphModule, root: Any) -> set[fx.Node]:
    """Graph inputs Inductor converts to channels-last copies for its convolutions (in a layout-optimised graph)."""
    copied: set[fx.Node] = set()
    for node in joint.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.convolution.default:
            continue
        for arg in node.args[:2]:
            if not isinstance(arg, fx.Node):
                continue
            base = root(arg)
            value = base.meta.get("val")
            if (
                base.op == "placeholder"
                and isinstance(value, torch.Tensor)
                and value.dim() == 4
                and not value.is_contiguous(memory_format=torch.channels_last)
            ):
                copied.add(base)
    return copied


def _can_save_uncopied(value: Any) -> bool:
    """Whether a graph input Inductor copies to channels-last can be saved as a 1-d view of itself.

    It must be contiguous, so that the view is its own storage, and of known
    size.  :func:`ckpt.partitioner.extract.save_inputs_uncopied` does it.
    """
    return (
        isinstance(value, torch.Tensor) and all(isinstance(size, int) for size in value.shape) and value.is_contiguous()
    )


def _no_recompute_plan(problem: Problem) -> frozenset[int]:
    """Save every value the backward reads; recompute only what cannot be saved."""
    saved: set[int] = set()
    seen: set[int] = set()
    stack = [i for i in range(len(problem)) if problem.needed[i]]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        if problem.can_save[i]:
            saved.add(i)
        else:
            stack.extend(problem.inputs[i])
    return frozenset(saved)


def _reference_plan(
    problem: Problem, baseline: frozenset[int], names: Sequence[str], root_names: dict[str, str]
) -> frozenset[int]:
    """The plan that saves what autograd saves (views count as their base).

    Values autograd saves that ours cannot are dropped (the backward
    recomputes them), and values that cannot be recomputed are saved as in
    the no-recompute plan.  If that is still no valid plan, the no-recompute
    plan is the reference.
    """
    index = {name: i for i, name in enumerate(problem.names)}
    saved = {index[root] for root in (root_names.get(n, n) for n in names) if root in index}
    saved = {i for i in saved if problem.can_save[i]}
    saved |= {i for i in baseline if not problem.can_recompute[i]}
    try:
        evaluate(problem, saved)
    except ProblemError as error:
        log.info("ckpt: what autograd saves is no valid plan here (%s); the reference is the no-recompute plan", error)
        return baseline
    return frozenset(saved)


def _library_call_seconds(profile: DeviceProfile, estimate: NodeEstimate) -> float:
    efficiency = profile.conv_efficiency if estimate.convolution else 1.0
    return kernel_seconds(
        profile, estimate.flops, estimate.bytes_read + estimate.bytes_written, estimate.dtype_class, efficiency
    )


def _fixed_seconds(context: _Context) -> float:
    """A rough forward + backward time: library calls at roofline, fused chains by their materialised tensors."""
    kinds, profile = context.kinds, context.profile
    total = 0.0
    for node, estimate in context.estimates.items():
        kind = kinds[node]
        if kind in (OpKind.VIEW, OpKind.GETITEM, OpKind.OTHER):
            continue
        if kind not in _FUSIBLE_KINDS:
            total += context.library_seconds(node, estimate)
            continue
        total += elementwise_seconds(profile, estimate.elements, estimate.transcendental, estimate.random)
        node_users = context.users.get(node, [])
        if not node_users or any(kinds[u] not in _FUSIBLE_KINDS or u.op == "output" for u in node_users):
            total += 2 * transfer_seconds(profile, estimate.bytes_written) + profile.kernel_overhead
    return total
