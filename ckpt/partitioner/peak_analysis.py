"""From an AOTAutograd joint graph and its analysis to a plain-data :class:`PeakGraph`.

The graph is read once; :mod:`ckpt.partitioner.peak` then simulates any plan
on the result without touching ``torch.fx``.

* **Values** are the joint graph's nodes with views folded into the value they
  alias (the analysis's ``root_names``), in graph order.
* **Phase.** A call is in the backward exactly when the analysis did not put
  it in the forward (``forward_names``); tangent placeholders are backward
  inputs.  The forward must compute the ancestors of its outputs.
* **What materialises** follows the cost model's op kinds (:class:`OpKind`):
  pointwise ops (``FUSIBLE``) fuse unless a reduction or library call needs
  them; reductions and everything else (library calls, collectives, mutations,
  multi-output ops' outputs) allocate.  Random draws are ``RANDOM``: Inductor
  realises every random tensor it generates, in float32 whatever the op's
  dtype, so that all its readers see the same numbers, and keeps it when
  more than one kernel reads it (a backward that recomputes a dropout's output
  holds the draw until the dropout's gradient reads it).  Parameters and the user's inputs live
  anyway and count nothing; tangents count.  Inductor gives a convolution
  channels-last copies of the inputs it reads (its weight, an image): those
  the forward saves as themselves (``JointAnalysis.uncopied_inputs``) are a
  copy of each convolution's own, alive while it runs (its scratch, and
  ``PeakGraph.pooled_copies``: Inductor's kernel writes the copy, and its
  pool holds it after the call until a later buffer of its size takes it); any
  other is allocated where the convolution reads it, like a pointwise value a
  library call reads, and a saved one is held to the backward.
* **Row reductions.**  A reduction over the trailing dimensions of a dense
  input (a norm's statistics, a softmax's sums; ``PeakGraph.row_reductions``)
  runs row by row, and Inductor computes the row's pointwise values that it
  reads and that read it in the same kernel.
* **addmm.**  Inductor rewrites ``add(mm(a, b), c)`` into one ``addmm``
  (:func:`_addmm_pairs`): the sum allocates as a library call's output and
  the product allocates nothing.
* **Concatenations.**  On the CPU Inductor lowers ``cat`` and ``stack`` to
  a ``ConcatKernel``: a buffer whatever reads it, into which its pointwise
  inputs are computed (:func:`_concat_inputs`, ``PeakGraph.concat_inputs``).
* **out= calls.**  Inductor allocates the output of ``mm``, ``addmm``,
  ``bmm`` and ``baddbmm`` itself and passes it as ``out=``
  (``PeakGraph.out_buffers``), so such a call can take over a freed buffer
  of its size, as Inductor's own kernels do; other library calls allocate
  their outputs themselves.
* **Scratch.**  A library call's working memory beyond its outputs, where it
  was measured on the device (``JointAnalysis.scratch_bytes``), is alive
  while the call runs.
* **Scatter-adds.**  Where Inductor runs a scatter-add as aten's call (on
  the CPU with more than one thread, :func:`_scatter_call`), it is a library
  call: it reads its index and source as buffers and writes into a buffer of
  its own, a copy of its first input (a pointwise input that only it reads,
  the zeros of a pooling's backward, is computed into that buffer and
  allocates nothing of its own).
* **Views a library call cannot read.**  Where Inductor fixes the layout of
  a graph with convolutions (channels-last), a library call's input that is
  a view no channels-last tensor of its value's shape can express (a 4-D
  index flattened to 2-D for the scatter above) is copied for the call: the
  copy is alive while the call runs (:func:`_view_copies`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.cost_model.node_cost import SizeEvaluator, numel_expr, size_expr, storage_bytes_expr
from ckpt.cost_model.ops import OpKind, argument_value
from ckpt.partitioner.analysis import JointAnalysis
from ckpt.partitioner.peak import Materialise, PeakGraph, PeakPrediction, predict_plan

__all__ = ["build_peak_graph", "describe", "predict_plan"]


# Library calls Inductor runs with an ``out=`` buffer it allocates itself (``ExternKernelOut``).
_OUT_CALLS = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.baddbmm.default,
    }
)


# Concatenations, which Inductor lowers on the CPU to a ConcatKernel with a buffer of its own.
_CONCATS = frozenset({torch.ops.aten.cat.default, torch.ops.aten.stack.default})

# Ops Inductor's CPU code counts as heavy: a pointwise value computing one inline is realised when
# several values read it (``StorageBox.should_realize_on_reuse``).
_CPU_HEAVY_OPS = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})


def _cpu_heavy(node: fx.Node) -> bool:
    target, value = node.target, node.meta.get("val")
    return (
        isinstance(target, torch._ops.OpOverload)
        and target.overloadpacket.__name__ in _CPU_HEAVY_OPS
        and isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
    )


def _is_reduction(node: fx.Node) -> bool:
    return compat.is_reduction_op(node.target)


def _reduced_dims(node: fx.Node, ndim: int) -> list[int] | None:
    """The dimensions a reduction's ``dim`` argument names, made non-negative; ``None`` for all or unknown."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    value = argument_value(node, target, "dim")
    dims: list[Any] = [value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else []
    if not dims or not all(isinstance(d, int) for d in dims):
        return None  # every dimension (None or []), no such argument, or not known here
    return sorted({int(d) % ndim for d in dims})


def _row_reduction(node: fx.Node, sizes: SizeEvaluator) -> bool:
    """Whether ``node`` reduces over the trailing dimensions of a dense input (the rows stay).

    Such a reduction (a norm's statistics, a softmax's sums) runs row by
    row, and Inductor computes the row's pointwise values that it reads and
    that read it in the same kernel.  Its ``dim`` argument names the last
    dimensions of its input, not all of them, and those are contiguous in
    the input.
    """
    source = node.args[0] if node.args else None
    read = source.meta.get("val") if isinstance(source, fx.Node) else None
    if not isinstance(read, torch.Tensor) or read.dim() == 0:
        return False
    ndim = read.dim()
    dims = _reduced_dims(node, ndim)
    if dims is None or len(dims) >= ndim or dims != list(range(ndim - len(dims), ndim)):
        return False
    shape = [sizes(size_expr(d)) for d in read.shape]
    strides = [sizes(size_expr(d)) for d in read.stride()]
    dense = 1
    for dim in reversed(dims):
        if shape[dim] != 1 and strides[dim] != dense:
            return False
        dense *= shape[dim]
    return dense > 1


# Scatters that reduce by sum, which Inductor may run as aten's scatter_reduce_ (``_scatter_call``).
_SCATTER_ADDS = frozenset({torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_reduce.two})


def _scatter_call(node: fx.Node) -> bool:
    """Whether Inductor runs this scatter-add as a library call (aten's ``scatter_reduce_``).

    ``scatter_add`` and ``scatter_reduce(..., "sum")`` fall back to aten on the
    CPU with more than one thread, among other cases
    (:func:`ckpt._torch_compat.inductor_scatter_sum_is_library_call`); a
    scatter that reduces otherwise (``"mean"``, ``"amax"``) always does.
    """
    if node.op != "call_function" or node.target not in _SCATTER_ADDS or len(node.args) < 4:
        return False
    value, src = node.meta.get("val"), node.args[3]
    source = src.meta.get("val") if isinstance(src, fx.Node) else None
    if not isinstance(value, torch.Tensor) or not isinstance(source, torch.Tensor):
        return False
    if node.target is torch.ops.aten.scatter_reduce.two and (len(node.args) < 5 or node.args[4] != "sum"):
        return True
    return compat.inductor_scatter_sum_is_library_call(value.dtype, source.dtype, value.device.type)


def _kind(node: fx.Node, analysis: JointAnalysis, backward: bool) -> Materialise:
    value = node.meta.get("val")
    if node.op == "placeholder":
        if backward and isinstance(value, torch.Tensor):
            return Materialise.BUFFER
        # A channels-last copy for a convolution: allocated where the convolution reads it. One the
        # forward saves as itself is a copy of each convolution's own (its scratch, see _scratch).
        copied = node.name in analysis.copied_inputs and node.name not in analysis.uncopied_inputs
        return Materialise.FUSIBLE if copied else Materialise.FREE
    if node.op != "call_function":
        return Materialise.FREE
    estimate = analysis.estimates.get(node.name)
    if isinstance(value, (tuple, list)):
        # Its outputs allocate where they are picked out. One that Inductor generates (var_mean's
        # Welford reduction, a pooling's values and offsets) reads its pointwise inputs inlined,
        # as a reduction does; a library call reads them materialised.
        if estimate is not None and estimate.kind is OpKind.FUSIBLE:
            return Materialise.REDUCTION
        return Materialise.BUFFER
    if not isinstance(value, torch.Tensor):
        return Materialise.FREE
    if node.target in _CONCATS and value.device.type == "cpu":
        return Materialise.BUFFER  # a ConcatKernel: its own buffer, whoever reads it (see _concat_inputs)
    if compat.is_inductor_random(node.target):
        return Materialise.RANDOM
    if _scatter_call(node):
        return Materialise.BUFFER  # aten's scatter_reduce_ on a copy of its first input
    if estimate is not None and estimate.kind is OpKind.RANDOM:
        return Materialise.BUFFER  # eager's generator (fallback_random): a library call
    if estimate is not None and estimate.kind is OpKind.FUSIBLE:
        return Materialise.REDUCTION if _is_reduction(node) else Materialise.FUSIBLE
    return Materialise.BUFFER


def _addmm_pairs(nodes: list[fx.Node]) -> dict[str, str]:
    """The adds Inductor turns into ``addmm`` with the ``mm`` they read, as ``{add: mm}``.

    Inductor's post-grad pass rewrites ``add(mm(a, b), c)`` (in either order)
    into ``addmm(c, a, b)`` when the mm has no other reader and ``c`` is a
    tensor of the mm's dtype that broadcasts to its shape; on a GPU only when
    some reader of the sum is not pointwise.  The sum is then a library
    call's output, and the mm's product is never a buffer of its own.  The
    partitioned graphs get the same rewrite, so the pairs found in the joint
    graph are the ones Inductor will see.
    """
    pairs: dict[str, str] = {}
    add, mm = torch.ops.aten.add.Tensor, torch.ops.aten.mm.default
    for node in nodes:
        if node.op != "call_function" or node.target is not add or len(node.args) != 2 or node.kwargs:
            continue
        for product, other in (node.args, node.args[::-1]):
            if not (isinstance(product, fx.Node) and product.target is mm and len(product.users) == 1):
                continue
            value, bias = product.meta.get("val"), getattr(other, "meta", {}).get("val")
            if not (isinstance(value, torch.Tensor) and isinstance(bias, torch.Tensor)):
                continue
            if bias.dtype != value.dtype or not _broadcasts(tuple(bias.shape), tuple(value.shape)):
                continue
            if value.device.type != "cpu" and all(compat.is_pointwise_op(u.target) for u in node.users):
                continue  # on a GPU Inductor keeps the add pointwise, to fuse it into its readers
            pairs[node.name] = product.name
            break
    return pairs


def _concat_inputs(
    nodes: list[fx.Node],
    index: dict[str, int],
    kinds: list[Materialise],
    roots: dict[str, str],
    concats: frozenset[int],
) -> tuple[tuple[int, int], ...]:
    """The pointwise inputs that Inductor computes straight into a ``cat``'s buffer, as (input, cat) pairs.

    On the CPU Inductor lowers every ``cat`` (and ``stack``) to a
    ``ConcatKernel`` (``concats``, the values of ``nodes`` that ``_kind``
    makes buffers), whose output is a buffer whatever reads it: an input that
    is a pointwise value of its own (not a view, not a graph input, not a
    library call's output, which are copied) is written into its slice of the
    cat's buffer.  On a GPU a small cat may be a pointwise kernel instead, so
    only CPU graphs have such buffers.
    """
    pairs: list[tuple[int, int]] = []
    for cat in sorted(concats):
        tensors = nodes[cat].args[0] if nodes[cat].args else ()
        if not isinstance(tensors, (list, tuple)):
            continue
        for source in dict.fromkeys(tensors):
            if not isinstance(source, fx.Node) or source.op != "call_function" or source.name in roots:
                continue
            if kinds[index[source.name]] is Materialise.FUSIBLE and tensors.count(source) == 1:
                pairs.append((index[source.name], cat))
    return tuple(pairs)


def _layout_optimised(
    layout_optimised: bool, nodes: list[fx.Node], concat_inputs: tuple[tuple[int, int], ...]
) -> tuple[frozenset[int], frozenset[int]]:
    """The convolutions, and the concatenated inputs whose layout Inductor fixes where a graph runs one.

    Where Inductor optimises the layout of a graph with convolutions
    (:func:`ckpt._torch_compat.inductor_layout_optimization`: on the CPU with
    oneDNN, any graph with one), it gives a dense 4-D value it realises for
    several readers a fixed channels-last layout (``GraphLowering.run_node``);
    a cat can then no longer write that input in place, and copies it.
    Inductor is asked once, about the joint graph (``layout_optimised``:
    ``JointAnalysis.layout_optimised``); the forward and backward graphs it
    compiles are taken to be optimised alike when they run a convolution.
    """
    if not concat_inputs or not layout_optimised:
        return frozenset(), frozenset()
    convolutions = frozenset(
        i for i, n in enumerate(nodes) if n.op == "call_function" and n.target is torch.ops.aten.convolution.default
    )
    dense = set()
    for source, _ in concat_inputs:
        value = nodes[source].meta.get("val")
        if isinstance(value, torch.Tensor) and value.dim() == 4 and compat.is_dense(value):
            dense.add(source)
    return convolutions, frozenset(dense)


def _broadcasts(shape: tuple[Any, ...], to: tuple[Any, ...]) -> bool:
    if len(shape) > len(to):
        return False
    return all(a == 1 or a == b for a, b in zip(shape[::-1], to[::-1]))


def _nbytes(node: fx.Node, sizes: SizeEvaluator) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    if compat.is_inductor_random(node.target):
        # Inductor's own generator realises its draw in float32, whatever the op's dtype.
        return sizes(numel_expr(value)) * max(value.element_size(), 4)
    return sizes(storage_bytes_expr(value))


def build_peak_graph(joint: fx.GraphModule, analysis: JointAnalysis, num_fwd_outputs: int) -> PeakGraph:
    """The plain-data peak graph of ``joint``, with ``problem_index`` mapping the analysis's values."""
    sizes = SizeEvaluator(analysis.size_hints)
    roots = analysis.root_names
    nodes = [n for n in joint.graph.nodes if n.op != "output" and n.name not in roots]
    index = {n.name: i for i, n in enumerate(nodes)}

    def value_of(node: fx.Node) -> int:
        return index[roots.get(node.name, node.name)]

    backward = [
        (n.op == "placeholder" and compat.is_tangent(n))
        or (n.op == "call_function" and n.name not in analysis.forward_names)
        for n in nodes
    ]
    inputs = [tuple(dict.fromkeys(value_of(a) for a in n.all_input_nodes)) for n in nodes]  # in operand order
    fwd_outputs, bwd_outputs = compat.fwd_bwd_outputs(joint, num_fwd_outputs)
    outputs = frozenset(value_of(n) for n in fwd_outputs if isinstance(n, fx.Node))
    gradients = frozenset(value_of(n) for n in bwd_outputs if isinstance(n, fx.Node))
    required = [False] * len(nodes)
    stack = [i for i in outputs if not backward[i]]
    stack += [i for i, n in enumerate(nodes) if n.op == "call_function" and compat.must_be_in_forward(n)]
    while stack:
        i = stack.pop()
        if required[i] or backward[i]:
            continue
        required[i] = True
        stack.extend(inputs[i])
    kinds = [_kind(n, analysis, backward[i]) for i, n in enumerate(nodes)]
    nbytes = [_nbytes(n, sizes) for n in nodes]
    # Concatenations the CPU lowers to a buffer of their own (``_kind``), which Inductor allocates.
    concats = frozenset(i for i, n in enumerate(nodes) if n.target in _CONCATS and kinds[i] is Materialise.BUFFER)
    out_buffers = {i for i, n in enumerate(nodes) if n.op == "call_function" and n.target in _OUT_CALLS} | concats
    concat_inputs = _concat_inputs(nodes, index, kinds, roots, concats)
    convolutions, dense_4d = _layout_optimised(analysis.layout_optimised, nodes, concat_inputs)
    for add_name, mm_name in _addmm_pairs(nodes).items():
        kinds[index[add_name]] = Materialise.BUFFER  # addmm: a library call's output
        nbytes[index[mm_name]] = 0  # its product is written into the sum's buffer
        out_buffers.add(index[add_name])
    for i, node in enumerate(nodes):
        if node.target not in _SCATTER_ADDS or kinds[i] is not Materialise.BUFFER:
            continue
        first = node.args[0]  # the call scatters into a clone of it
        if isinstance(first, fx.Node) and first.name in index and len(first.users) == 1:
            if kinds[index[first.name]] is Materialise.FUSIBLE:
                nbytes[index[first.name]] = 0  # computed into the call's own buffer
    call_outputs = _call_outputs(nodes, index, kinds)
    fallback_calls = _fallback_calls(nodes, call_outputs)
    scratch, pooled_copies = _scratch(nodes, analysis, sizes)
    copies = _view_copies(analysis.layout_optimised, nodes, kinds, roots, sizes)
    if copies:
        scratch = tuple(a + b for a, b in zip(scratch or (0,) * len(nodes), copies))
    return PeakGraph(
        names=tuple(n.name for n in nodes),
        bytes=tuple(nbytes),
        kinds=tuple(kinds),
        inputs=tuple(inputs),
        backward=tuple(backward),
        required=tuple(required),
        outputs=outputs,
        gradients=gradients,
        tangents=frozenset(i for i, n in enumerate(nodes) if n.op == "placeholder" and backward[i]),
        problem_index=tuple(index[name] for name in analysis.problem.names),
        scratch=scratch,
        out_buffers=frozenset(out_buffers),
        concat_inputs=concat_inputs,
        concats=concats,
        convolutions=convolutions,
        dense_4d=dense_4d,
        heavy_ops=frozenset(i for i, n in enumerate(nodes) if kinds[i] is Materialise.FUSIBLE and _cpu_heavy(n)),
        row_reductions=frozenset(
            i for i, n in enumerate(nodes) if kinds[i] is Materialise.REDUCTION and _row_reduction(n, sizes)
        ),
        call_outputs=call_outputs,
        pooled_copies=pooled_copies,
        fallback_calls=fallback_calls,
        unaligned_calls=frozenset(
            c
            for c in fallback_calls
            if any(kinds[p] is Materialise.FREE and _is_tensor_input(nodes[p]) for p in inputs[c])
        ),
    )


def _is_tensor_input(node: fx.Node) -> bool:
    """Whether ``node`` is a graph input holding a tensor (a parameter, the user's input)."""
    return node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)


def _fallback_calls(nodes: list[fx.Node], call_outputs: tuple[tuple[int, int], ...]) -> frozenset[int]:
    """The library calls returning ``call_outputs`` whose outputs Inductor may mark unaligned.

    Inductor runs such a call as aten's own kernel and marks its outputs
    unaligned when it reads a graph input that it does not assume aligned:
    on the CPU every graph input (on a GPU, one aligned when compiled is
    assumed aligned), on any device under
    ``TORCHINDUCTOR_ASSUME_UNALIGNED_FALLBACK_OUTPUT=1`` every output.
    """
    every = compat.inductor_assumes_unaligned_fallback_output()
    found = set()
    for _, call in call_outputs:
        value = nodes[call].meta.get("val")
        tensors = [v for v in value if isinstance(v, torch.Tensor)] if isinstance(value, (tuple, list)) else []
        if every or any(t.device.type == "cpu" for t in tensors):
            found.add(call)
    return frozenset(found)


_VIEWS = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default})


def _view_copies(
    layout_optimised: bool,
    nodes: list[fx.Node],
    kinds: list[Materialise],
    roots: dict[str, str],
    sizes: SizeEvaluator,
) -> tuple[int, ...]:
    """Per library call, the bytes of the views among its inputs that Inductor copies for it.

    Inductor realises a library call's input (``ExternKernel.realize_input``):
    a view is read in place where its value's layout can express it, and
    copied where not (``copy_input``).  In a graph whose layout Inductor
    optimises, a 4-D value is channels-last, and a view that merges its
    batch and channel dimensions (a pooling's index, flattened for a
    scatter) cannot be expressed.  Empty unless some library call reads such
    a view.
    """
    calls = [
        i
        for i, node in enumerate(nodes)
        if node.op == "call_function" and kinds[i] is Materialise.BUFFER and node.target not in _CONCATS
    ]
    candidates = []
    for i in calls:
        for arg in nodes[i].all_input_nodes:
            if arg.op == "call_function" and arg.target in _VIEWS and arg.name in roots:
                base, value = arg.args[0], arg.meta.get("val")
                base_value = base.meta.get("val") if isinstance(base, fx.Node) else None
                if isinstance(value, torch.Tensor) and isinstance(base_value, torch.Tensor) and base_value.dim() == 4:
                    candidates.append((i, arg, value, base_value))
    if not candidates or not layout_optimised:
        return ()
    copies = [0] * len(nodes)
    for i, arg, value, base_value in candidates:
        if not compat.is_dense(base_value):
            continue
        # at the size hints: a view's expressibility depends on the sizes, not on their symbols
        shape = [sizes(size_expr(d)) for d in base_value.shape]
        channels_last = torch.empty(shape, device="meta").to(memory_format=torch.channels_last)
        try:
            channels_last.view([sizes(size_expr(d)) for d in value.shape])
        except (RuntimeError, ValueError):  # torch raises either, by version and device
            copies[i] += _nbytes(arg, sizes)
    return tuple(copies) if any(copies) else ()


def _scratch(
    nodes: list[fx.Node], analysis: JointAnalysis, sizes: SizeEvaluator
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Each value's working memory while it runs: a library call's measured scratch, and a
    convolution's (or its backward's) channels-last copies of the inputs the forward saves as themselves.

    Also the copies alone, ``(call, bytes)`` (``PeakGraph.pooled_copies``).
    """
    scratch = [analysis.scratch_bytes.get(n.name, 0) for n in nodes]
    copies: list[tuple[int, int]] = []
    if analysis.uncopied_inputs:
        roots = analysis.root_names
        for i, node in enumerate(nodes):
            if node.op != "call_function":
                continue
            if node.target is torch.ops.aten.convolution.default:
                read = node.args[:2]  # input, weight
            elif node.target is torch.ops.aten.convolution_backward.default:
                read = node.args[1:3]  # input, weight: the library converts them to the gradient's layout
            else:
                continue
            for arg in read:
                if isinstance(arg, fx.Node) and roots.get(arg.name, arg.name) in analysis.uncopied_inputs:
                    size = _nbytes(arg, sizes)
                    if size > 0:
                        scratch[i] += size
                        copies.append((i, size))
    return (tuple(scratch) if any(scratch) else ()), tuple(copies)


def _call_outputs(nodes: list[fx.Node], index: dict[str, int], kinds: list[Materialise]) -> tuple[tuple[int, int], ...]:
    """``(output, call)`` for each tensor a library call returns in a tuple, which the call allocates itself."""
    pairs: list[tuple[int, int]] = []
    for node in nodes:
        if node.op != "call_function" or node.target is not operator.getitem:
            continue
        call = node.args[0]
        if not isinstance(call, fx.Node) or call.name not in index:
            continue
        if kinds[index[call.name]] is Materialise.BUFFER and kinds[index[node.name]] is Materialise.BUFFER:
            pairs.append((index[node.name], index[call.name]))
    return tuple(pairs)


def describe(prediction: PeakPrediction) -> dict[str, Any]:
    """The prediction as plain JSON-ready data, for reports."""
    return {
        "peak_bytes": prediction.peak_bytes,
        "forward_bytes": prediction.forward_bytes,
        "backward_bytes": prediction.backward_bytes,
        "phase": prediction.phase,
        "node": prediction.node,
        "alive": [list(item) for item in prediction.alive],
    }
