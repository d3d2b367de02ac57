"""FLOPs and bytes of one FX node, from its ``meta["val"]``.

FLOPs come from ``torch.utils.flop_counter``'s registered formulas, called on
shapes made of ``sympy`` expressions so that symbolic sizes stay symbolic;
ops without a formula count one FLOP per output element (pointwise) or per
input element (reductions).  Bytes are storage bytes of the tensors read and
written.  Every count is kept as a ``sympy`` expression and evaluated with the
shape environment's size hints, which never adds a guard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypeAlias

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ckpt import _torch_compat as compat
from ckpt.cost_model.ops import OpKind, classify

__all__ = [
    "NodeEstimate",
    "Size",
    "SizeEvaluator",
    "is_transcendental",
    "dtype_class",
    "estimate_node",
    "tensor_values",
]

log = logging.getLogger(__name__)

_UNBACKED_FALLBACK = 4096


def tensor_values(value: Any) -> list[torch.Tensor]:
    """The tensors in a node value (a tensor, or a tuple/list of them)."""
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def dtype_class(dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float64:
        return "fp64"
    return "fp32"


Size: TypeAlias = "int | sympy.Expr"  # static sizes stay plain ints, which keeps large graphs fast


def size_expr(size: Any) -> Size:
    """One dimension of a shape (or a stride) as an int, or a ``sympy`` expression of its symbols."""
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        return int(expr) if expr.is_Integer else expr
    return int(size)


class SizeEvaluator:
    """Turns ``sympy`` size expressions into integers with the graph's size hints."""

    def __init__(self, hints: dict[Any, int] | None = None) -> None:
        self._hints = dict(hints or {})

    @property
    def hints(self) -> dict[Any, int]:
        return dict(self._hints)

    @classmethod
    def for_graph(cls, graph: fx.Graph) -> SizeEvaluator:
        shape_env = compat.shape_env_of(n.meta.get("val") for n in graph.nodes)
        return cls(compat.symbol_hints(shape_env))

    def __call__(self, expr: Size) -> int:
        if isinstance(expr, int):
            return expr
        value = sympy.sympify(expr).xreplace(self._hints)
        if value.free_symbols:
            log.debug("no size hint for %s; using %d", sorted(map(str, value.free_symbols)), _UNBACKED_FALLBACK)
            value = value.xreplace({s: _UNBACKED_FALLBACK for s in value.free_symbols})
        return int(value)


def storage_bytes_expr(tensor: torch.Tensor) -> Size:
    """Bytes of the smallest storage that holds ``tensor`` at its strides.

    A symbolic size is taken to be non-zero.
    """
    sizes = [size_expr(s) for s in tensor.shape]
    if any(isinstance(s, int) and s == 0 for s in sizes):
        return 0
    strides = [size_expr(s) for s in tensor.stride()]
    span: Size = 1
    for size, stride in zip(sizes, strides):
        span = span + (size - 1) * stride
    return span * tensor.element_size()


def numel_expr(tensor: torch.Tensor) -> Size:
    numel: Size = 1
    for size in tensor.shape:
        numel = numel * size_expr(size)
    return numel


def _shape_arg(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(size_expr(s) for s in value.shape)
    if isinstance(value, torch.SymInt):
        return size_expr(value)
    return value


def flops_expr(node: fx.Node, kind: OpKind) -> Size:
    """FLOPs of one execution of ``node``."""
    if kind in (OpKind.VIEW, OpKind.GETITEM, OpKind.OTHER, OpKind.MUTATION, OpKind.COLLECTIVE):
        return 0
    formula = compat.flop_formula(node.target)
    if formula is not None:
        args, kwargs = pytree.tree_map(
            lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a, (node.args, node.kwargs)
        )
        out = node.meta.get("val")
        try:
            shape_args, shape_kwargs, out_shape = pytree.tree_map(_shape_arg, (args, kwargs, out))
            result = formula(*shape_args, out_val=out_shape, **shape_kwargs)
        except (TypeError, ValueError, AttributeError, IndexError, AssertionError, RuntimeError) as error:
            log.debug("flop formula for %s failed on symbolic shapes (%s)", node.target, error)
            return 0
        return int(result) if isinstance(result, int) or getattr(result, "is_Integer", False) else result
    outputs = tensor_values(node.meta.get("val"))
    inputs = [v for a in node.all_input_nodes for v in tensor_values(a.meta.get("val"))]
    if compat.is_reduction_op(node.target) and inputs:
        return numel_expr(inputs[0])
    return sum((numel_expr(t) for t in outputs), 0)


# Element-wise ops that cost several times a multiply: their per-element price is the
# profile's transcendental rate.
_TRANSCENDENTAL = frozenset(
    {
        "erf", "erfc", "erfinv", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid",
        "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh",
        "pow", "lgamma", "digamma", "gelu", "silu", "softplus", "mish", "logit",
    }
)  # fmt: skip


def is_transcendental(node: fx.Node) -> bool:
    name = getattr(getattr(node.target, "overloadpacket", node.target), "__name__", "")
    return name in _TRANSCENDENTAL or name.startswith("special_")


@dataclass(frozen=True)
class NodeEstimate:
    """What executing one node costs, before any roofline.

    ``elements`` is the element-wise work of a fused op (output elements, or
    input elements for a reduction); ``transcendental`` says it is priced at
    the transcendental rate, ``random`` that it draws random numbers (priced
    at the profile's rate for a draw); ``convolution`` says a library call is a
    convolution (priced at the profile's convolution efficiency).
    """

    kind: OpKind
    flops: int
    bytes_read: int
    bytes_written: int
    dtype_class: str
    flops_expr: Size
    bytes_written_expr: Size
    elements: int = 0
    transcendental: bool = False
    convolution: bool = False
    random: bool = False


def estimate_node(node: fx.Node, sizes: SizeEvaluator) -> NodeEstimate:
    kind = classify(node)
    outputs = tensor_values(node.meta.get("val"))
    written: Size = 0
    if kind not in (OpKind.VIEW, OpKind.GETITEM) and node.op == "call_function":
        written = sum((storage_bytes_expr(t) for t in outputs), 0)
    read: Size = 0
    if node.op == "call_function" and kind not in (OpKind.VIEW, OpKind.GETITEM):
        for arg in node.all_input_nodes:
            for tensor in tensor_values(arg.meta.get("val")):
                read += numel_expr(tensor) * tensor.element_size()
    flops = flops_expr(node, kind)
    dtype = outputs[0].dtype if outputs else torch.float32
    if kind is OpKind.EXTERN and node.all_input_nodes:
        first_inputs = tensor_values(node.all_input_nodes[0].meta.get("val"))
        if first_inputs:
            dtype = first_inputs[0].dtype
    elements = 0
    if kind in (OpKind.FUSIBLE, OpKind.RANDOM):
        inputs = [v for a in node.all_input_nodes for v in tensor_values(a.meta.get("val"))]
        is_reduction = compat.is_reduction_op(node.target)
        counted = inputs[:1] if is_reduction and inputs else outputs
        elements = sizes(sum((numel_expr(t) for t in counted), 0))
    packet = getattr(node.target, "overloadpacket", None)
    return NodeEstimate(
        kind=kind,
        flops=sizes(flops),
        bytes_read=sizes(read),
        bytes_written=sizes(written),
        dtype_class=dtype_class(dtype),
        flops_expr=flops,
        bytes_written_expr=written,
        elements=elements,
        transcendental=is_transcendental(node),
        convolution=getattr(packet, "__name__", "").startswith("convolution"),
        # Inductor's own draw is a pure function of its seed, so it classifies as pointwise.
        random=kind is OpKind.RANDOM or compat.is_inductor_random(node.target),
    )
