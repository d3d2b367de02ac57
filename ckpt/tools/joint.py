"""Trace a model's joint graph the way Inductor sees it, without compiling kernels.

:func:`trace_joint` runs AOTAutograd with Inductor's decompositions and a
partition function that captures the joint graph, runs Inductor's joint-graph
passes on it (as Inductor does before it calls the backend's partitioner: with
Inductor's RNG, dropout becomes a seeded draw the backward may repeat),
prepares it as the ckpt partitioner does, and returns it with its analysis.  It takes well under a
second for small models, so the partitioner's tests and the solver benchmark
need no C++ compile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.profiles import DeviceProfile
from ckpt.partitioner.analysis import JointAnalysis, analyze_joint
from ckpt.partitioner.joint_graph import autograd_saved_names

__all__ = ["Joint", "trace_joint"]


@dataclass
class Joint:
    """A prepared joint graph, its analysis, and how many of its outputs belong to the forward."""

    graph: fx.GraphModule
    analysis: JointAnalysis
    num_fwd_outputs: int
    raw_nodes: int  # nodes of the joint graph before preparation
    analysis_seconds: float  # preparing and analysing the joint graph


class _Captured(Exception):
    pass


def _default_loss(output: Any) -> torch.Tensor:
    return output if output.dim() == 0 else output.sum()


def trace_joint(
    model: torch.nn.Module,
    *inputs: Any,
    profile: DeviceProfile,
    loss: Callable[[Any], torch.Tensor] = _default_loss,
    measure: Any = None,
) -> Joint:
    """The first joint graph of ``model(*inputs)``, analysed on ``profile``.

    Buffer mutations stay in the graph, as under Inductor.  ``loss`` turns the
    output into the scalar the backward starts from (default: the output if it
    is a scalar, else its sum).  ``measure`` times library calls, as in
    :func:`~ckpt.partitioner.analysis.analyze_joint` (for example the
    :class:`~ckpt.cost_model.measured.OpCosts` of
    :func:`~ckpt.cost_model.measured.plan_costs`, as the backend plans);
    without it, library calls keep their roofline time.
    """
    captured: list[Joint] = []

    def capture(gm: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any) -> Any:
        gm = compat.inductor_joint_graph_passes(gm)  # Inductor's work, done before it calls the backend's partitioner
        raw_nodes = len(gm.graph.nodes)
        started = time.perf_counter()
        autograd_saved = autograd_saved_names(gm, num_fwd_outputs)
        gm, _, _ = compat.prepare_joint(gm)
        analysis = analyze_joint(gm, num_fwd_outputs, profile, autograd_saved=autograd_saved, measure=measure)
        seconds = time.perf_counter() - started
        captured.append(Joint(gm, analysis, num_fwd_outputs, raw_nodes, seconds))
        raise _Captured

    traced = compat.aot_module_without_kernels(model, capture, keep_inference_input_mutations=True)
    try:
        loss(traced(*inputs)).backward()
    except _Captured:
        pass
    except Exception:  # AOTAutograd may wrap what the partition function raised
        if not captured:
            raise
    if not captured:
        raise ValueError("the model produced no joint graph: does its output require grad?")
    return captured[0]
