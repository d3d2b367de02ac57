"""ckpt's partitioner for everyone who drives AOTAutograd: :func:`partition_fn`.

``aot_function``, ``aot_module``, ``aot_module_simplified`` and the
frameworks built on them (graph trainers, auto-parallel planners, custom
``torch.compile`` backends) take a ``partition_fn`` that splits the joint
forward+backward graph.  :func:`partition_fn` returns one that runs the same
planner as ``backend="ckpt"``: the exact min-cut save-or-recompute plan under
a memory budget, with the same records and the same failure policy.

Two things differ from the backend, and both follow from who calls it:

* **Device profile.** Without ``device``, it is picked per graph from the
  joint graph's inputs, as the backend picks it from the example inputs.
* **Fallback.**  A graph ckpt cannot plan gets AOTAutograd's own default,
  :func:`torch._functorch.partitioners.default_partition` (the forward saves
  what eager autograd saves), not Inductor's min cut: that is what this
  caller would have had without ckpt.

**Per-module budgets.**  A ``memory_budget`` mapping (``{"layers.*.mlp": 0.1,
"": 0.5}``) applies where the joint graph records which module computed each
node, as graphs that Dynamo traced do (a custom backend calling
``aot_module_simplified``); paths are relative to the module Dynamo compiled.
``aot_function`` and ``aot_module`` traces record no module paths, and
:func:`ckpt.set_budget` needs the graph inputs' sources that only
``backend="ckpt"`` sees.

**Input mutations.**  With AOTAutograd's default
``keep_inference_input_mutations=False``, a mutated input's new value is a
graph output that the runtime wrapper copies back after the forward.  The
planner reads AOTAutograd's output descriptors to find those inputs and
never saves them or recomputes from them
(:mod:`ckpt.partitioner.joint_graph`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.backend import CkptPartitioner, measured_op_costs, resolve_auto_peak, resolve_profile
from ckpt.config import CkptConfig
from ckpt.cost_model.profiles import DeviceProfile
from ckpt.module_budgets import ModuleBudgetWarning, frame_regions
from ckpt.partitioner.regions import RegionSpec

__all__ = ["CkptPartitionFn", "partition_fn"]

log = logging.getLogger(__name__)


class _AOTCkptPartitioner(CkptPartitioner):
    """:class:`CkptPartitioner` whose fallback is AOTAutograd's default partition."""

    def _fallback_partition(
        self,
        gm: fx.GraphModule,
        joint_inputs: Sequence[object],
        num_fwd_outputs: int,
        static_indices: Sequence[int] | None,
        kwargs: dict[str, Any],
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        return compat.aot_default_partition(
            gm, joint_inputs, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=static_indices
        )


def _flat_inputs(joint_inputs: Any) -> list[object]:
    """AOTAutograd passes ``[*primals, *tangents]`` or ``(primals, tangents)``."""
    if isinstance(joint_inputs, tuple) and len(joint_inputs) == 2 and all(isinstance(p, list) for p in joint_inputs):
        return [*joint_inputs[0], *joint_inputs[1]]
    return list(joint_inputs)


class CkptPartitionFn:
    """A ``partition_fn`` for AOTAutograd: ``(joint_module, joint_inputs, *, num_fwd_outputs, **kwargs)``.

    Made by :func:`partition_fn`; ``config`` is its parsed configuration.
    """

    def __init__(self, config: CkptConfig) -> None:
        self.config = config

    def __repr__(self) -> str:
        budget = str(self.config.budget)
        if self.config.module_budgets:
            budget = ",".join([budget, *(f"{path}={value}" for path, value in self.config.module_budgets)])
        return (
            f"ckpt.partition_fn(memory_budget={budget!r}, peak_memory={str(self.config.peak)!r}, "
            f"device={self.config.device!r})"
        )

    def profile_for(self, joint_inputs: Any) -> DeviceProfile:
        """The device profile for a joint graph with these inputs."""
        return resolve_profile(self.config, _flat_inputs(joint_inputs))

    def __call__(
        self, joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        regions: tuple[RegionSpec, ...] = ()
        if self.config.module_budgets:
            if not any(compat.node_module_path(node) for node in joint_module.graph.nodes):
                warnings.warn(
                    "ckpt.partition_fn: this joint graph records no module paths (aot_function and aot_module "
                    "traces do not), so its per-module budgets cannot apply; the default budget "
                    f"{self.config.budget} caps the whole graph",
                    ModuleBudgetWarning,
                    stacklevel=2,
                )
            else:
                regions = frame_regions(joint_module, (), self.config.module_budgets)
        flat = _flat_inputs(joint_inputs)
        config = resolve_auto_peak(self.config, flat)
        op_costs, profile = measured_op_costs(config, flat, self.profile_for(joint_inputs), agree=False)
        partitioner = _AOTCkptPartitioner(config, profile, regions=regions, op_costs=op_costs)
        return partitioner(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)


def partition_fn(
    memory_budget: Any = None,
    *,
    peak_memory: Any = None,
    device: str | None = None,
    strict: bool | str | None = None,
    solver_effort: float | str | None = None,
    explain: bool | str | None = None,
    measure_ops: bool | str | None = None,
) -> CkptPartitionFn:
    """ckpt's planner as a ``partition_fn`` for ``aot_function``, ``aot_module`` and their kin.

    Example::

        from functorch.compile import aot_module, nop
        import ckpt

        compiled = aot_module(model, fw_compiler=nop, bw_compiler=nop,
                              partition_fn=ckpt.partition_fn(memory_budget=0.5))
        compiled(x).sum().backward()

    Arguments take the forms of the ``torch.compile`` options and ``CKPT_*``
    variables of the same names (see the README); one left as None falls back
    to its ``CKPT_*`` variable, then to the default:

    * ``memory_budget``: ``"none"`` (no cap), a fraction in [0, 1] of what
      autograd saves (``0.5``), or a size (``"800MB"``, ``"1.5GiB"``); or a
      mapping from module paths to those (``{"layers.*.mlp": 0.1, "": 0.5}``,
      ``""`` being the default), for graphs that record module paths;
    * ``peak_memory``: a cap on the predicted peak of the graph's forward and
      backward: ``"none"``, a fraction of the peak of the plan that saves what
      autograd saves, a size, or ``"auto"`` (CUDA: free memory less a margin);
    * ``device``: a device profile name (``"cpu"``, ``"a100"``, ...), else
      picked from the joint graph's inputs;
    * ``strict``: raise :class:`ckpt.backend.CkptPartitionError` when a graph
      cannot be planned, instead of warning and using AOTAutograd's default
      partition;
    * ``solver_effort``: the repair search's work per graph (0 skips it);
    * ``explain``: ``"log"`` for a summary per graph, or a directory for reports;
    * ``measure_ops``: time the graph's library calls on its device (the
      default) instead of pricing them by the roofline.  Under an initialised
      process group a ``partition_fn`` uses no measured costs: it has no point
      that every rank reaches to agree on them.

    Each joint graph publishes a :class:`ckpt.records.PartitionRecord`, so
    :func:`ckpt.records.record_partitions` and ``ckpt.explain`` see it.  A bad
    value raises ``ValueError`` here, naming the argument, the value and the
    accepted forms.
    """
    compat.check_torch_version()
    given = {
        "memory_budget": memory_budget,
        "peak_memory": peak_memory,
        "device": device,
        "strict": strict,
        "solver_effort": solver_effort,
        "explain": explain,
        "measure_ops": measure_ops,
    }
    options = {key: value for key, value in given.items() if value is not None}
    return CkptPartitionFn(CkptConfig.from_sources(options))
