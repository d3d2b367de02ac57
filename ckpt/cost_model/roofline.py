"""Roofline time of a kernel on a device profile.

A library call (matmul, convolution, attention) is one kernel:

``time = max(flops / peak_flops, bytes / bandwidth) + kernel_overhead``

with convolutions at ``conv_efficiency`` of the matrix rate.  Work fused into
another kernel costs only its per-element arithmetic
(:func:`elementwise_seconds`); its memory traffic is the fused kernel's and is
charged where a tensor is materialised (:func:`transfer_seconds`).
"""

from __future__ import annotations

from ckpt.cost_model.profiles import DeviceProfile

__all__ = [
    "compute_seconds",
    "elementwise_seconds",
    "kernel_seconds",
    "tensor_read_seconds",
    "tensor_write_seconds",
    "transfer_seconds",
]


def compute_seconds(profile: DeviceProfile, flops: int, dtype_class: str = "fp32", efficiency: float = 1.0) -> float:
    return flops / (profile.flops_per_second(dtype_class) * efficiency)


def elementwise_seconds(
    profile: DeviceProfile, elements: int, transcendental: bool = False, random: bool = False
) -> float:
    """Arithmetic of one fused element-wise or reduction op over ``elements`` elements (or random draws)."""
    return elements * profile.seconds_per_element(transcendental, random)


def transfer_seconds(profile: DeviceProfile, nbytes: int) -> float:
    """Reading or writing one tensor of ``nbytes``."""
    return nbytes / profile.bytes_per_second(nbytes) if nbytes else 0.0


def kernel_seconds(
    profile: DeviceProfile, flops: int, nbytes: int, dtype_class: str = "fp32", efficiency: float = 1.0
) -> float:
    """One kernel launch that does ``flops`` and moves ``nbytes`` (read plus written)."""
    return (
        max(compute_seconds(profile, flops, dtype_class, efficiency), transfer_seconds(profile, nbytes))
        + profile.kernel_overhead
    )


def tensor_write_seconds(profile: DeviceProfile, nbytes: int, elements: int, itemsize: int) -> float:
    """A fused kernel writing one tensor: its bytes, or the per-element floor for one-byte tensors."""
    floor = elements * profile.byte_store_seconds if itemsize == 1 else 0.0
    return max(transfer_seconds(profile, nbytes), floor)


def tensor_read_seconds(profile: DeviceProfile, nbytes: int, elements: int, itemsize: int) -> float:
    """A fused kernel reading one tensor: its bytes, or the per-element floor for one-byte tensors."""
    floor = elements * profile.byte_load_seconds if itemsize == 1 else 0.0
    return max(transfer_seconds(profile, nbytes), floor)
