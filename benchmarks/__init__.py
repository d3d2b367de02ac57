"""Benchmarks: ckpt against every alternative, step time against activation memory.

``python -m benchmarks.run`` measures five model families under eager,
eager with ``torch.utils.checkpoint``, default ``torch.compile``, torch's own
``activation_memory_budget`` and ``backend="ckpt"`` at several budgets, and
writes a table, a JSON file and a Pareto plot.  ``python -m
benchmarks.solver_speed`` times the partitioner's solver alone on large joint
graphs.  See ``benchmarks/README.md``.
"""
