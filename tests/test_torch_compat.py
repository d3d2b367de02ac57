"""The version shims in ``ckpt._torch_compat`` give the same answers on every supported torch."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import ckpt._torch_compat as compat
from ckpt.cost_model import SizeEvaluator, estimate_node

aten = torch.ops.aten

pytestmark = pytest.mark.compat


@pytest.mark.parametrize(
    ("op", "reduces"),
    [
        (aten.sum.dim_IntList, True),
        (aten.amax.default, True),
        (aten.var_mean.correction, True),
        (aten.max.dim, True),
        (aten.max.other, False),  # elementwise maximum of two tensors
        (aten.mul.Tensor, False),
        (aten.mm.default, False),
    ],
    ids=lambda value: str(value),
)
def test_reductions_are_recognised_with_or_without_the_reduction_tag(monkeypatch, op, reduces):
    assert compat.is_reduction_op(op) is reduces
    # torch 2.9's Tag enum has no ``reduction``: the shim answers from its own table.
    monkeypatch.setattr(compat.torch, "Tag", _TagsWithoutReduction)
    assert compat.is_reduction_op(op) is reduces


class _TagsWithoutReduction:
    pointwise = torch.Tag.pointwise


@pytest.mark.skipif(not hasattr(torch.Tag, "reduction"), reason="this torch has no reduction tag to compare with")
def test_the_reduction_table_agrees_with_this_torchs_tags():
    """Every overload in the table for torch 2.9 is still a tagged reduction here, so the two agree."""
    for name in sorted(compat._REDUCTION_OVERLOADS):
        namespace, packet, overload = name.split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
        assert torch.Tag.reduction in op.tags, f"{name} is not tagged a reduction in torch {torch.__version__}"


def test_a_reduction_costs_its_input_elements():
    """A sum reads every element of its input: the cost model counts those, not the one it writes."""
    graph = make_fx(lambda x: x.sum(dim=1), tracing_mode="fake")(torch.randn(64, 32)).graph
    (node,) = [n for n in graph.nodes if n.op == "call_function"]
    assert estimate_node(node, SizeEvaluator.for_graph(graph)).elements == 64 * 32


@pytest.mark.parametrize("threads", [1, 2])
def test_inductor_runs_a_scatter_add_as_a_library_call_exactly_when_the_peak_model_says(threads):
    """The peak model's question (a library call, or a kernel?) against the code Inductor generates."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        expected = compat.inductor_scatter_sum_is_library_call(torch.float32, torch.float32, "cpu")
        torch._dynamo.reset()
        step = torch.compile(lambda x, i, s: x.scatter_add(1, i, s), backend="inductor")
        args = torch.zeros(4, 16), torch.randint(0, 16, (4, 8)), torch.randn(4, 8)
        with compat.compile_caches_disabled():
            result, code = compat.run_and_get_code(step, *args)
    finally:
        torch.set_num_threads(previous)
        torch._dynamo.reset()
    torch.testing.assert_close(result, args[0].scatter_add(1, args[1], args[2]))
    if torch._inductor.config.cpp.fallback_scatter_reduce_sum and not torch.are_deterministic_algorithms_enabled():
        assert expected == (threads > 1)  # Inductor's defaults: aten's call on a CPU with threads
    assert ("scatter_reduce_" in "\n".join(code)) == expected
