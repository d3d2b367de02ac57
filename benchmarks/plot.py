"""The Pareto pictures: step time against activation MiB, or against the measured step peak, one panel per model.

Each family of settings has its own marker and, where it has several budgets,
a line through them in budget order; ckpt under a peak cap is its own family.  matplotlib is an optional dependency
(``pip install 'torch-ckpt[plot]'``).
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.harness import ModelResult, SettingResult
from benchmarks.settings import CKPT, COMPILE, EAGER, EAGER_CHECKPOINT, TORCH_BUDGET, Setting

__all__ = ["PlotUnavailable", "matplotlib_available", "plot_results"]

MIB = 2**20
PEAK_CAPPED = "ckpt peak cap"

# family -> (marker, colour, line style or None for unconnected points)
_STYLES = {
    EAGER: ("o", "#7f7f7f", None),
    EAGER_CHECKPOINT: ("s", "#8c564b", None),
    COMPILE: ("D", "#000000", None),
    TORCH_BUDGET: ("^", "#1f77b4", "--"),
    CKPT: ("o", "#d62728", "-"),
    PEAK_CAPPED: ("*", "#ff7f0e", None),
}
_AXIS = {"activation": "activation MiB", "peak": "step peak MiB (measured)"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailable(
            "plotting needs matplotlib, which is the optional extra 'plot': pip install 'torch-ckpt[plot]' "
            "(or run with --plot no)"
        ) from error
    return plt


def _budget_order(budget: float | None) -> float:
    return math.inf if budget is None else budget


def _family(setting: Setting) -> str:
    return PEAK_CAPPED if setting.peak is not None else setting.family


def _memory(result: SettingResult, memory: str) -> int | None:
    return result.activation_bytes if memory == "activation" else result.measured_peak


def _panel(axes, model: ModelResult, memory: str) -> None:
    for family, (marker, colour, line) in _STYLES.items():
        points = [
            r for r in model.settings if _family(r.setting) == family and r.step_s and _memory(r, memory) is not None
        ]
        if not points:
            continue
        points.sort(key=lambda r: -_budget_order(r.setting.budget))
        xs = [_memory(r, memory) / MIB for r in points]  # type: ignore[operator]
        ys = [r.step_s * 1e3 for r in points]  # type: ignore[operator]
        axes.plot(xs, ys, marker=marker, color=colour, linestyle=line or "none", label=family, markersize=6)
        if family in (TORCH_BUDGET, CKPT, PEAK_CAPPED):
            for r, x, y in zip(points, xs, ys):
                text = "none" if r.setting.budget is None else f"{r.setting.budget:g}"
                if r.setting.peak is not None:
                    text = f"peak {r.setting.peak:g}"
                axes.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
    axes.set_title(f"{model.title} ({model.size})")
    axes.set_xlabel(_AXIS[memory])
    axes.set_ylabel("step ms")
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)


def plot_results(models: list[ModelResult], path: Path, title: str, memory: str = "activation") -> Path:
    """Draw one panel per model into ``path`` (PNG); ``memory`` is the x axis: "activation" or "peak"."""
    if memory not in _AXIS:
        raise ValueError(f"memory={memory!r} is not a plot axis; accepted are {', '.join(_AXIS)}")
    plt = _pyplot()
    shown = [m for m in models if any(r.step_s for r in m.settings)]
    if not shown:
        raise ValueError(f"nothing to plot into {path}: no model has a timed setting")
    columns = min(3, len(shown))
    rows = math.ceil(len(shown) / columns)
    figure, grid = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.2 * rows), squeeze=False)
    for index, model in enumerate(shown):
        _panel(grid[index // columns][index % columns], model, memory)
    for index in range(len(shown), rows * columns):
        grid[index // columns][index % columns].set_visible(False)
    legend: dict[str, object] = {}
    for axes in grid.flat:
        for handle, label in zip(*axes.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    per_row = len(legend) if columns > 1 else 3
    legend_rows = math.ceil(len(legend) / per_row)
    figure.legend(list(legend.values()), list(legend), loc="lower center", ncol=per_row, frameon=False, fontsize=9)
    figure.suptitle(title, fontsize=11)
    bottom = 0.35 * legend_rows / figure.get_figheight()
    figure.tight_layout(rect=(0, bottom, 1, 0.97))
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
