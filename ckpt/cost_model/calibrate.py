"""Measure this machine's CPU rates for the ``cpu`` profile, and cache them.

The calibration times, with the thread count torch uses:

* an fp32 and a bf16 matmul of 512 x 512 (peak matrix FLOP/s), and a 3x3
  channels-last convolution (the share of that rate convolutions reach);
* copies of 64 MiB (memory bandwidth) and of 1 MiB (the cache tier), and
  the largest copy size that still runs at least 1.5 times faster than
  memory (the cache tier's size);
* a tiny element-wise op (the fixed cost of one kernel);
* with ``fused=True`` only (``python -m ckpt calibrate``): chains of tiny
  fused Inductor kernels, compiled and timed in a subprocess
  (:mod:`ckpt.cost_model.fused_calibration`): the per-element cost of simple
  and of transcendental fused work and of a random draw, and of writing and
  reading bool tensors from fused kernels (without a working compiler,
  estimates from an eager multiply and ``erf`` stand in, and a draw is
  priced as a transcendental).

**First use is quick.**  Compiling and timing the fused kernels takes about
ten seconds, so a process that finds no cached profile measures everything
else (about a second): the transcendental rate from an eager ``erf`` beyond an
eager multiply (ATen's vectorised ``erf`` costs what one in a fused kernel
does: 0.60 against 0.59 ns per element on a 2-thread EPYC, where the
reference machine's ratio below gave 1.31), and the other fused per-element
costs from :data:`FUSED_DEFAULTS`: ratios to the measured fp32 matrix rate,
measured on a reference machine (Inductor's random draws and bool tensors
have no eager counterpart).  ``python -m ckpt calibrate`` measures them on this
machine and replaces the cached profile; the profile's ``source`` says which
it holds.

Compute rates are measured on one thread and multiplied by the thread count,
since a parallel region waits for its slowest thread and one busy core would
distort the reading.  Each figure is the fastest of a few repetitions after a
warm-up: other work on the machine can only add time, so the minimum is the
least disturbed reading.  The result is cached as JSON
under the cache directory (``CKPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ckpt``,
else ``~/.cache/ckpt``), keyed by CPU model, thread count and torch version.
A file lock makes processes that start together (for example the ranks of one
job) share one measurement, so they plan alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator

import torch

from ckpt.config import cache_dir
from ckpt.cost_model.cache_files import cached_profile, cpu_model
from ckpt.cost_model.fused_calibration import measure_fused_costs
from ckpt.cost_model.profiles import DeviceProfile
from ckpt.cost_model.timing import fastest_seconds

__all__ = ["FUSED_DEFAULTS", "MATMUL_SIZE", "calibrate_cpu", "cpu_profile"]

log = logging.getLogger(__name__)

_FORMAT_VERSION = 6  # 6: the first use measures the transcendental rate
# The square fp32/bf16 matmul whose rate is the profile's peak (the busy check of
# :mod:`ckpt.cost_model.measured` times it again).
MATMUL_SIZE = 512

# Seconds per element of fused work, times the fp32 matrix FLOP/s of the same machine: what
# the fused-kernel calibration measured on the reference machine (a 2-thread Xeon, torch
# 2.13, mean of two calibrations).  Per-element costs scale with the machine's compute
# rate to first order; ``python -m ckpt calibrate`` measures them instead.
FUSED_DEFAULTS: dict[str, float] = {
    "simple": 0.05,  # one multiply or add: far below its memory traffic either way
    "transcendental": 260.0,  # one erf (the first use measures it instead: _eager_transcendental)
    "random": 1130.0,  # one draw of Inductor's counter-based generator (dropout's mask)
    "byte_store": 1740.0,  # writing one bool element from a fused kernel, beyond its byte
    "byte_load": 540.0,  # reading one bool element, beyond its byte
}


def _machine_key() -> str:
    text = f"{cpu_model()}|threads={torch.get_num_threads()}|torch={torch.__version__}|v{_FORMAT_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _round(value: float) -> float:
    """Three significant digits, so tiny run-to-run jitter in a cache miss matters less."""
    return float(f"{value:.3g}")


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes read plus written per second by a copy: the better of one thread and all of them."""
    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    best = fastest_seconds(lambda: dst.copy_(src), repeats)
    with _one_thread():
        best = min(best, fastest_seconds(lambda: dst.copy_(src), repeats))
    return 2 * nbytes / best


# Enough elements that a call's fixed cost is a small share (1 MiB of fp32, in cache).
_TRANSCENDENTAL_ELEMENTS = 1 << 18


def _eager_transcendental(threads: int) -> float:
    """Seconds per element of an eager ``erf`` beyond an eager multiply, on one thread, over ``threads``."""
    with _one_thread():
        multiply = _per_element(lambda src, dst: torch.mul(src, 1.0001, out=dst), _TRANSCENDENTAL_ELEMENTS)
        erf = _per_element(lambda src, dst: torch.erf(src, out=dst), _TRANSCENDENTAL_ELEMENTS)
    return max(erf - multiply, 0.0) / threads


def _per_element(fn: Callable[[torch.Tensor, torch.Tensor], object], elements: int) -> float:
    src = torch.rand(elements) + 0.5
    dst = torch.empty_like(src)
    return fastest_seconds(lambda: fn(src, dst), 50) / elements


def calibrate_cpu(*, fused: bool = True) -> DeviceProfile:
    """Measure the CPU rates now and return the profile.

    ``fused=False`` skips compiling and timing fused Inductor kernels (about
    ten seconds; the rest takes about one) and scales :data:`FUSED_DEFAULTS`
    by the measured fp32 matrix rate instead.
    """
    threads = torch.get_num_threads()
    # Compute rates are measured on one thread and scaled by the thread count: a parallel
    # region waits for its slowest thread, so one busy core would distort the reading.
    with _one_thread():
        n = MATMUL_SIZE
        a, b = torch.randn(n, n), torch.randn(n, n)
        fp32 = threads * 2 * n**3 / fastest_seconds(lambda: torch.mm(a, b), 5)
        a16, b16 = a.bfloat16(), b.bfloat16()
        bf16 = threads * 2 * n**3 / fastest_seconds(lambda: torch.mm(a16, b16), 5)
        x = torch.randn(4, 64, 28, 28).contiguous(memory_format=torch.channels_last)
        w = torch.randn(64, 64, 3, 3).contiguous(memory_format=torch.channels_last)
        conv_flops = 2 * 4 * 64 * 28 * 28 * 64 * 9
        conv = threads * conv_flops / fastest_seconds(lambda: torch.conv2d(x, w, padding=1), 5)
    measured = measure_fused_costs(threads) if fused else None
    if not fused:
        simple, random, byte_store, byte_load = (
            FUSED_DEFAULTS[key] / fp32 for key in ("simple", "random", "byte_store", "byte_load")
        )
        transcendental = max(_eager_transcendental(threads), simple)
        fused_source = (
            "transcendental work from an eager erf; other fused-kernel costs scaled from the reference machine "
            "(python -m ckpt calibrate measures them)"
        )
    elif measured is not None:
        simple, transcendental, random = measured["simple"], measured["transcendental"], measured["random"]
        byte_store, byte_load = measured["byte_store"], measured["byte_load"]
        fused_source = "fused Inductor kernels"
    else:
        fused_source = "eager multiply and erf (fused kernels could not be timed)"
        # Without a compiler: a simple op is about one FLOP at the matrix rate, and a
        # transcendental costs what an eager erf costs beyond an eager multiply.
        simple = 1.0 / fp32
        transcendental = max(_eager_transcendental(threads), simple)
        byte_store = byte_load = random = 0.0
    bandwidth = _copy_bandwidth(64 * 2**20, 5)
    cache_bandwidth = _copy_bandwidth(2**20, 20)
    cache_bytes = 0
    for size in (2**18, 2**20, 2**22, 2**24):
        if _copy_bandwidth(size, 10) >= 1.5 * bandwidth:
            cache_bytes = size
    tiny = torch.empty(256)
    tiny_out = torch.empty_like(tiny)
    overhead = fastest_seconds(lambda: torch.add(tiny, tiny, out=tiny_out), 200)
    return DeviceProfile(
        name="cpu",
        peak_flops=(("fp32", _round(fp32)), ("bf16", _round(bf16)), ("fp16", _round(bf16)), ("fp64", _round(fp32 / 2))),
        bandwidth=_round(bandwidth),
        kernel_overhead=_round(overhead),
        source=(
            f"measured on this machine ({cpu_model()}, {threads} threads): 512x512 fp32/bf16 matmul, 3x3 "
            "convolution (one thread, scaled by the thread count), 64 MiB and 1 MiB copies, tiny element-wise "
            f"op; {fused_source}"
        ),
        element_seconds=_round(simple),
        transcendental_seconds=_round(transcendental),
        random_seconds=_round(random),
        byte_store_seconds=_round(byte_store),
        byte_load_seconds=_round(byte_load),
        cache_bytes=cache_bytes,
        cache_bandwidth=_round(cache_bandwidth) if cache_bytes else 0.0,
        conv_efficiency=_round(min(1.0, conv / fp32)),
    )


def cpu_profile(*, recalibrate: bool = False) -> DeviceProfile:
    """The cached ``cpu`` profile for this machine, measuring it on first use (quickly: see the module).

    ``recalibrate=True`` measures everything again, fused kernels included,
    and replaces the cached profile.
    """
    if recalibrate:
        announce = "ckpt: calibrating the cpu profile with fused kernels (about ten seconds; cached at %s)"
    else:
        announce = (
            "ckpt: calibrating the cpu profile (about a second, once; cached at %s). "
            "`python -m ckpt calibrate` also times fused kernels on this machine"
        )
    return cached_profile(
        cache_dir() / f"cpu-profile-{_machine_key()}.json",
        lambda: calibrate_cpu(fused=recalibrate),
        recalibrate=recalibrate,
        announce=announce,
    )
