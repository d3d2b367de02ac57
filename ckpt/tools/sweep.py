"""Compile one model at several budgets and measure each: saved bytes, the step's peak, and step time.

Each budget gets its own deep copy of the model and its own entry function
with a fresh code object.  Dynamo caches compiled code per code object, and
parameters are graph inputs, so two copies of one model compiled for two
budgets would otherwise share the first one's graph.  Each setting is checked
to have produced its own partition records.

Step times are taken in rounds that alternate the settings, so slow drifts
of a shared machine hit every setting alike, and summarised by the median or,
on a machine shared with other work (where interference only ever adds time),
by the minimum.  A step is one forward and
backward with the gradients cleared first; the first call of each setting
(the compile) and one warm-up call are not timed.  The peak is measured on
one more step (:func:`ckpt.measure.peak_memory`, gradients set to None first)
next to the sum of the recorded plans' predicted peaks.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ckpt.records import PartitionRecord, record_partitions
from ckpt.tools.common import (
    STATISTICS,
    check_model,
    check_statistic,
    clone_inputs,
    compile_options,
    fresh_entry,
    loss_of,
    rotation,
    summarise,
)
from ckpt.tools.report import plan_totals

__all__ = ["STATISTICS", "Measurement", "measure_budgets"]


@dataclass(frozen=True)
class Measurement:
    """One budget: what the plans predicted and what the steps measured (times in seconds, picoseconds)."""

    budget: str
    graphs: int
    predicted_bytes: int
    measured_bytes: int
    predicted_save_ps: int
    predicted_recompute_ps: int
    predicted_library_ps: int  # the part of the recompute spent in library calls (matmul, attention)
    predicted_fixed_seconds: float
    step_seconds: tuple[float, ...]
    records: tuple[PartitionRecord, ...] = field(default=(), repr=False, compare=False)
    predicted_peak: int | None = None  # sum of the graphs' predicted peaks (exact for one graph)
    measured_peak: int | None = None  # one step, above what was resident before it

    @property
    def predicted_extra_ps(self) -> int:
        return self.predicted_save_ps + self.predicted_recompute_ps

    def seconds(self, statistic: str = "median") -> float:
        """The step time by ``statistic``: ``"median"``, or ``"min"`` (robust on a shared machine)."""
        return summarise(statistic, self.step_seconds) if self.step_seconds else math.nan

    def error(self, statistic: str = "median") -> float:
        """Bootstrap standard error of :meth:`seconds` (seeded, so reports repeat)."""
        times = self.step_seconds
        if len(times) < 2:
            return math.nan
        check_statistic(statistic)
        rng = random.Random(0)
        estimates = [summarise(statistic, [rng.choice(times) for _ in times]) for _ in range(200)]
        return statistics.stdev(estimates)

    @property
    def median_seconds(self) -> float:
        return self.seconds("median")

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "graphs": self.graphs,
            "predicted_bytes": self.predicted_bytes,
            "measured_bytes": self.measured_bytes,
            "predicted_save_ps": self.predicted_save_ps,
            "predicted_recompute_ps": self.predicted_recompute_ps,
            "predicted_library_ps": self.predicted_library_ps,
            "predicted_fixed_seconds": self.predicted_fixed_seconds,
            "median_step_seconds": self.seconds("median"),
            "min_step_seconds": self.seconds("min"),
            "step_seconds": list(self.step_seconds),
            "predicted_peak": self.predicted_peak,
            "measured_peak": self.measured_peak,
        }


@dataclass
class _Setting:
    budget: str
    model: torch.nn.Module
    inputs: list[Any]
    compiled: Any
    times: list[float] = field(default_factory=list)


def _clear_grads(setting: _Setting) -> None:
    setting.model.zero_grad(set_to_none=True)
    for x in setting.inputs:
        if isinstance(x, torch.Tensor):
            x.grad = None


def _run(setting: _Setting) -> float:
    _clear_grads(setting)
    start = time.perf_counter()
    loss_of(setting.compiled(setting.model, *setting.inputs)).backward()
    return time.perf_counter() - start


def _measure_peak(setting: _Setting) -> int:
    from ckpt.measure import peak_memory

    devices = [x.device for x in setting.inputs if isinstance(x, torch.Tensor)]
    device = next((d for d in devices if d.type == "cuda"), torch.device("cpu"))
    _clear_grads(setting)
    return peak_memory(lambda: loss_of(setting.compiled(setting.model, *setting.inputs)).backward(), device).bytes


def _first_step(setting: _Setting) -> Measurement:
    """Compile and run once, recording the partitions and the saved bytes."""
    from ckpt import _torch_compat as compat
    from ckpt.measure import saved_activations

    tensors = [x for x in setting.inputs if isinstance(x, torch.Tensor)]
    with compat.compile_caches_disabled(), record_partitions() as records:
        with saved_activations(setting.model, *tensors) as saved:
            loss = loss_of(setting.compiled(setting.model, *setting.inputs))
        loss.backward()
    planned_records = tuple(r for r in records if r.planned is not None)
    planned = [p for p in (r.planned for r in records) if p is not None]
    if not records:
        raise RuntimeError(
            f"budget {setting.budget!r}: no graph was partitioned; the compiled model produced no training graph"
        )
    if len(planned) < len(records):
        reasons = "; ".join(f"{r.graph}: {r.fallback_reason}" for r in records if r.plan is None)
        raise RuntimeError(f"budget {setting.budget!r}: ckpt fell back to torch's partition ({reasons})")
    totals = [plan_totals(analysis, plan.saved) for analysis, plan in planned]
    peaks = [r.peak.peak_bytes for r in planned_records if r.peak is not None]
    return Measurement(
        budget=setting.budget,
        graphs=len(planned),
        predicted_bytes=sum(t.bytes for t in totals),
        measured_bytes=saved.bytes,
        predicted_save_ps=sum(t.save_ps for t in totals),
        predicted_recompute_ps=sum(t.recompute_ps for t in totals),
        predicted_library_ps=sum(t.recompute_library_ps for t in totals),
        predicted_fixed_seconds=sum(analysis.fixed_seconds for analysis, _ in planned),
        step_seconds=(),
        records=planned_records,
        predicted_peak=sum(peaks) if len(peaks) == len(planned_records) else None,
    )


def measure_budgets(
    model: torch.nn.Module,
    example_inputs: Sequence[Any],
    budgets: Sequence[Any],
    *,
    steps: int = 7,
    options: Mapping[str, Any] | None = None,
) -> list[Measurement]:
    """Compile ``model`` at each budget, then time ``steps`` alternating rounds; one Measurement per budget."""
    check_model(model)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps={steps!r} is not a valid number of timed steps; give an integer >= 0")
    if not budgets:
        raise ValueError("budgets is empty; give at least one budget, for example ['none', '0.5']")
    kwargs = [compile_options(b, options) for b in budgets]
    torch.compiler.reset()
    settings, firsts = [], []
    for index, (budget, compile_kwargs) in enumerate(zip(budgets, kwargs)):
        copy_of_model = copy.deepcopy(model)
        entry = fresh_entry(f"budget_{index}")
        compiled = torch.compile(entry, backend="ckpt", options=compile_kwargs)
        setting = _Setting(str(budget), copy_of_model, clone_inputs(example_inputs), compiled)
        first = _first_step(setting)
        _run(setting)  # warm-up
        firsts.append(dataclasses.replace(first, measured_peak=_measure_peak(setting)))
        settings.append(setting)
    counts = {m.budget: m.graphs for m in firsts}
    if len(set(counts.values())) > 1:
        raise RuntimeError(
            f"the budgets compiled to different numbers of graphs ({counts}); a compiled graph was reused"
        )
    for round_index in range(steps):
        for setting in rotation(settings, round_index):
            setting.times.append(_run(setting))
    return [dataclasses.replace(first, step_seconds=tuple(s.times)) for first, s in zip(firsts, settings)]
