"""The launcher the distributed tests rely on: a hang or a failing rank ends the run, never CI.

A rank that waits forever (a collective its peer never joins) is killed at the
time limit and the test fails with the step each rank was at; a rank that
raises stops the others at once, with its traceback; a rank that crashes in
native code is reported with its last step and the stack faulthandler wrote,
and the launch is tried once more.  The last case is the hang this issue is
about: two ranks that plan one graph differently issue different collectives
in the backward and wait for each other forever.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.distributed.launch import RankCrashed, RankCrashWarning, RankFailed, RanksTimedOut, progress, run_ranks

pytestmark = pytest.mark.compile  # each case starts two ranks

TIMEOUT_S = 10.0
SLACK_S = 8.0  # terminate, a grace period, kill
DIVERGING_TIMEOUT_S = 25.0  # a start, a trace and a step take under 12 s


def waits_for_a_peer_that_never_comes(rank: int, world_size: int) -> None:
    if rank == 0:
        progress("barrier")
        dist.barrier()
    else:
        progress("sleeping")
        time.sleep(3600)


def raises_while_its_peer_waits(rank: int, world_size: int) -> None:
    if rank == 0:
        dist.barrier()
    else:
        raise ValueError("rank 1 gives up")


def aborts_in_native_code(rank: int, world_size: int, marker: str) -> int:
    """Rank 1 aborts the first time (or every time, without a marker); rank 0 waits for it."""
    if rank == 1 and (not marker or not os.path.exists(marker)):
        if marker:
            Path(marker).touch()
        progress("about to abort")
        os.abort()
    dist.barrier()
    return rank


def plans_differently(rank: int, world_size: int) -> None:
    """Rank 0 saves what rank 1 recomputes, so their backwards re-gather different weights."""
    from tests.distributed.collectives import run_scenario

    run_scenario("diverging plans", rank, world_size, "traced", tag=True, budget=("none", "0")[rank])


def test_a_hang_fails_within_the_time_limit():
    started = time.monotonic()
    with pytest.raises(RanksTimedOut, match="did not finish within"):
        run_ranks(waits_for_a_peer_that_never_comes, timeout=TIMEOUT_S)
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S


def test_a_failing_rank_stops_its_peers():
    started = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 gives up"):
        run_ranks(raises_while_its_peer_waits, timeout=120)
    assert time.monotonic() - started < 60, "the waiting rank was stopped, not left to the time limit"


def test_ranks_with_different_plans_hang_and_the_time_limit_ends_it():
    started = time.monotonic()
    with pytest.raises((RanksTimedOut, RankFailed)) as caught:  # gloo may also notice the mismatch and raise
        run_ranks(plans_differently, timeout=DIVERGING_TIMEOUT_S)
    assert time.monotonic() - started < DIVERGING_TIMEOUT_S + SLACK_S
    message = str(caught.value)
    if caught.type is RanksTimedOut:  # both ranks reached the step and waited there
        assert "rank 0: diverging plans: step 0" in message and "rank 1: diverging plans: step 0" in message
    else:
        assert "gloo" in message.lower(), message


def test_a_crash_in_native_code_is_reported_with_the_stack_and_tried_once_more():
    with pytest.warns(RankCrashWarning) as warned, pytest.raises(RankCrashed) as crashed:
        run_ranks(aborts_in_native_code, "", timeout=60)
    assert len(warned) == 1, "one more try, not more"
    for message in (str(warned[0].message), str(crashed.value)):
        assert "terminated with signal SIGABRT" in message, message
        assert "rank 1: about to abort" in message, message
        assert "Fatal Python error: Aborted" in message and "in aborts_in_native_code" in message, message


def test_a_crash_that_does_not_come_back_gives_the_results(tmp_path):
    with pytest.warns(RankCrashWarning, match="SIGABRT"):
        assert run_ranks(aborts_in_native_code, str(tmp_path / "crashed once"), timeout=60) == [0, 1]
