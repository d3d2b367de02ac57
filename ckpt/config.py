"""Configuration: environment variables and ``torch.compile`` options, parsed once.

Everything the partitioner decides on is read here into a frozen
:class:`CkptConfig`, which is passed down explicitly.  Algorithms never read
the environment themselves.

Precedence: an ``options`` key given to ``torch.compile(..., options=...)``
overrides the matching ``CKPT_*`` environment variable, which overrides the
default.  A variable that is set but empty counts as unset, and an unknown
``CKPT_*`` variable (a typo) is warned about once, with the closest known name.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KNOWN_VARIABLES",
    "Budget",
    "CkptConfig",
    "ConfigWarning",
    "ENV_VARS",
    "OPTION_KEYS",
    "PeakCap",
    "auto_peak_bytes",
    "cache_dir",
    "format_bytes",
    "parse_budget",
    "parse_bool",
    "parse_peak",
    "parse_budgets",
    "validate_module_pattern",
]

# option key -> environment variable
ENV_VARS: dict[str, str] = {
    "memory_budget": "CKPT_MEMORY_BUDGET",
    "device": "CKPT_DEVICE",
    "strict": "CKPT_STRICT",
    "explain": "CKPT_EXPLAIN",
    "solver_effort": "CKPT_SOLVER_EFFORT",
    "peak_memory": "CKPT_PEAK_MEMORY",
    "measure_ops": "CKPT_MEASURE_OPS",
}
OPTION_KEYS: tuple[str, ...] = tuple(ENV_VARS)
# Every CKPT_* variable anything in the project reads: the options', the cache
# directory, and the test suite's own sizes (slow runs).
KNOWN_VARIABLES: frozenset[str] = frozenset(
    {*ENV_VARS.values(), "CKPT_CACHE_DIR", "CKPT_PROPERTY_EXAMPLES", "CKPT_RANDOM_PROGRAMS"}
)


class ConfigWarning(UserWarning):
    """A ``CKPT_*`` environment variable that ckpt does not know (probably a typo)."""


_warned_variables: set[str] = set()
_warned_lock = threading.Lock()


def _env_value(environ: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None if it is unset or empty (as most tools treat an empty variable)."""
    value = environ.get(name)
    return value if value is not None and value.strip() else None


def warn_unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Warn once per process about each ``CKPT_*`` variable in ``environ`` that ckpt does not read.

    Returns the names warned about by this call.
    """
    unknown = sorted(name for name in environ if name.startswith("CKPT_") and name not in KNOWN_VARIABLES)
    with _warned_lock:
        fresh = [name for name in unknown if name not in _warned_variables]
        _warned_variables.update(fresh)
    for name in fresh:
        close = difflib.get_close_matches(name, sorted(KNOWN_VARIABLES), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f"; known variables: {', '.join(sorted(KNOWN_VARIABLES))}"
        message = f"ckpt: environment variable {name} is not a ckpt setting and is ignored{hint}"
        warnings.warn(message, ConfigWarning, stacklevel=3)
    return fresh


_BUDGET_FORMS = (
    "'none' (no cap), a fraction in [0, 1] such as 0.3, "
    "or a size with a unit (B, KB, MB, GB, KiB, MiB, GiB) such as 1.5GiB or 800MB"
)

_PEAK_FORMS = (
    "'none' (no cap), a fraction in [0, 1] of the peak of the plan saving what autograd saves, such as 0.5, "
    "a size with a unit (B, KB, MB, GB, KiB, MiB, GiB) such as 6GiB, "
    "or 'auto' (on CUDA: the free memory at compile time less a margin)"
)

# `auto` leaves this much of the device free: allocator fragmentation, the CUDA context,
# workspaces of library calls, and what the step allocates outside the compiled graph.
AUTO_MARGIN_FRACTION = 0.10
AUTO_MARGIN_MIN_BYTES = 1024**3

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*$")
_NUMBER_RE = re.compile(r"^\s*[+-]?([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*$")


def format_bytes(nbytes: float, *, exact: bool = True) -> str:
    """``nbytes`` in the largest binary unit it reaches, as in ``20.28 MiB``.

    With ``exact`` (for messages) the byte count follows, ``20.28 MiB (21264784 bytes)``;
    without it (for tables) below a KiB reads ``512 B``.
    """
    unit, scale = next(
        ((unit, scale) for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)) if abs(nbytes) >= scale),
        ("", 1),
    )
    if not unit:
        return f"{nbytes:.0f} bytes" if exact else f"{nbytes:.0f} B"
    text = f"{nbytes / scale:.2f} {unit}"
    return f"{text} ({nbytes:.0f} bytes)" if exact else text


@dataclass(frozen=True)
class Budget:
    """A cap on saved activation bytes for one compiled graph.

    Exactly one of ``fraction`` and ``max_bytes`` is set, or neither (no cap).
    ``fraction`` is relative to what eager autograd saves for each graph when
    nothing is recomputed (``JointAnalysis.reference_bytes``).
    """

    fraction: float | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.fraction is not None and self.max_bytes is not None:
            raise ValueError("Budget takes a fraction or max_bytes, not both")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"Budget.fraction must be in [0, 1], got {self.fraction!r}")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"Budget.max_bytes must be >= 0, got {self.max_bytes!r}")

    @property
    def unlimited(self) -> bool:
        return self.fraction is None and self.max_bytes is None

    def resolve(self, reference_bytes: int) -> int | None:
        """The byte cap for a graph for which autograd saves ``reference_bytes``."""
        if self.fraction is not None:
            return math.floor(self.fraction * reference_bytes)
        return self.max_bytes

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.fraction:g}"
        if self.max_bytes is not None:
            return f"{self.max_bytes}B"
        return "none"


def parse_budget(value: Any, source: str = "CKPT_MEMORY_BUDGET") -> Budget:
    """Parse a memory budget given as text or a number.

    ``source`` names where the value came from, for the error message.
    """
    if value is None or isinstance(value, Budget):
        return value if isinstance(value, Budget) else Budget()
    if isinstance(value, bool):
        raise ValueError(_budget_error(source, value))
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number) and 0.0 <= number <= 1.0:
            return Budget(fraction=number)
        raise ValueError(_budget_error(source, value))
    if not isinstance(value, str):
        raise ValueError(_budget_error(source, value))
    text = value.strip()
    if text.lower() == "none":
        return Budget()
    if _NUMBER_RE.match(text):
        number = float(text)
        if math.isfinite(number) and 0.0 <= number <= 1.0:
            return Budget(fraction=number)
        raise ValueError(_budget_error(source, value))
    match = _SIZE_RE.match(text)
    if match and match.group(2).lower() in _UNITS:
        size = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if math.isfinite(size):
            return Budget(max_bytes=int(size))
    raise ValueError(_budget_error(source, value))


_PATTERN_RE = re.compile(r"^(?:[A-Za-z0-9_]+|\*)(?:\.(?:[A-Za-z0-9_]+|\*))*$")


def validate_module_pattern(pattern: Any, source: str) -> str:
    """A module path pattern: dotted names (``layers.0.mlp``), ``*`` for one component, or ``""`` (the root)."""
    if not isinstance(pattern, str) or (pattern and not _PATTERN_RE.match(pattern)):
        raise ValueError(
            f"{source}: {pattern!r} is not a module path; give dotted attribute names as in "
            "model.named_modules(), with * for one component (for example 'layers.*.mlp'), or '' for the root"
        )
    return pattern


def parse_budgets(value: Any, source: str = "CKPT_MEMORY_BUDGET") -> tuple[Budget, tuple[tuple[str, Budget], ...]]:
    """A default budget and per-module budgets by path.

    Accepts one budget (see :func:`parse_budget`), a mapping ``{path: budget}``
    in which ``""`` is the default, or text such as ``"0.5,layers.*.mlp=0.1"``:
    comma-separated items, an item without ``=`` being the default.
    """
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, str) and ("=" in value or "," in value):
        items = []
        for item in value.split(","):
            path, sep, budget = item.partition("=")
            if not item.strip():
                raise ValueError(f"{source}={value!r} has an empty item; separate items with single commas")
            items.append((path.strip(), budget.strip()) if sep else ("", item.strip()))
    else:
        return parse_budget(value, source), ()
    default = Budget()
    per_module: dict[str, Budget] = {}
    seen: set[str] = set()
    for path, budget in items:
        validate_module_pattern(path, source)
        if path in seen:
            raise ValueError(f"{source}={value!r} gives path {path!r} more than once")
        seen.add(path)
        parsed = parse_budget(budget, f"{source}[{path!r}]")
        if path == "":
            default = parsed
        else:
            per_module[path] = parsed
    return default, tuple(sorted(per_module.items()))


def _budget_error(source: str, value: Any) -> str:
    return f"{source}={value!r} is not a valid memory budget; accepted forms are {_BUDGET_FORMS}"


@dataclass(frozen=True)
class PeakCap:
    """A cap on the step's peak bytes for one compiled graph (``CKPT_PEAK_MEMORY``).

    The peak counts what the graph's forward and backward allocate above what
    is resident when its forward starts: activations, recompute working sets,
    tangents and the gradients it produces; not parameters, inputs or optimizer
    state.  At most one of ``fraction`` (of the predicted peak of the plan that
    saves what autograd saves), ``max_bytes`` and ``auto`` is set; none means no cap.  ``auto`` is
    resolved to bytes when compiling for a CUDA device (:func:`auto_peak_bytes`).
    """

    fraction: float | None = None
    max_bytes: int | None = None
    auto: bool = False

    def __post_init__(self) -> None:
        if sum((self.fraction is not None, self.max_bytes is not None, self.auto)) > 1:
            raise ValueError("PeakCap takes one of fraction, max_bytes and auto")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"PeakCap.fraction must be in [0, 1], got {self.fraction!r}")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"PeakCap.max_bytes must be >= 0, got {self.max_bytes!r}")

    @property
    def unlimited(self) -> bool:
        return self.fraction is None and self.max_bytes is None and not self.auto

    def resolve(self, reference_peak: int) -> int | None:
        """The byte cap for a graph whose plan saving what autograd saves peaks at ``reference_peak``."""
        if self.auto:
            raise ValueError("CKPT_PEAK_MEMORY=auto must be resolved to bytes for the device before planning")
        if self.fraction is not None:
            return math.floor(self.fraction * reference_peak)
        return self.max_bytes

    def __str__(self) -> str:
        if self.auto:
            return "auto"
        if self.fraction is not None:
            return f"{self.fraction:g}"
        if self.max_bytes is not None:
            return f"{self.max_bytes}B"
        return "none"


def parse_peak(value: Any, source: str = "CKPT_PEAK_MEMORY") -> PeakCap:
    """Parse a peak cap: ``none``, a fraction, a size with a unit, or ``auto``."""
    if value is None or isinstance(value, PeakCap):
        return value if isinstance(value, PeakCap) else PeakCap()
    if isinstance(value, str) and value.strip().lower() == "auto":
        return PeakCap(auto=True)
    try:
        budget = parse_budget(value, source)
    except ValueError:
        raise ValueError(
            f"{source}={value!r} is not a valid peak memory cap; accepted forms are {_PEAK_FORMS}"
        ) from None
    return PeakCap(fraction=budget.fraction, max_bytes=budget.max_bytes)


def auto_peak_bytes(free_bytes: int, total_bytes: int) -> int:
    """The ``auto`` peak cap: free device memory less ``max(10% of total, 1 GiB)``, at least 0."""
    if free_bytes < 0 or total_bytes <= 0 or free_bytes > total_bytes:
        raise ValueError(f"auto_peak_bytes: free_bytes={free_bytes!r} must be in [0, total_bytes={total_bytes!r}]")
    margin = max(math.ceil(AUTO_MARGIN_FRACTION * total_bytes), AUTO_MARGIN_MIN_BYTES)
    return max(0, free_bytes - margin)


def parse_bool(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{source}={value!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def _parse_device(value: Any, source: str) -> str | None:
    if value is None:
        return None
    from ckpt.cost_model.profiles import PROFILE_NAMES

    text = str(value).strip().lower()
    if text in ("", "auto"):
        return None
    if text not in PROFILE_NAMES:
        raise ValueError(
            f"{source}={value!r} is not a known device profile; accepted values are "
            f"'auto' or one of {', '.join(PROFILE_NAMES)}"
        )
    return text


def _parse_explain(value: Any, source: str) -> str | None:
    """``None`` (off), ``"log"`` (summary at INFO) or a directory path for full reports."""
    if value is None or value is False:
        return None
    if value is True:
        return "log"
    text = str(value).strip()
    if text.lower() in ("", "0", "false", "no", "off"):
        return None
    if text.lower() in ("1", "true", "yes", "on", "log"):
        return "log"
    return text


def _parse_effort(value: Any, source: str) -> float:
    try:
        effort = float(value)
    except (TypeError, ValueError):
        effort = float("nan")
    if not (math.isfinite(effort) and effort >= 0):
        raise ValueError(
            f"{source}={value!r} is not a valid solver effort; give a number >= 0 "
            "(1 is the default, 0 skips the repair search)"
        )
    return effort


@dataclass(frozen=True)
class CkptConfig:
    """Everything the ckpt backend and partitioner decide on, parsed once."""

    budget: Budget = field(default_factory=Budget)
    device: str | None = None  # device profile name; None picks it from the graph
    strict: bool = False
    explain: str | None = None  # None, "log", or a directory for reports
    solver_effort: float = 1.0  # work for the repair search per graph (deterministic, not seconds)
    peak: PeakCap = field(default_factory=PeakCap)
    module_budgets: tuple[tuple[str, Budget], ...] = ()  # (module path pattern, budget), sorted by path
    measure_ops: bool = True  # time the graph's library calls on its device (ckpt.cost_model.measured)

    @classmethod
    def from_sources(
        cls, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> CkptConfig:
        """Read ``CKPT_*`` variables from ``environ`` and override them with ``options``."""
        environ = os.environ if environ is None else environ
        warn_unknown_variables(environ)
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise ValueError(
                f"unknown ckpt option(s) {', '.join(map(repr, unknown))}; accepted keys are {', '.join(OPTION_KEYS)}"
            )

        def pick(key: str) -> tuple[Any, str]:
            if key in options:
                return options[key], f"options[{key!r}]"
            env = ENV_VARS[key]
            return _env_value(environ, env), env

        value, source = pick("memory_budget")
        budget, module_budgets = parse_budgets(value, source)
        value, source = pick("device")
        device = _parse_device(value, source)
        value, source = pick("strict")
        strict = parse_bool(value, source) if value is not None else False
        value, source = pick("explain")
        explain = _parse_explain(value, source)
        value, source = pick("solver_effort")
        effort = _parse_effort(value, source) if value is not None else cls.solver_effort
        value, source = pick("peak_memory")
        peak = parse_peak(value, source)
        value, source = pick("measure_ops")
        measure_ops = parse_bool(value, source) if value is not None else True
        return cls(
            budget=budget,
            device=device,
            strict=strict,
            explain=explain,
            solver_effort=effort,
            peak=peak,
            module_budgets=module_budgets,
            measure_ops=measure_ops,
        )


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ckpt caches its measurements: ``CKPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ckpt`` or ``~/.cache/ckpt``."""
    environ = os.environ if environ is None else environ
    configured = _env_value(environ, "CKPT_CACHE_DIR")
    if configured is not None:
        return Path(configured)
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ckpt"
