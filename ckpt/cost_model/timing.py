"""Timing for calibration: the fastest of a few runs after a warm-up.

Other work on the machine can only add time, so the minimum is the least
disturbed reading.  On a CUDA device each run is timed with CUDA events on
the current stream, from after the work queued before it to the end of its
own kernels.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

__all__ = ["device_seconds", "fastest_seconds"]


def fastest_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples)


def device_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``fn`` on ``device``, after a warm-up run."""
    if device.type != "cuda":
        return fastest_seconds(fn, repeats)
    fn()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(float(start.elapsed_time(end)) / 1e3)
    return min(samples)
