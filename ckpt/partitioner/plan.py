"""The one result type every solver returns."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ckpt.partitioner.problem import Problem, evaluate

__all__ = ["Plan", "make_plan"]


@dataclass(frozen=True)
class Plan:
    """Which values are saved and which are recomputed, and what that costs.

    ``time`` is the plan's variable cost in picoseconds (saving plus
    recomputation); the fixed forward and backward work is not included.
    ``lower_bound`` is a proven lower bound on the time of any plan within the
    budget, where the solver has one; ``optimal`` says the plan reaches it.
    ``budget_bytes`` is the cap the solver was given (None for no cap), and
    ``minimum_bytes`` the smallest memory any plan can reach, where known.
    ``over_regions`` names the per-region caps (per-module budgets) the plan
    exceeds, when no plan found keeps them all.
    """

    saved: tuple[int, ...]
    recomputed: tuple[int, ...]
    time: int
    bytes: int
    solver: str
    optimal: bool
    lower_bound: int | None = None
    budget_bytes: int | None = None
    minimum_bytes: int | None = None
    price: tuple[int, int] | None = None  # (time weight, byte weight) of the last cut
    price_per_byte: float | None = None  # λ: picoseconds of step time one byte is worth at the budget
    cuts: int = 0
    search_nodes: int = 0
    over_regions: tuple[str, ...] = ()

    @property
    def over_budget(self) -> bool:
        return bool(self.over_regions) or (self.budget_bytes is not None and self.bytes > self.budget_bytes)

    def fingerprint(self, problem: Problem) -> str:
        """A short hash of the decisions, equal on every process that makes the same plan."""
        text = "saved:" + ",".join(problem.names[i] for i in self.saved)
        text += "|recomputed:" + ",".join(problem.names[i] for i in self.recomputed)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_plan(problem: Problem, saved: frozenset[int] | set[int], solver: str, **extra: object) -> Plan:
    """Evaluate ``saved`` on ``problem`` and wrap it as a :class:`Plan`.

    A value in ``saved`` that the backward never reads (not needed, and read by
    no recomputed value) is dropped: the compiled graph would not keep it, so a
    plan that counted its bytes would report more memory than the step holds.
    """
    time, memory, recomputed = evaluate(problem, saved)
    # Dropping what nothing reads leaves the recompute closure as it is: only their own costs go.
    read = set(problem.needed_values).union(*(problem.inputs[r] for r in recomputed))
    unread = [i for i in saved if i not in read]
    time -= sum(problem.save_time[i] for i in unread)
    memory -= sum(problem.save_bytes[i] for i in unread)
    return Plan(
        saved=tuple(sorted(set(saved).difference(unread))),
        recomputed=tuple(sorted(recomputed)),
        time=time,
        bytes=memory,
        solver=solver,
        **extra,  # type: ignore[arg-type]
    )
