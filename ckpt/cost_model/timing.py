"""Timing for calibration: the fastest of a few runs after a warm-up.

Other work on the machine can only add time, so the minimum is the least
disturbed reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["fastest_seconds"]


def fastest_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples)
