"""Measure a GPU's rates for the roofline, once per device model, and cache them.

On a CUDA or ROCm device the profile is measured, never borrowed from
another GPU's datasheet.  The calibration times, with CUDA events, the
fastest of a few runs after a warm-up:

* matmuls of 4096 x 4096 in bf16 and fp16, and in fp32 under the process's
  current TF32 setting (``torch.backends.cuda.matmul.allow_tf32``), which is
  what the model's own fp32 matmuls get; fp64 at 1024 x 1024;
* the same fp32 matmul with TF32 off: the rate of the CUDA cores, which
  prices one simple op of fused element-wise work (transcendental functions
  at four times that, the special-function units' share; a fused kernel on a
  GPU is bound by its memory traffic long before either matters);
* a 3x3 channels-last bf16 convolution, for the share of the matrix rate
  convolutions reach;
* a 256 MiB device copy (bandwidth);
* a thousand tiny additions queued back to back (the cost of one kernel).

It takes about a second on a data-centre GPU.  The result is cached in the
cache directory keyed by the device name, the CUDA or HIP version and the
torch version, under the same lock as the CPU calibration, so the ranks of
one job on one machine share one measurement.  Ranks on different machines
agree on the profile of the lowest rank (:mod:`ckpt.cost_model.measured`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from ckpt.config import cache_dir
from ckpt.cost_model.cache_files import cached_profile
from ckpt.cost_model.profiles import DeviceProfile
from ckpt.cost_model.timing import device_seconds

__all__ = ["calibrate_gpu", "gpu_profile", "profile_name"]

log = logging.getLogger(__name__)

_FORMAT_VERSION = 1
_MATMUL = 4096
_FP64_MATMUL = 1024
_COPY_BYTES = 256 * 2**20
_TINY_KERNELS = 1000


def _round(value: float) -> float:
    return float(f"{value:.3g}")


def _device_name(device: torch.device) -> str:
    return str(torch.cuda.get_device_name(device))


def profile_name(device_name: str) -> str:
    """A profile name for a device name: ``'NVIDIA L4'`` -> ``'nvidia-l4'``."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "gpu"


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int) -> float:
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.empty(n, n, dtype=dtype, device=device).uniform_(-1, 1, generator=generator)
    b = torch.empty(n, n, dtype=dtype, device=device).uniform_(-1, 1, generator=generator)
    return 2 * n**3 / device_seconds(lambda: torch.mm(a, b), device, 5)


def _conv_rate(device: torch.device) -> float:
    """FLOP/s of a 3x3 channels-last bf16 convolution."""
    x = torch.zeros(32, 256, 56, 56, dtype=torch.bfloat16, device=device).contiguous(memory_format=torch.channels_last)
    w = torch.zeros(256, 256, 3, 3, dtype=torch.bfloat16, device=device).contiguous(memory_format=torch.channels_last)
    flops = 2 * 32 * 256 * 56 * 56 * 256 * 9
    return flops / device_seconds(lambda: torch.conv2d(x, w, padding=1), device, 5)


def _copy_bandwidth(device: torch.device) -> float:
    """Bytes read plus written per second by a large device copy."""
    src = torch.empty(_COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * _COPY_BYTES / device_seconds(lambda: dst.copy_(src), device, 5)


def calibrate_gpu(device: torch.device) -> DeviceProfile:
    """Measure the rates of the GPU ``device`` now and return its profile."""
    name = _device_name(device)
    with torch.no_grad():
        bf16 = _matmul_rate(device, torch.bfloat16, _MATMUL)
        fp16 = _matmul_rate(device, torch.float16, _MATMUL)
        fp32 = _matmul_rate(device, torch.float32, _MATMUL)
        with _tf32(False):
            cores = _matmul_rate(device, torch.float32, _MATMUL)
        fp64 = _matmul_rate(device, torch.float64, _FP64_MATMUL)
        conv = _conv_rate(device)
        bandwidth = _copy_bandwidth(device)
        tiny = torch.zeros(256, device=device)

        def tiny_kernels() -> None:
            for _ in range(_TINY_KERNELS):
                tiny.add_(1.0)

        overhead = device_seconds(tiny_kernels, device, 3) / _TINY_KERNELS
    return DeviceProfile(
        name=profile_name(name),
        peak_flops=(
            ("bf16", _round(bf16)),
            ("fp16", _round(fp16)),
            ("fp32", _round(fp32)),
            ("fp64", _round(fp64)),
        ),
        bandwidth=_round(bandwidth),
        kernel_overhead=_round(overhead),
        source=(
            f"measured on this GPU ({name}): {_MATMUL}x{_MATMUL} bf16/fp16/fp32 matmuls (fp32 with TF32 "
            f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}), fp32 without TF32 for fused "
            "element-wise work (transcendentals at 4x), 3x3 bf16 convolution, 256 MiB copy, tiny kernels"
        ),
        element_seconds=_round(1.0 / cores),
        transcendental_seconds=_round(4.0 / cores),
        conv_efficiency=_round(min(1.0, conv / bf16)),
    )


def _key(device: torch.device) -> str:
    version = torch.version.cuda or getattr(torch.version, "hip", None)
    text = f"{_device_name(device)}|{version}|torch={torch.__version__}|tf32={torch.backends.cuda.matmul.allow_tf32}"
    return hashlib.sha256(f"{text}|v{_FORMAT_VERSION}".encode()).hexdigest()[:16]


def gpu_profile(device: torch.device, *, directory: Path | None = None, recalibrate: bool = False) -> DeviceProfile:
    """The cached profile of the GPU ``device``, measuring it on first use (see the module).

    ``recalibrate=True`` measures it again and replaces the cached profile.
    """
    directory = cache_dir() if directory is None else directory
    announce = f"ckpt: measuring the {_device_name(device)} (about a second, once; cached at %s)"
    return cached_profile(
        directory / f"gpu-profile-{_key(device)}.json",
        lambda: calibrate_gpu(device),
        recalibrate=recalibrate,
        announce=announce,
    )
