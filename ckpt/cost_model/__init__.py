"""The cost model: FLOPs and bytes per node, and a roofline per device profile."""

from ckpt.cost_model.node_cost import NodeEstimate, SizeEvaluator, estimate_node
from ckpt.cost_model.ops import OpKind, classify
from ckpt.cost_model.profiles import GPU_PROFILES, PROFILE_NAMES, DeviceProfile
from ckpt.cost_model.roofline import compute_seconds, elementwise_seconds, kernel_seconds, transfer_seconds

__all__ = [
    "GPU_PROFILES",
    "PROFILE_NAMES",
    "DeviceProfile",
    "NodeEstimate",
    "OpKind",
    "SizeEvaluator",
    "classify",
    "compute_seconds",
    "elementwise_seconds",
    "estimate_node",
    "kernel_seconds",
    "transfer_seconds",
]
