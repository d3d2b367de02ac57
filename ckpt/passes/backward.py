"""FX passes on the extracted backward graph.

Random ops must never run in the backward, not even as dead code: dead-code
elimination keeps them because they are impure, and each one advances the
global RNG, so the next step's dropout masks would differ from eager.
"""

from __future__ import annotations

import torch.fx as fx

from ckpt.cost_model.ops import OpKind, classify

__all__ = ["RandomInBackwardError", "drop_dead_random_ops"]


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
