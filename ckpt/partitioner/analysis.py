"""From an AOTAutograd joint graph to a plain-data :class:`Problem`.

This is the only place that reads the FX joint graph for planning; it
returns data and changes nothing.

**Which values.**  The backward (everything downstream of the tangents)
reads some forward values.  Views are free to recompute, so a read of a view
is a read of the tensor it aliases: the *root*.  The problem holds the roots
the backward reads (``needed``) and, transitively, the roots they are computed
from, down to the graph inputs.  A saved view would keep its whole base
storage alive anyway, so this also makes the byte count exact.

**Hard constraints.**  A value cannot be recomputed if its op draws from the
global RNG (``Tag.nondeterministic_seeded``), is a collective (unless tagged
``MUST_RECOMPUTE``), mutates, has other side effects, reads a graph input that
the forward mutates (the backward would read the new value), or carries a
user ``MUST_SAVE``/``PREFER_SAVE`` tag.  It cannot be saved if it is not a
tensor (a tuple), is a ``SymFloat``, is a graph input the forward mutates, or
carries a ``MUST_RECOMPUTE``/``PREFER_RECOMPUTE`` tag (``torch.utils.checkpoint``
regions and selective-checkpoint policies).

**Costs** (seconds on the device profile, stored as integer picoseconds):

* saving: the backward reads the tensor; the forward also writes it if it
  would otherwise stay inside a fused kernel;
* recomputing a fusible op: its per-element arithmetic only (transcendental
  functions at their own, higher rate), because Inductor fuses it
  into the backward kernel that consumes it and the chain's inputs are read
  there (charged to those inputs); if a consumer is a library call (matmul,
  convolution), the value must be materialised: a write, a read and a launch;
* recomputing a library call: its full roofline time;
* values the forward does not compute anyway (used only by the backward)
  cost nothing extra to compute in the backward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.node_cost import (
    NodeEstimate,
    Size,
    SizeEvaluator,
    estimate_node,
    numel_expr,
    storage_bytes_expr,
    tensor_values,
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
from ckpt.partitioner.problem import Problem, evaluate

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
    fixed_seconds: float  # estimated forward + backward time without saving or recomputing
    reasons: dict[str, str]  # why a value cannot be saved or recomputed, by node name
    forward_names: frozenset[str]  # call_function nodes of the forward side
    root_names: dict[str, str]  # view name -> name of the value whose storage it aliases
    save_bytes_exprs: tuple[Size, ...]  # save_bytes as expressions in the size symbols
    size_hints: dict[Any, int]  # size symbol -> hint


@dataclass
class _Graph:
    """The joint graph, classified."""

    fwd_outputs: list[fx.Node]
    bwd_outputs: list[fx.Node]
    backward: set[fx.Node]  # downstream of the tangents, or tagged to run in the backward
    forward_required: set[fx.Node]  # needed to produce the forward outputs and forward mutations
    mutated_inputs: set[fx.Node]
    order: dict[fx.Node, int]  # topological index of every node


def _root(node: fx.Node, kinds: dict[fx.Node, OpKind]) -> fx.Node:
    """The non-view node whose storage ``node`` aliases."""
    while True:
        kind = kinds.get(node)
        if kind is OpKind.VIEW and node.all_input_nodes:
            node = node.all_input_nodes[0]
            continue
        if kind is OpKind.GETITEM and kinds.get(node.args[0]) is OpKind.VIEW:  # type: ignore[arg-type]
            node = node.args[0]  # type: ignore[assignment]
            continue
        return node


def _mutated_args(node: fx.Node) -> list[fx.Node]:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return []
    mutated = []
    for index, argument in enumerate(target._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
        if isinstance(value, fx.Node):
            mutated.append(value)
    return mutated


def _classify_graph(joint: fx.GraphModule, num_fwd_outputs: int, kinds: dict[fx.Node, OpKind]) -> _Graph:
    nodes = list(joint.graph.nodes)
    fwd_outputs, bwd_outputs = compat.fwd_bwd_outputs(joint, num_fwd_outputs)
    backward: set[fx.Node] = set()
    for node in nodes:
        if node.op == "placeholder":
            if compat.is_tangent(node) or compat.is_bwd_seed_offset(node):
                backward.add(node)
        elif node.op != "output" and (
            compat.must_be_in_backward(node) or any(a in backward for a in node.all_input_nodes)
        ):
            backward.add(node)
    forward_required: set[fx.Node] = set()
    stack = [n for n in fwd_outputs if isinstance(n, fx.Node)]
    stack += [n for n in nodes if n.op == "call_function" and compat.must_be_in_forward(n) and n not in backward]
    while stack:
        node = stack.pop()
        if node in forward_required or node in backward:
            continue
        forward_required.add(node)
        stack.extend(node.all_input_nodes)
    mutated_inputs: set[fx.Node] = set()
    for node in nodes:
        if node.op == "call_function" and node not in backward and kinds[node] is OpKind.MUTATION:
            for arg in _mutated_args(node):
                root = _root(arg, kinds)
                if root.op == "placeholder":
                    mutated_inputs.add(root)
    return _Graph(
        fwd_outputs=[n for n in fwd_outputs if isinstance(n, fx.Node)],
        bwd_outputs=[n for n in bwd_outputs if isinstance(n, fx.Node)],
        backward=backward,
        forward_required=forward_required,
        mutated_inputs=mutated_inputs,
        order={node: i for i, node in enumerate(nodes)},
    )


def _save_constraint(node: fx.Node, graph: _Graph) -> str | None:
    value = node.meta.get("val")
    if node in graph.mutated_inputs:
        return "graph input mutated in the forward"
    if compat.recompute_tag(node) == "recompute":
        return "tagged MUST_RECOMPUTE/PREFER_RECOMPUTE (checkpoint region or policy)"
    if isinstance(value, torch.SymFloat):
        return "SymFloat"
    if isinstance(value, (tuple, list)):
        return "not a tensor (multiple outputs)"
    if value is None and node.op == "call_function" and "tensor_meta" not in node.meta:
        return "no value metadata"
    return None


def _recompute_constraint(node: fx.Node, kind: OpKind, graph: _Graph, kinds: dict[fx.Node, OpKind]) -> str | None:
    if node.op == "placeholder":
        return "graph input"
    if node.op != "call_function":
        return f"{node.op} node"
    tag = compat.recompute_tag(node)
    if kind is OpKind.COLLECTIVE:  # before the tag: torch tags every untagged collective MUST_SAVE
        return None if tag == "recompute" else "collective"
    if tag == "save":
        return "tagged MUST_SAVE/PREFER_SAVE"
    if kind is OpKind.RANDOM:
        return None if tag == "recompute" else "random op (draws from the global RNG)"
    if kind is OpKind.MUTATION:
        return "mutates an argument"
    if compat.has_side_effects(node):
        return "has side effects"
    for arg in node.all_input_nodes:
        if _root(arg, kinds) in graph.mutated_inputs:
            return "reads a graph input that the forward mutates"
    return None


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
    graph: _Graph
    kinds: dict[fx.Node, OpKind]
    estimates: dict[fx.Node, NodeEstimate]
    users: dict[fx.Node, list[fx.Node]]  # users of each root, looking through views
    fwd_output_roots: set[fx.Node]
    charged_inputs: set[fx.Node]  # graph inputs whose saving keeps memory alive


def analyze_joint(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    profile: DeviceProfile,
    activation_inputs: frozenset[int] = frozenset(),
) -> JointAnalysis:
    """Build the save-or-recompute problem for ``joint`` on ``profile``.

    ``activation_inputs`` are positions among the graph's primal inputs that
    hold activations of earlier autograd work (the output of the graph before
    a graph break): saving one of those keeps it alive, so it is charged like
    any saved value.  Other inputs (parameters, buffers, the user's tensors)
    live anyway and are free to save.
    """
    context = _context(joint, num_fwd_outputs, profile, activation_inputs)
    kinds, graph = context.kinds, context.graph
    needed, ordered = _problem_values(graph, kinds)
    index = {node: i for i, node in enumerate(ordered)}
    rows = [_price(node, context) for node in ordered]
    problem = Problem(
        names=tuple(n.name for n in ordered),
        inputs=tuple(tuple(sorted({index[_root(a, kinds)] for a in n.all_input_nodes})) for n in ordered),
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
    return JointAnalysis(
        problem=problem,
        nodes=tuple(ordered),
        estimates={n.name: e for n, e in context.estimates.items()},
        no_recompute_saved=baseline,
        no_recompute_bytes=evaluate(problem, baseline)[1],
        fixed_seconds=_fixed_seconds(context),
        reasons=reasons,
        forward_names=frozenset(
            n.name for n in joint.graph.nodes if n.op == "call_function" and n not in graph.backward
        ),
        root_names={n.name: _root(n, kinds).name for n in context.estimates if _root(n, kinds) is not n},
        save_bytes_exprs=tuple(r.save_bytes_expr for r in rows),
        size_hints=context.sizes.hints,
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
    graph = _classify_graph(joint, num_fwd_outputs, kinds)
    users: dict[fx.Node, list[fx.Node]] = {}
    for node in joint.graph.nodes:
        if node.op == "output" or kinds[node] is OpKind.VIEW:
            continue
        for arg in node.all_input_nodes:
            users.setdefault(_root(arg, kinds), []).append(node)
    charged_inputs = _inputs_copied_for_convolution(joint, lambda n: _root(n, kinds))
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
    charged_inputs |= {primals[i] for i in sorted(activation_inputs) if i < len(primals)}
    return _Context(
        profile=profile,
        sizes=sizes,
        graph=graph,
        kinds=kinds,
        estimates=estimates,
        users=users,
        fwd_output_roots={_root(n, kinds) for n in graph.fwd_outputs},
        charged_inputs=charged_inputs,
    )


def _problem_values(graph: _Graph, kinds: dict[fx.Node, OpKind]) -> tuple[set[fx.Node], list[fx.Node]]:
    """The roots the backward reads, and those roots with everything they are computed from, in graph order."""
    needed: set[fx.Node] = set()
    for node in graph.backward:
        for arg in node.all_input_nodes:
            if arg not in graph.backward:
                needed.add(_root(arg, kinds))
    for node in graph.bwd_outputs:
        if node not in graph.backward:
            needed.add(_root(node, kinds))
    members: set[fx.Node] = set()
    stack = list(needed)
    while stack:
        node = stack.pop()
        if node in members:
            continue
        members.add(node)
        stack.extend(_root(a, kinds) for a in node.all_input_nodes)
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
        save_reason=_save_constraint(node, context.graph),
        recompute_reason=_recompute_constraint(node, kind, context.graph, context.kinds),
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
    if fusible and not extern_forward_user and node not in context.fwd_output_roots:
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
        return _library_call_seconds(profile, estimate)
    seconds = elementwise_seconds(profile, estimate.elements, estimate.transcendental)
    if any(context.kinds[u] not in _FUSIBLE_KINDS for u in context.users.get(node, [])):
        seconds += 2 * transfer_seconds(profile, estimate.bytes_written) + profile.kernel_overhead
    return seconds


def _inputs_copied_for_convolution(joint: fx.GraphModule, root: Any) -> set[fx.Node]:
    """Graph inputs Inductor converts to channels-last copies for its convolutions."""
    if not compat.inductor_layout_optimization(joint):
        return set()
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
            total += _library_call_seconds(profile, estimate)
            continue
        total += elementwise_seconds(profile, estimate.elements, estimate.transcendental)
        node_users = context.users.get(node, [])
        if not node_users or any(kinds[u] not in _FUSIBLE_KINDS or u.op == "output" for u in node_users):
            total += 2 * transfer_seconds(profile, estimate.bytes_written) + profile.kernel_overhead
    return total


def describe_value(node: fx.Node) -> dict[str, Any]:
    """Shape, dtype and source line of a joint-graph value, for reports."""
    value = node.meta.get("val")
    tensors = tensor_values(value)
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    source = ""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            source = lines[i] + (f"  {lines[i + 1]}" if i + 1 < len(lines) else "")
            break
    return {
        "shape": [str(s) for s in tensors[0].shape] if tensors else [],
        "dtype": str(tensors[0].dtype).replace("torch.", "") if tensors else type(value).__name__,
        "source": source,
    }
