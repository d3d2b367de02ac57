"""Per-element costs inside Inductor's fused CPU kernels, measured by compiling tiny ones.

Run as ``python -m ckpt.cost_model.fused_calibration --threads N``: it prints
one JSON object with seconds per element for

* ``simple``: one multiply or add inside a fused kernel;
* ``transcendental``: one ``erf`` inside a fused kernel;
* ``random``: one draw of Inductor's random-number generator inside a fused
  kernel (what a dropout mask costs to draw again);
* ``byte_store`` / ``byte_load``: writing / reading a one-byte (bool) tensor
  from a fused kernel, beyond what its bytes cost (Inductor's CPU code for
  bool tensors is far slower than for floats);

each from the difference between two compiled kernels, so memory traffic and
launch costs cancel.  :func:`measure_fused_costs` runs it in a subprocess, so a
calibration triggered while a model is being compiled never compiles inside
that compilation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable

import torch

from ckpt.cost_model.timing import fastest_seconds

__all__ = ["measure_fused_costs"]

log = logging.getLogger(__name__)

_ELEMENTS = 1 << 20


def _chain(steps: int, transcendental: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(steps):
            x = (torch.erf(x) if transcendental else x) * 0.5 + 0.25
        return x

    return chain


def _draws(steps: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def draws(x: torch.Tensor) -> torch.Tensor:
        for _ in range(steps):
            x = x * 0.5 + torch.rand_like(x)
        return x

    return draws


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


def _double_and_mask(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2.0, x > 0


def _select_by_float(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(y > 0, x, 0.0)


def _select_by_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, 0.0)


def _time(fn: Callable[..., object], *args: torch.Tensor) -> float:
    compiled = torch.compile(fn, backend="inductor", fullgraph=True)
    return fastest_seconds(lambda: compiled(*args), 40)


def _measure() -> dict[str, float]:
    x = torch.rand(_ELEMENTS) - 0.5
    y = torch.rand(_ELEMENTS) - 0.5
    mask = y > 0
    n = float(_ELEMENTS)
    simple = max(0.0, (_time(_chain(9, False), x) - _time(_chain(1, False), x)) / (8 * 2 * n))
    erf_step = (_time(_chain(9, True), x) - _time(_chain(1, True), x)) / (8 * n)
    draw_step = (_time(_draws(5), x) - _time(_draws(1), x)) / (4 * n)
    return {
        "simple": simple,
        "transcendental": max(simple, erf_step - 2 * simple),
        "random": max(simple, draw_step - 2 * simple),
        "byte_store": max(0.0, (_time(_double_and_mask, x) - _time(_double, x)) / n),
        "byte_load": max(0.0, (_time(_select_by_mask, x, mask) - _time(_select_by_float, x, y)) / n),
    }


def measure_fused_costs(threads: int, timeout: float = 600.0) -> dict[str, float] | None:
    """The per-element costs, measured in a subprocess; None if that fails."""
    command = [sys.executable, "-m", "ckpt.cost_model.fused_calibration", "--threads", str(threads)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("ckpt: could not time fused kernels (%s); using estimates from eager ops", error)
        return None
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        log.warning("ckpt: could not time fused kernels (%s); using estimates from eager ops", tail[0])
        return None
    try:
        costs = json.loads(result.stdout.strip().splitlines()[-1])
        return {key: float(costs[key]) for key in ("simple", "transcendental", "random", "byte_store", "byte_load")}
    except (ValueError, KeyError, IndexError) as error:
        log.warning("ckpt: unreadable fused-kernel timings (%s); using estimates from eager ops", error)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt.cost_model.fused_calibration", description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads to use")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads={args.threads} must be at least 1")
    torch.set_num_threads(args.threads)
    sys.stdout.write(json.dumps(_measure()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
