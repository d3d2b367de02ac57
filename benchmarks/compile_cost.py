"""``python -m benchmarks.compile_cost``: what ckpt adds to a cold compile, side by side with Inductor.

Every measurement runs in a fresh process with its own empty Inductor cache
directory and the FX graph and AOTAutograd caches off, so nothing compiled by
an earlier measurement is reused.  A measurement builds one of the benchmark
models (``--models``: ``name`` at its ``cpu`` size, or ``name:layers`` for a
stack at another depth; default the GPT-2 style at 4 and 28 layers), runs two
training steps (forward and backward) and reports the first step minus the
second: the compile.  The settings
(``--settings``, default ``inductor,torch-0.5,ckpt-none,ckpt-0.5``: Inductor
alone, Inductor with torch's ``activation_memory_budget``, and ckpt at a
budget, calibration cached beforehand) alternate, round by round, so a slow
drift of a shared machine hits them alike; the table gives the medians and
each setting's ratio to Inductor alone.  A plan that recomputes makes the
backward's kernels bigger, so a budget costs compile time with torch's knob
too: ``torch-0.5`` against ``ckpt-0.5`` separates that from ckpt's own cost.

For ckpt, the child also reports the time inside the partitioner (torch's
compile-time metric for the partitioner call) and, for Inductor, the time in
its own min-cut partitioner; the difference between them is the part of the
overhead that planning itself accounts for (the rest is extra kernels, for
example the recompute fused into the backward).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "compile-cost.md"
_PARTITIONERS = ("CkptPartitioner", "min_cut_rematerialization_partition")


DEFAULT_MODELS = "gpt2:4,gpt2:28"


def _case(text: str) -> tuple[str, int | None]:
    """``name`` or ``name:layers``: a benchmark model at its ``cpu`` size, its depth replaced if given."""
    from benchmarks.models import model_spec

    name, _, depth = text.partition(":")
    spec = model_spec(name)  # ValueError naming the accepted models
    if not depth:
        return name, None
    if not depth.isdigit() or int(depth) < 1:
        raise ValueError(f"--models: {text!r}: the depth after ':' must be a whole number of layers, at least 1")
    if not dataclasses.is_dataclass(config := spec.sizes["cpu"]) or "layers" not in {
        field.name for field in dataclasses.fields(config)
    }:
        raise ValueError(f"--models: {text!r}: model {name!r} has no depth to set; give {name!r} alone")
    return name, int(depth)


def _build(name: str, layers: int | None) -> Any:
    from benchmarks.models import model_spec

    spec = model_spec(name)
    if layers is None:
        return spec.build("cpu")
    return spec.factory(dataclasses.replace(spec.sizes["cpu"], layers=layers))


def _label(name: str, layers: int | None) -> str:
    return name if layers is None else f"{name}:{layers}"


def _child(setting: str, name: str, layers: int | None) -> dict[str, Any]:
    import torch

    from benchmarks.settings import torch_budget
    from ckpt import _torch_compat as compat
    from ckpt.records import record_partitions

    torch.manual_seed(0)
    model = _build(name, layers)
    inputs = model.make_inputs(torch.Generator().manual_seed(1), torch.device("cpu"), torch.float32)
    family, _, value = setting.partition("-")
    if family == "ckpt":
        compiled = torch.compile(model, backend="ckpt", options={"memory_budget": value})
    else:
        compiled = torch.compile(model)
    knob = contextlib.nullcontext() if family != "torch" else torch_budget(float(value))
    times = []
    with compat.compile_caches_disabled(), knob, record_partitions() as records:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            compiled(*inputs).backward()
            times.append(time.perf_counter() - started)
    return {
        "setting": setting,
        "model": name,
        "layers": getattr(model.config, "layers", None),
        "compile_s": times[0] - times[1],
        "step_s": times[1],
        "partition_s": compat.compilation_seconds(_PARTITIONERS),
        "plan_s": sum(r.solve_seconds for r in records),
        "graphs": len(records),
    }


def _measure(setting: str, case: tuple[str, int | None], cache_root: Path) -> dict[str, Any]:
    """One measurement in a fresh process with an empty Inductor cache."""
    with tempfile.TemporaryDirectory(dir=cache_root) as inductor_cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
        command = [sys.executable, "-m", "benchmarks.compile_cost", "--child", setting, "--models", _label(*case)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        # Inductor writes one C++ source per distinct kernel it compiles (identical kernels, as in a
        # stack of layers planned alike, are compiled once).
        kernels = sum(1 for _ in Path(inductor_cache).rglob("*.cpp"))
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{setting} on {_label(*case)} failed (exit {result.returncode}):\n{tail}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]), kernels=kernels)


def _markdown(rows: dict[tuple[str, int | None], dict[str, list[dict[str, Any]]]], rounds: int) -> str:
    lines = [
        "# Cold compile: ckpt against Inductor",
        "",
        f"Generated by `python -m benchmarks.compile_cost {shlex.join(sys.argv[1:])}` on "
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}.",
        f"{platform.machine()}, {os.cpu_count()} CPUs; torch {_torch_version()}; ckpt's calibration cached; medians "
        f"of {rounds} alternating rounds, each measurement in a fresh process with an empty Inductor cache (FX "
        "graph and AOTAutograd caches off).",
        "",
        "The benchmark models at their `cpu` size (`benchmarks/models.py`; the GPT-2 style: width 256, 4 heads, "
        "sequence 128, batch 8, vocabulary 2048, dropout 0.1), a stack's depth replaced where *layers* says so. "
        "*compile s*: first training step minus the second. *partition s*: time inside the partitioner (ckpt's, "
        "or Inductor's min cut, with or without torch's `activation_memory_budget`). *plan s*: ckpt's solve and "
        "peak step, part of its partition time. *kernels*: distinct C++ kernels Inductor compiled (a kernel whose "
        "source repeats, as in layers planned alike, is compiled once).",
        "",
        "| model | layers | setting | compile s | vs inductor | partition s | plan s | kernels |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]

    def med(items: list[dict[str, Any]], key: str) -> float:
        return statistics.median(item[key] for item in items)

    for (name, _), by_setting in rows.items():
        base = med(by_setting["inductor"], "compile_s") if "inductor" in by_setting else math.nan
        for setting, items in by_setting.items():
            plan = f"{med(items, 'plan_s'):.2f}" if setting.startswith("ckpt") else "-"
            depth = "-" if items[0]["layers"] is None else items[0]["layers"]
            compile_s = med(items, "compile_s")
            lines.append(
                f"| {name} | {depth} | {setting} | {compile_s:.1f} | {compile_s / base:.3f} "
                f"| {med(items, 'partition_s'):.2f} | {plan} | {med(items, 'kernels'):.0f} |"
            )
    lines += ["", "Target (issue 12): ckpt's cold compile at most 1.05 times Inductor's.", ""]
    return "\n".join(lines)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_cost", description=__doc__)
    parser.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help="comma-separated benchmark models at their cpu size, name or name:layers (default %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per model (default 2)")
    parser.add_argument(
        "--settings",
        default="inductor,torch-0.5,ckpt-none,ckpt-0.5",
        help="comma-separated: inductor, torch-<fraction> (torch's knob), ckpt-<budget> (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"Markdown file (default {DEFAULT_OUT})")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        cases = [_case(part.strip()) for part in args.models.split(",") if part.strip()]
    except ValueError as error:
        parser.error(str(error))
    if args.child:
        sys.stdout.write(json.dumps(_child(args.child, *cases[0])) + "\n")
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    if not cases:
        parser.error(f"--models={args.models!r} names no model")
    settings = [part.strip() for part in args.settings.split(",") if part.strip()]
    for setting in settings:
        family, _, value = setting.partition("-")
        if setting != "inductor" and not (family in ("torch", "ckpt") and value):
            parser.error(f"--settings: {setting!r} is not inductor, torch-<fraction> or ckpt-<budget>")
    from ckpt.cost_model.calibrate import cpu_profile

    cpu_profile()  # calibrate now, outside every measurement
    rows: dict[tuple[str, int | None], dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-compile-cost-") as root:
        for case in cases:
            rows[case] = {setting: [] for setting in settings}
            for round_index in range(args.rounds):
                shift = round_index % len(settings)
                for setting in settings[shift:] + settings[:shift]:
                    result = _measure(setting, case, Path(root))
                    rows[case][setting].append(result)
                    sys.stderr.write(f"{_label(*case)}, {setting}: compile {result['compile_s']:.1f} s\n")
    text = _markdown(rows, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
