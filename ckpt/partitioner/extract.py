"""Build the forward and backward graph modules from a plan.

The split itself is torch's (``_extract_fwd_bwd_modules``, through
:mod:`ckpt._torch_compat`): given the saved values, the forward returns them
and the backward recomputes whatever else it needs from them.  This module
feeds it the plan and checks the result: the backward must recompute exactly
the plan's values (plus free views), nothing else (:func:`verify_backward`).

One pass finishes the backward: random ops must never run there, not even as
dead code (:func:`drop_dead_random_ops`).  Dead-code elimination keeps them
because they are impure, and each one advances the global RNG, so the next
step's dropout masks would differ from eager.

One pass finishes the forward: its seed lookups become reads of tensors of
their own (:func:`share_seed_kernels`), so that layers alike share kernels.
And one finishes both: the parameters and inputs that Inductor copies to
channels-last for its convolutions are saved as themselves, not as their
copies (:func:`save_inputs_uncopied`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.ops import OpKind, classify
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.plan import Plan

__all__ = [
    "ExtractionError",
    "RandomInBackwardError",
    "channels_last_copy",
    "drop_dead_random_ops",
    "extract_modules",
    "recomputed_in_backward",
    "save_inputs_uncopied",
    "share_seed_kernels",
    "unbind_seeds",
    "verify_backward",
]


class ExtractionError(RuntimeError):
    """The extracted graphs do not implement the plan."""


def extract_modules(
    joint: fx.GraphModule,
    analysis: JointAnalysis,
    plan: Plan,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes: Any,
) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    """The forward and backward modules, and the number of saved symbolic values."""
    saved = [analysis.nodes[i] for i in plan.saved]
    sym_nodes = [n for n in saved if compat.is_sym_node(n)]
    opaque_nodes = [n for n in saved if n not in sym_nodes and compat.is_opaque_value(n.meta.get("val"))]
    tensors = [n for n in saved if n not in sym_nodes and n not in opaque_nodes]
    fw_module, bw_module = compat.extract_fwd_bwd_modules(
        joint,
        tensors,
        sym_nodes,
        opaque_nodes,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=static_lifetime_input_nodes,
    )
    return fw_module, bw_module, len(sym_nodes)


def verify_backward(bw_module: fx.GraphModule, analysis: JointAnalysis, plan: Plan) -> None:
    """Raise unless the backward recomputes only what the plan recomputes (views aside)."""
    planned = {analysis.problem.names[i] for i in plan.recomputed}
    unplanned = sorted(recomputed_in_backward(bw_module, analysis) - planned)
    if unplanned:
        raise ExtractionError(f"the backward recomputes values the plan does not: {', '.join(unplanned)}")


def recomputed_in_backward(bw_module: fx.GraphModule, analysis: JointAnalysis) -> set[str]:
    """Forward values (other than free views) that ``bw_module`` computes."""
    return {
        node.name
        for node in bw_module.graph.nodes
        if node.op == "call_function"
        and node.name in analysis.forward_names
        and node.name not in analysis.root_names
        and len(node.users) > 0
    }


class RandomInBackwardError(RuntimeError):
    """A random op is live in the backward graph: its result would differ from the forward's."""


def _is_random(node: fx.Node) -> bool:
    return classify(node) is OpKind.RANDOM


def drop_dead_random_ops(bw_module: fx.GraphModule) -> fx.GraphModule:
    """Erase random ops with no users from the backward; raise if one is used.

    Postcondition: the backward graph contains no op that draws from the
    global RNG (see :func:`ckpt.cost_model.ops.classify`).
    """
    changed = True
    while changed:
        # Erasing a dead random op can leave pure nodes dead (a getitem of another random op),
        # and those in turn can leave the next random op dead.
        bw_module.graph.eliminate_dead_code()
        changed = False
        for node in reversed(list(bw_module.graph.nodes)):
            if _is_random(node) and not node.users:
                bw_module.graph.erase_node(node)
                changed = True
    live = [node.name for node in bw_module.graph.nodes if _is_random(node)]
    if live:
        raise RandomInBackwardError(f"random ops would be re-drawn in the backward: {', '.join(live)}")
    bw_module.graph.eliminate_dead_code()
    bw_module.recompile()
    return bw_module


@torch.library.custom_op("ckpt::unbind_seeds", mutates_args=())
def unbind_seeds(seeds: torch.Tensor) -> list[torch.Tensor]:
    """Each value of the 1-d ``seeds`` as a 0-d tensor of its own (one multi-tensor copy)."""
    return list(torch._foreach_add(seeds.unbind(0), 0))


@unbind_seeds.register_fake
def _unbind_seeds_fake(seeds: torch.Tensor) -> list[torch.Tensor]:
    return [seeds.new_empty(()) for _ in range(seeds.shape[0])]


def share_seed_kernels(fw_module: fx.GraphModule) -> fx.GraphModule:
    """Read each seed of the forward's random draws from a tensor of its own, so that layers share kernels.

    Inductor draws every random op of a graph from one seeds tensor
    (``prims.inductor_seeds``), picking each op's seed with
    ``inductor_lookup_seed(seeds, index)``.  The lookup is computed inline in
    the kernel that draws, with its index written into the kernel's source,
    so every dropout compiles a kernel of its own, layers alike included (on
    a 28-layer GPT, 56 of the forward's 59 distinct kernels).  Here the
    seeds tensor is split once (:func:`unbind_seeds`, a library call of one
    copy) and each lookup becomes a read of its own 0-d tensor at index 0:
    the same values, and one kernel for every layer alike.  A seeds tensor
    with fewer than two lookups is left alone.
    """
    graph = fw_module.graph
    changed = False
    for seeds in [n for n in graph.nodes if n.op == "call_function" and compat.is_inductor_seeds(n.target)]:
        lookups = [
            user
            for user in seeds.users
            if compat.is_inductor_seed_lookup(user.target) and isinstance(user.args[1], int)
        ]
        value = seeds.meta.get("val")
        if len(lookups) < 2 or not isinstance(value, torch.Tensor) or value.dim() != 1:
            continue
        count = value.shape[0]
        if not isinstance(count, int) or not all(0 <= user.args[1] < count for user in lookups):
            continue
        with graph.inserting_after(seeds):
            parts = graph.call_function(torch.ops.ckpt.unbind_seeds.default, (seeds,))
        parts.meta["val"] = _unbind_seeds_fake(value)
        for lookup in lookups:
            with graph.inserting_before(lookup):
                item = graph.call_function(operator.getitem, (parts, lookup.args[1]))
            item.meta = dict(lookup.meta)
            lookup.replace_all_uses_with(item)
            graph.erase_node(lookup)
        changed = True
    if changed:
        graph.lint()
        fw_module.recompile()
    return fw_module


@torch.library.custom_op("ckpt::channels_last_copy", mutates_args=())
def channels_last_copy(value: torch.Tensor) -> torch.Tensor:
    """A channels-last copy of a 4-d tensor, made by a library call rather than a kernel of Inductor's."""
    return value.clone(memory_format=torch.channels_last)


@channels_last_copy.register_fake
def _channels_last_copy_fake(value: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(value, memory_format=torch.channels_last)


def save_inputs_uncopied(
    fw_module: fx.GraphModule, bw_module: fx.GraphModule, inputs: frozenset[str], num_fwd_outputs: int
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Save the graph inputs Inductor copies to channels-last as they are, not as their copies.

    Under layout optimisation Inductor gives a convolution's weight (and
    image) a channels-last copy, and a forward output that is such an input
    is returned as that copy: a saved weight then holds a second copy of
    itself until the backward.  Here the forward saves a 1-d view of each
    such input instead (Inductor lays out only 4-d values channels-last, so
    the view is the input's own storage) and the backward views it back;
    the backward's convolutions make their own short-lived copies.
    ``inputs`` names the inputs to treat so (``JointAnalysis.uncopied_inputs``:
    the analysis chose them, contiguous and of known size, and prices them as
    saved for free); one that is also a user-visible output of the forward is
    left alone.
    """
    result = fw_module.graph.output_node().args[0]
    outputs: list[Any] = list(result) if isinstance(result, (tuple, list)) else []
    backward_inputs = {n.name: n for n in bw_module.graph.find_nodes(op="placeholder")}
    last_input = list(backward_inputs.values())[-1] if backward_inputs else None
    changed = False
    for position in range(num_fwd_outputs, len(outputs)):
        node = outputs[position]
        if not isinstance(node, fx.Node) or node.op != "placeholder" or node.name not in inputs:
            continue
        target = backward_inputs.get(node.name)
        value, original = node.meta["val"], target.meta.get("val") if target is not None else None
        if target is None or not isinstance(original, torch.Tensor) or outputs.index(node) != position:
            continue
        shape = list(value.shape)
        with fw_module.graph.inserting_after(node):
            flat = fw_module.graph.call_function(torch.ops.aten.view.default, (node, [value.numel()]))
        flat.meta["val"] = value.view(-1)
        outputs[position] = flat
        readers = list(target.users)
        with bw_module.graph.inserting_after(last_input):
            restored = bw_module.graph.call_function(torch.ops.aten.view.default, (target, shape))
        restored.meta["val"] = original
        for reader in readers:
            if reader.target is torch.ops.aten.convolution.default:
                # A recomputed convolution: its copy comes from a library call, so that no kernel
                # of Inductor's fuses the copy (which changed the layouts it chose for the activations).
                with bw_module.graph.inserting_before(reader):
                    copy = bw_module.graph.call_function(torch.ops.ckpt.channels_last_copy.default, (restored,))
                copy.meta["val"] = _channels_last_copy_fake(original)
                reader.replace_input_with(target, copy)
            else:
                reader.replace_input_with(target, restored)
        target.meta["val"] = original.view(-1)
        changed = True
    if changed:
        fw_module.graph.output_node().args = (tuple(outputs),)
        for module in (fw_module, bw_module):
            module.graph.lint()
            module.recompile()
    return fw_module, bw_module
