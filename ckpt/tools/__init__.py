"""The user tools: explain, the Pareto curve and validate, the budget sweep, the demo.

They compile a copy of the user's model, read the partitioner's records
(:mod:`ckpt.records`) and measure steps.  Nothing in ``ckpt``'s core imports
them.
"""
