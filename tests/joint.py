"""Joint-graph tracing for the partitioner tests, on a fixed device profile.

The tracing itself is :func:`ckpt.tools.joint.trace_joint`, shared with the
solver benchmark; here it gets a fixed profile, so tests do not depend on this
machine's calibration.  :class:`CausalSelfAttention` is the small attention
block the tests trace when they need a library call that returns a tuple.
"""

from __future__ import annotations

from typing import Any

import torch

from ckpt.cost_model.profiles import GPU_PROFILES, DeviceProfile
from ckpt.tools.joint import Joint
from ckpt.tools.joint import trace_joint as _trace_joint

__all__ = ["TEST_PROFILE", "CausalSelfAttention", "Joint", "trace_joint"]

TEST_PROFILE: DeviceProfile = GPU_PROFILES["h100"]


def trace_joint(model: torch.nn.Module, *inputs: Any, profile: DeviceProfile = TEST_PROFILE) -> Joint:
    return _trace_joint(model, *inputs, profile=profile)


class CausalSelfAttention(torch.nn.Module):
    """One projection to q, k and v, then causal ``scaled_dot_product_attention``; input (batch, seq, width)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
