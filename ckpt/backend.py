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
3. solve it under the budget (:mod:`ckpt.partitioner.solver`), then weigh the
   step's predicted peak (:mod:`ckpt.partitioner.peak_search`): under a peak
   cap, the first plan of the repair walk within it; under a budget alone,
   the lowest peak among the walk's plans within the 1% time slack, and never
   a peak above the plan without a budget's while a plan within the budget
   avoids it;
4. extract the forward and backward graphs (:mod:`ckpt.partitioner.extract`);
5. finish them: torch's own final steps (which make random ops that a
   checkpoint region recomputes replay the forward's RNG state), then no other
   random op may remain in the backward, and the backward must recompute
   exactly what the plan says.

If any step raises, the failure policy applies: one warning and torch's
default partition, or, under ``CKPT_STRICT=1``, an error naming the graph.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt._version import __version__
from ckpt.config import CkptConfig, PeakCap, auto_peak_bytes, format_bytes
from ckpt.cost_model.measured import OpCosts, plan_costs
from ckpt.cost_model.profiles import GPU_PROFILES, DeviceProfile, gpu_profile_for_name
from ckpt.module_budgets import frame_regions
from ckpt.partitioner.analysis import JointAnalysis, analyze_joint, to_picoseconds
from ckpt.partitioner.extract import (
    drop_dead_random_ops,
    extract_modules,
    save_inputs_uncopied,
    share_seed_kernels,
    verify_backward,
)
from ckpt.partitioner.joint_graph import autograd_saved_names
from ckpt.partitioner.min_cut import CutNetwork
from ckpt.partitioner.peak import PeakGraph
from ckpt.partitioner.peak_analysis import build_peak_graph, predict_plan
from ckpt.partitioner.peak_search import budget_peak, cap_peak
from ckpt.partitioner.plan import Plan, make_plan
from ckpt.partitioner.problem import ProblemError, RegionCap, region_bytes
from ckpt.partitioner.regional import solve_regions
from ckpt.partitioner.regions import RegionSpec, region_caps
from ckpt.partitioner.solver import solve
from ckpt.partitioner.symbolic import fit_fraction, fit_region_fractions
from ckpt.partitioner.torch_plan import plan_from_saved_names, torch_default_saved_names
from ckpt.records import PartitionRecord, publish

__all__ = [
    "BudgetWarning",
    "CkptPartitionError",
    "CkptPartitioner",
    "PeakWarning",
    "ProfileWarning",
    "ckpt_backend",
    "graph_device",
    "make_partitioner",
    "measured_op_costs",
    "resolve_auto_peak",
    "resolve_profile",
]

log = logging.getLogger(__name__)

# The peak cap's walk re-solves once per pinned value or tightened budget, up to
# peak_search.MAX_STEPS times; its re-solves run the repair search at this fraction of
# the solver effort (the first solve keeps all of it).  On the benchmark models this
# cuts the planning time under a cap by 1.2-3.7x, with the same peaks and times within 1%
# on most graphs.
CAP_WALK_EFFORT = 0.25
# Under a budget alone, the peak tie-break's re-solves with pinned values (segment plans, walk
# steps) run the repair search at this fraction of the solver effort; the solves without pins
# (the budget's own plan, the reference budgets) keep all of it.  On the benchmark models this
# halves the planning time of the 4-layer graphs (GPT-2 at 0.5: 2.29 -> 1.29 s) with the same
# plans, but for two ViT budgets whose plans save fewer bytes at the same or a lower predicted time and peak.
PINNED_EFFORT = 0.5


class BudgetWarning(UserWarning):
    """The memory budget is below the smallest plan this graph allows."""


class PeakWarning(UserWarning):
    """The peak cap is below the smallest peak found, or a budget raises the peak."""


class CkptPartitionError(RuntimeError):
    """The ckpt partitioner failed on a graph (raised under ``CKPT_STRICT=1``)."""


_graph_counter = itertools.count()


def _package_files() -> list[str]:
    root = Path(__file__).resolve().parent
    return sorted(str(p) for p in root.rglob("*.py"))


class CkptPartitioner(compat.custom_partitioner_base()):  # type: ignore[misc]
    """Inductor's ``custom_partitioner_fn``: plans and extracts each joint graph."""

    def __init__(
        self,
        config: CkptConfig,
        profile: DeviceProfile,
        activation_inputs: frozenset[int] = frozenset(),
        num_graph_inputs: int = 0,
        regions: tuple[RegionSpec, ...] = (),
        op_costs: OpCosts | None = None,
    ) -> None:
        """``activation_inputs``: positions, among the ``num_graph_inputs`` inputs of the graph
        being compiled, of inputs that are activations (see :func:`activation_inputs`).
        ``regions``: the modules with their own budget (:func:`ckpt.module_budgets.frame_regions`).
        ``op_costs``: measured times of library calls on the graph's device (None: the roofline)."""
        self.config = config
        self.op_costs = op_costs
        self.profile = profile
        self.activation_inputs = activation_inputs
        self.num_graph_inputs = num_graph_inputs
        self.regions = regions
        # This graph's per-module caps, reused by its re-solves; dropped after it (Inductor copies its config,
        # this object included, and the analysis holds fake tensors).
        self._caps: tuple[JointAnalysis, tuple[RegionCap, ...]] | None = None
        # The graph's min-cut network while it is planned: each re-solve starts from earlier cuts' flows.
        self._network: CutNetwork | None = None

    def uuid(self) -> str:
        """Covers everything a plan depends on, so a cached graph never crosses budgets."""
        digest = hashlib.sha256()
        digest.update(__version__.encode())
        digest.update(repr(self.config.budget).encode())
        digest.update(repr(self.regions).encode())
        digest.update(repr(self.config.solver_effort).encode())
        digest.update(repr(self.config.peak).encode())
        digest.update(self.profile.key().encode())
        digest.update(repr(sorted(self.activation_inputs)).encode())
        digest.update((self.op_costs.key() if self.op_costs is not None else "roofline").encode())
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
            publish(
                PartitionRecord(
                    name, None, None, self.config.budget, None, self.profile, 0.0, reason, explain=self.config.explain
                )
            )
            return self._fallback_partition(gm, joint_inputs, num_fwd_outputs, static_indices, kwargs)
        finally:
            self._caps = None

    def _fallback_partition(
        self,
        gm: fx.GraphModule,
        joint_inputs: Sequence[object],
        num_fwd_outputs: int,
        static_indices: Sequence[int] | None,
        kwargs: dict[str, Any],
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        """torch's partition for a graph ckpt could not plan: Inductor's own min cut."""
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
        autograd_saved = autograd_saved_names(gm, num_fwd_outputs)  # before CSE merges the backward's recomputes
        gm, _, has_recompute_rng = compat.prepare_joint(gm)
        analysis = analyze_joint(
            gm, num_fwd_outputs, self.profile, self._activation_inputs(gm), autograd_saved, measure=self.op_costs
        )
        peak_graph = self.planning_graph(build_peak_graph(gm, analysis, num_fwd_outputs))
        plan, budget_bytes, peak_cap, solve_seconds = self.plan(name, analysis, peak_graph)
        caps = self.region_caps(analysis)
        if plan.over_regions:
            over = ", ".join(
                f"{cap.label!r} (budget {cap.budget}: {format_bytes(cap.max_bytes)}; the plan keeps "
                f"{format_bytes(region_bytes(analysis.problem, plan.saved, plan.recomputed, cap.members))})"
                for cap in caps
                if cap.label in plan.over_regions
            )
            warnings.warn(
                f"ckpt: graph {name!r}: no plan found keeps the per-module budgets of {over}: the backward needs "
                "values there that cannot be recomputed, or recomputing them needs more than the cap; "
                "using the plan that exceeds them least",
                BudgetWarning,
                stacklevel=2,
            )
        elif plan.over_budget:
            warnings.warn(
                f"ckpt: graph {name!r}: memory budget {self.config.budget} ({format_bytes(plan.budget_bytes or 0)}) is "
                f"below the smallest achievable plan ({format_bytes(plan.minimum_bytes or plan.bytes)} of saved "
                "activations); using that plan",
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
        fw_module = share_seed_kernels(fw_module)
        fw_module, bw_module = save_inputs_uncopied(fw_module, bw_module, analysis.uncopied_inputs, num_fwd_outputs)
        verify_backward(bw_module, analysis, plan)
        record = PartitionRecord(
            name,
            analysis,
            plan,
            self.config.budget,
            budget_bytes,
            self.profile,
            solve_seconds,
            torch_plan=torch_plan,
            explain=self.config.explain,
            peak_graph=peak_graph,
            peak=predict_plan(peak_graph, plan),
            peak_cap_bytes=peak_cap,
            region_caps=caps,
        )
        log.debug("ckpt graph %r plan fingerprint %s", name, record.fingerprint)
        publish(record)
        return fw_module, bw_module

    def plan(
        self, name: str, analysis: JointAnalysis, peak_graph: PeakGraph
    ) -> tuple[Plan, int | None, int | None, float]:
        """The plan for an analysed joint graph, its budget and peak cap in bytes, and the seconds it took.

        The budget resolves against what autograd saves; the solve is followed
        by the peak step (the cap, or the lowest peak within the slack).  A
        fractional budget under dynamic shapes is checked again on the peak
        step's plan: the budget is a promise at every size, the peak a
        preference.  This is all the planning :meth:`__call__` does before
        extracting the graphs, so tools can plan a traced joint graph exactly
        as the backend would.
        """
        peak_graph = self.planning_graph(peak_graph)
        # With per-module budgets, the default budget caps the rest of the graph (a region cap).
        budget_bytes = None if self.regions else self.config.budget.resolve(analysis.reference_bytes)
        started = time.perf_counter()
        self._network = CutNetwork(analysis.problem)
        try:
            plan = self._solve(analysis, budget_bytes)
            plan, peak_cap = self._fit_peak(name, analysis, peak_graph, plan, budget_bytes)
            plan = self._fit_fraction(analysis, budget_bytes, plan)
        finally:
            self._network = None  # its flows are only worth keeping while this graph is planned
        return plan, budget_bytes, peak_cap, time.perf_counter() - started

    def planning_graph(self, peak_graph: PeakGraph) -> PeakGraph:
        """The peak graph plans are chosen on: calls' tuple outputs and pooled input copies count only under a cap.

        A cap is a promise, so it is planned on the model that counts what
        Inductor's code allocates while a library call runs (its outputs,
        ``PeakGraph.call_outputs``), the higher estimate where attention or a
        convolution's backward peaks, and the convolutions' input copies that
        Inductor's pool holds after the call (``PeakGraph.pooled_copies``).
        Without a cap, the budget's tie-break only prefers a lower peak, and
        it leaves them out (the copies then count as each call's scratch):
        with the outputs it prefers plans whose peak the model's known gap
        (Inductor fusing kernels that share any read, see the README's known
        limits) underestimates more, and with the copies it moved the U-Net's
        budget of 0.25 to a plan that measured 27.30 MiB instead of 21.65
        under another set of library-call timings.  :meth:`plan` applies this
        itself; the records predict with the same graph.
        """
        if self.config.peak.unlimited and (peak_graph.call_outputs or peak_graph.pooled_copies):
            return dataclasses.replace(
                peak_graph, call_outputs=(), pooled_copies=(), fallback_calls=frozenset(), unaligned_calls=frozenset()
            )
        return peak_graph

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

    def region_caps(self, analysis: JointAnalysis) -> tuple[RegionCap, ...]:
        """The per-module caps for this graph (none without per-module budgets)."""
        if not self.regions:
            return ()
        if self._caps is None or self._caps[0] is not analysis:
            self._caps = (analysis, region_caps(analysis, self.regions, self.config.budget))
        return self._caps[1]

    def _resolve(
        self, analysis: JointAnalysis, cap: int | None, force: frozenset[int] = frozenset(), effort: float = 1.0
    ) -> Plan:
        """The solver's plan under ``cap`` (and the per-module caps), with ``force`` saved."""
        # Stop searching once no plan can beat this one by 0.5% of the estimated step: less than
        # the cost model's own accuracy.
        tolerance = to_picoseconds(analysis.fixed_seconds * 5e-3)
        if self.regions:
            caps = self.region_caps(analysis)
            if cap is not None:
                caps += (RegionCap("(whole graph)", frozenset(range(len(analysis.problem))), cap),)
            if caps:
                plan = solve_regions(
                    analysis.problem,
                    caps,
                    effort=self.config.solver_effort * effort,
                    tolerance_ps=tolerance,
                    force_saved=force,
                )
                return dataclasses.replace(plan, budget_bytes=cap)
        return solve(
            analysis.problem,
            cap,
            effort=self.config.solver_effort * effort,
            tolerance_ps=tolerance,
            slack_ps=2 * tolerance,  # the leanest plan within 1% of the fastest the budget allows
            force_saved=force,
            network=self._network if self._network is not None and self._network.problem is analysis.problem else None,
        )

    def _solve(self, analysis: JointAnalysis, budget_bytes: int | None) -> Plan:
        return self._fit_fraction(analysis, budget_bytes, self._resolve(analysis, budget_bytes))

    def _fit_fraction(self, analysis: JointAnalysis, budget_bytes: int | None, plan: Plan) -> Plan:
        """Under dynamic shapes, a plan whose fraction holds at every sample size (:mod:`ckpt.partitioner.symbolic`)."""
        if self.regions:
            return self._fit_region_fractions(analysis, budget_bytes, plan)
        fraction = self.config.budget.fraction
        if fraction is None or budget_bytes is None:
            return plan
        baseline = make_plan(analysis.problem, analysis.reference_saved, "autograd", optimal=False)
        return fit_fraction(
            plan,
            fraction,
            budget_bytes,
            baseline,
            analysis.save_bytes_exprs,
            analysis.size_hints,
            lambda cap: self._resolve(analysis, cap),
        )

    def _fit_region_fractions(self, analysis: JointAnalysis, budget_bytes: int | None, plan: Plan) -> Plan:
        """Per-module fractions that hold at every sample size; the lowered caps stay for later re-solves."""
        caps = self.region_caps(analysis)

        def resolve(tightened: tuple[RegionCap, ...]) -> Plan:
            self._caps = (analysis, tightened)
            return self._resolve(analysis, budget_bytes)

        plan, caps = fit_region_fractions(
            plan,
            caps,
            analysis.problem,
            analysis.reference_saved,
            analysis.save_bytes_exprs,
            analysis.size_hints,
            resolve,
        )
        self._caps = (analysis, caps)
        return plan

    def _fit_peak(
        self, name: str, analysis: JointAnalysis, peak_graph: PeakGraph, plan: Plan, budget_bytes: int | None
    ) -> tuple[Plan, int | None]:
        """Apply the peak cap, or the budget-alone rule; the plan and the cap in bytes."""
        tolerance = to_picoseconds(analysis.fixed_seconds * 5e-3)

        solved: dict[tuple[int | None, frozenset[int]], Plan] = {(budget_bytes, frozenset()): plan}

        def solve_pinned(cap: int | None, force: frozenset[int], effort: float | None = None) -> Plan:
            if (cap, force) not in solved:
                if effort is None:
                    effort = PINNED_EFFORT if force else 1.0
                solved[cap, force] = self._resolve(analysis, cap, force, effort)
            return solved[cap, force]

        def solve_capped(cap: int | None, force: frozenset[int]) -> Plan:
            return solve_pinned(cap, force, CAP_WALK_EFFORT)

        problem = analysis.problem
        reference = 0  # only a fractional cap needs the reference plan's peak (one more simulation)
        if self.config.peak.fraction is not None:
            baseline = make_plan(problem, analysis.reference_saved, "autograd", optimal=False)
            reference = predict_plan(peak_graph, baseline).peak_bytes
        peak_cap = self.config.peak.resolve(reference)
        if peak_cap is not None:
            result = cap_peak(problem, peak_graph, solve_capped, budget_bytes, peak_cap)
            if not result.within_cap:
                warnings.warn(
                    f"ckpt: graph {name!r}: peak memory cap {self.config.peak} ({format_bytes(peak_cap)}) is below the "
                    f"smallest peak found ({format_bytes(result.lowest_peak)} predicted); using that plan",
                    PeakWarning,
                    stacklevel=4,
                )
            return result.plan, peak_cap
        guarded = budget_peak(problem, peak_graph, solve_pinned, budget_bytes, 2 * tolerance, solve_capped)
        if guarded.raises_peak:
            warnings.warn(
                f"ckpt: graph {name!r}: memory budget {self.config.budget} lowers saved activations but raises the "
                f"predicted peak to {format_bytes(guarded.search.prediction.peak_bytes)}, above the "
                f"{format_bytes(guarded.reference_peak)} of a plan at a larger budget (or none), and no plan found "
                "within the budget avoids it; to bound what runs out, set CKPT_PEAK_MEMORY",
                PeakWarning,
                stacklevel=4,
            )
        return guarded.search.plan, None

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
    """The device profile: ``CKPT_DEVICE`` if set, else measured on the graph's device.

    A GPU is measured once per device model (:mod:`ckpt.cost_model.gpu_calibrate`);
    if measuring fails, its datasheet profile stands in, with one warning.
    """
    name = config.device
    device = graph_device(example_inputs)
    if name is None:
        if device is not None and device.type == "cuda":
            return _measured_gpu_profile(device)
        if device is not None and device.type not in ("cpu", "meta"):
            log.info("ckpt: no profile for device type %r; using the cpu profile (set CKPT_DEVICE)", device.type)
        name = "cpu"
    if name == "cpu":
        from ckpt.cost_model.calibrate import cpu_profile

        return cpu_profile()
    return GPU_PROFILES[name]


_gpu_warnings: set[str] = set()


class ProfileWarning(UserWarning):
    """A device could not be measured: a datasheet profile stands in."""


def _measured_gpu_profile(device: torch.device) -> DeviceProfile:
    from ckpt.cost_model.gpu_calibrate import gpu_profile

    try:
        return gpu_profile(device)
    except (RuntimeError, ValueError, TypeError, AttributeError) as error:  # CUDA errors are RuntimeErrors
        gpu_name = torch.cuda.get_device_name(device)
        fallback = gpu_profile_for_name(gpu_name)
        if gpu_name not in _gpu_warnings:
            _gpu_warnings.add(gpu_name)
            warnings.warn(
                f"ckpt: could not measure the {gpu_name} ({type(error).__name__}: {error}); planning with the "
                f"{fallback.name} datasheet profile ({fallback.source}). Set CKPT_DEVICE to choose a profile",
                ProfileWarning,
                stacklevel=2,
            )
        return fallback


def resolve_auto_peak(config: CkptConfig, example_inputs: Sequence[object]) -> CkptConfig:
    """Turn ``CKPT_PEAK_MEMORY=auto`` into bytes: free CUDA memory now, less the margin."""
    if not config.peak.auto:
        return config
    device = next((v.device for v in example_inputs if isinstance(v, torch.Tensor) and v.device.type == "cuda"), None)
    if device is None:
        raise ValueError(
            "CKPT_PEAK_MEMORY='auto' needs a CUDA device (it reads the free device memory at compile time); "
            "this graph has none. Give a fraction such as 0.5 or a size such as 6GiB instead"
        )
    free, total = torch.cuda.mem_get_info(device)
    cap = auto_peak_bytes(int(free), int(total))
    log.info(
        "ckpt: CKPT_PEAK_MEMORY=auto: %d bytes free of %d on %s; capping the peak at %d bytes", free, total, device, cap
    )
    return dataclasses.replace(config, peak=PeakCap(max_bytes=cap))


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
    config = resolve_auto_peak(CkptConfig.from_sources(options), example_inputs)
    patches: dict[str, Any] = dict(compat.inductor_mode_options(mode))
    patches.update(compat.eager_rng_order_patches())
    patches["custom_partitioner_fn"] = make_partitioner(gm, example_inputs, config)
    return compat.compile_fx(gm, example_inputs, config_patches=patches)


def graph_device(example_inputs: Sequence[object]) -> torch.device | None:
    """The device a graph runs on: its first tensor's that is not on the CPU, else the CPU (None: no tensors)."""
    device: torch.device | None = None
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            device = value.device
            if device.type != "cpu":
                break
    return device


def measured_op_costs(
    config: CkptConfig, example_inputs: Sequence[object], profile: DeviceProfile, *, agree: bool = True
) -> tuple[OpCosts | None, DeviceProfile]:
    """Measured library-call costs for a graph, and the profile to plan it with.

    There are costs only if measuring is on and ``profile`` is for the kind of
    device the graph runs on.  ``agree``: the caller runs on every rank for
    every graph (the backend), so the ranks can agree on the costs and the
    profile here; see :func:`ckpt.cost_model.measured.plan_costs`.
    """
    device = graph_device(example_inputs)
    if not config.measure_ops or device is None or device.type not in ("cpu", "cuda"):
        return None, profile
    if config.device is not None and (config.device == "cpu") != (device.type == "cpu"):
        return None, profile  # planning for another device than the one at hand
    return plan_costs(device, profile, agree=agree)


def make_partitioner(gm: fx.GraphModule, example_inputs: Sequence[object], config: CkptConfig) -> CkptPartitioner:
    """The partitioner for one Dynamo graph: its device profile, activation inputs, budgeted modules and op costs."""
    op_costs, profile = measured_op_costs(config, example_inputs, resolve_profile(config, example_inputs))
    return CkptPartitioner(
        config,
        profile,
        activation_inputs(example_inputs),
        len(example_inputs),
        frame_regions(gm, example_inputs, config.module_budgets),
        op_costs,
    )
