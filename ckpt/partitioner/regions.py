"""Which values each per-module budget covers, and its cap in bytes for one joint graph.

A :class:`RegionSpec` names a module by its path in the compiled frame
(``L['self'].layers.0.mlp``, see :func:`ckpt._torch_compat.module_path`) and
gives it a budget.  A forward value belongs to the most specific region whose
module produced it: of the regions whose path is a prefix of the value's
innermost ``nn_module_stack`` entry, the deepest.  A value computed outside
every submodule belongs to a region only if that region is the frame's own
module (or contains it).

A value read across a border (a module's output read by the next module) is
charged to the region that computes it.  Fractions are per region: a region's
cap is its fraction of what autograd saves among the region's values.  The
values of no region form the rest of the graph, capped by the default budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckpt import _torch_compat as compat
from ckpt.config import Budget
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.problem import RegionCap

__all__ = ["REST_LABEL", "RegionSpec", "region_caps", "region_of_values"]

REST_LABEL = "(rest of the graph)"


@dataclass(frozen=True)
class RegionSpec:
    """A module of the compiled frame, by path, with its budget; ``label`` is how users name it.

    ``depth`` orders regions by specificity: the number of path components for
    a module inside the frame, and less than 1 for a module that contains the
    frame's own module (a frame Dynamo compiled for a submodule after a graph
    break), whose region is the whole frame.  The path ``""`` is the whole graph.
    """

    path: str
    budget: Budget
    label: str
    depth: int


def _covers(region_path: str, module_path: str | None) -> bool:
    if region_path == "":  # a module around the whole graph
        return True
    if module_path is None:
        return "." not in region_path  # the frame's own module
    return module_path == region_path or module_path.startswith(region_path + ".")


def _region_of_path(specs: Sequence[RegionSpec], path: str | None) -> int | None:
    best: int | None = None
    for k, spec in enumerate(specs):
        if _covers(spec.path, path) and (best is None or spec.depth > specs[best].depth):
            best = k
    return best


def region_of_values(analysis: JointAnalysis, specs: Sequence[RegionSpec]) -> list[int | None]:
    """For each problem value, the index in ``specs`` of its region (None: the rest of the graph).

    A graph input (an activation an earlier graph computed, before a graph
    break) belongs to the region of its readers here, if they share one.
    """
    forward = analysis.forward_names
    result: list[int | None] = []
    for node in analysis.nodes:
        if node.op != "placeholder":
            result.append(_region_of_path(specs, compat.node_module_path(node)))
            continue
        readers = {_region_of_path(specs, compat.node_module_path(user)) for user in node.users if user.name in forward}
        result.append(readers.pop() if len(readers) == 1 else None)
    return result


def region_caps(analysis: JointAnalysis, specs: Sequence[RegionSpec], default: Budget) -> tuple[RegionCap, ...]:
    """One cap per region with a budget, and one for the rest of the graph if the default budget caps it.

    A region whose module computes none of this graph's values gets no cap.
    """
    problem = analysis.problem
    owner = region_of_values(analysis, specs)
    groups: dict[int | None, set[int]] = {}
    for i, k in enumerate(owner):
        groups.setdefault(k, set()).add(i)
    caps: list[RegionCap] = []
    for k in [*range(len(specs)), None]:
        members = frozenset(groups.get(k, ()))
        budget = default if k is None else specs[k].budget
        if not members:
            continue
        reference = sum(problem.save_bytes[i] for i in analysis.reference_saved if i in members)
        cap = budget.resolve(reference)
        if cap is None:
            continue
        label = REST_LABEL if k is None else specs[k].label
        caps.append(RegionCap(label, members, cap, str(budget), reference, budget.fraction))
    return tuple(caps)
