"""What each rank runs: FSDP2 and DDP training under ``backend="ckpt"``.

Each worker runs several scenarios one after the other in the same process
group (a process start and ``import torch`` cost more than a scenario), and
returns, per scenario, the steps (global loss, gathered gradients, saved
bytes), the plan summaries, every rank's fingerprints (gathered with
``dist.all_gather_object``) and the fingerprints the backend logged.

Compile caches are off while a scenario runs, so the partitioner runs for
every graph and leaves a record, and Dynamo is reset between scenarios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ckpt import _torch_compat as compat
from ckpt.measure import saved_activations
from ckpt.module_budgets import clear_budgets, set_budget
from ckpt.records import record_partitions
from tests.distributed.launch import progress
from tests.distributed.models import LR, Step, global_batches, make_net
from tests.distributed.rank_tools import (
    PlanSummary,
    fingerprint_log,
    gather,
    global_loss,
    saved_activation_bytes,
    summarize,
)

__all__ = ["DDP_DIM", "FSDP_DIM", "Outcome", "ddp_worker", "fsdp_worker"]

FSDP_DIM = 16
# torch.compile's DDP optimizer requires buckets of at least DDP's first bucket (1 MiB), so each
# block's weights are 1 MiB: with bucket_cap_mb=1 the model is split into several graphs.
DDP_DIM = 512
DDP_BUCKET_MB = 1


@dataclass
class Outcome:
    """One scenario on one rank."""

    steps: list[Step]
    plans: list[PlanSummary]
    fingerprints: list[list[tuple[str, str | None]]]  # every rank's (graph, fingerprint) pairs, in rank order
    logged: list[tuple[str, str]]  # (graph, fingerprint) from the backend's DEBUG log on this rank
    library_saved: int | str | None = None  # ckpt.measure.saved_activations(model, batch) after training, or its error


# A scenario budget of this form gives the first block its own budget with ckpt.set_budget
# (before fully_shard) and leaves the rest of the model without one.
FIRST_BLOCK = "first-block="


def _options(budget: str) -> dict[str, str]:
    return {"memory_budget": "none" if budget.startswith(FIRST_BLOCK) else budget}


def _train(
    name: str,
    rank: int,
    world_size: int,
    model: nn.Module,
    step_fn: Any,
    batches: list[torch.Tensor],
    full_grad: Any,
    measure: Any,
) -> Outcome:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    with fingerprint_log() as logged, compat.compile_caches_disabled(), record_partitions() as records:
        for index, batch in enumerate(batches):
            progress(f"{name}: step {index}")
            local = batch.chunk(world_size)[rank]
            with measure(model, local) as saved:
                loss = step_fn(local)
            loss.backward()
            grads = {n: full_grad(p.grad) for n, p in model.named_parameters()}
            steps.append(Step(global_loss(loss, world_size), grads, saved.bytes))
            optimizer.step()
            optimizer.zero_grad()
    plans = summarize(records)
    fingerprints = gather([(plan.graph, plan.fingerprint) for plan in plans], world_size)
    return Outcome(steps, plans, fingerprints, list(logged))


def _library_measure(model: nn.Module, step_fn: Any, batch: torch.Tensor) -> int | str:
    """What ``ckpt.measure.saved_activations`` counts for one more step.

    Both ranks fail alike, before any collective.
    """
    try:
        with saved_activations(model, batch) as saved:
            loss = step_fn(batch)
    except RuntimeError as error:
        return f"{type(error).__name__}: {error}"
    loss.backward()
    return saved.bytes


def _fsdp_scenario(name: str, rank: int, world_size: int, wrapping: str, budget: str) -> Outcome:
    from torch.distributed.fsdp import fully_shard

    torch.compiler.reset()
    model = make_net(FSDP_DIM)
    clear_budgets()
    if budget.startswith(FIRST_BLOCK):
        set_budget(model.blocks[0], budget.removeprefix(FIRST_BLOCK))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    if wrapping == "model":
        step_fn = torch.compile(model, backend="ckpt", options=_options(budget))
    elif wrapping == "blocks":
        for block in model.blocks:
            block.compile(backend="ckpt", options=_options(budget))
        step_fn = model
    else:
        raise ValueError(f"unknown FSDP wrapping {wrapping!r}")
    batches = global_batches(FSDP_DIM)
    outcome = _train(
        name,
        rank,
        world_size,
        model,
        step_fn,
        batches,
        full_grad=lambda grad: grad.full_tensor(),
        measure=saved_activation_bytes,
    )
    outcome.library_saved = _library_measure(model, step_fn, batches[0].chunk(world_size)[rank])
    return outcome


def fsdp_worker(rank: int, world_size: int, scenarios: list[tuple[str, str, str]]) -> dict[str, Outcome]:
    """FSDP2 (``fully_shard`` on every block and the root), compiled whole or per block."""
    outcomes = {}
    for name, wrapping, budget in scenarios:
        outcomes[name] = _fsdp_scenario(name, rank, world_size, wrapping, budget)
        dist.barrier()
    return outcomes


def _ddp_scenario(name: str, rank: int, world_size: int, budget: str) -> Outcome:
    from torch.nn.parallel import DistributedDataParallel

    torch.compiler.reset()
    model = make_net(DDP_DIM)
    ddp = DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_MB)
    step_fn = torch.compile(ddp, backend="ckpt", options=_options(budget))
    return _train(
        name,
        rank,
        world_size,
        model,
        step_fn,
        global_batches(DDP_DIM),
        full_grad=lambda grad: grad.detach().clone(),
        measure=saved_activations,
    )


def ddp_worker(rank: int, world_size: int, scenarios: list[tuple[str, str]]) -> dict[str, Outcome]:
    """DDP with a small bucket cap, compiled whole: Dynamo's DDP optimizer splits the graph at buckets."""
    outcomes = {}
    for name, budget in scenarios:
        outcomes[name] = _ddp_scenario(name, rank, world_size, budget)
        dist.barrier()
    return outcomes


def op_costs_worker(rank: int, world_size: int, budget_fraction: float) -> dict[str, Any]:
    """Ranks whose raw timings disagree (matmuls cheap on rank 0, dear on rank 1) plan one traced joint graph.

    Each rank gets a cache of its own, as ranks on different hosts have, and
    fills it with its timings through one planning pass (under a process
    group that pass plans from the agreed table, then empty).  The second pass
    plans from the table the ranks agree on.  Returns the raw and agreed
    tables, the agreed and own profiles, the cost key, the agreed plan's
    fingerprint, and the fingerprint of a plan from this rank's own timings alone.
    """
    import os
    from pathlib import Path

    from benchmarks.language_models import GPT, GPTConfig
    from ckpt.cost_model import measured
    from ckpt.partitioner import solve
    from ckpt.partitioner.analysis import analyze_joint
    from tests.joint import TEST_PROFILE, trace_joint

    os.environ["CKPT_CACHE_DIR"] = str(Path(os.environ["CKPT_CACHE_DIR"]) / f"rank{rank}")
    factor = 0.02 if rank == 0 else 50.0
    measured._time_call = lambda call: call.roofline_seconds * factor  # type: ignore[assignment]
    # The working memory differs as much, and must be agreed on too: it moves the predicted peak.
    measured._measure_scratch = lambda call: 1000 if rank == 0 else 10**6  # type: ignore[assignment]
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=2, dim=32, heads=2, seq=16, batch=2, vocab=64, dropout=0.0))
    joint = trace_joint(model, *model.make_inputs(torch.Generator().manual_seed(0), "cpu", torch.float32))
    device = torch.device("cpu")

    def plan(costs: measured.OpCosts) -> str:
        analysis = analyze_joint(joint.graph, joint.num_fwd_outputs, TEST_PROFILE, measure=costs)
        cap = int(budget_fraction * analysis.no_recompute_bytes)
        return solve(analysis.problem, cap).fingerprint(analysis.problem)

    import dataclasses

    # The ranks' device profiles differ too, as separately calibrated hosts' do.
    own_profile = dataclasses.replace(TEST_PROFILE, bandwidth=TEST_PROFILE.bandwidth * (1 + rank))
    progress("first pass")
    plan(measured.plan_costs(device, own_profile)[0])
    raw = measured.cached_costs(device)
    progress("second pass")
    agreed, profile = measured.plan_costs(device, own_profile)
    return {
        "raw": raw,
        "agreed": agreed.known,
        "profile": profile.key(),
        "own_profile": own_profile.key(),
        "key": agreed.key(),
        "fingerprint": plan(agreed),
        "own_fingerprint": plan(measured.OpCosts(device, raw, use_fresh=False)),
    }
