"""What kind of kernel an FX node becomes, for the fusion-aware cost model.

The kinds follow what Inductor does with an op:

* ``VIEW``: aliases its input (schema alias annotation); free, never a kernel.
* ``FUSIBLE``: pointwise, reduction and data-movement ops that Inductor lowers
  into its own loops, so chains of them fuse into one kernel.
* ``EXTERN``: library calls (matmul, convolution, attention) and ops Inductor
  falls back to eager for; each is its own kernel and materialises its inputs
  and outputs.
* ``RANDOM``: draws from the global generator (``Tag.nondeterministic_seeded``).
* ``COLLECTIVE``: ``_c10d_functional`` and ``c10d`` ops.
* ``MUTATION``: the schema writes to an argument.
* ``GETITEM``: picks one output of a multi-output op.
* ``OTHER``: placeholders, symbolic-size arithmetic and anything unknown.

The fusible/extern split reads Inductor's own lowering tables when they are
importable, and the op tags otherwise.
"""

from __future__ import annotations

import enum
import functools
import operator
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat

__all__ = ["OpKind", "argument_value", "classify", "is_view_op"]


class OpKind(enum.Enum):
    VIEW = "view"
    FUSIBLE = "fusible"
    EXTERN = "extern"
    RANDOM = "random"
    COLLECTIVE = "collective"
    MUTATION = "mutation"
    GETITEM = "getitem"
    OTHER = "other"


def is_view_op(target: Any) -> bool:
    """Whether an aten/prims op returns an alias of an input (and writes nothing)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    if schema.is_mutable:
        return False
    for ret in schema.returns:
        info = ret.alias_info
        if info is not None and not info.is_write:
            return True
    return target.overloadpacket.__name__ in ("_unsafe_view",)


@functools.lru_cache(maxsize=None)
def _lowering_tables() -> tuple[Any, Any, Any] | None:
    return compat.inductor_lowering_tables()


def _is_extern_op(target: torch._ops.OpOverload) -> bool:
    if compat.flop_formula(target) is not None:
        return True
    tables = _lowering_tables()
    if tables is None:
        return not (compat.is_pointwise_op(target) or compat.is_reduction_op(target))
    lowerings, fallbacks, needs_realized = tables
    if target in fallbacks or target in needs_realized:
        return True
    if target in lowerings or target.overloadpacket in lowerings:
        return False
    return not (compat.is_pointwise_op(target) or compat.is_reduction_op(target))


def argument_value(node: fx.Node, target: torch._ops.OpOverload, name: str) -> Any:
    """The value ``node`` passes for ``target``'s argument ``name`` (its default if left out), else None."""
    for index, argument in enumerate(target._schema.arguments):
        if argument.name == name:
            if index < len(node.args):
                return node.args[index]
            return node.kwargs.get(name, argument.default_value)
    return None


def _draws_random(node: fx.Node, target: torch._ops.OpOverload) -> bool:
    """Seeded ops with a dropout probability draw nothing when it is zero (attention without dropout)."""
    names = {argument.name for argument in target._schema.arguments}
    if "dropout_p" in names:
        return argument_value(node, target, "dropout_p") not in (0, 0.0)
    if "train" in names and argument_value(node, target, "train") is False:
        return False
    return True


def classify(node: fx.Node) -> OpKind:
    if node.op != "call_function":
        return OpKind.OTHER
    target = node.target
    if target is operator.getitem:
        return OpKind.GETITEM
    if not isinstance(target, torch._ops.OpOverload):
        if isinstance(target, torch._ops.HigherOrderOperator):
            return OpKind.EXTERN
        return OpKind.OTHER  # python arithmetic on symbolic sizes
    namespace = target.namespace
    if namespace in ("_c10d_functional", "c10d", "_dtensor", "c10d_functional"):
        return OpKind.COLLECTIVE
    if target._schema.is_mutable:
        return OpKind.MUTATION
    if torch.Tag.nondeterministic_seeded in target.tags and _draws_random(node, target):
        return OpKind.RANDOM
    if is_view_op(target):
        return OpKind.VIEW
    if _is_extern_op(target):
        return OpKind.EXTERN
    return OpKind.FUSIBLE
