"""The time-memory trade-off across budgets: predicted curve, measured points, and a check of the time model.

:func:`pareto` compiles the model at a few budgets and measures each (bytes,
median step time; :mod:`ckpt.tools.sweep`).  The curve itself needs no
more compiles: the partition records hold each graph's plain-data problem,
and :func:`ckpt.partitioner.solve` is run on it at many budget fractions.
The PNG shows the curve, the measured points over it and the chosen budget.

The curve's times are predictions of the *extra* time of save and recompute;
the fixed work of the step is the same for every plan.  When the no-cap
budget was measured, the curve is anchored at its measured step time, so
measured and predicted points differ only by the error of that extra time.

:func:`validate_time_model` reports, per budget, the measured change in step
time against the no-cap plan next to the predicted change, and splits the
prediction into its terms (saving, recomputing library calls, recomputing
fused ops), to show where the cost model is off.  It also puts each
budget's measured step peak next to the predicted one
(:mod:`ckpt.partitioner.peak`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ckpt.config import Budget, parse_budget
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.solver import solve
from ckpt.records import PartitionRecord
from ckpt.tools.common import check_statistic, require_matplotlib
from ckpt.tools.sweep import Measurement, measure_budgets

__all__ = ["CurvePoint", "ParetoResult", "TimeValidation", "pareto", "predicted_curve", "validate_time_model"]

DEFAULT_MEASURE = ("none", "0.5", "0.25", "0")


@dataclass(frozen=True)
class CurvePoint:
    """The plans of every graph at one budget, summed."""

    budget: str
    bytes: int
    extra_ps: int  # predicted save + recompute time
    fixed_seconds: float  # predicted fixed forward + backward time

    @property
    def step_seconds(self) -> float:
        return self.fixed_seconds + self.extra_ps * 1e-12


def _point(analyses: Sequence[JointAnalysis], budget: Budget, effort: float) -> CurvePoint:
    nbytes = extra = 0
    fixed = 0.0
    for analysis in analyses:
        plan = solve(analysis.problem, budget.resolve(analysis.reference_bytes), effort=effort)
        nbytes, extra, fixed = nbytes + plan.bytes, extra + plan.time, fixed + analysis.fixed_seconds
    return CurvePoint(str(budget), nbytes, extra, fixed)


def _analyses(records: Sequence[PartitionRecord]) -> list[JointAnalysis]:
    return [planned[0] for planned in (r.planned for r in records) if planned is not None]


def predicted_curve(records: Sequence[PartitionRecord], *, points: int = 41, effort: float = 0.4) -> list[CurvePoint]:
    """Predicted bytes and time at no cap and at ``points`` fractions from 1 to 0, without recompiling."""
    analyses = _analyses(records)
    if not analyses:
        raise ValueError("records holds no planned graph; compile with backend='ckpt' inside record_partitions()")
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ValueError(f"points={points!r} is too few; give an integer >= 2")
    budgets = [Budget()] + [Budget(fraction=1 - i / (points - 1)) for i in range(points)]
    return [_point(analyses, b, effort) for b in budgets]


@dataclass(frozen=True)
class ParetoResult:
    budget: str
    chosen: CurvePoint
    curve: tuple[CurvePoint, ...]
    measured: tuple[Measurement, ...]
    path: str | None
    statistic: str = "median"

    def _anchor(self) -> float | None:
        """Measured no-cap step time minus its predicted extra time, or None if no-cap was not timed."""
        base = next((m for m in self.measured if m.budget == "none" and m.step_seconds), None)
        return None if base is None else base.seconds(self.statistic) - base.predicted_extra_ps * 1e-12

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "chosen": asdict(self.chosen),
            "curve": [asdict(p) for p in self.curve],
            "measured": [m.to_dict() for m in self.measured],
            "path": self.path,
            "statistic": self.statistic,
        }

    def __str__(self) -> str:
        from ckpt.tools.formatting import format_bytes, table

        rows = [
            [
                m.budget,
                format_bytes(m.predicted_bytes),
                format_bytes(m.measured_bytes),
                f"{m.predicted_extra_ps * 1e-9:.3f}",
                f"{m.seconds(self.statistic) * 1e3:.3f}",
            ]
            for m in self.measured
        ]
        lines = [
            f"Pareto curve: {len(self.curve)} predicted points; chosen budget {self.budget}: "
            f"{format_bytes(self.chosen.bytes)}, {self.chosen.extra_ps * 1e-9:.3f} ms predicted extra time",
            "",
        ]
        if rows:
            headers = [
                "budget",
                "predicted bytes",
                "measured bytes",
                "predicted extra ms",
                f"measured step ms ({self.statistic})",
            ]
            lines.append(table(headers, rows, {1, 2, 3, 4}))
        if self.path:
            lines += ["", f"plot written to {self.path}"]
        return "\n".join(lines)


def plot_pareto(result: ParetoResult, path: str | Path) -> Path:
    """Draw ``result`` to a PNG at ``path``: curve, measured points, chosen budget."""
    figure_class = require_matplotlib()
    mib = 2**20
    anchor = result._anchor()

    def y(point: CurvePoint) -> float:
        return 1e3 * ((anchor + point.extra_ps * 1e-12) if anchor is not None else point.step_seconds)

    figure = figure_class(figsize=(7, 4.5))
    axes = figure.subplots()
    curve = sorted(result.curve, key=lambda p: (p.bytes, -p.extra_ps))
    label = "predicted (anchored at the measured no-cap step)" if anchor is not None else "predicted"
    axes.plot([p.bytes / mib for p in curve], [y(p) for p in curve], "-", marker=".", color="tab:blue", label=label)
    timed = [m for m in result.measured if m.step_seconds]
    stat = result.statistic
    if timed:
        axes.errorbar(
            [m.measured_bytes / mib for m in timed],
            [m.seconds(stat) * 1e3 for m in timed],
            yerr=[m.error(stat) * 1e3 for m in timed],
            fmt="o",
            color="tab:orange",
            label=f"measured ({stat} step)",
        )
        for m in timed:
            axes.annotate(
                m.budget,
                (m.measured_bytes / mib, m.seconds(stat) * 1e3),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=8,
            )
    axes.plot(
        [result.chosen.bytes / mib],
        [y(result.chosen)],
        "*",
        markersize=16,
        color="tab:red",
        label=f"chosen budget {result.budget}",
    )
    axes.set_xlabel("saved activations (MiB)")
    axes.set_ylabel("step time (ms)")
    axes.set_title("ckpt: step time against activation memory across budgets")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path


def _budget_list(name: str, budgets: Sequence[Any]) -> list[str]:

    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, Sequence):
        raise ValueError(f"{name}={budgets!r} is not a list of budgets; give a list such as ['none', '0.5']")
    return [str(parse_budget(b, f"{name}[{i}]")) for i, b in enumerate(budgets)]


def pareto(
    model: torch.nn.Module,
    *example_inputs: Any,
    budget: Any = "0.5",
    path: str | Path | None = "ckpt-pareto.png",
    measure: Sequence[Any] = DEFAULT_MEASURE,
    steps: int = 5,
    points: int = 41,
    statistic: str = "median",
    options: Mapping[str, Any] | None = None,
) -> ParetoResult:
    """Predicted step time against activation bytes across budgets, with measured points; plots to ``path``.

    Compiles once per budget in ``measure`` (plus ``budget``) and times
    ``steps`` alternating rounds; the curve is solved from the records at
    ``points`` fractions.  ``statistic`` summarises the timed steps:
    ``"median"``, or ``"min"`` on a machine shared with other work.
    ``path=None`` skips the plot (and matplotlib).
    """

    check_statistic(statistic)
    chosen_budget = parse_budget(budget, "budget")
    measured_budgets = _budget_list("measure", measure)
    if path is not None:
        require_matplotlib()  # fail before compiling
    if str(chosen_budget) not in measured_budgets:
        measured_budgets.append(str(chosen_budget))
    measured = measure_budgets(model, example_inputs, measured_budgets, steps=steps, options=options)
    records = next(m.records for m in measured if m.budget == str(chosen_budget))
    curve = predicted_curve(records, points=points)
    chosen = _point(_analyses(records), chosen_budget, effort=1.0)
    result = ParetoResult(str(chosen_budget), chosen, tuple(curve), tuple(measured), None, statistic)
    if path is not None:
        result = dataclasses.replace(result, path=str(plot_pareto(result, path)))
    return result


@dataclass(frozen=True)
class TimeCheck:
    """One budget against the no-cap plan: predicted and measured change in step time (seconds)."""

    budget: str
    predicted_bytes: int
    measured_bytes: int
    predicted_delta: float
    measured_delta: float
    noise: float  # standard error of the measured change
    delta_save: float  # the predicted change split into its terms
    delta_recompute_library: float
    delta_recompute_fused: float
    predicted_peak: int | None = None  # the step's peak, predicted and measured (bytes)
    measured_peak: int | None = None

    @property
    def peak_error(self) -> float:
        """Predicted over measured peak, less one."""
        if not self.predicted_peak or not self.measured_peak:
            return math.nan
        return self.predicted_peak / self.measured_peak - 1

    @property
    def above_noise(self) -> bool:
        return abs(self.measured_delta) > 2 * self.noise

    @property
    def ratio(self) -> float:
        """Predicted over measured change."""
        return self.predicted_delta / self.measured_delta if self.measured_delta else math.nan


@dataclass(frozen=True)
class TimeValidation:
    baseline: Measurement
    checks: tuple[TimeCheck, ...]
    statistic: str

    def to_dict(self) -> dict[str, Any]:
        rows = [
            {**asdict(c), "ratio": c.ratio, "above_noise": c.above_noise, "peak_error": c.peak_error}
            for c in self.checks
        ]
        return {"baseline": self.baseline.to_dict(), "checks": rows, "statistic": self.statistic}

    def __str__(self) -> str:
        from ckpt.tools.formatting import format_bytes, table

        b = self.baseline
        rows = [
            [
                c.budget,
                format_bytes(c.predicted_bytes),
                format_bytes(c.measured_bytes),
                f"{c.predicted_delta * 1e3:+.3f}",
                f"{c.measured_delta * 1e3:+.3f} ± {c.noise * 1e3:.3f}",
                f"{c.ratio:.2f}" if c.above_noise else f"({c.ratio:.2f}, in noise)",
                f"{c.delta_save * 1e3:+.3f}",
                f"{c.delta_recompute_library * 1e3:+.3f}",
                f"{c.delta_recompute_fused * 1e3:+.3f}",
                "-" if c.predicted_peak is None else format_bytes(c.predicted_peak),
                "-" if c.measured_peak is None else format_bytes(c.measured_peak),
                f"{c.peak_error:+.1%}" if math.isfinite(c.peak_error) else "-",
            ]
            for c in self.checks
        ]
        head = (
            f"No-cap baseline: {format_bytes(b.measured_bytes)}, "
            f"measured step {b.seconds(self.statistic) * 1e3:.3f} ms "
            f"({self.statistic} of {len(b.step_seconds)} steps per budget; predicted "
            f"{(b.predicted_fixed_seconds + b.predicted_extra_ps * 1e-12) * 1e3:.3f} ms); "
            f"step peak {_peak_text(b.predicted_peak, b.measured_peak)}. "
            "Changes are against the baseline, in ms, ± one bootstrap standard error; "
            "a ratio is shown where the change exceeds two."
        )
        headers = [
            "budget",
            "predicted bytes",
            "measured bytes",
            "predicted change",
            "measured change",
            "predicted/measured",
            "save term",
            "recompute library",
            "recompute fused",
            "predicted peak",
            "measured peak",
            "peak error",
        ]
        return head + "\n\n" + table(headers, rows, set(range(1, 12)))


def _peak_text(predicted: int | None, measured: int | None) -> str:
    from ckpt.tools.formatting import format_bytes

    text = "measured " + ("-" if measured is None else format_bytes(measured))
    return text + ", predicted " + ("-" if predicted is None else format_bytes(predicted))


def validate_time_model(
    model: torch.nn.Module,
    *example_inputs: Any,
    budgets: Sequence[Any] = ("0.5", "0.25", "0"),
    steps: int = 15,
    statistic: str = "median",
    options: Mapping[str, Any] | None = None,
) -> TimeValidation:
    """Measure the step-time change of each budget against no cap, next to the cost model's prediction.

    ``statistic`` summarises the timed steps: ``"median"``, or ``"min"`` on a
    machine shared with other work, where interference only adds time.
    """
    check_statistic(statistic)
    names = [b for b in _budget_list("budgets", budgets) if b != "none"]
    if steps < 2:
        raise ValueError(f"steps={steps!r} is too few to tell change from noise; give an integer >= 2")
    measured = measure_budgets(model, example_inputs, ["none", *names], steps=steps, options=options)
    base, others = measured[0], measured[1:]
    checks = []
    for m in others:
        noise = math.hypot(m.error(statistic), base.error(statistic))
        fused = m.predicted_recompute_ps - m.predicted_library_ps
        fused -= base.predicted_recompute_ps - base.predicted_library_ps
        checks.append(
            TimeCheck(
                budget=m.budget,
                predicted_bytes=m.predicted_bytes,
                measured_bytes=m.measured_bytes,
                predicted_delta=(m.predicted_extra_ps - base.predicted_extra_ps) * 1e-12,
                measured_delta=m.seconds(statistic) - base.seconds(statistic),
                noise=noise,
                delta_save=(m.predicted_save_ps - base.predicted_save_ps) * 1e-12,
                delta_recompute_library=(m.predicted_library_ps - base.predicted_library_ps) * 1e-12,
                delta_recompute_fused=fused * 1e-12,
                predicted_peak=m.predicted_peak,
                measured_peak=m.measured_peak,
            )
        )
    return TimeValidation(base, tuple(checks), statistic)
