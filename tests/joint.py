"""Joint-graph tracing for the partitioner tests, on a fixed device profile.

The tracing itself is :func:`ckpt.tools.joint.trace_joint`, shared with the
solver benchmark; here it gets a fixed profile, so tests do not depend on this
machine's calibration.
"""

from __future__ import annotations

from typing import Any

import torch

from ckpt.cost_model.profiles import GPU_PROFILES, DeviceProfile
from ckpt.tools.joint import Joint
from ckpt.tools.joint import trace_joint as _trace_joint

__all__ = ["TEST_PROFILE", "Joint", "trace_joint"]

TEST_PROFILE: DeviceProfile = GPU_PROFILES["h100"]


def trace_joint(model: torch.nn.Module, *inputs: Any, profile: DeviceProfile = TEST_PROFILE) -> Joint:
    return _trace_joint(model, *inputs, profile=profile)
