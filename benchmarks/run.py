"""``python -m benchmarks.run``: every model under every setting, with table, JSON and plot.

Examples::

    python -m benchmarks.run                         # full CPU run: results/cpu.{md,json,png}
    python -m benchmarks.run --quick                 # tiny models, a few settings: results/cpu-quick.*
    python -m benchmarks.run --models gpt2 --settings compile,ckpt-0.5 --out /tmp/bench
    python -m benchmarks.run --settings gpu --time-limit 420 --out "$OUT"   # what benchmarks/gpu.sh runs

On the CPU, glibc's malloc is told to keep freed memory (``--malloc keep``,
:func:`ckpt.measure.keep_freed_memory`), so that no setting's steps pay page
faults for memory given back between steps, and the memory is given back
between models, so each starts from a compact heap; ``--malloc default``
keeps glibc's own thresholds.  Each timed step's page faults are recorded
either way.

``--quick`` uses the tiny model sizes, the ``quick`` group of settings and
three timed rounds, and names its files ``<device>-quick.*`` so it never
overwrites the committed full results (``results/.gitignore`` ignores them).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import STOP, Clock, ModelResult, benchmark_model, progress_units
from benchmarks.models import MODELS, SIZES, ModelSpec, model_spec
from benchmarks.plot import matplotlib_available, plot_results
from benchmarks.report import write_results
from benchmarks.settings import SETTING_GROUPS, Setting, select_settings
from ckpt.measure import MALLOC_CHOICES, set_malloc
from ckpt.tools.progress import Progress

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MIN_MODEL_S = 60.0  # do not start a model with less time than this left


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0].strip("`"))
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument(
        "--settings",
        default=None,
        help=f"comma-separated setting keys or groups ({', '.join(SETTING_GROUPS)}); default all",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, the 'quick' settings, 3 rounds, '-quick' file names"
    )
    parser.add_argument(
        "--size",
        choices=SIZES,
        default=None,
        help="model size (default: gpu on CUDA, cpu otherwise; tiny with --quick)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    parser.add_argument(
        "--dtype", choices=sorted(_DTYPES), default=None, help="default: bfloat16 on CUDA, float32 on CPU"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="timed round-robin rounds (default 30; 3 with --quick)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument(
        "--name", default=None, help="file name stem (default: the device, e.g. cpu or h200, plus -quick)"
    )
    parser.add_argument(
        "--plot", choices=("yes", "no", "auto"), default="yes", help="auto: plot only if matplotlib is installed"
    )
    parser.add_argument(
        "--time-limit", type=float, default=None, help="seconds: skip settings and models that would not fit"
    )
    parser.add_argument(
        "--malloc",
        choices=MALLOC_CHOICES,
        default="keep",
        help="CPU: keep: glibc's malloc keeps freed memory, so no step pays page faults for memory given back "
        "between steps (ckpt.measure.keep_freed_memory; default); default: glibc's own thresholds",
    )
    return parser


def _device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text not in ("cpu", "cuda"):
        raise SystemExit(f"--device={text!r} is not supported; use cpu, cuda or auto")
    if text == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device=cuda but torch sees no CUDA device; use --device cpu")
    return torch.device(text)


def _device_tag(device: torch.device) -> tuple[str, str]:
    """(file stem, readable name) of the device."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tag = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
        return tag or "cuda", name
    return "cpu", f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _meta(
    args: argparse.Namespace, device: torch.device, name: str, size: str, dtype: str, rounds: int
) -> dict[str, Any]:
    return {
        "device": device.type,
        "device_name": name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": dtype,
        "size": size,
        "rounds": rounds,
        "quick": args.quick,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m benchmarks.run " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "skipped_models": [],
    }


def _write(out: Path, stem: str, meta: dict[str, Any], results: list[ModelResult], plot: str) -> None:
    write_results(out, stem, meta, results)
    if plot == "no" or (plot == "auto" and not matplotlib_available()):
        return
    if any(r.step_s for m in results for r in m.settings):
        plot_results(results, out / f"{stem}.png", f"step time against activation memory: {meta['device_name']}")
        title = f"step time against measured step peak: {meta['device_name']}"
        plot_results(results, out / f"{stem}-peak.png", title, memory="peak")


@dataclass
class _Plan:
    """What one run measures and where it writes, parsed from the command line."""

    specs: list[ModelSpec]
    settings: list[Setting]
    device: torch.device
    size: str
    dtype: str
    rounds: int
    out: Path
    stem: str
    plot: str
    time_limit: float | None
    meta: dict[str, Any]
    malloc: str  # --malloc, which main() applies on the CPU before measuring


def _configure(args: argparse.Namespace) -> _Plan:
    if args.plot == "yes" and not matplotlib_available():
        raise SystemExit("plotting needs matplotlib, which is the optional extra 'plot': "
                         "pip install 'torch-ckpt[plot]' (or run with --plot no or --plot auto)")  # fmt: skip
    try:
        specs = [model_spec(name.strip()) for name in args.models.split(",") if name.strip()]
        settings = select_settings(args.settings or ("quick" if args.quick else "all"))
    except ValueError as error:
        raise SystemExit(str(error)) from error
    if args.rounds is not None and args.rounds < 1:
        raise SystemExit(f"--rounds={args.rounds} must be at least 1")
    device = _device(args.device)
    size = args.size or ("tiny" if args.quick else ("gpu" if device.type == "cuda" else "cpu"))
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    rounds = args.rounds or (3 if args.quick else 30)
    tag, device_name = _device_tag(device)
    stem = args.name or (tag + ("-quick" if args.quick else ""))
    meta = _meta(args, device, device_name, size, dtype, rounds)
    return _Plan(
        specs, settings, device, size, dtype, rounds, args.out, stem, args.plot, args.time_limit, meta, args.malloc
    )


def _measure(plan: _Plan, progress: Progress, results: list[ModelResult]) -> None:
    clock = Clock(plan.time_limit)
    for index, spec in enumerate(plan.specs):
        # Each model gets an equal share of the time left, so a slow compile cannot starve the rest.
        share = Clock(clock.left() / (len(plan.specs) - index)) if plan.time_limit is not None else clock
        if share.left() < _MIN_MODEL_S:
            plan.meta["skipped_models"].append(spec.name)
            progress.update(f"skip {spec.name} (time limit)", advance=len(plan.settings) + plan.rounds + 1)
            continue
        benchmark_model(spec, plan.size, plan.settings, device=plan.device, dtype=_DTYPES[plan.dtype],
                        rounds=plan.rounds, progress=progress, clock=share, sink=results)  # fmt: skip
        _write(plan.out, plan.stem, plan.meta, results, plan.plot)


def _interrupt(signum: int, frame: object) -> None:
    STOP.set()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    plan = _configure(_parser().parse_args(argv))
    if plan.device.type == "cpu":
        plan.meta["malloc"] = set_malloc(plan.malloc)
    progress = Progress(progress_units(len(plan.specs), len(plan.settings), plan.rounds))
    results: list[ModelResult] = []
    STOP.clear()
    previous = signal.signal(signal.SIGINT, _interrupt)
    try:
        _measure(plan, progress, results)
    except KeyboardInterrupt:
        progress.close()
        plan.meta["interrupted"] = True
        _write(plan.out, plan.stem, plan.meta, results, plan.plot)
        print(f"interrupted; wrote what was measured to {plan.out / plan.stem}.md", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
    progress.close()
    _write(plan.out, plan.stem, plan.meta, results, plan.plot)
    print(f"wrote {plan.out / plan.stem}.md, .json" + ("" if plan.plot == "no" else ", .png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
