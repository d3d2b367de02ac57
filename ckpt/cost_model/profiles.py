"""Device profiles: the rates behind the roofline.

A profile gives:

* peak matrix throughput per dtype class (matmul, attention), and the
  fraction of it convolutions reach;
* the cost per element of work fused into a kernel: simple arithmetic,
  transcendental functions (``exp``, ``erf``, ``tanh``...), which cost several
  times more, and random draws (Inductor's counter-based generator, which on
  the CPU costs several transcendentals per element);
* memory bandwidth, with a higher rate for tensors small enough to stay in
  cache;
* a fixed overhead per launched kernel.

Where a figure was measured, the profile says so in ``source``; otherwise it
is a datasheet figure.

GPU profiles:

* ``h200``: measured on an H200 (bf16 matmul about 790 TFLOP/s, device copy
  about 4.3 TB/s).  fp32 matmul runs at the TF32 datasheet rate scaled by the
  same measured/datasheet ratio as bf16.
* ``h100``, ``a100``: datasheet figures (SXM parts, dense tensor cores),
  scaled by the H200's measured/datasheet ratios for bf16 (0.80) and copy (0.90).
* On every GPU, element-wise work is charged at the datasheet fp32 CUDA-core
  rate (transcendentals at a quarter of it, the special-function units'
  share; random draws at the transcendental rate), and convolutions at the
  matmul rate; these are datasheet figures,
  not measurements.  They matter little: on these GPUs fused element-wise work
  is bound by memory traffic, which the bandwidth term covers.

The ``cpu`` profile is measured on the machine itself by
:mod:`ckpt.cost_model.calibrate` and cached; a GPU in use is measured by
:mod:`ckpt.cost_model.gpu_calibrate`.  The GPU tables here are for
``CKPT_DEVICE`` and the fallback when measuring fails.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

__all__ = ["DeviceProfile", "GPU_PROFILES", "PROFILE_NAMES", "gpu_profile_for_name"]


@dataclass(frozen=True)
class DeviceProfile:
    """Roofline rates for one device.

    ``peak_flops`` maps a dtype class (``"fp32"``, ``"bf16"``, ``"fp16"``,
    ``"fp64"``) to matrix FLOP/s; ``bandwidth`` is bytes/s for a read or a
    write of a large tensor, ``cache_bandwidth`` the same for tensors of at
    most ``cache_bytes`` (0: no cache tier); ``kernel_overhead`` is seconds per
    launched kernel; ``element_seconds`` and ``transcendental_seconds`` are
    seconds per element of fused work (0: one FLOP per element at the fp32
    matrix rate), and ``random_seconds`` the same for one random draw (0:
    the transcendental rate); ``conv_efficiency`` is the share of the matrix rate that
    convolutions reach; ``byte_store_seconds`` and ``byte_load_seconds`` are
    the least time per element for a fused kernel to write or read a
    one-byte (bool) tensor, where the code for those is slow.
    """

    name: str
    peak_flops: tuple[tuple[str, float], ...]
    bandwidth: float
    kernel_overhead: float
    source: str
    element_seconds: float = 0.0
    transcendental_seconds: float = 0.0
    cache_bytes: int = 0
    cache_bandwidth: float = 0.0
    conv_efficiency: float = 1.0
    byte_store_seconds: float = 0.0
    byte_load_seconds: float = 0.0
    random_seconds: float = 0.0

    def __post_init__(self) -> None:
        rates = dict(self.peak_flops)
        if "fp32" not in rates:
            raise ValueError(f"DeviceProfile {self.name!r}: peak_flops needs an 'fp32' entry, got {sorted(rates)}")
        for field_name in ("bandwidth", "conv_efficiency"):
            if not getattr(self, field_name) > 0:
                raise ValueError(f"DeviceProfile {self.name!r}: {field_name} must be > 0")

    def flops_per_second(self, dtype_class: str) -> float:
        rates = dict(self.peak_flops)
        return rates.get(dtype_class, rates["fp32"])

    def bytes_per_second(self, nbytes: int) -> float:
        """The bandwidth for moving one tensor of ``nbytes``."""
        if self.cache_bytes and self.cache_bandwidth and nbytes <= self.cache_bytes:
            return self.cache_bandwidth
        return self.bandwidth

    def seconds_per_element(self, transcendental: bool, random: bool = False) -> float:
        simple = self.element_seconds or 1.0 / self.flops_per_second("fp32")
        if random and self.random_seconds:
            return self.random_seconds
        if transcendental or random:
            return self.transcendental_seconds or 4.0 * simple
        return simple

    def to_json(self) -> str:
        """The profile as JSON, for the calibration caches."""
        data: dict[str, object] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["peak_flops"] = [list(item) for item in self.peak_flops]
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> DeviceProfile | None:
        """The profile :meth:`to_json` wrote, or None if ``text`` is not one (a corrupt or older cache file)."""
        try:
            data = json.loads(text)
            fields = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name != "peak_flops"}
            return cls(peak_flops=tuple((str(k), float(v)) for k, v in data["peak_flops"]), **fields)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def key(self) -> str:
        """A stable text that identifies the rates, for cache keys."""
        rates = ",".join(f"{k}={v:.4g}" for k, v in self.peak_flops)
        return (
            f"{self.name}:{rates}:bw={self.bandwidth:.4g}:ovh={self.kernel_overhead:.4g}"
            f":el={self.element_seconds:.4g}:tr={self.transcendental_seconds:.4g}"
            f":cache={self.cache_bytes}@{self.cache_bandwidth:.4g}:conv={self.conv_efficiency:.4g}"
            f":bytes={self.byte_store_seconds:.4g}/{self.byte_load_seconds:.4g}"
            + (f":rnd={self.random_seconds:.4g}" if self.random_seconds else "")
        )


_BF16_EFFICIENCY = 790e12 / 989e12  # measured / datasheet, H200
_COPY_EFFICIENCY = 4.3e12 / 4.8e12  # measured / datasheet, H200


def _gpu(
    name: str, bf16: float, tf32: float, fp32_cores: float, fp64: float, bandwidth: float, source: str
) -> DeviceProfile:
    return DeviceProfile(
        name=name,
        peak_flops=(("bf16", bf16), ("fp16", bf16), ("fp32", tf32), ("fp64", fp64)),
        bandwidth=bandwidth,
        kernel_overhead=4e-6,
        source=source,
        element_seconds=1.0 / fp32_cores,
        transcendental_seconds=4.0 / fp32_cores,
    )


GPU_PROFILES: dict[str, DeviceProfile] = {
    "h200": _gpu(
        "h200",
        bf16=790e12,
        tf32=494e12 * _BF16_EFFICIENCY,
        fp32_cores=67e12,
        fp64=67e12,
        bandwidth=4.3e12,
        source="measured: bf16 matmul 790 TFLOP/s and device copy 4.3 TB/s on an H200; other rates datasheet",
    ),
    "h100": _gpu(
        "h100",
        bf16=989e12 * _BF16_EFFICIENCY,
        tf32=494e12 * _BF16_EFFICIENCY,
        fp32_cores=67e12,
        fp64=67e12,
        bandwidth=3.35e12 * _COPY_EFFICIENCY,
        source="datasheet (H100 SXM), scaled by the H200's measured/datasheet ratios",
    ),
    "a100": _gpu(
        "a100",
        bf16=312e12 * _BF16_EFFICIENCY,
        tf32=156e12 * _BF16_EFFICIENCY,
        fp32_cores=19.5e12,
        fp64=19.5e12,
        bandwidth=2.04e12 * _COPY_EFFICIENCY,
        source="datasheet (A100 SXM 80GB), scaled by the H200's measured/datasheet ratios",
    ),
}

PROFILE_NAMES: tuple[str, ...] = ("cpu", *GPU_PROFILES)


def gpu_profile_for_name(device_name: str) -> DeviceProfile:
    """The profile for a CUDA device name such as ``'NVIDIA H100 80GB HBM3'``.

    Unknown GPUs get the H100 profile: the fallback when a GPU cannot be
    measured, which the caller warns about.
    """
    lowered = device_name.lower()
    for key in ("h200", "h100", "a100"):
        if key in lowered:
            return GPU_PROFILES[key]
    return GPU_PROFILES["h100"]
