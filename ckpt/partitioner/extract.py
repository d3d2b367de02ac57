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
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.ops import OpKind, classify
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.plan import Plan

__all__ = [
    "ExtractionError",
    "RandomInBackwardError",
    "drop_dead_random_ops",
    "extract_modules",
    "recomputed_in_backward",
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
