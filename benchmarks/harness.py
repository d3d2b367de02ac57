"""Measure one model under many settings: compile all, then time round-robin.

For one model the harness

1. builds the model once (all settings share its parameters) and one batch;
2. runs each setting's first step with the compile caches off, so the ckpt
   partitioner really runs and its decisions are recorded, and times it
   (the compile time);
3. runs a second step under :func:`ckpt.measure.saved_activations` to count
   the activation bytes, and a third under :func:`ckpt.measure.peak_memory`
   for the step's peak above what was allocated before it (the profiler's
   allocation events on the CPU, the allocator's statistics on a GPU);
4. times the settings round-robin (A B C A B C ..., each round starting one
   setting later), so drift on a busy machine hits them all alike; on the
   CPU it also counts the process's page faults in each timed step
   (:func:`ckpt.measure.minor_faults`).

A step is forward plus backward; gradients are dropped (``set_to_none``)
between steps, outside the timed region.  On a GPU each step is timed with
CUDA events and its peak memory above the memory allocated before the step is
read with ``torch.cuda.max_memory_allocated``.  During the timed rounds a
recompile is an error (``torch._dynamo.config.error_on_recompile``), so no
setting is silently recompiled with other settings' configuration.

A setting that raises is recorded with its error and left out of the timing;
the others go on.
"""

from __future__ import annotations

import gc
import logging
import math
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.model_base import BlockModel
from benchmarks.models import ModelSpec, parameter_count
from benchmarks.settings import Setting, Step, make_step
from ckpt import _torch_compat as compat
from ckpt.measure import minor_faults, peak_memory, release_freed_memory, saved_activations
from ckpt.records import PartitionRecord, record_partitions
from ckpt.tools.common import rotation
from ckpt.tools.progress import Progress

__all__ = [
    "STOP",
    "Clock",
    "ModelResult",
    "SettingResult",
    "benchmark_model",
    "prepare_step",
    "summarize_record",
    "time_round_robin",
]

log = logging.getLogger(__name__)

_PARTITION_METRICS = ("CkptPartitioner", "min_cut_rematerialization_partition")

STOP = threading.Event()  # set by the runner's SIGINT handler


@dataclass
class SettingResult:
    setting: Setting
    activation_bytes: int | None = None
    first_call_s: float | None = None  # the compiling first step, wall clock
    second_call_s: float | None = None  # the byte-counting second step, wall clock (a guess of the step time)
    samples_s: list[float] = field(default_factory=list)
    peak_bytes: list[int] = field(default_factory=list)  # GPU: per step, above the memory allocated before it
    page_faults: list[int] = field(default_factory=list)  # CPU: the process's minor page faults per timed step
    step_peak: int | None = None  # one step's peak above what was allocated before it (CPU and GPU)
    partition_s: float | None = None  # time inside the partitioner call (ckpt's or torch's)
    graphs: list[dict[str, Any]] = field(default_factory=list)  # ckpt: one summary per partitioned graph
    error: str | None = None

    @property
    def measured_peak(self) -> int | None:
        """The step's measured peak: the profiled step, else the highest of the timed GPU steps."""
        if self.step_peak is not None:
            return self.step_peak
        return max(self.peak_bytes) if self.peak_bytes else None

    @property
    def predicted_peak(self) -> int | None:
        """ckpt's predicted peak, summed over graphs; None unless every graph has one."""
        peaks = [g.get("predicted_peak") for g in self.graphs]
        return sum(peaks) if peaks and None not in peaks else None  # type: ignore[arg-type]

    @property
    def step_s(self) -> float | None:
        return statistics.median(self.samples_s) if self.samples_s else None

    @property
    def spread(self) -> float | None:
        """Interquartile range over the median (the full range under four samples)."""
        if len(self.samples_s) < 2 or not self.step_s:
            return None
        if len(self.samples_s) < 4:
            low, high = min(self.samples_s), max(self.samples_s)
        else:
            low, _, high = statistics.quantiles(self.samples_s, n=4)
        return (high - low) / self.step_s

    @property
    def compile_s(self) -> float | None:
        if not self.setting.compiled:
            return None
        if self.first_call_s is None or self.step_s is None:
            return self.first_call_s
        return max(self.first_call_s - self.step_s, 0.0)


@dataclass
class ModelResult:
    name: str
    title: str
    transformer: bool
    size: str
    params: int
    config: dict[str, Any]
    settings: list[SettingResult]
    skipped: list[str] = field(default_factory=list)


class Clock:
    """Seconds left before a deadline (``math.inf`` when there is none)."""

    def __init__(self, limit_s: float | None) -> None:
        self.end = math.inf if limit_s is None else time.perf_counter() + limit_s

    def left(self) -> float:
        return self.end - time.perf_counter()


def summarize_record(record: PartitionRecord, top: int = 8) -> dict[str, Any]:
    """Plain data from one partition record, with the most expensive recomputed values."""
    summary: dict[str, Any] = {
        "graph": record.graph,
        "budget": str(record.budget),
        "budget_bytes": record.budget_bytes,
        "solve_s": record.solve_seconds,
        "profile": record.profile.name,
        "fallback_reason": record.fallback_reason,
        "predicted_peak": None if record.peak is None else record.peak.peak_bytes,
        "peak_at": None if record.peak is None else f"{record.peak.phase}:{record.peak.node}",
        "peak_cap_bytes": record.peak_cap_bytes,
        "fingerprint": record.fingerprint,  # equal for equal plans: their compiled code is the same
    }
    plan, analysis = record.plan, record.analysis
    if plan is None or analysis is None:
        return summary
    problem = analysis.problem
    costly = sorted(plan.recomputed, key=lambda i: (-problem.recompute_time[i], i))[:top]
    summary.update(
        values=len(problem),
        saved=len(plan.saved),
        recomputed=len(plan.recomputed),
        predicted_bytes=plan.bytes,
        predicted_extra_s=plan.time * 1e-12,
        lower_bound_s=None if plan.lower_bound is None else plan.lower_bound * 1e-12,
        optimal=plan.optimal,
        over_budget=plan.over_budget,
        minimum_bytes=plan.minimum_bytes,
        no_recompute_bytes=analysis.no_recompute_bytes,
        reference_bytes=analysis.reference_bytes,
        fixed_s=analysis.fixed_seconds,
        solver=plan.solver,
        cuts=plan.cuts,
        top_recomputed=[[problem.names[i], problem.recompute_time[i] * 1e-12] for i in costly],
    )
    return summary


def _partition_seconds() -> float:
    return compat.compilation_seconds(_PARTITION_METRICS)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(
    step: Step, model: BlockModel, inputs: Sequence[torch.Tensor], device: torch.device
) -> tuple[float, int | None, int | None]:
    """One forward and backward: (seconds, GPU peak bytes above the start or None, CPU page faults or None)."""
    faults = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with step.context():
            loss = step.run(*inputs)
        loss.backward()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        peak: int | None = torch.cuda.max_memory_allocated(device) - base
    else:
        faults_before = minor_faults()
        started = time.perf_counter()
        with step.context():
            loss = step.run(*inputs)
        loss.backward()
        seconds, peak = time.perf_counter() - started, None
        faults_after = minor_faults()
        if faults_before is not None and faults_after is not None:
            faults = faults_after - faults_before
    model.zero_grad(set_to_none=True)
    return seconds, peak, faults


def _step_peak(step: Step, model: BlockModel, inputs: Sequence[torch.Tensor], device: torch.device) -> int:
    def run() -> None:
        with step.context():
            loss = step.run(*inputs)
        loss.backward()

    model.zero_grad(set_to_none=True)
    peak = peak_memory(run, device).bytes
    model.zero_grad(set_to_none=True)
    return peak


def prepare_step(step: Step, model: BlockModel, inputs: Sequence[torch.Tensor], device: torch.device) -> SettingResult:
    """Compile (first step, caches off, partitions recorded), then count activation bytes."""
    result = SettingResult(step.setting)
    try:
        before = _partition_seconds()
        with compat.compile_caches_disabled(), record_partitions() as records:
            _sync(device)
            started = time.perf_counter()
            _timed_step(step, model, inputs, device)
            _sync(device)
            result.first_call_s = time.perf_counter() - started
        result.partition_s = _partition_seconds() - before if step.setting.compiled else None
        result.graphs = [summarize_record(r) for r in records]
        started = time.perf_counter()
        with step.context(), saved_activations(model, *inputs) as saved:
            loss = step.run(*inputs)
        loss.backward()
        _sync(device)
        result.second_call_s = time.perf_counter() - started
        model.zero_grad(set_to_none=True)
        result.activation_bytes = saved.bytes
        result.step_peak = _step_peak(step, model, inputs, device)
    except Exception as error:  # one failing setting must not end the whole benchmark
        if STOP.is_set():  # an interrupt that torch wrapped into another exception
            raise KeyboardInterrupt from error
        result.error = f"{type(error).__name__}: {error}"
        log.warning("setting %s failed while compiling: %s", step.setting.label, result.error)
        model.zero_grad(set_to_none=True)
    return result


def time_round_robin(
    steps: list[Step], results: list[SettingResult], model: BlockModel, inputs: Sequence[torch.Tensor],
    device: torch.device, rounds: int, progress: Progress, name: str,
) -> None:  # fmt: skip
    import torch._dynamo.config as dynamo_config

    live = [i for i, r in enumerate(results) if r.error is None]
    with dynamo_config.patch(error_on_recompile=True):
        for round_index in range(rounds + 1):  # round 0 warms up and is not kept
            for i in rotation(live, round_index):
                if results[i].error is not None:
                    continue
                try:
                    seconds, peak, faults = _timed_step(steps[i], model, inputs, device)
                except Exception as error:  # a recompile or a runtime failure: drop this setting
                    if STOP.is_set():
                        raise KeyboardInterrupt from error
                    results[i].error = f"{type(error).__name__}: {error}"
                    log.warning("setting %s failed while timing: %s", steps[i].setting.label, results[i].error)
                    model.zero_grad(set_to_none=True)
                    continue
                if round_index > 0:
                    results[i].samples_s.append(seconds)
                    if peak is not None:
                        results[i].peak_bytes.append(peak)
                    if faults is not None:
                        results[i].page_faults.append(faults)
            progress.update(f"{name}: timing round {round_index}/{rounds}")


def benchmark_model(
    spec: ModelSpec, size: str, settings: Sequence[Setting], *, device: torch.device, dtype: torch.dtype,
    rounds: int, progress: Progress, clock: Clock, sink: list[ModelResult], seed: int = 0,
) -> ModelResult:  # fmt: skip
    """Measure ``spec`` at ``size`` under every setting; settings that do not fit ``clock`` are skipped.

    The result is appended to ``sink`` as soon as it exists and filled in as
    the run goes, so an interrupted run can still write what it measured.
    """
    torch.compiler.reset()
    torch.manual_seed(seed)
    model = spec.build(size).to(device=device, dtype=dtype)
    model.train()
    inputs = model.make_inputs(torch.Generator().manual_seed(seed + 1), device, dtype)
    config = {k: v for k, v in vars(spec.sizes[size]).items()}
    outcome = ModelResult(spec.name, spec.title, spec.transformer, size, parameter_count(model), config, [])
    sink.append(outcome)
    steps: list[Step] = []
    next_compile = 0.0  # guess: the last compile again, plus a fifth (the first one is the coldest)
    for setting in settings:
        step_guess = max((r.second_call_s or 0.0 for r in outcome.settings), default=1.0)
        reserve = (rounds + 1) * step_guess * (len(steps) + 1) + 20.0  # the timed rounds, and a margin
        if setting.compiled and clock.left() < next_compile + reserve:
            outcome.skipped.append(setting.key)
            progress.update(f"{spec.name}: skip {setting.label} (time limit)")
            continue
        step = make_step(setting, model)
        result = prepare_step(step, model, inputs, device)
        if setting.compiled and result.first_call_s is not None:
            next_compile = 1.2 * result.first_call_s
        steps.append(step)
        outcome.settings.append(result)
        progress.update(f"{spec.name}: compiled {setting.label}")
    time_round_robin(steps, outcome.settings, model, inputs, device, rounds, progress, spec.name)
    del steps, model, inputs
    torch.compiler.reset()
    gc.collect()
    release_freed_memory()  # the next model starts from a compact heap (ckpt.measure.release_freed_memory)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return outcome


def progress_units(models: int, settings: int, rounds: int) -> int:
    """How many progress updates a run makes, for the bar's total."""
    return models * (settings + rounds + 1)
