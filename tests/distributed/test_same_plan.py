"""Every rank must make the same plan, however fast it runs.

Ranks compile the same graph at the same time, but not at the same speed: a
rank that shares its cores with a data loader, or a slower host, gets through
less work per second.  If the plan depended on wall-clock time, the ranks'
forward and backward graphs would differ; with collectives inside the graphs,
the ranks would then issue different collectives and hang.

The solver's repair search stops at a wall-clock deadline
(``solver_time_limit``, 0.5 s by default).  On a two-layer GPT at budget 0.75
the search does not finish within it, so the plan depends on how many search
nodes the rank got through: :func:`test_a_slower_rank_makes_the_same_plan`
runs the same solve under a clock that ticks ten times faster per call (a rank
ten times slower) and gets a different plan.
"""

from __future__ import annotations

import pytest
import torch

import ckpt.partitioner.solver as solver_module
from benchmarks.language_models import GPT, GPTConfig
from ckpt.config import CkptConfig
from ckpt.partitioner import solve
from ckpt.partitioner.analysis import to_picoseconds
from tests.joint import trace_joint

FRACTION = 0.75


class _TickingClock:
    """A clock that advances a fixed step per reading: the search's progress per second, made exact."""

    def __init__(self, seconds_per_reading: float) -> None:
        self.now = 0.0
        self.step = seconds_per_reading

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture(scope="module")
def gpt_joint():
    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=2, dim=32, heads=2, seq=16, batch=2, vocab=64, dropout=0.0))
    idx, targets = model.make_inputs(torch.Generator().manual_seed(0), "cpu", torch.float32)
    return trace_joint(model, idx, targets)


def _plan_fingerprint(joint, seconds_per_reading: float, monkeypatch, time_limit: float | None = None) -> str:
    analysis = joint.analysis
    monkeypatch.setattr(solver_module, "_time", _TickingClock(seconds_per_reading))
    plan = solve(
        analysis.problem,
        int(FRACTION * analysis.no_recompute_bytes),
        time_limit=CkptConfig().solver_time_limit if time_limit is None else time_limit,
        tolerance_ps=to_picoseconds(analysis.fixed_seconds * 5e-3),  # as the backend sets it
    )
    return plan.fingerprint(analysis.problem)


def test_the_same_speed_gives_the_same_plan(gpt_joint, monkeypatch):
    assert _plan_fingerprint(gpt_joint, 1e-3, monkeypatch) == _plan_fingerprint(gpt_joint, 1e-3, monkeypatch)


@pytest.mark.xfail(
    strict=True,
    reason="the repair search in ckpt.partitioner.solver.solve stops at a wall-clock deadline (solver_time_limit), "
    "so a rank ten times slower explores about a tenth of the branch-and-bound nodes (11 against about 150 here) "
    "and returns another plan; the search needs a budget of work (min cuts or nodes), the same on every rank",
)
def test_a_slower_rank_makes_the_same_plan(gpt_joint, monkeypatch):
    fast = _plan_fingerprint(gpt_joint, 1e-3, monkeypatch)
    slow = _plan_fingerprint(gpt_joint, 1e-2, monkeypatch)
    assert slow == fast


def test_without_a_time_limit_a_slower_rank_makes_the_same_plan(gpt_joint, monkeypatch):
    """The documented workaround (CKPT_SOLVER_TIME_LIMIT=0): the search stops at its first deadline check."""
    fast = _plan_fingerprint(gpt_joint, 1e-3, monkeypatch, time_limit=0.0)
    assert _plan_fingerprint(gpt_joint, 1e-2, monkeypatch, time_limit=0.0) == fast
