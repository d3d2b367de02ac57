"""From measurements to verdicts: noise, time at matched memory, dominance, targets.

Definitions, which every results file repeats:

* **noise** of a model: from two independently compiled copies of the same
  setting, compile and compile (repeat), timed in the same rounds: the larger
  of the gap between their medians, ``|t(compile) / t(compile (repeat)) - 1|``,
  and twice the standard error of that ratio (rounds resampled in pairs,
  bootstrap with a fixed seed).  The gap alone is one draw and can be lucky.
  ckpt settings that made the same plan (equal plan fingerprints in every
  graph: the same compiled code, say no budget and a budget it keeps) are
  such copies too, and the largest of all these pairs' figures counts.
* **time at matched memory** of a ckpt point: its step time divided by the
  step time of the fastest non-ckpt setting (eager, eager checkpoint, default
  compile or torch's budget) whose activation bytes are at most its own.
  This is a superset of "torch's knob or eager checkpoint", so it can only
  be stricter.  Undefined when no alternative is that lean.
* a ckpt point is **dominated** when another setting has no more bytes and no
  more time, and is better in one; **beyond noise** when that setting's time
  is below ``t * (1 - noise)``.
* the **step peak** of a setting is measured on one step, above what was
  allocated before it, gradients set to None first; the **no-recompute peak**
  is default compile's.
* **peak monotone**: along ckpt's budgets from none down to 0.1, no point
  peaks more than 2% of the no-recompute peak above the point of the next
  larger budget.
* **time at matched peak** of a ckpt point: its step time divided by the
  step time of the fastest torch-budget setting whose measured peak is at
  most its own; met when at most ``1 + noise``.
* **time predicted** (what ``python -m ckpt validate`` checks, on the
  benchmark's own run): at ckpt's budgets 0.5, 0.25 and 0, the predicted
  change of the step against ckpt without a budget (the difference of the
  plans' predicted save and recompute time) over the measured change of the
  median step; checked where the measured change exceeds the model's noise,
  met when within 25% of it.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import ModelResult, SettingResult
from benchmarks.settings import CKPT, TORCH_BUDGET

__all__ = ["ModelVerdict", "Target", "analyze_model", "evaluate_targets", "same_plan_pairs"]

MATCHED_GOAL = 0.95
COMPILE_GOAL = 1.05


@dataclass
class ModelVerdict:
    name: str
    noise: float | None
    compile_s: float | None  # reference step time: mean of compile and compile (repeat)
    matched: list[dict[str, Any]] = field(default_factory=list)
    dominated: list[dict[str, Any]] = field(default_factory=list)
    budgets: list[dict[str, Any]] = field(default_factory=list)
    # ckpt settings that made the same plans (labels): timed twice, so part of the noise
    same_plans: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Target:
    name: str
    goal: str
    value: str
    met: bool | None  # None: not measured in this run
    misses: list[str] = field(default_factory=list)


def _measured(model: ModelResult) -> list[SettingResult]:
    return [r for r in model.settings if r.error is None and r.step_s is not None and r.activation_bytes is not None]


BOOTSTRAP_RESAMPLES = 2000


def _ratio_standard_error(first: list[float], repeat: list[float]) -> float:
    """Bootstrap standard error of median(first) / median(repeat), rounds resampled in pairs."""
    pairs = list(zip(first, repeat))
    if len(pairs) < 3:
        return 0.0
    rng = random.Random(0)
    ratios = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        sample = rng.choices(pairs, k=len(pairs))
        ratios.append(statistics.median(a for a, _ in sample) / statistics.median(b for _, b in sample))
    return statistics.stdev(ratios)


def _pair_noise(first: SettingResult, repeat: SettingResult) -> float:
    """The noise two copies of one program show: their medians' gap, or twice its standard error if larger."""
    assert first.step_s is not None and repeat.step_s is not None
    gap = abs(first.step_s / repeat.step_s - 1.0)
    return max(gap, 2.0 * _ratio_standard_error(first.samples_s, repeat.samples_s))


def _plan_fingerprint(point: SettingResult) -> tuple[str, ...] | None:
    """The plans of a ckpt point, graph by graph; None where any graph's plan is unknown."""
    prints = tuple(g.get("fingerprint") for g in point.graphs)
    return prints if prints and None not in prints else None  # type: ignore[return-value]


def same_plan_pairs(model: ModelResult) -> list[tuple[SettingResult, SettingResult]]:
    """Pairs of ckpt settings that made the same plans: the same compiled program, timed twice."""
    groups: dict[tuple[str, ...], list[SettingResult]] = {}
    for point in _measured(model):
        prints = _plan_fingerprint(point) if point.setting.family == CKPT else None
        if prints is not None:
            groups.setdefault(prints, []).append(point)
    return [(a, b) for group in groups.values() for k, a in enumerate(group) for b in group[k + 1 :]]


def _noise(model: ModelResult, pairs: list[tuple[SettingResult, SettingResult]]) -> tuple[float | None, float | None]:
    """The noise (compile against its repeat, and ``pairs``: same plans timed twice) and the compile step.

    A run without compile's repeat (``--settings`` leaving it out) still
    measures the noise where two ckpt settings made the same plan: without
    it, the slower of two timings of one program was reported as dominated
    by the faster beyond a noise of zero.  None when neither is there.
    """
    by_key = {r.setting.key: r for r in _measured(model)}
    first, repeat = by_key.get("compile"), by_key.get("compile-repeat")
    copies = [_pair_noise(a, b) for a, b in pairs]
    if first is None or repeat is None:
        compile_s = None if first is None else first.step_s
        return (max(copies) if copies else None), compile_s
    assert first.step_s is not None and repeat.step_s is not None
    return max([_pair_noise(first, repeat)] + copies), (first.step_s + repeat.step_s) / 2


def _budget_check(point: SettingResult) -> dict[str, Any]:
    graphs = point.graphs
    check: dict[str, Any] = {
        "setting": point.setting.label,
        "measured_bytes": point.activation_bytes,
        "graphs": len(graphs),
    }
    fallbacks = [g["fallback_reason"] for g in graphs if g.get("fallback_reason")]
    caps = [g.get("budget_bytes") for g in graphs]
    check["budget_bytes"] = sum(caps) if graphs and None not in caps else None
    check["predicted_bytes"] = sum(g.get("predicted_bytes", 0) for g in graphs) if graphs else None
    check["below_minimum"] = any(g.get("over_budget") for g in graphs)
    if not graphs:
        check["status"] = "no partition record"
    elif fallbacks:
        check["status"] = "fallback: " + "; ".join(fallbacks)
    elif check["budget_bytes"] is None:
        check["status"] = "no cap"
    elif point.activation_bytes is not None and point.activation_bytes <= check["budget_bytes"]:
        check["status"] = "within"
    elif check["below_minimum"]:
        check["status"] = "budget below the smallest plan"
    else:
        check["status"] = "over"
    return check


def analyze_model(model: ModelResult) -> ModelVerdict:
    points = _measured(model)
    pairs = same_plan_pairs(model)
    noise, compile_s = _noise(model, pairs)
    verdict = ModelVerdict(model.name, noise, compile_s)
    verdict.same_plans = [(a.setting.label, b.setting.label) for a, b in pairs]
    tolerance = noise or 0.0
    for point in (p for p in points if p.setting.family == CKPT):
        assert point.step_s is not None and point.activation_bytes is not None
        lean = [a for a in points if a.setting.family != CKPT and a.activation_bytes <= point.activation_bytes]  # type: ignore[operator]
        entry: dict[str, Any] = {
            "setting": point.setting.label,
            "budget": point.setting.budget,
            "ratio": None,
            "reference": None,
        }
        if lean:
            best = min(lean, key=lambda a: a.step_s)  # type: ignore[arg-type,return-value]
            entry.update(ratio=point.step_s / best.step_s, reference=best.setting.label)  # type: ignore[operator]
        verdict.matched.append(entry)
        for other in points:
            if other is point:
                continue
            assert other.step_s is not None and other.activation_bytes is not None
            no_worse = other.activation_bytes <= point.activation_bytes and other.step_s <= point.step_s
            better = other.activation_bytes < point.activation_bytes or other.step_s < point.step_s
            if no_worse and better:
                verdict.dominated.append(
                    {
                        "setting": point.setting.label,
                        "by": other.setting.label,
                        "time_ratio": other.step_s / point.step_s,
                        "beyond_noise": other.step_s < point.step_s * (1.0 - tolerance),
                    }
                )
        verdict.budgets.append(_budget_check(point))
    return verdict


def _predicted_seconds(point: SettingResult) -> float:
    """The plan's predicted save and recompute time, summed over its graphs."""
    return sum(g.get("predicted_extra_s", 0.0) for g in point.graphs)


def _diagnosis(model: ModelResult, label: str, verdict: ModelVerdict) -> str:
    """Predicted against measured extra time of one ckpt point, and its costliest recomputed values."""
    point = next((r for r in model.settings if r.setting.label == label), None)
    if point is None or point.step_s is None:
        return ""
    predicted = _predicted_seconds(point)
    text = f"cost model: plan's extra time {predicted * 1e3:.2f} ms"
    if verdict.compile_s is not None:
        text += f", measured {(point.step_s - verdict.compile_s) * 1e3:+.2f} ms against compile"
    top = sorted((item for g in point.graphs for item in g.get("top_recomputed", [])), key=lambda item: -item[1])[:5]
    if top:
        text += "; costliest recomputed: " + ", ".join(f"{name} ({seconds * 1e6:.0f} us)" for name, seconds in top)
    return text


def _within_budget(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    checks = [(m.name, b) for m, v in zip(models, verdicts) for b in v.budgets]
    fine = ("within", "no cap", "budget below the smallest plan")
    misses = [
        f"{name} {b['setting']}: {b['status']} (measured {b['measured_bytes']} B, budget {b['budget_bytes']} B)"
        for name, b in checks
        if b["status"] not in fine
    ]
    at_minimum = sum(b["status"] == "budget below the smallest plan" for _, b in checks)
    value = f"{len(checks) - len(misses)}/{len(checks)} points"
    if at_minimum:
        value += f" ({at_minimum} with the budget below the smallest plan, which they keep)"
    goal = "every ckpt point's measured bytes <= its budget"
    return Target("within budget", goal, value, not misses if checks else None, misses)


def _not_dominated(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    misses = [
        f"{m.name} {d['setting']} by {d['by']} (time x{d['time_ratio']:.3f}, noise {v.noise or 0:.1%})"
        for m, v in zip(models, verdicts)
        for d in v.dominated
        if d["beyond_noise"]
    ]
    points = sum(len(v.matched) for v in verdicts)
    value = f"{len(misses)} of {points} points"
    return Target(
        "not dominated", "no ckpt point dominated beyond noise", value, not misses if points else None, misses
    )


def _matched_memory(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    ratios, misses = [], []
    for model, verdict in zip(models, verdicts):
        for entry in verdict.matched:
            if entry["ratio"] is None:
                continue
            ratios.append(entry["ratio"])
            if entry["ratio"] > MATCHED_GOAL:
                why = _diagnosis(model, entry["setting"], verdict)
                misses.append(f"{model.name} {entry['setting']}: {entry['ratio']:.3f} vs {entry['reference']}; {why}")
    median = statistics.median(ratios) if ratios else None
    value = "n/a" if median is None else f"median {median:.3f} over {len(ratios)} points"
    met = None if median is None else median <= MATCHED_GOAL
    return Target("time at matched memory", f"median <= {MATCHED_GOAL}", value, met, misses)


def _half_budget(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    rows, misses = [], []
    for model, verdict in zip(models, verdicts):
        point = next((r for r in _measured(model) if r.setting.key == "ckpt-0.5"), None)
        if not model.transformer or point is None or verdict.compile_s is None:
            continue
        ratio = point.step_s / verdict.compile_s  # type: ignore[operator]
        rows.append(f"{model.name} x{ratio:.3f}")
        if ratio > COMPILE_GOAL:
            misses.append(f"{model.name}: x{ratio:.3f}; {_diagnosis(model, point.setting.label, verdict)}")
    goal = f"transformers: t(ckpt 0.5) <= {COMPILE_GOAL} x t(compile)"
    return Target("budget 0.5 vs compile", goal, ", ".join(rows) or "n/a", not misses if rows else None, misses)


PEAK_PREDICTION_GOAL = 0.10
PEAK_CAP_SLACK = 0.02
PEAK_MONOTONE_SLACK = 0.02
RESNET_PEAK_GOAL = 0.6


def _reference_peak(model: ModelResult) -> int | None:
    point = next((r for r in model.settings if r.setting.key == "compile" and r.error is None), None)
    return None if point is None else point.measured_peak


def _ckpt_points(model: ModelResult) -> list[SettingResult]:
    return [r for r in model.settings if r.setting.family == CKPT and r.error is None]


def _peak_predicted(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    errors, misses = [], []
    for model in models:
        for point in _ckpt_points(model):
            measured, predicted = point.measured_peak, point.predicted_peak
            if not measured or predicted is None:
                continue
            error = predicted / measured - 1
            errors.append(abs(error))
            if abs(error) > PEAK_PREDICTION_GOAL:
                misses.append(f"{model.name} {point.setting.label}: predicted {predicted} B, measured {measured} B")
    value = "n/a" if not errors else f"largest error {max(errors):.1%} over {len(errors)} points"
    goal = f"every ckpt point's predicted peak within {PEAK_PREDICTION_GOAL:.0%} of measured"
    return Target("peak predicted", goal, value, not misses if errors else None, misses)


def _peak_cap_kept(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    """A reachable cap is kept; a cap below every plan's predicted peak runs the plan that peaks lowest.

    ckpt warns when no plan's predicted peak is within the cap and runs the
    plan with the lowest peak it found; that point is checked against the
    lowest peak measured for the model in any setting (torch's, eager
    checkpointing and ckpt's own).
    """
    rows, misses = [], []
    below = 0
    for model in models:
        lowest = min((r.measured_peak for r in model.settings if r.error is None and r.measured_peak), default=None)
        for point in _ckpt_points(model):
            caps = [g.get("peak_cap_bytes") for g in point.graphs]
            measured = point.measured_peak
            if not caps or None in caps or measured is None:
                continue
            cap = sum(caps)  # type: ignore[arg-type]
            rows.append(f"{model.name} {point.setting.label} {measured / cap:.2f}")
            if any((g.get("predicted_peak") or 0) > g["peak_cap_bytes"] for g in point.graphs):
                below += 1
                if lowest is not None and measured > lowest * (1 + PEAK_CAP_SLACK):
                    misses.append(
                        f"{model.name} {point.setting.label}: cap {cap} B below every plan's predicted peak; measured "
                        f"{measured} B, above the model's lowest measured peak {lowest} B"
                    )
            elif measured > cap * (1 + PEAK_CAP_SLACK):
                misses.append(f"{model.name} {point.setting.label}: measured {measured} B, cap {cap} B")
    goal = (
        f"measured peak <= cap + {PEAK_CAP_SLACK:.0%} at every capped point (measured/cap); a cap below every "
        f"plan's predicted peak (warned): within {PEAK_CAP_SLACK:.0%} of the lowest peak measured for the model"
    )
    value = ", ".join(rows) or "n/a"
    if below:
        value += f" ({below} below every plan's predicted peak)"
    return Target("peak cap kept", goal, value, not misses if rows else None, misses)


def _peak_monotone(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    checked, misses = 0, []
    for model in models:
        reference = _reference_peak(model)
        points = [p for p in _ckpt_points(model) if p.setting.peak is None and p.measured_peak is not None]
        points = [p for p in points if p.setting.budget is None or p.setting.budget >= 0.1]
        points.sort(key=lambda p: -(2.0 if p.setting.budget is None else p.setting.budget))
        if reference is None or len(points) < 2:
            continue
        checked += 1
        for larger, smaller in zip(points, points[1:]):
            rise = smaller.measured_peak - larger.measured_peak  # type: ignore[operator]
            if rise > PEAK_MONOTONE_SLACK * reference:
                misses.append(
                    f"{model.name}: {smaller.setting.label} peaks {rise / reference:.1%} of the no-recompute peak "
                    f"above {larger.setting.label}"
                )
    goal = f"ckpt none down to 0.1: no rise above {PEAK_MONOTONE_SLACK:.0%} of the no-recompute peak"
    value = f"{checked - len({m.split(':')[0] for m in misses})}/{checked} models" if checked else "n/a"
    return Target("peak monotone in the budget", goal, value, not misses if checked else None, misses)


def _matched_peak(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    ratios, misses = [], []
    for model, verdict in zip(models, verdicts):
        knob = [r for r in _measured(model) if r.setting.family == TORCH_BUDGET and r.measured_peak is not None]
        for point in (p for p in _measured(model) if p.setting.family == CKPT and p.measured_peak is not None):
            lower = [k for k in knob if k.measured_peak <= point.measured_peak]  # type: ignore[operator]
            if not lower:
                continue
            best = min(lower, key=lambda k: k.step_s)  # type: ignore[arg-type,return-value]
            ratio = point.step_s / best.step_s  # type: ignore[operator]
            ratios.append(ratio)
            if ratio > 1 + (verdict.noise or 0.0):
                misses.append(f"{model.name} {point.setting.label}: x{ratio:.3f} vs {best.setting.label}")
    value = "n/a" if not ratios else f"median {statistics.median(ratios):.3f} over {len(ratios)} points"
    goal = "every ckpt point no slower (beyond noise) than torch's fastest budget that peaks no higher"
    return Target("time at matched peak", goal, value, not misses if ratios else None, misses)


TIME_PREDICTED_BUDGETS = (0.5, 0.25, 0.0)
TIME_PREDICTED_TOLERANCE = 0.25


def _time_predicted(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    checked, in_noise, ratios, misses = 0, 0, [], []
    for model, verdict in zip(models, verdicts):
        points = {p.setting.key: p for p in _measured(model) if p.setting.family == CKPT and p.graphs}
        base = points.get("ckpt-none")
        if base is None or verdict.noise is None:
            continue
        for budget in TIME_PREDICTED_BUDGETS:
            point = next((p for p in points.values() if p.setting.budget == budget and p.setting.peak is None), None)
            if point is None:
                continue
            measured = point.step_s - base.step_s  # type: ignore[operator]
            predicted = _predicted_seconds(point) - _predicted_seconds(base)
            if abs(measured) <= verdict.noise * base.step_s:  # type: ignore[operator]
                in_noise += 1
                continue
            checked += 1
            ratios.append(predicted / measured)
            if abs(predicted - measured) > TIME_PREDICTED_TOLERANCE * abs(measured):
                misses.append(
                    f"{model.name} {point.setting.label}: predicted {predicted * 1e3:+.2f} ms, measured "
                    f"{measured * 1e3:+.2f} ms against ckpt none (x{predicted / measured:.2f})"
                )
    goal = (
        f"ckpt {', '.join(f'{b:g}' for b in TIME_PREDICTED_BUDGETS)}: predicted step change against ckpt none "
        f"within {TIME_PREDICTED_TOLERANCE:.0%} of the measured one, where that exceeds the noise"
    )
    if not checked:
        return Target("time predicted", goal, "n/a", None)
    value = f"{checked - len(misses)}/{checked} points (median predicted/measured {statistics.median(ratios):.2f})"
    if in_noise:
        value += f"; {in_noise} within the noise"
    return Target("time predicted", goal, value, not misses, misses)


def _resnet_peak(models: list[ModelResult], verdicts: list[ModelVerdict]) -> Target:
    model = next((m for m in models if m.name == "resnet"), None)
    reference = None if model is None else _reference_peak(model)
    if model is None or not reference:
        return Target("ResNet peak", f"ckpt 0.1 <= {RESNET_PEAK_GOAL} x no-recompute peak", "n/a", None)
    by_key = {r.setting.key: r for r in model.settings if r.error is None}
    parts, misses = [], []
    budget = by_key.get("ckpt-0.1")
    if budget is not None and budget.measured_peak is not None:
        ratio = budget.measured_peak / reference  # type: ignore[operator]
        parts.append(f"ckpt 0.1 x{ratio:.2f}")
        if ratio > RESNET_PEAK_GOAL:
            misses.append(f"ckpt 0.1 peaks x{ratio:.2f} of the no-recompute peak")
    capped, hand = by_key.get("ckpt-peak-0.5"), by_key.get("eager-checkpoint")
    if capped is not None and capped.measured_peak is not None:
        parts.append(f"ckpt peak 0.5 x{capped.measured_peak / reference:.2f}")  # type: ignore[operator]
        if hand is not None and hand.measured_peak is not None:
            parts.append(f"eager checkpoint x{hand.measured_peak / reference:.2f}")  # type: ignore[operator]
            if capped.measured_peak > hand.measured_peak:  # type: ignore[operator]
                misses.append("ckpt peak 0.5 peaks above eager checkpoint")
    goal = f"ckpt 0.1 <= {RESNET_PEAK_GOAL} x no-recompute peak; ckpt peak 0.5 <= eager checkpoint"
    return Target("ResNet peak", goal, ", ".join(parts) or "n/a", not misses if parts else None, misses)


def evaluate_targets(models: list[ModelResult], verdicts: list[ModelVerdict]) -> list[Target]:
    """The issues' targets, met or missed, with the points that miss them."""
    checks = (
        _within_budget, _not_dominated, _matched_memory, _half_budget,
        _peak_predicted, _peak_cap_kept, _peak_monotone, _matched_peak, _resnet_peak, _time_predicted,
    )  # fmt: skip
    return [check(models, verdicts) for check in checks]
