"""The joint graph, classified: which side each node runs on, what the forward mutates, and the hard constraints.

Views are free to recompute, so a read of a view is a read of the tensor it
aliases: its *root* (:func:`root_of`).

**Mutated inputs.**  A graph input is mutated in two ways, and both make its
old contents unavailable to the backward.  Inside the graph: a mutating op in
the forward writes it (Inductor keeps input mutations in the graph).  After
the forward: with ``keep_inference_input_mutations=False`` (AOTAutograd's
default), and with mutations kept in the graph still for an input that
requires grad or whose metadata changes, the graph returns the input's new value and AOTAutograd's runtime
wrapper copies it back after the forward ran, before any backward.
AOTAutograd marks those outputs with an ``InputMutationAOTOutput``
descriptor, which names the input
(:func:`ckpt._torch_compat.inputs_mutated_after_forward`).  A metadata-only
mutation (``t_()``, ``unsqueeze_()``) returns a view of the input itself and
leaves its data alone, so it does not count.

**Hard constraints.**  A value cannot be recomputed if its op draws from the
global RNG (``Tag.nondeterministic_seeded``), is a collective (unless tagged
``MUST_RECOMPUTE``), mutates, has other side effects, reads a graph input that
is mutated in or after the forward (the backward would read the new value), or carries a
user ``MUST_SAVE``/``PREFER_SAVE`` tag.  It cannot be saved if it is not a
tensor (a tuple), is a ``SymFloat``, is a graph input mutated in or after the forward, or
carries a ``MUST_RECOMPUTE``/``PREFER_RECOMPUTE`` tag (``torch.utils.checkpoint``
regions and selective-checkpoint policies).

**Seeds.**  Inductor's seed lookup (``prims.inductor_lookup_seed``) could be
recomputed, but is not: a backward that draws a dropout mask again reads the
saved 8-byte seed instead.  Inductor writes the lookup's index into the source
of the kernel that computes it inline, so a backward that looked its seeds up
compiled one kernel per layer (on a 28-layer GPT at budget 0.5, 44 of the 137
distinct kernels Inductor compiled).  The forward's lookups are replaced for
the same reason after extraction (:func:`ckpt.partitioner.extract.share_seed_kernels`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.ops import OpKind

__all__ = [
    "JointGraph",
    "autograd_saved_names",
    "classify_joint",
    "find_inputs_mutated_after_forward",
    "recompute_constraint",
    "read_roots",
    "root_of",
    "save_constraint",
]

log = logging.getLogger(__name__)


@dataclass
class JointGraph:
    """The joint graph, classified."""

    fwd_outputs: list[fx.Node]
    bwd_outputs: list[fx.Node]
    backward: set[fx.Node]  # downstream of the tangents, or tagged to run in the backward
    forward_required: set[fx.Node]  # needed to produce the forward outputs and forward mutations
    mutated_inputs: set[fx.Node]  # by the forward, or after it (a subset: mutated_after_forward)
    order: dict[fx.Node, int]  # topological index of every node
    mutated_after_forward: set[fx.Node] = field(default_factory=set)  # by AOTAutograd's runtime wrapper


def root_of(node: fx.Node, kinds: dict[fx.Node, OpKind]) -> fx.Node:
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


def read_roots(node: fx.Node, kinds: dict[fx.Node, OpKind]) -> list[fx.Node]:
    """The roots ``node`` reads: its inputs' roots, and what the views between them take.

    A view's other arguments (symbolic sizes of a ``view``, say) are read
    wherever the view is, so a backward that recomputes through a view needs
    them too.
    """
    found: list[fx.Node] = []
    seen: set[fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        arg = stack.pop()
        if arg in seen:
            continue
        seen.add(arg)
        root = root_of(arg, kinds)
        if root not in found:
            found.append(root)
        view = arg
        while view is not root:  # the views between arg and its root, and their other arguments
            kind = kinds.get(view)
            if kind is OpKind.VIEW:
                stack.extend(view.all_input_nodes[1:])
                view = view.all_input_nodes[0]
            else:  # a getitem of a multi-output view
                view = view.args[0]  # type: ignore[assignment]
    return found


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


def classify_joint(joint: fx.GraphModule, num_fwd_outputs: int, kinds: dict[fx.Node, OpKind]) -> JointGraph:
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
                root = root_of(arg, kinds)
                if root.op == "placeholder":
                    mutated_inputs.add(root)
    after_forward = find_inputs_mutated_after_forward(joint, kinds)
    mutated_inputs |= after_forward
    return JointGraph(
        fwd_outputs=[n for n in fwd_outputs if isinstance(n, fx.Node)],
        bwd_outputs=[n for n in bwd_outputs if isinstance(n, fx.Node)],
        backward=backward,
        forward_required=forward_required,
        mutated_inputs=mutated_inputs,
        order={node: i for i, node in enumerate(nodes)},
        mutated_after_forward=after_forward,
    )


def autograd_saved_names(joint: fx.GraphModule, num_fwd_outputs: int) -> tuple[str, ...]:
    """The values eager autograd saves for the backward: the reference of fractional budgets.

    Read on the joint graph as traced, before CSE, the rule of torch's
    ``default_partition``: the forward is what the forward outputs (and the
    ops that must run in the forward) are computed from, with the outputs of
    its multi-output ops; a forward value is saved when a backward op reads
    its data.  The backward's own formulas then recompute whatever else they
    need from those values, as eager's do.  CSE must come after, or it
    merges such recomputations into forward values that autograd never saves.
    Values tagged to be recomputed (checkpoint regions) are not saved.
    """
    nodes = [n for n in joint.graph.nodes if n.op != "output"]
    fwd_outputs, _ = compat.fwd_bwd_outputs(joint, num_fwd_outputs)
    forward: set[fx.Node] = set()
    stack = [n for n in fwd_outputs if isinstance(n, fx.Node)]
    stack += [n for n in nodes if n.op == "call_function" and compat.must_be_in_forward(n)]
    while stack:
        node = stack.pop()
        if node in forward or (node.op == "placeholder" and compat.is_tangent(node)):
            continue
        forward.add(node)
        stack.extend(node.all_input_nodes)
    forward |= {u for n in list(forward) if isinstance(n.meta.get("val"), (tuple, list)) for u in n.users}
    saved = []
    for node in nodes:
        if node not in forward or isinstance(node.meta.get("val"), (tuple, list)):
            continue
        readers = [u for u in node.users if u not in forward and u.op != "output"]
        if not readers or all(compat.is_sym_node(u) for u in readers) or compat.is_sym_node(node):
            continue
        if compat.recompute_tag(node) == "recompute":
            continue
        saved.append(node.name)
    return tuple(saved)


def find_inputs_mutated_after_forward(joint: fx.GraphModule, kinds: dict[fx.Node, OpKind]) -> set[fx.Node]:
    """The graph inputs whose data AOTAutograd's runtime wrapper overwrites after the forward."""
    pairs = compat.inputs_mutated_after_forward(joint)
    if pairs is None:
        log.debug("ckpt: the joint graph has no output descriptors; inputs mutated after the forward are unknown")
        return set()
    mutated: set[fx.Node] = set()
    for placeholder, new_value in pairs:
        if isinstance(new_value, fx.Node) and root_of(new_value, kinds) is placeholder:
            continue  # a metadata-only mutation: the input's data is unchanged
        mutated.add(placeholder)
    return mutated


def save_constraint(node: fx.Node, graph: JointGraph) -> str | None:
    value = node.meta.get("val")
    if node in graph.mutated_after_forward:
        return "graph input mutated after the forward (AOTAutograd copies its new value back)"
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


def recompute_constraint(node: fx.Node, kind: OpKind, graph: JointGraph, kinds: dict[fx.Node, OpKind]) -> str | None:
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
    if compat.is_inductor_seed_lookup(node.target) and tag != "recompute":
        # Inductor writes the lookup's index into the kernel that regenerates a random draw, so
        # each layer would compile a backward kernel of its own; a saved seed is one read (8 bytes).
        return "seed lookup (saved so that layers share their backward kernels)"
    if kind is OpKind.MUTATION:
        return "mutates an argument"
    if compat.has_side_effects(node):
        return "has side effects"
    for arg in node.all_input_nodes:
        root = root_of(arg, kinds)
        if root in graph.mutated_after_forward:
            return "reads a graph input that is mutated after the forward"
        if root in graph.mutated_inputs:
            return "reads a graph input that the forward mutates"
    return None
