"""Trace a model's joint graph the way Inductor sees it, without compiling kernels.

``trace_joint(model, *inputs)`` runs AOTAutograd with Inductor's decompositions
and a capturing partition function, prepares the joint graph as the ckpt
partitioner does, and returns it with its analysis. It takes well under a
second for small models, so partitioner tests need no C++ compile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module
from torch._functorch.compilers import nop
from torch._inductor.decomposition import select_decomp_table

from ckpt import _torch_compat as compat
from ckpt.cost_model.profiles import GPU_PROFILES, DeviceProfile
from ckpt.partitioner.analysis import JointAnalysis, analyze_joint

# A fixed profile, so tests do not depend on this machine's calibration.
TEST_PROFILE: DeviceProfile = GPU_PROFILES["h100"]


@dataclass
class Joint:
    graph: fx.GraphModule
    analysis: JointAnalysis
    num_fwd_outputs: int


class _Captured(Exception):
    pass


def trace_joint(model: torch.nn.Module, *inputs: torch.Tensor, profile: DeviceProfile = TEST_PROFILE) -> Joint:
    captured: list[Joint] = []

    def capture(gm: fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **kwargs):
        gm, _, _ = compat.prepare_joint(gm)
        captured.append(Joint(gm, analyze_joint(gm, num_fwd_outputs, profile), num_fwd_outputs))
        raise _Captured

    traced = aot_module(
        model,
        fw_compiler=nop,
        bw_compiler=nop,
        partition_fn=capture,
        decompositions=select_decomp_table(),
        keep_inference_input_mutations=True,  # as Inductor does: buffer mutations stay in the graph
    )
    try:
        out = traced(*inputs)
        (out if out.dim() == 0 else out.sum()).backward()
    except _Captured:
        pass
    if not captured:
        raise AssertionError("the model produced no joint graph (does its output require grad?)")
    return captured[0]
