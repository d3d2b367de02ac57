"""Plain-data planning: the problem, the solvers, the plan, and extraction."""

from ckpt.partitioner.exhaustive import solve_exhaustive
from ckpt.partitioner.plan import Plan
from ckpt.partitioner.problem import Problem, ProblemError, evaluate, recompute_closure
from ckpt.partitioner.solver import solve

__all__ = ["Plan", "Problem", "ProblemError", "evaluate", "recompute_closure", "solve", "solve_exhaustive"]
