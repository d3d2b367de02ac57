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
    sizes = SizeEvaluator.for_graph(joint.graph)
    order = {node: i for i, node in enumerate(joint.graph.nodes)}
    estimates: dict[fx.Node, NodeEstimate] = {
        node: estimate_node(node, sizes) for node in joint.graph.nodes if node.op == "call_function"
    }
    kinds: dict[fx.Node, OpKind] = {node: est.kind for node, est in estimates.items()}
    for node in joint.graph.nodes:
        kinds.setdefault(node, OpKind.OTHER)
    graph = _classify_graph(joint, num_fwd_outputs, kinds)

    def root(node: fx.Node) -> fx.Node:
        return _root(node, kinds)

    # Roots the backward reads.
    needed: set[fx.Node] = set()
    for node in graph.backward:
        for arg in node.all_input_nodes:
            if arg not in graph.backward:
                needed.add(root(arg))
    for node in graph.bwd_outputs:
        if node not in graph.backward:
            needed.add(root(node))

    # The problem's values: the needed roots and everything they are computed from.
    members: set[fx.Node] = set()
    stack = list(needed)
    while stack:
        node = stack.pop()
        if node in members:
            continue
        members.add(node)
        stack.extend(root(a) for a in node.all_input_nodes)
    ordered = sorted(members, key=order.__getitem__)
    index = {node: i for i, node in enumerate(ordered)}

    # Users of each root, looking through views, for the fusion terms.
    users: dict[fx.Node, list[fx.Node]] = {}
    for node in joint.graph.nodes:
        if node.op == "output" or kinds[node] is OpKind.VIEW:
            continue
        for arg in node.all_input_nodes:
            users.setdefault(root(arg), []).append(node)
    fwd_output_roots = {root(n) for n in graph.fwd_outputs}
    charged_inputs = _inputs_copied_for_convolution(joint, root)
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
    charged_inputs |= {primals[i] for i in sorted(activation_inputs) if i < len(primals)}

    inputs: list[tuple[int, ...]] = []
    save_bytes: list[int] = []
    save_bytes_exprs: list[Size] = []
    recompute_bytes: list[int] = []
    save_time: list[int] = []
    recompute_time: list[int] = []
    can_save: list[bool] = []
    can_recompute: list[bool] = []
    reasons: dict[str, str] = {}
    for node in ordered:
        kind = kinds[node]
        preds = sorted({index[root(a)] for a in node.all_input_nodes}, key=lambda i: i)
        inputs.append(tuple(preds))
        save_reason = _save_constraint(node, graph)
        recompute_reason = _recompute_constraint(node, kind, graph, kinds)
        value = node.meta.get("val")
        nbytes_expr: Size = storage_bytes_expr(value) if isinstance(value, torch.Tensor) else 0
        nbytes = sizes(nbytes_expr)
        node_users = users.get(node, [])
        extern_user = any(kinds[u] not in _FUSIBLE_KINDS for u in node_users)
        extern_forward_user = any(kinds[u] not in _FUSIBLE_KINDS for u in node_users if u not in graph.backward)
        fusible = kind in _FUSIBLE_KINDS and node.op == "call_function"
        in_forward = node in graph.forward_required or node.op == "placeholder"
        # Save: the backward reads it; a fused value must also be written in the forward.
        write_in_forward = fusible and not extern_forward_user and node not in fwd_output_roots
        is_tensor = isinstance(value, torch.Tensor)
        elements = sizes(numel_expr(value)) if is_tensor else 0
        itemsize = value.element_size() if is_tensor else 0
        seconds_save = tensor_read_seconds(profile, nbytes, elements, itemsize)
        if write_in_forward:
            seconds_save += tensor_write_seconds(profile, nbytes, elements, itemsize)
        if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)) or compat.is_opaque_value(value):
            seconds_save = 0.0
        # Recompute.
        estimate = estimates.get(node)
        if not in_forward or estimate is None or kind is OpKind.GETITEM:
            seconds_recompute = 0.0
        elif fusible:
            seconds_recompute = elementwise_seconds(profile, estimate.elements, estimate.transcendental)
            if extern_user:
                seconds_recompute += 2 * transfer_seconds(profile, estimate.bytes_written) + profile.kernel_overhead
        else:
            seconds_recompute = _library_call_seconds(profile, estimate)
        # A graph input is available to the backward for free (only its read costs time),
        # unless it is an activation passed in, or Inductor hands the backward a copy of it.
        is_input = node.op == "placeholder" and node not in charged_inputs
        save_bytes.append(0 if is_input else nbytes)
        save_bytes_exprs.append(0 if is_input else nbytes_expr)
        # A random op that a checkpoint region recomputes replays the forward's RNG state,
        # which torch saves for the backward.
        recompute_bytes.append(compat.rng_state_bytes(value) if kind is OpKind.RANDOM else 0)
        save_time.append(to_picoseconds(seconds_save))
        recompute_time.append(to_picoseconds(seconds_recompute))
        can_save.append(save_reason is None)
        can_recompute.append(recompute_reason is None)
        if save_reason:
            reasons[f"{node.name}:save"] = save_reason
        if recompute_reason:
            reasons[f"{node.name}:recompute"] = recompute_reason

    problem = Problem(
        names=tuple(n.name for n in ordered),
        inputs=tuple(inputs),
        needed=tuple(n in needed for n in ordered),
        save_bytes=tuple(save_bytes),
        save_time=tuple(save_time),
        recompute_time=tuple(recompute_time),
        can_save=tuple(can_save),
        can_recompute=tuple(can_recompute),
        recompute_bytes=tuple(recompute_bytes),
    )
    baseline = _no_recompute_plan(problem)
    return JointAnalysis(
        problem=problem,
        nodes=tuple(ordered),
        estimates={n.name: e for n, e in estimates.items()},
        no_recompute_saved=baseline,
        no_recompute_bytes=evaluate(problem, baseline)[1],
        fixed_seconds=_fixed_seconds(joint, estimates, kinds, users, profile),
        reasons=reasons,
        forward_names=frozenset(
            n.name for n in joint.graph.nodes if n.op == "call_function" and n not in graph.backward
        ),
        root_names={n.name: root(n).name for n in estimates if root(n) is not n},
        save_bytes_exprs=tuple(save_bytes_exprs),
        size_hints=sizes.hints,
    )


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


def _fixed_seconds(
    joint: fx.GraphModule,
    estimates: dict[fx.Node, NodeEstimate],
    kinds: dict[fx.Node, OpKind],
    users: dict[fx.Node, list[fx.Node]],
    profile: DeviceProfile,
) -> float:
    """A rough forward + backward time: library calls at roofline, fused chains by their materialised tensors."""
    total = 0.0
    for node, estimate in estimates.items():
        kind = kinds[node]
        if kind in (OpKind.VIEW, OpKind.GETITEM, OpKind.OTHER):
            continue
        if kind not in _FUSIBLE_KINDS:
            total += _library_call_seconds(profile, estimate)
            continue
        total += elementwise_seconds(profile, estimate.elements, estimate.transcendental)
        node_users = users.get(node, [])
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
