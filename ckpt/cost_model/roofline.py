"""Roofline time of a kernel on a device profile.

``time = max(flops / peak_flops, bytes / bandwidth) + kernel_overhead``

and, for work fused into another kernel, only the compute term (its memory
traffic is the fused kernel's, counted there).
"""

from __future__ import annotations

from ckpt.cost_model.profiles import DeviceProfile

__all__ = ["compute_seconds", "kernel_seconds", "transfer_seconds"]


def compute_seconds(profile: DeviceProfile, flops: int, dtype_class: str = "fp32") -> float:
    return flops / profile.flops_per_second(dtype_class)


def transfer_seconds(profile: DeviceProfile, nbytes: int) -> float:
    return nbytes / profile.bandwidth


def kernel_seconds(profile: DeviceProfile, flops: int, nbytes: int, dtype_class: str = "fp32") -> float:
    """One kernel launch that does ``flops`` and moves ``nbytes`` (read plus written)."""
    return (
        max(compute_seconds(profile, flops, dtype_class), transfer_seconds(profile, nbytes))
        + profile.kernel_overhead
    )
