"""torch's own partition of a joint graph, as a plan in our problem's terms.

Used to put torch's default next to ours in reports and tests: it runs
``min_cut_rematerialization_partition`` on a copy of the joint graph, reads
which values its backward receives, and evaluates that saved set with our
cost model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.plan import Plan, make_plan

__all__ = ["plan_from_saved_names", "torch_default_saved_names"]


def torch_default_saved_names(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Sequence[int] | None = None,
    activation_memory_budget: float | None = None,
) -> tuple[str, ...]:
    """Names of the joint-graph values torch's default partitioner saves for the backward.

    ``activation_memory_budget``, if given, is torch's own knob
    (``torch._functorch.config.activation_memory_budget``) for this one call;
    otherwise the current setting applies (1.0 unless changed).
    """
    scratch = copy.deepcopy(joint)  # torch's partitioner edits the graph it is given
    patch = {} if activation_memory_budget is None else {"activation_memory_budget": activation_memory_budget}
    with compat.functorch_config().patch(**patch):
        _, bw_module = compat.torch_default_partition(
            scratch,
            None,
            compiler="inductor",
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=list(static_lifetime_input_indices or []),
        )
    return tuple(
        node.name
        for node in bw_module.graph.nodes
        if node.op == "placeholder" and not compat.is_tangent(node) and not compat.is_bwd_seed_offset(node)
    )


def plan_from_saved_names(analysis: JointAnalysis, names: Sequence[str], solver: str = "torch-default") -> Plan:
    """Our evaluation of a plan given as saved value names (views count as their base).

    Raises :class:`ckpt.partitioner.problem.ProblemError` if that plan breaks
    one of our hard constraints.
    """
    index = {name: i for i, name in enumerate(analysis.problem.names)}
    saved = set()
    for name in names:
        root = analysis.root_names.get(name, name)
        if root in index:
            saved.add(index[root])
    return make_plan(analysis.problem, saved, solver, optimal=False)
