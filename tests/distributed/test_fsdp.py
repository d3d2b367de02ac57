"""FSDP2 under ``backend="ckpt"``: two ranks, gloo, against one eager process on the global batch.

``fully_shard`` wraps every block and the root.  The model is compiled either
whole (``torch.compile(model)``: Dynamo runs FSDP's hooks eagerly and compiles
what lies between them) or block by block (``block.compile()``, the form FSDP2
recommends).  Three SGD steps run at each budget; after every step the global
loss and the gathered gradients must equal a single-process eager run, every
graph's plan must keep its own cap, and every rank must have made the same
plan for every graph.
"""

from __future__ import annotations

import pytest

from tests.distributed.launch import run_ranks
from tests.distributed.models import assert_steps_close, eager_reference, global_batches, make_net
from tests.distributed.workers import FSDP_DIM, fsdp_worker

pytestmark = pytest.mark.compile

SCENARIOS = [
    ("model-none", "model", "none"),
    ("model-0.5", "model", "0.5"),
    ("model-0", "model", "0"),
    ("blocks-0.5", "blocks", "0.5"),
    ("blocks-0", "blocks", "0"),
    ("model-first-block-0", "model", "first-block=0"),
    ("blocks-first-block-0", "blocks", "first-block=0"),
]
NAMES = [name for name, _, _ in SCENARIOS]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def ranks():
    """Every scenario's outcome on each rank (one process group for all of them)."""
    return run_ranks(fsdp_worker, SCENARIOS, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def reference():
    return eager_reference(make_net(FSDP_DIM), global_batches(FSDP_DIM))


@pytest.mark.parametrize("name", NAMES)
def test_losses_and_gathered_gradients_match_eager(ranks, reference, name):
    for outcome in (rank[name] for rank in ranks):
        assert_steps_close(outcome.steps, reference)


@pytest.mark.parametrize("name", NAMES)
def test_every_graph_keeps_its_budget(ranks, name):
    plans = ranks[0][name].plans
    assert plans, "the ckpt partitioner never ran"
    for plan in plans:
        assert plan.fallback_reason is None
        assert plan.within_budget, plan


@pytest.mark.parametrize("name", NAMES)
def test_every_rank_makes_the_same_plan(ranks, name):
    everyone = ranks[0][name].fingerprints
    assert all(pairs == everyone[0] for pairs in everyone), everyone
    assert all(fingerprint is not None for _, fingerprint in everyone[0])
    profiles = {plan.profile for outcomes in ranks for plan in outcomes[name].plans}
    assert len(profiles) == 1, "ranks on one machine share one calibrated cpu profile"
    for rank, outcomes in enumerate(ranks):
        assert outcomes[name].logged == everyone[rank], "the DEBUG log names the recorded fingerprints"


@pytest.mark.parametrize("name", ["model-first-block-0", "blocks-first-block-0"])
def test_a_per_module_budget_applies_under_fsdp2(ranks, name):
    """ckpt.set_budget on a block that fully_shard then wraps: the graphs with its values keep its cap."""
    plans = ranks[0][name].plans
    capped = [plan for plan in plans if plan.regions]
    assert capped, [plan.graph for plan in plans]
    assert all(kept <= cap for plan in capped for kept, cap in plan.regions.values()), capped
    assert ranks[0][name].steps[0].saved_bytes < ranks[0]["model-none"].steps[0].saved_bytes


def test_the_budget_lowers_saved_activations(ranks):
    """Measured per rank, leaving out the shards and the unsharded parameters FSDP holds while saving."""
    measured = {name: ranks[0][name].steps[0].saved_bytes for name in NAMES}
    assert measured["model-0"] < measured["model-none"], measured
    assert measured["model-0.5"] <= measured["model-none"], measured
    assert measured["blocks-0"] < measured["blocks-0.5"], measured


def test_ckpt_measure_counts_what_the_budget_counts_under_fsdp2(ranks):
    """ckpt.measure, on one more step, agrees with the measurement above (which reads the parameters when saving)."""
    outcome = ranks[0]["model-none"]
    assert outcome.library_saved == outcome.steps[0].saved_bytes
