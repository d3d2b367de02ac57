"""Every rank must make the same plan, however fast it runs.

Ranks compile the same graph at the same time, but not at the same speed: a
rank that shares its cores with a data loader, or a slower host, gets through
less work per second.  If the plan depended on wall-clock time, the ranks'
forward and backward graphs would differ; with collectives inside the graphs,
the ranks would then issue different collectives and hang.

The solver's repair search therefore stops at a budget of work (edges
processed by its min cuts), never at a wall-clock deadline.  On a two-layer
GPT at budget 0.75 the search does not finish within that budget, so the test
runs the same solve under clocks of different speeds and checks that the plan
does not change.
"""

from __future__ import annotations

import time

import pytest
import torch

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


def _plan(joint, seconds_per_reading: float, monkeypatch, effort: float | None = None):
    analysis = joint.analysis
    monkeypatch.setattr(time, "perf_counter", _TickingClock(seconds_per_reading).perf_counter)
    return solve(
        analysis.problem,
        int(FRACTION * analysis.no_recompute_bytes),  # a byte cap where the repair search has work to do
        effort=CkptConfig().solver_effort if effort is None else effort,
        tolerance_ps=to_picoseconds(analysis.fixed_seconds * 5e-3),  # as the backend sets it
    )


def test_the_same_speed_gives_the_same_plan(gpt_joint, monkeypatch):
    problem = gpt_joint.analysis.problem
    first, second = _plan(gpt_joint, 1e-3, monkeypatch), _plan(gpt_joint, 1e-3, monkeypatch)
    assert first.fingerprint(problem) == second.fingerprint(problem)


def test_a_slower_rank_makes_the_same_plan(gpt_joint, monkeypatch):
    problem = gpt_joint.analysis.problem
    fast = _plan(gpt_joint, 1e-3, monkeypatch)
    slow = _plan(gpt_joint, 1e-1, monkeypatch)
    assert not fast.optimal, "the search must stop at its work limit here, or this test shows nothing"
    assert slow.fingerprint(problem) == fast.fingerprint(problem)
    assert (slow.cuts, slow.search_nodes) == (fast.cuts, fast.search_nodes)


def test_more_effort_searches_further_and_never_does_worse(gpt_joint, monkeypatch):
    default = _plan(gpt_joint, 1e-3, monkeypatch)
    more = _plan(gpt_joint, 1e-3, monkeypatch, effort=4.0)
    assert more.cuts > default.cuts
    assert (more.time, more.bytes) <= (default.time, default.bytes)
