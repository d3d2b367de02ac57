"""What each rank runs for the traced-collectives cases: parameters all-gathered inside the graph.

This torch (2.13) always runs FSDP2's hooks eagerly (they are
``torch._dynamo.disable``-d), so its collectives never enter a compiled graph.
Graphs that do contain them come from code that calls functional collectives
itself, as SimpleFSDP-style sharding does: each weight is a parameter shard,
and the forward all-gathers it (``compat.all_gather_autograd``, whose backward
is a reduce-scatter) and uses the full weight.  The joint graph then holds
``_c10d_functional.all_gather_into_tensor`` and ``wait_tensor`` in the forward
and ``reduce_scatter_tensor`` in the backward.

Two ways in:

* **hand-tagged** (:func:`_traced`): AOTAutograd traces the module with
  Inductor's decompositions and no kernel compile; the partition function tags
  the forward all-gathers (and their waits) ``MUST_RECOMPUTE``, or not, as
  traced FSDP did, and hands the graph to :class:`ckpt.backend.CkptPartitioner`;
* **compiled** (:func:`_compiled`): ``torch.compile(backend="ckpt")`` of a module
  that gathers inside ``torch.utils.checkpoint`` with a selective policy that
  marks the collectives ``MUST_RECOMPUTE`` (the way a user tags them), or
  gathers outside any checkpoint (untagged).

Each scenario returns the gathered gradients and the global loss of three
steps, the plan, the shapes of every tensor saved for the backward, the
collectives in the backward graph, the budget warnings, and every rank's
fingerprint.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ckpt import _torch_compat as compat
from ckpt.backend import BudgetWarning, CkptPartitioner, resolve_profile
from ckpt.config import CkptConfig
from ckpt.records import record_partitions
from tests.distributed.launch import progress
from tests.distributed.models import BATCH, LR, STEPS, Step
from tests.distributed.rank_tools import PlanSummary, gather, summarize

__all__ = [
    "FULL_SHAPES",
    "SCENARIOS",
    "CollectiveOutcome",
    "GatheredMLP",
    "collectives_worker",
    "eager_model",
    "full_weights",
    "input_batches",
    "run_scenario",
]

IN, HIDDEN = 16, 24
FULL_SHAPES = ((HIDDEN, IN), (IN, HIDDEN))  # the gathered weights: shapes no activation has here
_ALL_GATHER = torch.ops._c10d_functional.all_gather_into_tensor.default
_WAIT = torch.ops._c10d_functional.wait_tensor.default


def full_weights() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(HIDDEN, IN, generator=generator) / 4, torch.randn(IN, HIDDEN, generator=generator) / 4


def input_batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    return [torch.randn(BATCH, IN, generator=generator) for _ in range(STEPS)]


class GatheredMLP(nn.Module):
    """Two weights sharded over the ranks along dim 0 and gathered in every forward.

    The loss is this rank's mean divided by the world size, so the reduce-scatter
    (a sum) of the gathered weights' gradients gives each rank its shard of the
    global mean's gradient.  With ``world_size=1`` it is the plain eager model.
    """

    def __init__(self, rank: int, world_size: int, *, policy: bool = False) -> None:
        super().__init__()
        w, v = full_weights()
        self.world_size = world_size
        self.policy = policy
        self.w = nn.Parameter(w.chunk(world_size)[rank].clone())
        self.v = nn.Parameter(v.chunk(world_size)[rank].clone())

    def _gather(self, w: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.world_size == 1:
            return w, v
        group = dist.group.WORLD
        return compat.all_gather_autograd(w, 0, group), compat.all_gather_autograd(v, 0, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.policy:
            w, v = checkpoint(self._gather, self.w, self.v, use_reentrant=False, context_fn=_recompute_collectives)
        else:
            w, v = self._gather(self.w, self.v)
        h = torch.tanh(x @ w.t())
        return torch.tanh(h @ v.t()).square().mean() / self.world_size


def _collective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if getattr(op, "namespace", None) == "_c10d_functional":
        return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.PREFER_SAVE


def _recompute_collectives() -> Any:
    return create_selective_checkpoint_contexts(_collective_policy)


@dataclass
class CollectiveOutcome:
    steps: list[Step]
    plans: list[PlanSummary]
    saved_shapes: list[tuple[int, ...]]  # every tensor saved for the backward in the first step
    backward_collectives: list[str] = field(default_factory=list)  # collective ops in the backward graph
    budget_warnings: int = 0
    fingerprints: list[list[tuple[str, str | None]]] = field(default_factory=list)


def _tag_gathers(gm: fx.GraphModule) -> None:
    """Tag the all-gathers and the waits on them ``MUST_RECOMPUTE``, as traced FSDP does.

    Like a checkpoint region, the tagged nodes carry an ``ac_graph_id``: torch
    2.9's ``cleanup_recompute_tags`` reads it from every tagged node.
    """
    gathered: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.target is _ALL_GATHER or (node.target is _WAIT and node.args[0] in gathered):
            gathered.add(node)
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            node.meta["ac_graph_id"] = 0


def _collectives(gm: fx.GraphModule) -> list[str]:
    return [
        node.target.__name__
        for node in gm.graph.nodes
        if node.op == "call_function" and getattr(node.target, "namespace", None) == "_c10d_functional"
    ]


def _traced(model: GatheredMLP, budget: str, tag: bool, backward: list[str]) -> Any:
    """The model's forward through AOTAutograd and the ckpt partitioner, without compiling kernels."""
    config = CkptConfig.from_sources({"memory_budget": budget})
    partitioner = CkptPartitioner(config, resolve_profile(config, []))

    def partition(gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        if tag:
            _tag_gathers(gm)
        forward, backward_module = partitioner(gm, joint_inputs, **kwargs)
        backward.extend(_collectives(backward_module))
        return forward, backward_module

    return compat.aot_module_without_kernels(model, partition)


def _compiled(model: GatheredMLP, budget: str) -> Any:
    torch.compiler.reset()
    return torch.compile(model, backend="ckpt", options={"memory_budget": budget})


def _full(shard: torch.Tensor, world_size: int) -> torch.Tensor:
    pieces = [torch.empty_like(shard) for _ in range(world_size)]
    dist.all_gather(pieces, shard.contiguous())
    return torch.cat(pieces)


def run_scenario(name: str, rank: int, world_size: int, how: str, *, tag: bool, budget: str) -> CollectiveOutcome:
    model = GatheredMLP(rank, world_size, policy=tag and how == "compiled")
    backward: list[str] = []
    step_fn = _traced(model, budget, tag, backward) if how == "traced" else _compiled(model, budget)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    steps, shapes = [], []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not steps:
            shapes.append(tuple(tensor.shape))
        return tensor

    with (
        warnings.catch_warnings(record=True) as caught,
        compat.compile_caches_disabled(),
        record_partitions() as records,
    ):
        warnings.simplefilter("always", BudgetWarning)
        for index, batch in enumerate(input_batches()):
            progress(f"{name}: step {index}")
            local = batch.chunk(world_size)[rank]
            with torch.autograd.graph.saved_tensors_hooks(torch.compiler.disable(pack), lambda tensor: tensor):
                loss = step_fn(local)
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            grads = {n: _full(p.grad, world_size) for n, p in model.named_parameters()}
            steps.append(Step(total, grads))
            optimizer.step()
            optimizer.zero_grad()
    plans = summarize(records)
    return CollectiveOutcome(
        steps=steps,
        plans=plans,
        saved_shapes=shapes,
        backward_collectives=backward,
        budget_warnings=sum(issubclass(w.category, BudgetWarning) for w in caught),
        fingerprints=gather([(plan.graph, plan.fingerprint) for plan in plans], world_size),
    )


SCENARIOS: list[tuple[str, str, bool, str]] = [
    # (name, how, tagged MUST_RECOMPUTE, budget)
    ("traced-untagged-none", "traced", False, "none"),
    ("traced-untagged-0", "traced", False, "0"),
    ("traced-tagged-none", "traced", True, "none"),
    ("traced-tagged-0.5", "traced", True, "0.5"),
    ("traced-tagged-0", "traced", True, "0"),
    ("compiled-untagged-0.5", "compiled", False, "0.5"),
    ("compiled-policy-0.5", "compiled", True, "0.5"),
]


def collectives_worker(rank: int, world_size: int) -> dict[str, CollectiveOutcome]:
    outcomes = {}
    for name, how, tag, budget in SCENARIOS:
        outcomes[name] = run_scenario(name, rank, world_size, how, tag=tag, budget=budget)
        dist.barrier()
    return outcomes


eager_model = functools.partial(GatheredMLP, 0, 1)
