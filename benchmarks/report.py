"""Write the results: a Markdown table per model, the targets, and JSON with every number."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.analysis import ModelVerdict, Target, analyze_model, evaluate_targets
from benchmarks.analysis import __doc__ as _definitions
from benchmarks.harness import ModelResult, SettingResult
from benchmarks.settings import SETTINGS, display_order

__all__ = ["load_results", "main", "write_results"]

MIB = 2**20

_COLUMNS = (
    "setting", "activation MiB", "step ms", "vs compile", "compile s", "partition s", "ckpt solve s",
    "budget MiB", "predicted MiB", "peak MiB", "predicted peak MiB",
)  # fmt: skip

_LEGEND = (
    "A step is forward plus backward. *activation MiB*: unique storages saved for the backward (parameters "
    "and inputs left out). *step ms*: median, and the interquartile range over the median. *vs compile*: step "
    "time over default torch.compile's (mean of compile and its repeat). *compile s*: first step minus a timed "
    "step. *partition s*: time in the partitioner (ckpt's or torch's min cut). *budget MiB*, *predicted MiB*: "
    "ckpt's cap and its plan's bytes, summed over graphs. *peak MiB*: the highest memory allocated during one "
    "step, above what was allocated before it, gradients set to None first (`ckpt.measure.peak_memory`: the "
    "profiler's allocation events on the CPU, the allocator's statistics on a GPU). *predicted peak MiB*: "
    "ckpt's prediction of it (`ckpt.partitioner.peak`), summed over graphs."
)


def _fmt(value: float | None, pattern: str = "{:.2f}", missing: str = "-") -> str:
    return missing if value is None else pattern.format(value)


def _mib(value: int | None) -> str:
    return _fmt(None if value is None else value / MIB)


def _setting_row(result: SettingResult, compile_s: float | None) -> str:
    columns = len(_COLUMNS)
    if result.error is not None:
        error = " ".join(result.error.split())[:160].replace("|", "/")
        cells = [result.setting.label, "failed: " + error] + [""] * (columns - 2)
        return "| " + " | ".join(cells) + " |"
    step = result.step_s
    ratio = None if step is None or compile_s is None else step / compile_s
    caps = [g.get("budget_bytes") for g in result.graphs]
    budget = sum(caps) if caps and None not in caps else None  # type: ignore[arg-type]
    predicted = sum(g.get("predicted_bytes", 0) for g in result.graphs) if result.graphs else None
    solve = sum(g["solve_s"] for g in result.graphs) if result.graphs else None
    cells = [
        result.setting.label,
        _mib(result.activation_bytes),
        _fmt(None if step is None else step * 1e3, "{:.1f}") + _fmt(result.spread, " ±{:.0%}", ""),
        _fmt(ratio, "{:.3f}"),
        _fmt(result.compile_s, "{:.1f}"),
        _fmt(result.partition_s, "{:.3f}"),
        _fmt(solve, "{:.3f}"),
        _mib(budget),
        _mib(predicted),
        _mib(result.measured_peak),
        _mib(result.predicted_peak),
    ]
    return "| " + " | ".join(cells) + " |"


def _ckpt_lines(verdict: ModelVerdict) -> list[str]:
    parts = [
        f"{e['setting']} **{e['ratio']:.3f}** (vs {e['reference']})"
        if e["ratio"] is not None
        else f"{e['setting']} - (no alternative this lean)"
        for e in verdict.matched
    ]
    dominated = [
        f"{d['setting']} by {d['by']} (x{d['time_ratio']:.3f}{', beyond noise' if d['beyond_noise'] else ''})"
        for d in verdict.dominated
    ]
    return [
        "Time at matched memory: " + "; ".join(parts) + ".",
        "Dominated ckpt points: " + ("; ".join(dominated) if dominated else "none") + ".",
    ]


def _model_section(model: ModelResult, verdict: ModelVerdict) -> list[str]:
    config = ", ".join(f"{k}={v}" for k, v in model.config.items())
    columns = _COLUMNS
    lines = [
        f"## {model.title} (`{model.name}`)",
        "",
        f"Size `{model.size}`: {config}; {model.params / 1e6:.2f}M parameters.",
        "",
    ]
    lines += ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    ordered = sorted(model.settings, key=lambda r: display_order(r.setting))
    lines += [_setting_row(r, verdict.compile_s) for r in ordered]
    noise = (
        "not measured (needs compile and compile-repeat, or two ckpt settings with the same plan)"
        if verdict.noise is None
        else f"{verdict.noise:.1%}"
    )
    pairs = [f"{a} against {b}" for a, b in verdict.same_plans]
    copies = f" and the ckpt settings that made the same plan ({', '.join(pairs)})" if pairs else ""
    lines += [
        "",
        f"Noise (compile against compile (repeat){copies}, at least twice the standard error of their ratio): {noise}.",
    ]
    faults = _page_faults(ordered)
    if faults:
        lines.append(f"Page faults per timed step (median), where any: {faults}.")
    if verdict.matched:
        lines += _ckpt_lines(verdict)
    if model.skipped:
        lines.append(f"Skipped for the time limit: {', '.join(model.skipped)}.")
    return lines + [""]


def _page_faults(results: list[SettingResult]) -> str:
    """The settings whose timed steps took page faults, with the median per step; empty if none did."""
    counts = [(r.setting.label, statistics.median(r.page_faults)) for r in results if r.page_faults]
    return ", ".join(f"{label} {count:,.0f}" for label, count in counts if count > 0)


def _targets_section(targets: list[Target], analysis: str | None) -> list[str]:
    lines = ["## Targets", "", "| target | goal | measured | met |", "|---|---|---|---|"]
    for t in targets:
        met = "n/a" if t.met is None else ("yes" if t.met else "**no**")
        lines.append(f"| {t.name} | {t.goal} | {t.value} | {met} |")
    lines.append("")
    for t in targets:
        if t.misses:
            lines += [f'Points that miss "{t.name}":', ""] + [f"- {miss}" for miss in t.misses] + [""]
    if analysis:
        lines += [analysis.strip(), ""]
    elif any(t.met is False for t in targets):
        lines += ["Analysis of the misses: _to be written in `<stem>-analysis.md` beside this file (the graph "
                  "nodes or cost-model terms responsible, and the fix)._", ""]  # fmt: skip
    return lines


def _summary(models: list[ModelResult], verdicts: list[ModelVerdict]) -> list[str]:
    lines = [
        "| model | noise | time at matched memory (median) | ckpt 0.5 vs compile "
        "| ckpt points dominated beyond noise |",
        "|---|---:|---:|---:|---:|",
    ]
    for model, v in zip(models, verdicts):
        ratios = [e["ratio"] for e in v.matched if e["ratio"] is not None]
        median = statistics.median(ratios) if ratios else None
        half = next((r.step_s for r in model.settings if r.setting.key == "ckpt-0.5" and r.step_s), None)
        vs_compile = None if half is None or v.compile_s is None else half / v.compile_s
        beyond = sum(d["beyond_noise"] for d in v.dominated)
        cells = [model.title, _fmt(v.noise, "{:.1%}"), _fmt(median, "{:.3f}"), _fmt(vs_compile, "{:.3f}"), str(beyond)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _markdown(
    meta: dict[str, Any],
    models: list[ModelResult],
    verdicts: list[ModelVerdict],
    targets: list[Target],
    analysis: str | None = None,
) -> str:
    gpu = meta["device"] == "cuda"
    lines = [
        f"# ckpt benchmarks: {meta['device_name']}",
        "",
        f"Generated by `{meta['command']}` on {meta['date']}.",
        f"torch {meta['torch']}, {meta['dtype']}, model size `{meta['size']}`, median of {meta['rounds']} "
        f"round-robin steps per setting{', CUDA-event timings' if gpu else ''}.",
    ]
    if meta.get("malloc"):
        lines.append(f"Memory allocator: {meta['malloc']}.")
    lines += [
        "",
        _LEGEND,
        "",
        "## Summary",
        "",
    ]
    lines += _summary(models, verdicts) + _targets_section(targets, analysis)
    for model, verdict in zip(models, verdicts):
        lines += _model_section(model, verdict)
    if meta.get("interrupted"):
        lines += ["**The run was interrupted: the last model may lack settings or timings.**", ""]
    if meta.get("skipped_models"):
        lines += [f"Models skipped for the time limit: {', '.join(meta['skipped_models'])}.", ""]
    definitions = (_definitions or "").split("Definitions, which every results file repeats:", 1)[-1]
    lines += ["## Definitions", "", definitions.strip(), ""]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _model_json(model: ModelResult, verdict: ModelVerdict) -> dict[str, Any]:
    data = _jsonable(model)
    for result, entry in zip(model.settings, data["settings"]):
        entry.update(step_s=result.step_s, spread=result.spread, compile_s=result.compile_s)
    data["verdict"] = _jsonable(verdict)
    return data


def write_results(out_dir: Path, stem: str, meta: dict[str, Any], models: list[ModelResult]) -> list[Path]:
    """Write ``<stem>.md`` and ``<stem>.json`` under ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    verdicts = [analyze_model(m) for m in models]
    targets = evaluate_targets(models, verdicts)
    md_path, json_path = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    # A hand-written analysis of the missed targets, kept beside the results, is merged in.
    analysis_path = out_dir / f"{stem}-analysis.md"
    analysis = analysis_path.read_text(encoding="utf-8") if analysis_path.exists() else None
    md_path.write_text(_markdown(meta, models, verdicts, targets, analysis), encoding="utf-8")
    payload = {
        "meta": meta,
        "models": [_model_json(m, v) for m, v in zip(models, verdicts)],
        "targets": _jsonable(targets),
    }
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return [md_path, json_path]


def load_results(path: Path) -> tuple[dict[str, Any], list[ModelResult]]:
    """Read back a results JSON file written by :func:`write_results`."""
    data = json.loads(path.read_text(encoding="utf-8"))
    models = []
    for m in data["models"]:
        settings = []
        for s in m["settings"]:
            fields = {f.name for f in dataclasses.fields(SettingResult)} - {"setting"}
            settings.append(SettingResult(SETTINGS[s["setting"]["key"]], **{k: s[k] for k in fields if k in s}))
        names = ("name", "title", "transformer", "size", "params", "config", "skipped")
        models.append(ModelResult(settings=settings, **{k: m[k] for k in names}))
    return data["meta"], models


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.report RESULTS.json``: write the Markdown (and plot) again from the JSON."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    parser.add_argument("json", type=Path, help="a results file written by python -m benchmarks.run")
    parser.add_argument("--plot", choices=("yes", "no"), default="yes", help="draw the PNG again too")
    args = parser.parse_args(argv)
    meta, models = load_results(args.json)
    written = write_results(args.json.parent, args.json.stem, meta, models)
    if args.plot == "yes":
        from benchmarks.plot import plot_results

        title = f"step time against activation memory: {meta['device_name']}"
        written.append(plot_results(models, args.json.with_suffix(".png"), title))
        title = f"step time against measured step peak: {meta['device_name']}"
        peak_path = args.json.with_name(args.json.stem + "-peak.png")
        written.append(plot_results(models, peak_path, title, memory="peak"))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
