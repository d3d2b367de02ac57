"""The ``ckpt`` torch.compile backend: Inductor with our partitioner.

``torch.compile(model, backend="ckpt")`` finds :func:`ckpt_backend` through the
``torch_dynamo_backends`` entry point.  It reads the configuration once, picks
the device profile from the example inputs, and compiles with Inductor,
replacing Inductor's partitioner with :class:`CkptPartitioner` through
``custom_partitioner_fn``.  Inference graphs never reach a partitioner, so
they compile exactly as with the default backend.

For each joint graph the partitioner runs, top to bottom:

1. prepare the joint graph as torch does (dead code, CSE, checkpoint tags);
2. analyse it into a plain-data problem (:mod:`ckpt.partitioner.analysis`);
3. solve it under the budget (:mod:`ckpt.partitioner.solver`);
4. extract the forward and backward graphs (:mod:`ckpt.partitioner.extract`);
5. finish them: torch's own final steps (which make random ops that a
   checkpoint region recomputes replay the forward's RNG state), then no other
   random op may remain in the backward, and the backward must recompute
   exactly what the plan says.

If any step raises, the failure policy applies: one warning and torch's
default partition, or, under ``CKPT_STRICT=1``, an error naming the graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

import ckpt
from ckpt import _torch_compat as compat
from ckpt.config import Budget, CkptConfig
from ckpt.cost_model.profiles import GPU_PROFILES, DeviceProfile, gpu_profile_for_name
from ckpt.partitioner.analysis import JointAnalysis, analyze_joint, to_picoseconds
from ckpt.partitioner.extract import extract_modules, verify_backward
from ckpt.partitioner.plan import Plan, make_plan
from ckpt.partitioner.problem import ProblemError
from ckpt.partitioner.solver import solve
from ckpt.partitioner.symbolic import fit_fraction
from ckpt.partitioner.torch_plan import plan_from_saved_names, torch_default_saved_names
from ckpt.passes.backward import drop_dead_random_ops

__all__ = [
    "BudgetWarning",
    "CkptPartitionError",
    "CkptPartitioner",
    "PartitionRecord",
    "ckpt_backend",
    "record_partitions",
    "resolve_profile",
]

log = logging.getLogger(__name__)


class BudgetWarning(UserWarning):
    """The memory budget is below the smallest plan this graph allows."""


class CkptPartitionError(RuntimeError):
    """The ckpt partitioner failed on a graph (raised under ``CKPT_STRICT=1``)."""


@dataclass(frozen=True)
class PartitionRecord:
    """What the partitioner decided for one joint graph."""

    graph: str
    analysis: JointAnalysis | None
    plan: Plan | None
    budget: Budget
    budget_bytes: int | None
    profile: DeviceProfile
    solve_seconds: float
    fallback_reason: str | None = None
    torch_plan: Plan | None = None  # torch's default partition in our terms (only when explaining)

    @property
    def fingerprint(self) -> str | None:
        if self.plan is None or self.analysis is None:
            return None
        return self.plan.fingerprint(self.analysis.problem)


_recorders: list[list[PartitionRecord]] = []
_recorders_lock = threading.Lock()
_graph_counter = itertools.count()


@contextlib.contextmanager
def record_partitions() -> Iterator[list[PartitionRecord]]:
    """Collect a :class:`PartitionRecord` for every graph partitioned inside the block."""
    records: list[PartitionRecord] = []
    with _recorders_lock:
        _recorders.append(records)
    try:
        yield records
    finally:
        with _recorders_lock:
            _recorders.remove(records)


def _publish(record: PartitionRecord) -> None:
    with _recorders_lock:
        for records in _recorders:
            records.append(record)


def _package_files() -> list[str]:
    root = Path(ckpt.__file__).parent
    return sorted(str(p) for p in root.rglob("*.py"))


class CkptPartitioner(compat.custom_partitioner_base()):  # type: ignore[misc]
    """Inductor's ``custom_partitioner_fn``: plans and extracts each joint graph."""

    def __init__(
        self,
        config: CkptConfig,
        profile: DeviceProfile,
        activation_inputs: frozenset[int] = frozenset(),
        num_graph_inputs: int = 0,
    ) -> None:
        """``activation_inputs``: positions, among the ``num_graph_inputs`` inputs of the graph
        being compiled, of inputs that are activations (see :func:`activation_inputs`)."""
        self.config = config
        self.profile = profile
        self.activation_inputs = activation_inputs
        self.num_graph_inputs = num_graph_inputs

    def uuid(self) -> str:
        """Covers everything a plan depends on, so a cached graph never crosses budgets."""
        digest = hashlib.sha256()
        digest.update(ckpt.__version__.encode())
        digest.update(repr(self.config.budget).encode())
        digest.update(repr(self.config.solver_effort).encode())
        digest.update(self.profile.key().encode())
        digest.update(repr(sorted(self.activation_inputs)).encode())
        digest.update(compat.hash_for_files(_package_files()))
        return digest.hexdigest()

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        num_fwd_outputs = int(kwargs["num_fwd_outputs"])
        static_indices = kwargs.get("static_lifetime_input_indices")
        name = compat.graph_name(default=f"graph_{next(_graph_counter)}")
        try:
            return self._partition(name, gm, num_fwd_outputs, static_indices)
        except Exception as error:  # the failure policy: any planner error falls back
            reason = f"{type(error).__name__}: {error}"
            if self.config.strict:
                raise CkptPartitionError(f"ckpt could not partition graph {name!r}: {reason}") from error
            log.warning(
                "ckpt could not partition graph %r (%s); using torch's default partition instead. "
                "Set CKPT_STRICT=1 to raise instead.",
                name,
                reason,
            )
            _publish(PartitionRecord(name, None, None, self.config.budget, None, self.profile, 0.0, reason))
            return compat.torch_default_partition(
                gm,
                joint_inputs,
                compiler=kwargs.get("compiler", "inductor"),
                num_fwd_outputs=num_fwd_outputs,
                static_lifetime_input_indices=static_indices,
            )

    def _partition(
        self, name: str, gm: fx.GraphModule, num_fwd_outputs: int, static_indices: Sequence[int] | None
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        gm, _, has_recompute_rng = compat.prepare_joint(gm)
        analysis = analyze_joint(gm, num_fwd_outputs, self.profile, self._activation_inputs(gm))
        budget_bytes = self.config.budget.resolve(analysis.no_recompute_bytes)
        started = time.perf_counter()
        plan = self._solve(analysis, budget_bytes)
        solve_seconds = time.perf_counter() - started
        if plan.over_budget:
            warnings.warn(
                f"ckpt: graph {name!r}: memory budget {self.config.budget} ({budget_bytes} bytes) is below the "
                f"smallest achievable plan ({plan.minimum_bytes} bytes of saved activations); using that plan",
                BudgetWarning,
                stacklevel=2,
            )
        torch_plan = self._torch_plan(gm, analysis, num_fwd_outputs, static_indices) if self.config.explain else None
        fw_module, bw_module, num_sym = extract_modules(
            gm,
            analysis,
            plan,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=compat.static_lifetime_input_nodes(gm, static_indices),
        )
        # torch's final steps first: they wrap random ops that a checkpoint region asks to
        # recompute so that they replay the forward's RNG state.
        fw_module, bw_module = compat.finish_modules(
            gm, fw_module, bw_module, num_saved_sym_nodes=num_sym, has_recompute_rng=has_recompute_rng
        )
        bw_module = drop_dead_random_ops(bw_module)
        verify_backward(bw_module, analysis, plan)
        record = PartitionRecord(
            name, analysis, plan, self.config.budget, budget_bytes, self.profile, solve_seconds, torch_plan=torch_plan
        )
        log.debug("ckpt graph %r plan fingerprint %s", name, record.fingerprint)
        if self.config.explain is not None:
            from ckpt.explainer import emit_explain

            emit_explain(record, self.config.explain)
        _publish(record)
        return fw_module, bw_module

    def _activation_inputs(self, gm: fx.GraphModule) -> frozenset[int]:
        """The activation inputs, if the joint graph's primals line up with the compiled graph's inputs."""
        if not self.activation_inputs:
            return frozenset()
        primals = [n for n in gm.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
        if len(primals) != self.num_graph_inputs:
            log.debug(
                "ckpt: %d primal inputs for %d graph inputs; not charging activation inputs",
                len(primals),
                self.num_graph_inputs,
            )
            return frozenset()
        return self.activation_inputs

    def _solve(self, analysis: JointAnalysis, budget_bytes: int | None) -> Plan:
        # Stop searching once no plan can beat this one by 0.5% of the estimated step: less than
        # the cost model's own accuracy.
        tolerance = to_picoseconds(analysis.fixed_seconds * 5e-3)

        def resolve(cap: int | None) -> Plan:
            return solve(
                analysis.problem,
                cap,
                effort=self.config.solver_effort,
                tolerance_ps=tolerance,
                slack_ps=2 * tolerance,  # the leanest plan within 1% of the fastest the budget allows
            )

        plan = resolve(budget_bytes)
        fraction = self.config.budget.fraction
        if fraction is not None and budget_bytes is not None:
            baseline = make_plan(analysis.problem, analysis.no_recompute_saved, "no-recompute", optimal=False)
            plan = fit_fraction(
                plan, fraction, budget_bytes, baseline, analysis.save_bytes_exprs, analysis.size_hints, resolve
            )
        return plan

    @staticmethod
    def _torch_plan(
        gm: fx.GraphModule, analysis: JointAnalysis, num_fwd_outputs: int, static_indices: Sequence[int] | None
    ) -> Plan | None:
        """torch's default partition of ``gm``, evaluated by our cost model, for reports."""
        try:
            names = torch_default_saved_names(gm, num_fwd_outputs, static_indices)
            return plan_from_saved_names(analysis, names)
        except (ProblemError, RuntimeError, ValueError) as error:
            log.info("ckpt: cannot evaluate torch's default partition for comparison (%s)", error)
            return None


def activation_inputs(example_inputs: Sequence[object]) -> frozenset[int]:
    """Positions of inputs that are activations: results of earlier autograd work.

    A tensor that requires grad but is not a leaf was computed by autograd
    before this graph ran, for example by the graph before a graph break.
    Parameters and the user's inputs are leaves.
    """
    return frozenset(
        i
        for i, value in enumerate(example_inputs)
        if isinstance(value, torch.Tensor) and value.requires_grad and not value.is_leaf
    )


def resolve_profile(config: CkptConfig, example_inputs: Sequence[object]) -> DeviceProfile:
    """The device profile: ``CKPT_DEVICE`` if set, else from the graph's tensors."""
    name = config.device
    device: torch.device | None = None
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            device = value.device
            if device.type != "cpu":
                break
    if name is None:
        if device is not None and device.type == "cuda":
            gpu_name = torch.cuda.get_device_name(device)
            profile = gpu_profile_for_name(gpu_name)
            if profile.name not in gpu_name.lower():
                log.info("ckpt: no profile for GPU %r; using the %s profile (set CKPT_DEVICE)", gpu_name, profile.name)
            return profile
        if device is not None and device.type not in ("cpu", "meta"):
            log.info("ckpt: no profile for device type %r; using the cpu profile (set CKPT_DEVICE)", device.type)
        name = "cpu"
    if name == "cpu":
        from ckpt.cost_model.calibrate import cpu_profile

        return cpu_profile()
    return GPU_PROFILES[name]


def ckpt_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[object],
    *,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Any:
    """The ``torch.compile`` backend registered as ``"ckpt"``.

    ``options`` takes the keys in :data:`ckpt.config.OPTION_KEYS`; ``mode`` is
    passed on to Inductor (for example ``"max-autotune"``).
    """
    compat.check_torch_version()
    config = CkptConfig.from_sources(options)
    profile = resolve_profile(config, example_inputs)
    patches: dict[str, Any] = dict(compat.inductor_mode_options(mode))
    patches.update(compat.eager_rng_order_patches())
    patches["custom_partitioner_fn"] = CkptPartitioner(
        config, profile, activation_inputs(example_inputs), len(example_inputs)
    )
    return compat.compile_fx(gm, example_inputs, config_patches=patches)
