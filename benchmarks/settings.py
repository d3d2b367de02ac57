"""The settings every model is measured under, and how each one runs a step.

A setting is eager, eager with ``torch.utils.checkpoint`` around every block,
default ``torch.compile``, ``torch.compile`` with torch's own
``activation_memory_budget``, or ``backend="ckpt"`` at a budget or under a
peak cap (``ckpt-peak-<fraction>``: ``CKPT_PEAK_MEMORY``, no budget).
``ckpt-roofline-<budget>`` is ckpt with ``CKPT_MEASURE_OPS=0``: library
calls priced by the roofline instead of timed on the device, to measure what
the timings change side by side (the ``roofline`` group; not in ``all``).

**One code object per setting.**  Dynamo caches compiled code on the code
object it compiled.  Parameters are graph inputs, so a second setting that
called the same function would pass the first one's guards and silently run
the first one's graph.  :func:`make_step` therefore gives every setting a
function with its own code object (named after the setting), compiled with
``fullgraph=True`` so that no inner frame gets a cache entry of its own.  All
settings share one model instance, so parameters exist once (this matters for
GPU peak memory).

**torch's knob** is read when the graph is partitioned, which happens at the
first call.  Each call of a torch-budget setting runs inside
``torch._functorch.config.patch(activation_memory_budget=...)``, so a
recompile, should one happen, sees the right value too.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from benchmarks.model_base import BlockModel
from ckpt.tools.common import fresh_function

__all__ = [
    "FAMILIES",
    "SETTINGS",
    "SETTING_GROUPS",
    "Setting",
    "Step",
    "display_order",
    "make_step",
    "select_settings",
    "torch_budget",
]

EAGER, EAGER_CHECKPOINT, COMPILE, TORCH_BUDGET, CKPT, CKPT_ROOFLINE = (
    "eager",
    "eager checkpoint",
    "torch.compile",
    "torch budget",
    "ckpt",
    "ckpt roofline",
)
FAMILIES = (EAGER, EAGER_CHECKPOINT, COMPILE, TORCH_BUDGET, CKPT, CKPT_ROOFLINE)
BUDGETS = (0.75, 0.5, 0.25, 0.1, 0.0)
PEAK_CAPS = (0.5,)


@dataclass(frozen=True)
class Setting:
    key: str  # command-line name, e.g. "ckpt-0.5"
    label: str  # table name, e.g. "ckpt 0.5"
    family: str
    budget: float | None = None  # fraction for torch budget and ckpt; None: no cap
    peak: float | None = None  # ckpt only: CKPT_PEAK_MEMORY as a fraction; None: no peak cap
    budget_text: str | None = None  # ckpt only: CKPT_MEMORY_BUDGET as text (a size, or per-module budgets)

    @property
    def compiled(self) -> bool:
        return self.family in (COMPILE, TORCH_BUDGET, CKPT, CKPT_ROOFLINE)


def _all_settings() -> tuple[Setting, ...]:
    settings = [
        Setting("eager", "eager", EAGER),
        Setting("eager-checkpoint", "eager + checkpoint", EAGER_CHECKPOINT),
        Setting("compile", "compile", COMPILE),
        Setting("compile-repeat", "compile (repeat)", COMPILE),
    ]
    settings += [Setting(f"torch-{b}", f"torch {b}", TORCH_BUDGET, b) for b in BUDGETS]
    settings.append(Setting("ckpt-none", "ckpt none", CKPT))
    settings += [Setting(f"ckpt-{b}", f"ckpt {b}", CKPT, b) for b in BUDGETS]
    settings += [Setting(f"ckpt-peak-{p}", f"ckpt peak {p}", CKPT, peak=p) for p in PEAK_CAPS]
    settings.append(Setting("ckpt-roofline-none", "ckpt roofline none", CKPT_ROOFLINE))
    settings += [Setting(f"ckpt-roofline-{b}", f"ckpt roofline {b}", CKPT_ROOFLINE, b) for b in BUDGETS]
    return tuple(settings)


SETTINGS: dict[str, Setting] = {s.key: s for s in _all_settings()}

SETTING_GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(k for k, s in SETTINGS.items() if s.family != CKPT_ROOFLINE),
    # measured op costs against the roofline, side by side
    "roofline": (
        "compile", "compile-repeat", "torch-0.5", "torch-0.25", "ckpt-none", "ckpt-roofline-none",
        "ckpt-0.5", "ckpt-roofline-0.5", "ckpt-0.25", "ckpt-roofline-0.25",
    ),
    # --quick: every family, one budget each.
    "quick": ("eager", "eager-checkpoint", "compile", "compile-repeat", "torch-0.5", "ckpt-none", "ckpt-0.5"),
    # gpu.sh, in priority order: under a time limit the last ones are skipped first.
    "gpu": (
        "eager", "eager-checkpoint", "compile", "ckpt-0.5", "torch-0.5", "compile-repeat",
        "ckpt-none", "ckpt-0.1", "torch-0.1", "ckpt-peak-0.5", "ckpt-0.25", "torch-0.25",
    ),
}  # fmt: skip


def select_settings(text: str) -> list[Setting]:
    """Settings from a comma-separated list of keys and group names (``all``, ``quick``, ``gpu``)."""
    chosen: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        keys = SETTING_GROUPS.get(item, (item,))
        for key in keys:
            if key not in SETTINGS:
                raise ValueError(
                    f"--settings: {key!r} is not a setting; accepted are the groups {', '.join(SETTING_GROUPS)} "
                    f"or the settings {', '.join(SETTINGS)}"
                )
            if key not in chosen:
                chosen.append(key)
    if not chosen:
        raise ValueError(
            f"--settings={text!r} names no setting; accepted are {', '.join(SETTING_GROUPS)} or setting keys"
        )
    return [SETTINGS[key] for key in chosen]


@dataclass
class Step:
    """A setting, ready to run: ``run(*inputs)`` returns the loss; call it inside ``context()``."""

    setting: Setting
    run: Callable[..., torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager[None]]


def _fresh_function(tag: str, model: BlockModel, checkpoint_blocks: bool) -> Callable[..., torch.Tensor]:
    """``model(*inputs)`` wrapped in a function whose code object no other setting shares."""

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        return model(*inputs, checkpoint_blocks=checkpoint_blocks)

    return fresh_function(step, "step_" + re.sub(r"\W", "_", tag))


@contextlib.contextmanager
def torch_budget(fraction: float) -> Iterator[None]:
    import torch._functorch.config as functorch_config

    with functorch_config.patch(activation_memory_budget=fraction):
        yield


def make_step(setting: Setting, model: BlockModel) -> Step:
    """A step function for ``setting`` on ``model``; compiled settings compile at their first call."""
    fn = _fresh_function(setting.key, model, checkpoint_blocks=setting.family == EAGER_CHECKPOINT)
    context: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    if setting.family in (EAGER, EAGER_CHECKPOINT):
        return Step(setting, fn, context)
    if setting.family == COMPILE:
        return Step(setting, torch.compile(fn, fullgraph=True), context)
    if setting.family == TORCH_BUDGET:
        assert setting.budget is not None
        fraction = setting.budget
        return Step(setting, torch.compile(fn, fullgraph=True), lambda: torch_budget(fraction))
    from ckpt.backend import ckpt_backend  # the callable, so an uninstalled checkout (PYTHONPATH=.) works too

    options = {
        "memory_budget": setting.budget_text or ("none" if setting.budget is None else str(setting.budget)),
        "peak_memory": "none" if setting.peak is None else str(setting.peak),
        "measure_ops": setting.family == CKPT,
    }
    compiled = torch.compile(fn, backend=ckpt_backend, fullgraph=True, options=options)
    return Step(setting, compiled, context)


def display_order(setting: Setting) -> int:
    """Position in the canonical table order (settings may be measured in another order)."""
    return list(SETTINGS).index(setting.key)
