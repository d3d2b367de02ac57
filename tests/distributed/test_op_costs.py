"""Ranks whose measured op costs differ still make the same plan.

Measured times differ from host to host, and ranks whose plans differ issue
different collectives and hang.  Under a process group the ranks join their
cached tables (each call's time from the lowest rank that has one) and plan
from that.  Here the two ranks' raw timings are made to disagree by a factor
of 2,500 on every library call, enough that each rank's own timings give it a
different plan; the agreed table must give both the same one.
"""

from __future__ import annotations

import pytest

from tests.distributed.launch import run_ranks
from tests.distributed.workers import op_costs_worker

pytestmark = pytest.mark.compat

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(op_costs_worker, 0.5, timeout=TIMEOUT_S)


def test_the_raw_timings_disagree_and_would_give_different_plans(ranks):
    first, second = ranks
    assert first["raw"] and set(first["raw"]) == set(second["raw"])
    assert all(second["raw"][k] > 100 * v for k, v in first["raw"].items())
    assert first["own_fingerprint"] != second["own_fingerprint"], "the test needs timings that change the plan"


def test_every_rank_plans_from_rank_zeros_timings(ranks):
    first, second = ranks
    assert first["agreed"] == second["agreed"] == first["raw"]
    assert first["key"] == second["key"]
    assert first["fingerprint"] == second["fingerprint"] == first["own_fingerprint"]


def test_every_rank_plans_with_rank_zeros_device_profile(ranks):
    first, second = ranks
    assert first["own_profile"] != second["own_profile"]
    assert first["profile"] == second["profile"] == first["own_profile"]
