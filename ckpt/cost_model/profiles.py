"""Device profiles: the rates behind the roofline.

Each profile gives a peak matrix throughput per dtype class, a memory
bandwidth and a fixed per-kernel overhead.  Where a figure was measured, the
profile says so in ``source``; otherwise it is a datasheet figure.

GPU profiles:

* ``h200``: measured on an H200 (bf16 matmul about 790 TFLOP/s, device copy
  about 4.3 TB/s).  fp32 runs at the TF32 datasheet rate scaled by the same
  measured/datasheet ratio as bf16.
* ``h100``, ``a100``: datasheet figures (SXM parts, dense tensor cores),
  scaled by the H200's measured/datasheet ratio for bf16 (0.80) and copy (0.90),
  since datasheet peaks are not reached in practice.

The ``cpu`` profile is measured on the machine itself by
:mod:`ckpt.cost_model.calibrate` and cached.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceProfile", "GPU_PROFILES", "PROFILE_NAMES", "gpu_profile_for_name"]


@dataclass(frozen=True)
class DeviceProfile:
    """Roofline rates for one device.

    ``peak_flops`` maps a dtype class (``"fp32"``, ``"bf16"``, ``"fp16"``,
    ``"fp64"``) to FLOP/s; ``bandwidth`` is bytes/s for a read or a write;
    ``kernel_overhead`` is seconds per launched kernel.
    """

    name: str
    peak_flops: tuple[tuple[str, float], ...]
    bandwidth: float
    kernel_overhead: float
    source: str

    def flops_per_second(self, dtype_class: str) -> float:
        rates = dict(self.peak_flops)
        return rates.get(dtype_class, rates["fp32"])

    def key(self) -> str:
        """A stable text that identifies the rates, for cache keys."""
        rates = ",".join(f"{k}={v:.4g}" for k, v in self.peak_flops)
        return f"{self.name}:{rates}:bw={self.bandwidth:.4g}:ovh={self.kernel_overhead:.4g}"


_BF16_EFFICIENCY = 790e12 / 989e12  # measured / datasheet, H200
_COPY_EFFICIENCY = 4.3e12 / 4.8e12  # measured / datasheet, H200

GPU_PROFILES: dict[str, DeviceProfile] = {
    "h200": DeviceProfile(
        name="h200",
        peak_flops=(
            ("bf16", 790e12),
            ("fp16", 790e12),
            ("fp32", 494e12 * _BF16_EFFICIENCY),
            ("fp64", 67e12),
        ),
        bandwidth=4.3e12,
        kernel_overhead=4e-6,
        source="measured: bf16 matmul 790 TFLOP/s and device copy 4.3 TB/s on an H200; fp32 and fp64 datasheet",
    ),
    "h100": DeviceProfile(
        name="h100",
        peak_flops=(
            ("bf16", 989e12 * _BF16_EFFICIENCY),
            ("fp16", 989e12 * _BF16_EFFICIENCY),
            ("fp32", 494e12 * _BF16_EFFICIENCY),
            ("fp64", 67e12),
        ),
        bandwidth=3.35e12 * _COPY_EFFICIENCY,
        kernel_overhead=4e-6,
        source="datasheet (H100 SXM), scaled by the H200's measured/datasheet ratios",
    ),
    "a100": DeviceProfile(
        name="a100",
        peak_flops=(
            ("bf16", 312e12 * _BF16_EFFICIENCY),
            ("fp16", 312e12 * _BF16_EFFICIENCY),
            ("fp32", 156e12 * _BF16_EFFICIENCY),
            ("fp64", 19.5e12),
        ),
        bandwidth=2.04e12 * _COPY_EFFICIENCY,
        kernel_overhead=5e-6,
        source="datasheet (A100 SXM 80GB), scaled by the H200's measured/datasheet ratios",
    ),
}

PROFILE_NAMES: tuple[str, ...] = ("cpu", *GPU_PROFILES)


def gpu_profile_for_name(device_name: str) -> DeviceProfile:
    """The profile for a CUDA device name such as ``'NVIDIA H100 80GB HBM3'``.

    Unknown GPUs get the H100 profile; the caller logs that choice.
    """
    lowered = device_name.lower()
    for key in ("h200", "h100", "a100"):
        if key in lowered:
            return GPU_PROFILES[key]
    return GPU_PROFILES["h100"]
