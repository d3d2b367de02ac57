"""DDP under ``backend="ckpt"``: Dynamo's DDP optimizer splits the model into one graph per bucket.

With ``bucket_cap_mb=1`` (the least torch.compile accepts: DDP's first bucket
is 1 MiB) and 1 MiB weight matrices, the model compiles into several graphs,
each planned on its own.  The budget applies per graph: a fraction is a
fraction of each graph's own no-recompute bytes, and an absolute size caps
every graph at that size, so the whole model may save up to the number of
graphs times it.  Gradients must equal a single-process eager run, and every
rank must make the same plan for every graph.
"""

from __future__ import annotations

import math

import pytest

from tests.distributed.launch import run_ranks
from tests.distributed.models import assert_steps_close, eager_reference, global_batches, make_net
from tests.distributed.workers import DDP_DIM, ddp_worker

pytestmark = pytest.mark.compile

ABSOLUTE = "6KiB"
ABSOLUTE_BYTES = 6 * 1024
SCENARIOS = [("ddp-0.5", "0.5"), ("ddp-absolute", ABSOLUTE)]
NAMES = [name for name, _ in SCENARIOS]
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(ddp_worker, SCENARIOS, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def reference():
    return eager_reference(make_net(DDP_DIM), global_batches(DDP_DIM))


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_eager(ranks, reference, name):
    for outcome in (rank[name] for rank in ranks):
        assert_steps_close(outcome.steps, reference)


@pytest.mark.parametrize("name", NAMES)
def test_the_bucket_split_gives_several_planned_graphs(ranks, name):
    plans = ranks[0][name].plans
    assert len({plan.graph for plan in plans}) > 1, [plan.graph for plan in plans]
    assert all(plan.fallback_reason is None for plan in plans)


def test_a_fraction_is_kept_by_every_graph(ranks):
    """Each graph's cap is half of its own no-recompute bytes, and its plan keeps it."""
    for plan in ranks[0]["ddp-0.5"].plans:
        assert plan.budget_bytes == math.floor(0.5 * plan.reference_bytes), plan
        assert plan.within_budget, plan


def test_an_absolute_budget_caps_each_graph_not_the_model(ranks):
    """Every graph gets the whole cap; the step as a whole saves more, in the activations passed between graphs."""
    outcome = ranks[0]["ddp-absolute"]
    assert all(plan.budget_bytes == ABSOLUTE_BYTES for plan in outcome.plans), outcome.plans
    assert all(plan.within_budget for plan in outcome.plans), outcome.plans
    assert outcome.steps[0].saved_bytes > ABSOLUTE_BYTES


@pytest.mark.parametrize("name", NAMES)
def test_every_rank_makes_the_same_plan(ranks, name):
    everyone = ranks[0][name].fingerprints
    assert all(pairs == everyone[0] for pairs in everyone), everyone
    for rank, outcomes in enumerate(ranks):
        assert outcomes[name].logged == everyone[rank]
