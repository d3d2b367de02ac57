"""Collectives inside the joint graph: never recomputed unless tagged ``MUST_RECOMPUTE``.

A forward that all-gathers sharded parameters (see
:mod:`tests.distributed.collectives`) runs on two gloo ranks:

* untagged, the all-gathers stay in the forward only; the gathered weight the
  backward needs is saved, at every budget, and at budget 0 the user is told
  that the budget is below the smallest plan;
* tagged ``MUST_RECOMPUTE`` (by hand, as traced FSDP tags them, or by a
  selective-checkpoint policy under ``torch.compile``), the gathered weights are
  never saved: the backward gathers them again.

In every case the losses and the gathered gradients equal one eager process
holding the full weights, and every rank makes the same plan.
"""

from __future__ import annotations

import pytest

from tests.distributed.collectives import FULL_SHAPES, SCENARIOS, collectives_worker, eager_model, input_batches
from tests.distributed.launch import run_ranks
from tests.distributed.models import assert_steps_close, eager_reference

pytestmark = [pytest.mark.compile, pytest.mark.compat]  # one launch of two ranks runs every scenario

NAMES = [name for name, _, _, _ in SCENARIOS]
UNTAGGED = [name for name, _, tagged, _ in SCENARIOS if not tagged]
TAGGED = [name for name, _, tagged, _ in SCENARIOS if tagged]
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(collectives_worker, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def reference():
    return eager_reference(eager_model(), input_batches())


def _collective(name: str) -> bool:
    return name.startswith(("all_gather", "wait_tensor", "reduce_scatter"))


@pytest.mark.parametrize("name", NAMES)
def test_losses_and_gathered_gradients_match_eager(ranks, reference, name):
    for outcome in (rank[name] for rank in ranks):
        assert_steps_close(outcome.steps, reference)


@pytest.mark.parametrize("name", UNTAGGED)
def test_untagged_collectives_are_never_recomputed(ranks, name):
    outcome = ranks[0][name]
    (plan,) = outcome.plans
    assert not [value for value in plan.recomputed if _collective(value)], plan.recomputed
    assert any(_collective(value) for value in plan.saved), "the gathered weight the backward reads is saved"
    assert FULL_SHAPES[1] in outcome.saved_shapes, outcome.saved_shapes
    assert "all_gather_into_tensor.default" not in outcome.backward_collectives


def test_untagged_gathers_put_a_floor_under_the_budget(ranks):
    outcome = ranks[0]["traced-untagged-0"]
    (plan,) = outcome.plans
    assert plan.over_budget and plan.plan_bytes == plan.minimum_bytes > 0
    assert outcome.budget_warnings == 1


@pytest.mark.parametrize("name", TAGGED)
def test_tagged_gathers_are_gathered_again_not_saved(ranks, name):
    outcome = ranks[0][name]
    (plan,) = outcome.plans
    assert not [value for value in plan.saved if _collective(value)], plan.saved
    assert [value for value in plan.recomputed if value.startswith("all_gather")], plan.recomputed
    assert not set(FULL_SHAPES) & set(outcome.saved_shapes), outcome.saved_shapes
    assert outcome.budget_warnings == 0
    if name.startswith("traced"):  # v, whose full weight the backward reads for the gradient of h
        assert outcome.backward_collectives.count("all_gather_into_tensor.default") >= 1


@pytest.mark.parametrize("name", NAMES)
def test_every_rank_makes_the_same_plan(ranks, name):
    everyone = ranks[0][name].fingerprints
    assert len(everyone[0]) == 1 and everyone[0][0][1] is not None
    assert all(pairs == everyone[0] for pairs in everyone), everyone
