"""``python -m benchmarks.plan_at_scale``: plan GPU-size models on a machine without a GPU.

Nothing is allocated at the models' sizes.  Each model is built on the meta
device, cast to bf16 there, and its parameters and buffers are replaced by
fake tensors (shapes, dtypes and a device, no storage) on the CPU device.
``torch.compile`` with a capturing backend sends the Dynamo graph through
AOTAutograd with Inductor's decompositions; the partition function receives
the joint forward+backward graph exactly as Inductor's partitioner would,
records it, and raises to stop the compile.

The joint graph is then planned as the ``ckpt`` backend plans it
(:meth:`ckpt.backend.CkptPartitioner.plan`: the solve under the budget, then
the peak step) with the ``h200`` profile, at every memory budget and peak
cap.  Next to each row stands torch's own knob at the same fraction:
``min_cut_rematerialization_partition`` under
``torch._functorch.config.activation_memory_budget``, its saved set mapped
into our problem and priced by our cost model.

Attention: fake tensors on the CPU device make ``scaled_dot_product_attention``
pick the fused CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``),
which, like the flash kernel on an H200, saves the output and a float32
log-sum-exp per row and never materialises the seq x seq matrix.  On the meta
device it decomposes to the math path (``bmm``, softmax), which does.  The
report lists the attention ops each trace contains and the bytes of any
seq x seq values.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from benchmarks.language_models import Llama, LlamaConfig
from benchmarks.model_base import BlockModel
from benchmarks.models import model_spec, parameter_count
from ckpt import _torch_compat as compat
from ckpt.backend import CkptPartitioner
from ckpt.config import CkptConfig, parse_budget, parse_peak
from ckpt.cost_model.profiles import GPU_PROFILES, DeviceProfile
from ckpt.partitioner.analysis import JointAnalysis, analyze_joint
from ckpt.partitioner.joint_graph import autograd_saved_names
from ckpt.partitioner.peak import PeakGraph
from ckpt.partitioner.peak_analysis import build_peak_graph, predict_plan
from ckpt.partitioner.plan import Plan, make_plan
from ckpt.partitioner.problem import ProblemError, recompute_closure
from ckpt.partitioner.torch_plan import plan_from_saved_names, torch_default_saved_names

__all__ = ["BUDGETS", "PEAKS", "ScaleResult", "ScaleRow", "TorchRow", "main", "plan_model", "trace_fake_joint"]

BUDGETS: tuple[float | None, ...] = (None, 0.5, 0.25, 0.1, 0.05, 0.0)
PEAKS: tuple[float, ...] = (0.5, 0.3)
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "plan-at-scale-h200.md"
GiB = 2**30


def llama_7b(layers: int = 32) -> LlamaConfig:
    """A Llama-2 7B shape (``layers`` deep), batch 4, sequence 2048."""
    return LlamaConfig(layers=layers, dim=4096, heads=32, kv_heads=32, ffn=11008, seq=2048, batch=4, vocab=32000)


# ---------------------------------------------------------------- tracing under fake tensors


@dataclass
class FakeJoint:
    """A joint graph traced under fake tensors, as AOTAutograd hands it to the partitioner."""

    graph: fx.GraphModule
    num_fwd_outputs: int
    seconds: float  # Dynamo and AOTAutograd, up to the partition function


class _Captured(Exception):
    pass


def fake_model(build: Callable[[], BlockModel], dtype: torch.dtype, mode: Any, device: str = "cpu") -> BlockModel:
    """``build()`` on the meta device, cast to ``dtype``, its tensors then fake on ``device``.

    Shared parameters and buffers stay shared (the Llama rotary tables are).
    """
    with torch.device("meta"):
        model = build()
    model = model.to(dtype)  # what the GPU benchmark does: floating buffers follow the dtype
    fakes: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in fakes:
            with mode:
                fakes[id(t)] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        return fakes[id(t)]

    params: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for key, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in params:
                    params[id(param)] = nn.Parameter(fake(param), requires_grad=param.requires_grad)
                module._parameters[key] = params[id(param)]
        for key, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[key] = fake(buffer)
    return model


def fake_inputs(model: BlockModel, dtype: torch.dtype, mode: Any, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """The model's example inputs as fake tensors on ``device`` (made small and real on the CPU first)."""
    real = model.make_inputs(torch.Generator().manual_seed(1), torch.device("cpu"), dtype)
    return tuple(mode.from_tensor(t.to(device)) for t in real)


def trace_fake_joint(model: BlockModel, inputs: Sequence[torch.Tensor], mode: Any) -> FakeJoint:
    """The joint graph of ``model(*inputs).backward()`` through ``torch.compile``, never run."""
    captured: list[FakeJoint] = []
    started = time.perf_counter()

    def capture(gm: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any) -> Any:
        captured.append(FakeJoint(gm, num_fwd_outputs, time.perf_counter() - started))
        raise _Captured

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return compat.aot_simplified_without_kernels(gm, example_inputs, capture)

    torch.compiler.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    try:
        with mode:
            compiled(*inputs).backward()
    except Exception:  # Dynamo wraps what the partition function raised
        if not captured:
            raise
    finally:
        torch.compiler.reset()
    if not captured:
        raise ValueError("the model produced no joint graph: does its loss require grad?")
    return captured[0]


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class TorchRow:
    """torch's min-cut partition under ``activation_memory_budget``, priced by our cost model."""

    knob: float
    saved_bytes: int | None
    peak_bytes: int | None
    extra_ps: int | None
    seconds: float
    error: str | None = None  # torch's partitioner failed
    note: str | None = None  # priced, but it breaks one of our hard constraints


@dataclass(frozen=True)
class ScaleRow:
    setting: str  # "autograd", "budget 0.5", "peak 0.3"
    budget_bytes: int | None
    peak_cap_bytes: int | None
    saved_bytes: int
    over_budget: bool
    peak_bytes: int
    peak_where: str
    extra_ps: int
    solve_s: float
    torch: TorchRow | None
    notes: tuple[str, ...] = ()


@dataclass
class ScaleResult:
    name: str
    description: str
    parameters: int
    joint_nodes: int  # as AOTAutograd hands it to the partitioner
    prepared_nodes: int
    problem_values: int
    trace_s: float
    analysis_s: float
    fixed_seconds: float
    reference_bytes: int
    reference_peak: int
    attention_ops: tuple[str, ...]
    square_values: int  # values shaped (..., seq, seq): materialised attention matrices
    square_saved_bytes: int  # of those, bytes autograd saves
    math_attention_bytes: int  # what SDPA's math path would save: one seq x seq probability matrix per layer
    rows: list[ScaleRow] = field(default_factory=list)


def _where(gm: fx.GraphModule, phase: str, node_name: str) -> str:
    """The peak's phase and node, with the module it belongs to where the graph says."""
    node = next((n for n in gm.graph.nodes if n.name == node_name), None)
    stack = (node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")) if node is not None else None
    if stack:
        path = str(list(stack.values())[-1][0]).replace("L['self'].", "").replace("L['self']", "model")
        return f"{phase} {node_name} ({path})"
    return f"{phase} {node_name}"


def _attention_ops(gm: fx.GraphModule) -> tuple[str, ...]:
    names = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    attention = sorted(name for name in names if "attention" in name)
    if attention:
        return tuple(attention)
    return tuple(sorted(name for name in names if "bmm" in name or "softmax" in name))


def _square_values(gm: fx.GraphModule, analysis: JointAnalysis, config: Any) -> tuple[int, int]:
    """How many joint values are attention matrices (batch x heads x seq x seq elements, seq x seq last),
    and the bytes of those autograd saves."""
    seq, batch, heads = (getattr(config, key, None) for key in ("seq", "batch", "heads"))
    if seq is None or batch is None or heads is None:
        return 0, 0
    square = set()
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if (
            isinstance(value, torch.Tensor)
            and value.dim() >= 3
            and tuple(value.shape[-2:]) == (seq, seq)
            and value.numel() == batch * heads * seq * seq
        ):
            square.add(node.name)
    problem = analysis.problem
    saved = sum(problem.save_bytes[i] for i in analysis.reference_saved if problem.names[i] in square)
    return len(square), int(saved)


def _math_attention_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of the attention probabilities (batch x heads x seq x seq per layer) that SDPA's math path saves."""
    sizes = [getattr(config, key, None) for key in ("layers", "batch", "heads", "seq")]
    if any(size is None for size in sizes):
        return 0
    layers, batch, heads, seq = sizes
    return int(layers * batch * heads * seq * seq * torch.empty((), dtype=dtype, device="meta").element_size())


def _priced_anyway(analysis: JointAnalysis, names: Sequence[str]) -> tuple[Plan, tuple[str, ...]]:
    """torch's saved set priced by our cost model even where it breaks our hard constraints.

    Under ``activation_memory_budget < 1`` torch's min cut may recompute random
    ops (the dropout's ``rand``), which our problem forbids: the backward would
    draw a different mask unless the RNG state is replayed.  The plan is still
    priced, and the values it recomputes against our rules are returned.
    """
    problem = analysis.problem
    index = {name: i for i, name in enumerate(problem.names)}
    saved = {index[r] for r in (analysis.root_names.get(n, n) for n in names) if r in index}
    recomputed = recompute_closure(problem, saved)
    broken = tuple(problem.names[i] for i in sorted(recomputed) if not problem.can_recompute[i])
    plan = Plan(
        saved=tuple(sorted(saved)),
        recomputed=tuple(sorted(recomputed)),
        time=sum(problem.save_time[i] for i in saved) + sum(problem.recompute_time[i] for i in recomputed),
        bytes=sum(problem.save_bytes[i] for i in saved) + sum(problem.recompute_bytes[i] for i in recomputed),
        solver="torch-budget",
        optimal=False,
    )
    return plan, broken


def _torch_row(
    gm: fx.GraphModule, analysis: JointAnalysis, peak_graph: PeakGraph, num_fwd_outputs: int, knob: float
) -> TorchRow:
    started = time.perf_counter()
    try:
        names = torch_default_saved_names(gm, num_fwd_outputs, activation_memory_budget=knob)
    except (RuntimeError, ValueError) as error:
        return TorchRow(knob, None, None, None, time.perf_counter() - started, f"{type(error).__name__}: {error}")
    seconds = time.perf_counter() - started
    note = None
    try:
        plan = plan_from_saved_names(analysis, names)
    except ProblemError:
        plan, broken = _priced_anyway(analysis, names)
        shown = ", ".join(broken[:3]) + (f" and {len(broken) - 3} more" if len(broken) > 3 else "")
        note = f"recomputes {len(broken)} random op(s) ({shown}), which ckpt never does"
    return TorchRow(knob, plan.bytes, predict_plan(peak_graph, plan).peak_bytes, plan.time, seconds, note=note)


def _plan_row(
    setting: str,
    partitioner: CkptPartitioner,
    gm: fx.GraphModule,
    analysis: JointAnalysis,
    peak_graph: PeakGraph,
    reference_peak: int,
    torch_row: TorchRow | None,
) -> ScaleRow:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, budget_bytes, _, seconds = partitioner.plan(setting, analysis, peak_graph)
    notes = [type(w.message).__name__ for w in caught]
    over_budget = budget_bytes is not None and plan.bytes > budget_bytes
    if over_budget:
        notes.append(f"budget below the smallest plan ({_gib(plan.minimum_bytes)} GiB)")
    prediction = predict_plan(peak_graph, plan)
    return ScaleRow(
        setting,
        budget_bytes,
        partitioner.config.peak.resolve(reference_peak),
        plan.bytes,
        over_budget,
        prediction.peak_bytes,
        _where(gm, prediction.phase, prediction.node),
        plan.time,
        seconds,
        torch_row,
        tuple(notes),
    )


def plan_model(
    name: str,
    build: Callable[[], BlockModel],
    *,
    profile: DeviceProfile,
    dtype: torch.dtype = torch.bfloat16,
    budgets: Sequence[float | None] = BUDGETS,
    peaks: Sequence[float] = PEAKS,
    compare_torch: bool = True,
    effort: float = 1.0,
    log: Callable[[str], None] = lambda _: None,
) -> ScaleResult:
    """Trace ``build()``'s joint graph under fake CPU tensors and plan it at every budget and peak cap."""
    mode = compat.fake_tensor_mode()
    model = fake_model(build, dtype, mode)
    config = getattr(model, "config", None)
    inputs = fake_inputs(model, dtype, mode)
    joint = trace_fake_joint(model, inputs, mode)
    gm, num_fwd = joint.graph, joint.num_fwd_outputs
    joint_nodes = len(gm.graph.nodes)
    log(f"{name}: traced {joint_nodes} nodes in {joint.seconds:.1f} s")

    started = time.perf_counter()
    autograd_saved = autograd_saved_names(gm, num_fwd)  # before CSE, as the backend does
    gm, _, _ = compat.prepare_joint(gm)
    analysis = analyze_joint(gm, num_fwd, profile, autograd_saved=autograd_saved)
    peak_graph = build_peak_graph(gm, analysis, num_fwd)
    reference = make_plan(analysis.problem, analysis.reference_saved, "autograd", optimal=False)
    reference_prediction = predict_plan(peak_graph, reference)
    analysis_s = time.perf_counter() - started
    log(f"{name}: analysed in {analysis_s:.1f} s ({len(analysis.problem)} problem values)")

    squares, square_bytes = _square_values(gm, analysis, config)
    result = ScaleResult(
        name,
        repr(config) if config is not None else type(model).__name__,
        parameter_count(model),
        joint_nodes,
        len(gm.graph.nodes),
        len(analysis.problem),
        joint.seconds,
        analysis_s,
        analysis.fixed_seconds,
        analysis.reference_bytes,
        reference_prediction.peak_bytes,
        _attention_ops(gm),
        squares,
        square_bytes,
        _math_attention_bytes(config, dtype),
    )
    result.rows.append(
        ScaleRow(
            "autograd",
            None,
            None,
            reference.bytes,
            False,
            reference_prediction.peak_bytes,
            _where(gm, reference_prediction.phase, reference_prediction.node),
            reference.time,
            0.0,
            None,
        )
    )

    torch_rows: dict[float, TorchRow] = {}

    def torch_at(knob: float) -> TorchRow | None:
        if not compare_torch:
            return None
        if knob not in torch_rows:
            torch_rows[knob] = _torch_row(gm, analysis, peak_graph, num_fwd, knob)
            log(f"{name}: torch at activation_memory_budget={knob:g}: {torch_rows[knob].seconds:.1f} s")
        return torch_rows[knob]

    settings: list[tuple[str, CkptConfig, float]] = []
    for fraction in budgets:
        budget = parse_budget("none" if fraction is None else fraction)
        knob = 1.0 if fraction is None else fraction
        settings.append((f"budget {budget}", CkptConfig(budget=budget, solver_effort=effort), knob))
    for fraction in peaks:
        peak = parse_peak(fraction)
        settings.append((f"peak {peak}", CkptConfig(peak=peak, solver_effort=effort), fraction))
    for setting, ckpt_config, knob in settings:
        partitioner = CkptPartitioner(ckpt_config, profile)
        row = _plan_row(setting, partitioner, gm, analysis, peak_graph, reference_prediction.peak_bytes, torch_at(knob))
        log(f"{name}: {setting}: solved in {row.solve_s:.1f} s")
        result.rows.append(row)
    return result


# ---------------------------------------------------------------- report


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.2f}"


def _ms(picoseconds: int | None) -> str:
    return "-" if picoseconds is None else f"{picoseconds / 1e9:.1f}"


def _table(result: ScaleResult) -> list[str]:
    fixed_ms = f"{result.fixed_seconds * 1e3:.1f}"
    lines = [
        "| setting | budget GiB | saved GiB | peak GiB | peak at | extra ms | fixed ms | solve s "
        "| torch knob | torch saved GiB | torch peak GiB | torch extra ms | torch s | notes |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result.rows:
        cap = r.budget_bytes if r.peak_cap_bytes is None else r.peak_cap_bytes
        cap_text = _gib(cap) + (" (peak)" if r.peak_cap_bytes is not None else "")
        saved = _gib(r.saved_bytes) + (" **over**" if r.over_budget else "")
        notes = list(r.notes)
        t = r.torch
        if t is None:
            torch_cells = "- | - | - | - | -"
        elif t.error is not None:
            torch_cells = f"{t.knob:g} | - | - | - | {t.seconds:.1f}"
            notes.append(f"torch: {t.error}")
        else:
            if t.note is not None:
                notes.append(f"torch: {t.note}")
            torch_cells = (
                f"{t.knob:g} | {_gib(t.saved_bytes)} | {_gib(t.peak_bytes)} | {_ms(t.extra_ps)} | {t.seconds:.1f}"
            )
        lines.append(
            f"| {r.setting} | {cap_text} | {saved} | {_gib(r.peak_bytes)} | {r.peak_where} | {_ms(r.extra_ps)} "
            f"| {fixed_ms} | {r.solve_s:.2f} | {torch_cells} | {'; '.join(notes) or ''} |"
        )
    return lines


def markdown(results: Sequence[ScaleResult], command: str, profile: DeviceProfile, notes: Sequence[str] = ()) -> str:
    lines = [
        f"# Plans at GPU scale, planned without a GPU ({profile.name} profile)",
        "",
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, on {platform.machine()} "
        f"without a GPU. Every number is a prediction of ckpt's cost model and peak simulation for the "
        f"{profile.name} profile; nothing ran on a device.",
        "",
        "How: each model is built on the meta device in bf16 and its tensors replaced by fake CPU tensors; "
        "`torch.compile` with a capturing backend hands the joint graph (AOTAutograd, Inductor's "
        "decompositions) to a partition function that records it and stops the compile. It is planned "
        "by `CkptPartitioner.plan`, the backend's own planning step (solve, then the peak step).",
        "",
        "Columns: *budget GiB* is the budget (or, for `peak` rows, the peak cap) in bytes; *saved* the plan's "
        "saved activations; *peak* the predicted step peak above what is resident before the forward "
        "(activations, recompute working sets, tangents, gradients; not parameters or optimizer state) "
        "and *peak at* the phase and node where it happens; *extra ms* the plan's predicted time for "
        "saving and recomputing on top of *fixed ms*, the estimated forward+backward time; *solve s* the "
        "planning time including the peak step. *torch* columns: `min_cut_rematerialization_partition` "
        "with `torch._functorch.config.activation_memory_budget` set to the row's fraction (1 for `none`; "
        "for `peak` rows the peak fraction, as the nearest knob torch has), its saved set priced by our cost "
        "model. torch's knob is a fraction of what its own default partition saves, ours of what eager "
        "autograd saves, so the same number is not the same target. *torch s* is torch's partition time.",
        "",
        "Notes: `PeakWarning` on a budget row means the budget raises the peak above that of a plan at a larger "
        "budget (no budget, or the ladder of 1/2 to 1/16 of what the unbudgeted plan saves) and no plan within the "
        "budget avoids it, on a peak row that the cap is below the smallest peak found.",
        "",
    ]
    lines += [
        "Attention: on an H200 SDPA runs a fused kernel (flash attention for these shapes) that saves the "
        "output and a float32 log-sum-exp per query row and never materialises the seq x seq matrix. "
        "Fake tensors on the CPU device trace `_scaled_dot_product_flash_attention_for_cpu`, which has the "
        "same outputs and saved values (the cost model prices it as the CUDA flash kernel). Fake CUDA "
        "tensors are not usable on a CPU-only torch build (SDPA aborts in autograd's device guard), and "
        "meta tensors decompose SDPA into the math path (`bmm`, softmax), which would materialise and "
        "save the seq x seq probabilities; each model's section says how many bytes that would be.",
        "",
        *notes,
    ]
    for r in results:
        ops = ", ".join(f"`{op}`" for op in r.attention_ops) or "none"
        lines += [
            "",
            f"## {r.name}",
            "",
            f"`{r.description}`: {r.parameters / 1e9:.2f} B parameters.",
            "",
            f"Joint graph: {r.joint_nodes} nodes as traced ({r.prepared_nodes} after preparation, "
            f"{r.problem_values} problem values); trace {r.trace_s:.1f} s, analysis {r.analysis_s:.1f} s. "
            f"Autograd saves {_gib(r.reference_bytes)} GiB, predicted peak {_gib(r.reference_peak)} GiB; "
            f"estimated fixed step time {r.fixed_seconds * 1e3:.1f} ms.",
            "",
            f"Attention ops in the trace: {ops}. Values shaped (..., seq, seq): {r.square_values} "
            f"({_gib(r.square_saved_bytes)} GiB of them saved by autograd). SDPA's math path would instead "
            f"save the attention probabilities, {_gib(r.math_attention_bytes)} GiB over all layers.",
            "",
            *_table(r),
        ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- command line


def _models(names: Sequence[str], layers_7b: int, compare_layers: int) -> list[tuple[str, Callable[[], BlockModel]]]:
    models: list[tuple[str, Callable[[], BlockModel]]] = []
    for name in names:
        if name in ("gpt2", "llama"):
            spec = model_spec(name)
            models.append((f"{name} (gpu size)", lambda spec=spec: spec.build("gpu")))
        elif name == "llama7b":
            for layers in dict.fromkeys(n for n in (compare_layers, layers_7b) if n > 0):
                models.append((f"llama 7B shape, {layers} layers", lambda layers=layers: Llama(llama_7b(layers))))
        else:
            raise SystemExit(f"--models: {name!r} is unknown; accepted are gpt2, llama, llama7b")
    return models


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_at_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt2,llama,llama7b", help="comma-separated: gpt2, llama, llama7b")
    parser.add_argument("--llama7b-layers", type=int, default=32, help="layers of the 7B shape (default 32)")
    parser.add_argument(
        "--compare-layers", type=int, default=4, help="also plan the 7B shape with this many layers (0: do not)"
    )
    parser.add_argument("--profile", default="h200", choices=sorted(GPU_PROFILES))
    parser.add_argument("--effort", type=float, default=1.0, help="the solver effort (CKPT_SOLVER_EFFORT)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch's partitioner for comparison")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    argv_used = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python -m benchmarks.plan_at_scale", *(shlex.quote(a) for a in argv_used)])
    profile = GPU_PROFILES[args.profile]

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    results = []
    for name, build in _models(args.models.split(","), args.llama7b_layers, args.compare_layers):
        results.append(
            plan_model(
                name,
                build,
                profile=profile,
                compare_torch=not args.no_torch,
                effort=args.effort,
                log=log,
            )
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(results, command, profile))  # what finished so far
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
