"""The explain report: what a plan saves and recomputes, its predicted costs, as data and as tables.

:func:`graph_report` turns one :class:`~ckpt.backend.PartitionRecord` into a
:class:`GraphReport` of plain values.  Predictions come from the record's
plain-data problem (:func:`ckpt.partitioner.problem.evaluate`), so the
no-recompute plan and torch's default partition are priced by the same cost
model as ckpt's plan.  Torch's saved set is the record's ``torch_plan``,
which the backend computes when explaining (torch's partitioner on a copy of
the joint graph, saved views counted as the tensors they alias).

Predicted step time is the analysis's fixed forward-and-backward estimate
plus the plan's save and recompute time: a rough absolute figure, but the
difference between two plans is exactly the difference the solver optimises.
"""

from __future__ import annotations

import logging
import operator
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch.fx as fx

from ckpt.cost_model.node_cost import tensor_values
from ckpt.cost_model.ops import OpKind
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.peak_analysis import describe
from ckpt.partitioner.problem import evaluate, region_bytes
from ckpt.tools.formatting import clip_rows, format_bytes, format_ps, short_source, table

if TYPE_CHECKING:
    from ckpt.records import PartitionRecord

__all__ = ["ExplainReport", "GraphReport", "PlanTotals", "RegionRow", "graph_report", "plan_totals"]

log = logging.getLogger(__name__)

MAX_ROWS = 40


@dataclass(frozen=True)
class SavedTensor:
    name: str
    op: str
    shape: list[str]
    dtype: str
    bytes: int
    source: str
    is_input: bool  # a graph input (parameter or user input): costs bytes only if Inductor copies it


@dataclass(frozen=True)
class RecomputedValue:
    name: str
    op: str
    shape: list[str]
    dtype: str
    cost_ps: int
    flops: int
    library_call: bool  # a matmul, convolution or attention kernel, not a fused pointwise op
    source: str
    timed: bool = False  # a library call whose cost was measured on the device, not its roofline


@dataclass(frozen=True)
class PlanTotals:
    """Predicted costs of one plan for one graph (times in picoseconds)."""

    bytes: int
    save_ps: int
    recompute_ps: int
    recompute_library_ps: int  # the part of recompute_ps spent in library calls
    step_seconds: float  # fixed forward + backward estimate plus save and recompute time

    @property
    def extra_ps(self) -> int:
        return self.save_ps + self.recompute_ps


@dataclass(frozen=True)
class SolverFacts:
    solver: str
    optimal: bool
    solve_seconds: float
    lambda_ps_per_byte: float | None  # the hull's time per byte at the budget; 0 when the budget does not bind
    lambda_note: str
    cuts: int
    search_nodes: int
    over_budget: bool
    minimum_bytes: int | None


@dataclass(frozen=True)
class RegionRow:
    """One per-module budget in one graph: its cap and what the plan keeps there."""

    label: str
    budget: str
    cap_bytes: int
    autograd_bytes: int  # what autograd saves among the region's values (a fraction's reference)
    saved_bytes: int  # what the plan keeps for the region's values
    recompute_ps: int  # predicted time recomputing the region's values
    values: int  # forward values the region computes

    @property
    def kept(self) -> bool:
        return self.saved_bytes <= self.cap_bytes


@dataclass(frozen=True)
class GraphReport:
    graph: str
    budget: str
    budget_bytes: int | None
    fallback_reason: str | None = None
    solver: SolverFacts | None = None
    # "ckpt", "autograd", "no_recompute", "torch_default"
    plans: dict[str, PlanTotals | None] = field(default_factory=dict)
    torch_default_note: str | None = None
    saved: tuple[SavedTensor, ...] = ()
    recomputed: tuple[RecomputedValue, ...] = ()
    backward_only: int = 0  # values the backward computes anyway, at no extra cost
    peak: dict[str, Any] | None = None  # the plan's predicted peak (ckpt.partitioner.peak_analysis.describe)
    regions: tuple[RegionRow, ...] = ()  # per-module budgets, with the rest of the graph's cap last
    profile: str = ""  # the device profile's name
    profile_source: str = ""  # where its rates come from
    library_calls: int = 0  # the graph's library-call nodes
    timed_calls: int = 0  # of those, the ones priced by a time measured on the device


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


def plan_totals(analysis: JointAnalysis, saved: frozenset[int] | tuple[int, ...]) -> PlanTotals:
    """Predicted bytes and time of the plan that saves ``saved``; raises ProblemError if it is not valid."""
    problem = analysis.problem
    time_ps, nbytes, recomputed = evaluate(problem, saved)
    save_ps = sum(problem.save_time[i] for i in saved)
    library_ps = sum(
        problem.recompute_time[i]
        for i in recomputed
        if (est := analysis.estimates.get(problem.names[i])) is not None and est.kind is OpKind.EXTERN
    )
    return PlanTotals(nbytes, save_ps, time_ps - save_ps, library_ps, analysis.fixed_seconds + time_ps * 1e-12)


def _op_name(node: fx.Node) -> str:
    """``aten.addmm``, ``prims.iota``; an item of a multi-output op as ``aten.op[i]``."""
    if node.op == "placeholder":
        return "input"
    target = node.target
    if target is operator.getitem and node.args and isinstance(node.args[0], fx.Node):
        return f"{_op_name(node.args[0])}[{node.args[1]}]"
    if callable(target) and not hasattr(target, "_schema"):  # a Python function
        return getattr(target, "__name__", str(target))
    name = str(target)
    return name[: -len(".default")] if name.endswith(".default") else name


def _solver_facts(record: PartitionRecord) -> SolverFacts:
    plan = record.plan
    assert plan is not None
    lam: float | None
    if plan.price_per_byte is not None:
        lam = plan.price_per_byte
        note = "time per byte saved at the budget (slope of the trade-off curve)"
    elif plan.over_budget:
        lam, note = None, "the budget is below the smallest plan; the leanest plan is used"
    else:
        lam, note = 0.0, "the budget does not bind: this is the fastest plan"
    return SolverFacts(
        solver=plan.solver,
        optimal=plan.optimal,
        solve_seconds=record.solve_seconds,
        lambda_ps_per_byte=lam,
        lambda_note=note,
        cuts=plan.cuts,
        search_nodes=plan.search_nodes,
        over_budget=plan.over_budget,
        minimum_bytes=plan.minimum_bytes,
    )


_MODULE_ROOT_RE = re.compile(r"^L\[['\"][^'\"]*['\"]\]\.?")


def _source(node: fx.Node, info: dict[str, Any]) -> str:
    """The user's source line; else, for code inside torch's own modules, the module that ran it."""
    if info["source"]:
        return info["source"]
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    path, module_class = list(stack.values())[-1]
    path = _MODULE_ROOT_RE.sub("", str(path)) or "(root)"
    return f"module {path} ({getattr(module_class, '__name__', module_class)})"


def _saved_rows(analysis: JointAnalysis, saved: tuple[int, ...]) -> tuple[SavedTensor, ...]:
    rows = []
    for i in saved:
        node = analysis.nodes[i]
        info = describe_value(node)
        nbytes = analysis.problem.save_bytes[i]
        is_input = node.op == "placeholder"
        op = "input (Inductor keeps a converted copy)" if is_input and nbytes else _op_name(node)
        row = SavedTensor(node.name, op, info["shape"], info["dtype"], nbytes, _source(node, info), is_input)
        rows.append(row)
    return tuple(rows)


def _recomputed_rows(analysis: JointAnalysis, recomputed: tuple[int, ...]) -> tuple[tuple[RecomputedValue, ...], int]:
    rows, free = [], 0
    for i in recomputed:
        node, cost = analysis.nodes[i], analysis.problem.recompute_time[i]
        estimate = analysis.estimates.get(node.name)
        if cost == 0:
            free += 1
            continue
        info = describe_value(node)
        rows.append(
            RecomputedValue(
                node.name,
                _op_name(node),
                info["shape"],
                info["dtype"],
                cost,
                int(estimate.flops) if estimate is not None else 0,
                estimate is not None and estimate.kind is OpKind.EXTERN,
                _source(node, info),
                node.name in analysis.measured_seconds,
            )
        )
    return tuple(rows), free


def graph_report(record: PartitionRecord) -> GraphReport:
    """The report for one partitioned graph: predictions only."""
    graph, budget, budget_bytes = record.graph, str(record.budget), record.budget_bytes
    planned = record.planned
    if planned is None:
        return GraphReport(graph, budget, budget_bytes, fallback_reason=record.fallback_reason or "no plan")
    analysis, plan = planned
    plans: dict[str, PlanTotals | None] = {
        "ckpt": plan_totals(analysis, plan.saved),
        "autograd": plan_totals(analysis, analysis.reference_saved),
        "no_recompute": plan_totals(analysis, analysis.no_recompute_saved),
    }
    torch_plan = record.torch_plan
    plans["torch_default"] = None if torch_plan is None else plan_totals(analysis, torch_plan.saved)
    note = None if torch_plan is not None else "not evaluated (the backend does so only when explaining; see the log)"
    recomputed, free = _recomputed_rows(analysis, plan.recomputed)
    return GraphReport(
        graph,
        budget,
        budget_bytes,
        solver=_solver_facts(record),
        plans=plans,
        torch_default_note=note,
        saved=_saved_rows(analysis, plan.saved),
        recomputed=recomputed,
        backward_only=free,
        peak=None if record.peak is None else describe(record.peak),
        regions=_region_rows(record),
        profile=record.profile.name,
        profile_source=record.profile.source,
        library_calls=sum(1 for e in analysis.estimates.values() if e.kind is OpKind.EXTERN),
        timed_calls=len(analysis.measured_seconds),
    )


def _region_rows(record: PartitionRecord) -> tuple[RegionRow, ...]:
    planned = record.planned
    if planned is None:
        return ()
    analysis, plan = planned
    problem = analysis.problem
    return tuple(
        RegionRow(
            cap.label,
            cap.budget,
            cap.max_bytes,
            cap.reference_bytes,
            region_bytes(problem, plan.saved, plan.recomputed, cap.members),
            sum(problem.recompute_time[i] for i in plan.recomputed if i in cap.members),
            len(cap.members),
        )
        for cap in record.region_caps
    )


# --- Markdown -------------------------------------------------------------------------


_PLAN_LABELS = {
    "ckpt": "ckpt plan",
    "autograd": "what autograd saves (budget reference)",
    "no_recompute": "no-recompute plan",
    "torch_default": "torch default partition",
}


def _peak_markdown(peak: dict[str, Any] | None) -> list[str]:
    if peak is None:
        return []
    alive = ", ".join(f"{name} {format_bytes(nbytes)}" for name, nbytes in peak["alive"][:5])
    return [
        f"Predicted peak {format_bytes(peak['peak_bytes'])} in the {peak['phase']} at `{peak['node']}` "
        f"(forward {format_bytes(peak['forward_bytes'])}, backward {format_bytes(peak['backward_bytes'])}); "
        f"largest alive there: {alive or '-'}.",
        "",
    ]


def _regions_markdown(regions: tuple[RegionRow, ...]) -> list[str]:
    if not regions:
        return []
    rows = [
        [
            r.label,
            r.budget,
            format_bytes(r.cap_bytes),
            format_bytes(r.autograd_bytes),
            format_bytes(r.saved_bytes),
            format_ps(r.recompute_ps),
            "yes" if r.kept else "**no**",
        ]
        for r in regions
    ]
    header = ["region", "budget", "cap", "autograd saves", "plan keeps", "recompute time", "kept"]
    return ["Per-module budgets:", "", table(header, rows, {2, 3, 4, 5}), ""]


def _graph_markdown(g: GraphReport, max_rows: int | None) -> list[str]:
    out = [f"## graph {g.graph}", ""]
    if g.fallback_reason is not None:
        return out + [f"ckpt fell back to torch's partition: {g.fallback_reason}", ""]
    assert g.solver is not None
    s = g.solver
    cap = "no cap" if g.budget_bytes is None else f"cap {format_bytes(g.budget_bytes)}"
    lam = "n/a"
    if s.lambda_ps_per_byte is not None:
        lam = f"{s.lambda_ps_per_byte:.4g} ps/byte ({s.lambda_ps_per_byte * 2**20 / 1e6:.4g} us per MiB)"
    out += [
        f"Budget {g.budget} ({cap}). Solver {s.solver}, {'optimal' if s.optimal else 'best found'}, "
        f"{s.solve_seconds * 1e3:.1f} ms, {s.cuts} cuts, {s.search_nodes} search nodes.",
        f"lambda = {lam}: {s.lambda_note}.",
        f"Costs: the {g.profile} profile; {g.timed_calls} of {g.library_calls} library calls timed on the device "
        "(the rest at their roofline time).",
        "",
        "Predicted totals:",
        "",
    ]
    rows = []
    for key, label in _PLAN_LABELS.items():
        p = g.plans.get(key)
        if p is None:
            rows.append([label, "-", "-", "-", "-"])
        else:
            step = f"{p.step_seconds * 1e3:.3f} ms"
            rows.append([label, format_bytes(p.bytes), format_ps(p.save_ps), format_ps(p.recompute_ps), step])
    out += [table(["plan", "saved bytes", "save time", "recompute time", "step time"], rows, {1, 2, 3, 4}), ""]
    if g.torch_default_note:
        out += [f"torch default partition: {g.torch_default_note}.", ""]
    out += _peak_markdown(g.peak)
    out += _regions_markdown(g.regions)
    activations = [t for t in g.saved if not t.is_input or t.bytes]
    inputs = len(g.saved) - len(activations)
    out += [
        f"Saved tensors: {len(activations)}, {format_bytes(sum(t.bytes for t in activations))}, largest first "
        f"(and {inputs} graph inputs, which live anyway).",
        "",
    ]
    activations = sorted(activations, key=lambda t: -t.bytes)
    rows = [
        [t.name, t.op, "x".join(t.shape) or "-", t.dtype, format_bytes(t.bytes), short_source(t.source)]
        for t in activations
    ]
    if rows:
        out += [table(["node", "op", "shape", "dtype", "bytes", "source"], clip_rows(rows, max_rows, 6), {4}), ""]
    cost = sum(r.cost_ps for r in g.recomputed)
    out += [
        f"Recomputed values: {len(g.recomputed)}, {format_ps(cost)} predicted, costliest first "
        f"(and {g.backward_only} values the backward computes anyway, at no extra cost).",
        "",
    ]
    rows = [
        [r.name, r.op, "x".join(r.shape) or "-", format_ps(r.cost_ps) + " (timed)" * r.timed, short_source(r.source)]
        for r in sorted(g.recomputed, key=lambda r: -r.cost_ps)
    ]
    if rows:
        out += [table(["node", "op", "shape", "cost", "source"], clip_rows(rows, max_rows, 5), {3}), ""]
    return out


@dataclass(frozen=True)
class ExplainReport:
    """What ckpt decided for every graph of one compiled model, and what one step measured."""

    graphs: tuple[GraphReport, ...]
    budget: str
    measured_bytes: int | None  # None when no step ran (reports written by the backend)
    loss: str | None = None  # how the measured step formed its loss
    measured_peak_bytes: int | None = None  # a second step's peak above what was resident before it

    @property
    def predicted_peak_bytes(self) -> int | None:
        """The highest graph's predicted peak; with several graphs the step also holds the others' saved bytes."""
        peaks = [g.peak["peak_bytes"] for g in self.graphs if g.peak is not None]
        return max(peaks) if peaks else None

    @property
    def predicted_bytes(self) -> int:
        return sum(p.bytes for g in self.graphs if (p := g.plans.get("ckpt")) is not None)

    @property
    def bytes_error(self) -> int | None:
        """Measured minus predicted activation bytes."""
        return None if self.measured_bytes is None else self.measured_bytes - self.predicted_bytes

    def predicted_step_seconds(self, plan: str = "ckpt") -> float | None:
        """Summed over graphs; None if a graph has no such plan."""
        totals = [g.plans.get(plan) for g in self.graphs]
        known = [t for t in totals if t is not None]
        return None if not totals or len(known) < len(totals) else sum(t.step_seconds for t in known)

    def predicted_plan_bytes(self, plan: str) -> int | None:
        totals = [g.plans.get(plan) for g in self.graphs]
        known = [t for t in totals if t is not None]
        return None if not totals or len(known) < len(totals) else sum(t.bytes for t in known)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: plain dicts, lists, strings and numbers."""
        graphs = []
        for g in self.graphs:
            d = asdict(g)
            for key, totals in g.plans.items():
                if totals is not None:
                    d["plans"][key]["extra_ps"] = totals.extra_ps
            graphs.append(d)
        error = self.bytes_error
        return {
            "budget": self.budget,
            "loss": self.loss,
            "predicted_bytes": self.predicted_bytes,
            "measured_bytes": self.measured_bytes,
            "bytes_error": error,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "measured_peak_bytes": self.measured_peak_bytes,
            "predicted_step_seconds": {k: self.predicted_step_seconds(k) for k in _PLAN_LABELS},
            "predicted_plan_bytes": {k: self.predicted_plan_bytes(k) for k in _PLAN_LABELS},
            "graphs": graphs,
        }

    def to_markdown(self, max_rows: int | None = MAX_ROWS) -> str:
        """The report as aligned Markdown tables; ``max_rows`` caps each table (None: all rows)."""
        out = [f"# ckpt explain: budget {self.budget}, {len(self.graphs)} graph(s)", ""]
        rows = []
        for key, label in _PLAN_LABELS.items():
            nbytes, seconds = self.predicted_plan_bytes(key), self.predicted_step_seconds(key)
            rows.append(
                [
                    f"{label} (predicted)",
                    "-" if nbytes is None else format_bytes(nbytes),
                    "-" if seconds is None else f"{seconds * 1e3:.3f} ms",
                ]
            )
        if self.measured_bytes is None:
            note = "Predictions only: the backend cannot run a step. ckpt.explain(model, *inputs) adds measured bytes."
            out += [table(["", "activation bytes", "step time"], rows, {1, 2}), "", note, ""]
        else:
            error = self.bytes_error or 0
            ratio = f" ({100 * error / self.predicted_bytes:+.1f}%)" if self.predicted_bytes else ""
            rows.insert(1, ["ckpt plan (measured, one step)", format_bytes(self.measured_bytes), "-"])
            rows.insert(2, ["measured - predicted", f"{error} B{ratio}", ""])
            out += [table(["", "activation bytes", "step time"], rows, {1, 2}), ""]
            out += [f"The step's loss: {self.loss}.", ""]
        predicted_peak = self.predicted_peak_bytes
        if predicted_peak is not None:
            line = f"Step peak: {format_bytes(predicted_peak)} predicted"
            if self.measured_peak_bytes is not None:
                peak_error = 100 * (self.measured_peak_bytes - predicted_peak) / max(predicted_peak, 1)
                line += f", {format_bytes(self.measured_peak_bytes)} measured ({peak_error:+.1f}%)"
            out += [line + " (above what is resident before the step; gradients included).", ""]
        for g in self.graphs:
            out += _graph_markdown(g, max_rows)
        return "\n".join(out).rstrip() + "\n"

    def __str__(self) -> str:
        return self.to_markdown()
