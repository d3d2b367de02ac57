"""The only home of private torch imports.

Everything ckpt takes from ``torch._*`` goes through this module, so a torch
upgrade touches one file.  Functions import lazily, adapt to the signatures of
the torch versions we support (2.9 and newer), and raise
:class:`UnsupportedTorchError` with the torch version when something is missing.

The tests and benchmarks go through it too, with these exceptions, each a
documented switch rather than an internal whose shape changes:

* the config modules ``torch._inductor.config``, ``torch._functorch.config``
  and ``torch._dynamo.config``, patched with their own ``patch`` context
  managers (Inductor's RNG fallback, torch's own memory budget, recompile
  errors);
* ``torch.distributed._functional_collectives``, the only way to write a
  collective that AOTAutograd traces into the graph (the distributed tests);
* the op classes ``torch._ops.OpOverload`` and ``HigherOrderOperator`` in
  ``isinstance`` checks: every FX node's target is one of them;
* Dynamo's documented entry points ``torch._dynamo.mark_dynamic``,
  ``graph_break``, ``disable`` and ``reset``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx

__all__ = [
    "all_gather_autograd",
    "aot_default_partition",
    "aot_module_without_kernels",
    "aot_simplified_without_kernels",
    "check_torch_version",
    "checkpoint_policy",
    "compilation_seconds",
    "compile_caches_disabled",
    "compile_fx",
    "custom_partitioner_base",
    "dynamo_counters",
    "eager_rng_order_patches",
    "extract_fwd_bwd_modules",
    "fake_tensor_mode",
    "finish_modules",
    "flop_formula",
    "functorch_config",
    "fwd_bwd_outputs",
    "graph_name",
    "has_side_effects",
    "hash_for_files",
    "inductor_fallback_random",
    "is_inductor_random",
    "is_inductor_seed_lookup",
    "is_inductor_seeds",
    "inductor_joint_graph_passes",
    "inductor_layout_optimization",
    "inductor_lowering_tables",
    "inductor_mode_options",
    "inductor_scatter_sum_is_library_call",
    "inputs_mutated_after_forward",
    "is_bwd_seed_offset",
    "is_dense",
    "is_opaque_value",
    "is_pointwise_op",
    "is_primal",
    "is_reduction_op",
    "is_sym_node",
    "is_tangent",
    "MIN_TORCH",
    "must_be_in_backward",
    "must_be_in_forward",
    "prepare_joint",
    "profiled_cpu_allocations",
    "real_tensors",
    "recompute_tag",
    "rng_state_bytes",
    "run_and_get_code",
    "shape_env_of",
    "static_lifetime_input_nodes",
    "symbol_hints",
    "torch_default_partition",
    "torch_version",
    "UnsupportedTorchError",
]

log = logging.getLogger(__name__)

MIN_TORCH = (2, 9)


class UnsupportedTorchError(RuntimeError):
    """This torch lacks an internal that ckpt relies on."""


def torch_version() -> tuple[int, int]:
    base = torch.__version__.split("+")[0]
    parts = base.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def check_torch_version(version: tuple[int, int] | None = None) -> None:
    """Raise if this torch cannot host the ckpt partitioner."""
    version = torch_version() if version is None else version
    if version < MIN_TORCH or not _has_custom_partitioner():
        raise UnsupportedTorchError(
            f"backend='ckpt' needs torch>={MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"(for torch._inductor.config.custom_partitioner_fn); this is torch {torch.__version__}"
        )


def _has_custom_partitioner() -> bool:
    try:
        import torch._inductor.config as inductor_config
        from torch._inductor.custom_graph_pass import CustomPartitionerFn  # noqa: F401
    except ImportError:
        return False
    return hasattr(inductor_config, "custom_partitioner_fn")


# --- Inductor -------------------------------------------------------------------------


def custom_partitioner_base() -> type:
    try:
        from torch._inductor.custom_graph_pass import CustomPartitionerFn
    except ImportError:
        # Keep ckpt importable on old torch; check_torch_version reports the problem.
        return object
    return CustomPartitionerFn


def hash_for_files(paths: Sequence[str]) -> bytes:
    from torch._inductor.custom_graph_pass import get_hash_for_files

    return get_hash_for_files(tuple(paths))


def compile_fx(gm: fx.GraphModule, example_inputs: Sequence[Any], config_patches: dict[str, Any]) -> Any:
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    return inductor_compile_fx(gm, example_inputs, config_patches=config_patches)


def inductor_fallback_random() -> bool:
    import torch._inductor.config as inductor_config

    return bool(inductor_config.fallback_random)


def is_inductor_random(target: Any) -> bool:
    """Whether ``target`` is Inductor's own random draw (``prims.inductor_random``).

    Inductor's joint-graph passes put it in place of ``aten.rand`` and friends
    when ``fallback_random`` is off; its lowering always realises the draw,
    in float32.
    """
    return _is_prims_op(target, "inductor_random")


def is_inductor_seeds(target: Any) -> bool:
    """Whether ``target`` draws the seeds of every random op of a graph at once (``prims.inductor_seeds``)."""
    return _is_prims_op(target, "inductor_seeds")


def _is_prims_op(target: Any, name: str) -> bool:
    """Whether ``target`` is ``torch.ops.prims.<name>`` (the packet or its default overload)."""
    op = getattr(torch.ops.prims, name, None)
    return op is not None and target in (op, getattr(op, "default", None))


def is_inductor_seed_lookup(target: Any) -> bool:
    """Whether ``target`` picks one layer's seed from Inductor's seeds tensor (``prims.inductor_lookup_seed``).

    Its index is a constant, and Inductor writes it into the source of every
    kernel that computes the lookup inline.
    """
    return _is_prims_op(target, "inductor_lookup_seed")


def inductor_joint_graph_passes(joint_module: fx.GraphModule) -> fx.GraphModule:
    """Inductor's rewrites of a joint graph before it is partitioned: the graph its partitioner sees.

    Pattern rewrites, and (without ``fallback_random``) random ops replaced by
    draws from one seeds tensor (``prims.inductor_seeds``,
    ``inductor_lookup_seed``, ``inductor_random``).
    """
    from torch._guards import detect_fake_mode
    from torch._inductor import compile_fx
    from torch._inductor.virtualized import V

    values = [node.meta.get("val") for node in joint_module.graph.nodes if node.op == "placeholder"]
    fake_mode = detect_fake_mode(values)
    if fake_mode is None:
        raise ValueError("inductor_joint_graph_passes: the joint graph's inputs carry no fake tensors ('val' meta)")
    with V.set_fake_mode(fake_mode):
        rewritten = compile_fx._recursive_joint_graph_passes(joint_module)
    return joint_module if rewritten is None else rewritten  # torch 2.9 rewrites in place and returns None


def eager_rng_order_patches() -> dict[str, Any]:
    """Inductor config patches that keep random kernels in program order under ``fallback_random``.

    With ``fallback_random`` Inductor calls eager's random ops, which draw from
    the global generator in the order they run.  Its peak-memory reordering
    sees no data dependency between two such calls (a dropout and a
    ``rand_like``) and may swap them, and then the masks differ from eager's:
    torch 2.11 does so for some saved sets.  Only that reordering is turned off,
    and only while ``fallback_random`` is set.
    """
    import torch._inductor.config as inductor_config

    if not inductor_fallback_random() or not hasattr(inductor_config, "reorder_for_peak_memory"):
        return {}
    return {"reorder_for_peak_memory": False}


def inductor_lowering_tables() -> tuple[Any, Any, Any] | None:
    """Inductor's (lowerings, fallbacks, needs_realized_inputs), or None if unavailable."""
    try:
        from torch._inductor import lowering
    except ImportError:
        return None
    try:
        return lowering.lowerings, lowering.fallbacks, lowering.needs_realized_inputs
    except AttributeError:
        return None


# --- op tags --------------------------------------------------------------------------

# The aten and prims overloads that carry ``torch.Tag.reduction`` in torch 2.13, for
# torch 2.9, whose ``torch.Tag`` has no ``reduction`` member.  ``max.other`` and the
# scalar overloads of ``sum`` or ``any`` are elementwise or not tensor ops at all.
_REDUCTION_OVERLOADS = frozenset(
    f"aten.{name}"
    for name in (
        "all.default",
        "all.dim",
        "all.dims",
        "all.out",
        "all.dims_out",
        "all.all_out",
        "amax.default",
        "amax.out",
        "amin.default",
        "amin.out",
        "aminmax.default",
        "aminmax.out",
        "any.default",
        "any.dim",
        "any.dims",
        "any.out",
        "any.dims_out",
        "any.all_out",
        "argmax.default",
        "argmax.out",
        "argmin.default",
        "argmin.out",
        "count_nonzero.default",
        "count_nonzero.dim_IntList",
        "linalg_vector_norm.default",
        "linalg_vector_norm.out",
        "logsumexp.default",
        "logsumexp.out",
        "max.default",
        "max.dim",
        "max.dim_max",
        "max.unary_out",
        "mean.default",
        "mean.dim",
        "mean.out",
        "mean.dtype_out",
        "min.default",
        "min.dim",
        "min.dim_min",
        "min.unary_out",
        "nansum.default",
        "nansum.out",
        "norm.Scalar",
        "norm.ScalarOpt_dim",
        "norm.ScalarOpt_dim_dtype",
        "norm.dtype_out",
        "norm.out",
        "norm.ScalarOpt_dtype",
        "prod.default",
        "prod.dim_int",
        "prod.int_out",
        "std.default",
        "std.dim",
        "std.correction",
        "std.correction_out",
        "std.out",
        "std_mean.default",
        "std_mean.dim",
        "std_mean.correction",
        "sum.dim_IntList",
        "sum.default",
        "sum.IntList_out",
        "var.default",
        "var.dim",
        "var.correction",
        "var.correction_out",
        "var.out",
        "var_mean.default",
        "var_mean.dim",
        "var_mean.correction",
    )
) | frozenset({"prims.amax.default", "prims.amin.default", "prims.var.default"})


def is_dense(value: torch.Tensor) -> bool:
    """Whether ``value`` is non-overlapping and dense (False where its strides are symbolic and undecided)."""
    import torch._prims_common as prims_common

    # Older torch has the same test without the symbolic case under the shorter name.
    for name in ("is_non_overlapping_and_dense_or_false", "is_non_overlapping_and_dense"):
        test = getattr(prims_common, name, None)
        if test is not None:
            return bool(test(value))
    raise UnsupportedTorchError(f"torch {torch.__version__} has no test for a dense tensor in torch._prims_common")


def is_reduction_op(target: Any) -> bool:
    """Whether an op overload reduces over some dimensions (``torch.Tag.reduction``)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    tag = getattr(torch.Tag, "reduction", None)
    if tag is not None:
        return tag in target.tags
    return str(target) in _REDUCTION_OVERLOADS


def is_pointwise_op(target: Any) -> bool:
    """Whether an op overload is elementwise (``torch.Tag.pointwise``)."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


# --- functional collectives ----------------------------------------------------------


def all_gather_autograd(tensor: torch.Tensor, gather_dim: int, group: Any) -> torch.Tensor:
    """All-gather ``tensor`` along ``gather_dim`` with a reduce-scatter as its backward.

    The differentiable gather that SimpleFSDP-style code calls inside a compiled
    region.  torch 2.13 names it ``all_gather_single_autograd`` (and deprecates
    ``all_gather_tensor_autograd``, which 2.9 and 2.11 have instead).  The older
    one returns a tensor that waits for itself: waiting on it explicitly as
    well cuts the gradient on torch 2.9, whose ``wait_tensor`` has no autograd
    formula, and the traced backward then reduce-scatters zeros.
    """
    import torch.distributed._functional_collectives as funcol

    gather = getattr(funcol, "all_gather_single_autograd", None)
    if gather is None:
        return funcol.all_gather_tensor_autograd(tensor, gather_dim, group)
    return funcol.wait_tensor(gather(tensor, gather_dim, group))


# --- FLOP formulas ----------------------------------------------------------------------

# Ops with the same argument layout as one that torch.utils.flop_counter registers.
_FLOP_ALIASES = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_efficient_attention_backward",
}


def flop_formula(target: Any) -> Any | None:
    """The registered ``torch.utils.flop_counter`` formula for an op, if any.

    The formula takes the op's arguments with tensors replaced by shapes (or by
    tensors) and returns the FLOP count.
    """
    from torch.utils.flop_counter import flop_registry

    packet = getattr(target, "overloadpacket", target)
    formula = flop_registry.get(packet)
    if formula is None:
        alias = _FLOP_ALIASES.get(getattr(packet, "__name__", ""))
        if alias is not None:
            formula = flop_registry.get(getattr(torch.ops.aten, alias))
    return formula


# --- symbolic sizes -------------------------------------------------------------------


def shape_env_of(values: Iterable[Any]) -> Any | None:
    for value in values:
        if isinstance(value, torch.Tensor):
            fake_mode = getattr(value, "fake_mode", None)
            if fake_mode is not None and fake_mode.shape_env is not None:
                return fake_mode.shape_env
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return value.node.shape_env
    return None


def symbol_hints(shape_env: Any) -> dict[Any, int]:
    """Size hints of the backed symbols, read without adding guards."""
    if shape_env is None:
        return {}
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:
        hints = getattr(shape_env, "var_to_val", {})
    return dict(hints)


# --- AOTAutograd partitioner internals ------------------------------------------------


def _partitioners() -> Any:
    import torch._functorch.partitioners as partitioners

    return partitioners


def functorch_config() -> Any:
    import torch._functorch.config as config

    return config


def is_primal(node: fx.Node) -> bool:
    return _partitioners()._is_primal(node)


def is_tangent(node: fx.Node) -> bool:
    return _partitioners()._is_tangent(node)


def is_bwd_seed_offset(node: fx.Node) -> bool:
    return _partitioners()._is_bwd_seed_offset(node)


def is_sym_node(node: fx.Node) -> bool:
    from torch.fx.experimental.proxy_tensor import is_sym_node as _is_sym_node

    return _is_sym_node(node)


def is_opaque_value(value: Any) -> bool:
    """Script objects and opaque values, which are saved by reference and cost no bytes."""
    from torch._library.fake_class_registry import FakeScriptObject
    from torch.fx.experimental._backward_state import BackwardState

    return isinstance(value, (FakeScriptObject, BackwardState))


def must_be_in_forward(node: fx.Node) -> bool:
    return _partitioners()._must_be_in_forward(node)


def must_be_in_backward(node: fx.Node) -> bool:
    return _partitioners()._must_be_in_backward(node)


def fwd_bwd_outputs(joint_module: fx.GraphModule, num_fwd_outputs: int) -> tuple[list[Any], list[Any]]:
    outputs = _partitioners()._extract_fwd_bwd_outputs(joint_module, num_fwd_outputs=num_fwd_outputs)
    return list(outputs[0]), list(outputs[1])


def prepare_joint(joint_module: fx.GraphModule) -> tuple[fx.GraphModule, bool, bool]:
    """The joint-graph preparation torch's min-cut partitioner does before deciding.

    Dead-code elimination, CSE (if enabled), cleanup of user checkpoint tags,
    and the MUST_SAVE tags on collectives, effectful ops and the sources of
    backward mutations.  Returns the module and whether it has user-tagged
    recompute ops and recompute random ops.
    """
    partitioners = _partitioners()
    joint_module.graph.eliminate_dead_code()
    joint_module.recompile()
    if functorch_config().cse:
        from torch._functorch.compile_utils import fx_graph_cse

        joint_module.graph = fx_graph_cse(joint_module.graph)
    has_recompute = partitioners.has_recomputable_ops(joint_module)
    has_recompute_rng = partitioners.has_recomputable_rng_ops(joint_module)
    if has_recompute:
        cleanup = partitioners.cleanup_recompute_tags
        if "is_default_partition" in inspect.signature(cleanup).parameters:
            joint_module = cleanup(joint_module, is_default_partition=False)
        else:  # torch 2.9
            joint_module = cleanup(joint_module)
    if not getattr(functorch_config(), "unsafe_allow_optimization_of_collectives", False):
        partitioners.force_save_collectives(joint_module)
    for name in ("force_save_effectful_ops", "force_save_bw_mutation_src"):
        fn = getattr(partitioners, name, None)
        if fn is not None:
            fn(joint_module)
    return joint_module, has_recompute, has_recompute_rng


def extract_fwd_bwd_modules(
    joint_module: fx.GraphModule,
    saved_values: list[fx.Node],
    saved_sym_nodes: list[fx.Node],
    saved_opaque_nodes: list[fx.Node],
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes: Any,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """torch's ``_extract_fwd_bwd_modules``, called with whatever arguments this version takes.

    ``saved_values`` and ``saved_sym_nodes`` are updated in place to what the
    backward actually uses, as torch does.
    """
    extract = _partitioners()._extract_fwd_bwd_modules
    params = inspect.signature(extract).parameters
    kwargs: dict[str, Any] = {"num_fwd_outputs": num_fwd_outputs}
    if "saved_opaque_nodes" in params:
        kwargs["saved_opaque_nodes"] = saved_opaque_nodes
    elif saved_opaque_nodes:
        saved_values.extend(saved_opaque_nodes)
    if "static_lifetime_input_nodes" in params:
        kwargs["static_lifetime_input_nodes"] = static_lifetime_input_nodes
    return extract(joint_module, saved_values, saved_sym_nodes=saved_sym_nodes, **kwargs)


def finish_modules(
    joint_module: fx.GraphModule,
    fw_module: fx.GraphModule,
    bw_module: fx.GraphModule,
    *,
    num_saved_sym_nodes: int,
    has_recompute_rng: bool,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The steps torch's min-cut partitioner runs after extraction."""
    partitioners = _partitioners()
    if has_recompute_rng:
        fw_module, bw_module = partitioners.functionalize_rng_ops(
            joint_module, fw_module, bw_module, num_saved_sym_nodes
        )
    bw_module = partitioners.reordering_to_mimic_autograd_engine(bw_module)
    from torch._functorch import compile_utils

    raise_getitems = getattr(compile_utils, "raise_getitems", None)
    if raise_getitems is not None:
        fw_module = raise_getitems(fw_module)
        bw_module = raise_getitems(bw_module)
    thread_rng = getattr(partitioners, "thread_graphsafe_rng_from_hops", None)
    if thread_rng is not None:
        fw_module = thread_rng(fw_module, is_backward=False)
        bw_module = thread_rng(bw_module, is_backward=True)
    return fw_module, bw_module


def static_lifetime_input_nodes(joint_module: fx.GraphModule, indices: Sequence[int] | None) -> Any:
    from torch.utils._ordered_set import OrderedSet

    primals = [n for n in joint_module.graph.nodes if n.op == "placeholder" and is_primal(n)]
    wanted = set(indices or ())
    return OrderedSet(p for i, p in enumerate(primals) if i in wanted)


def torch_default_partition(
    joint_module: fx.GraphModule, joint_inputs: Any, **kwargs: Any
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """torch's own partitioner for Inductor (min-cut rematerialisation)."""
    return _partitioners().min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)


@functools.lru_cache(maxsize=None)
def checkpoint_policy() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy


def recompute_tag(node: fx.Node) -> str | None:
    """``"save"``, ``"recompute"`` or None, from a user or torch checkpoint policy tag."""
    policy = checkpoint_policy()
    tag = node.meta.get("recompute", None)
    if tag in (policy.MUST_SAVE, policy.PREFER_SAVE):
        return "save"
    if tag in (policy.MUST_RECOMPUTE, policy.PREFER_RECOMPUTE):
        return "recompute"
    return None


def graph_name(default: str) -> str:
    """AOTAutograd's name for the graph being compiled, or ``default``."""
    try:
        from torch._functorch._aot_autograd.logging_utils import get_aot_graph_name

        return str(get_aot_graph_name())
    except (ImportError, AttributeError, RuntimeError, AssertionError):
        return default


def inductor_mode_options(mode: str | None) -> dict[str, Any]:
    """Inductor config patches for a ``torch.compile`` mode such as ``"max-autotune"``."""
    if mode in (None, "default"):
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def has_side_effects(node: fx.Node) -> bool:
    """FX's impurity test, not counting random draws (ckpt handles those itself)."""
    try:
        return bool(node.is_impure(impure_random=False))
    except TypeError:  # older torch: no impure_random argument, random ops not impure
        return bool(node.is_impure())


def compile_caches_disabled() -> Any:
    """A context manager that turns off Inductor's FX graph cache and AOTAutograd's cache.

    Inside it every compile runs the partitioner, so its decisions can be recorded.
    """
    import contextlib

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    if hasattr(functorch_config, "enable_autograd_cache"):
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def inductor_layout_optimization(gm: fx.GraphModule) -> bool:
    """Whether Inductor will switch this graph's convolutions to channels-last.

    When it does, a graph input that feeds a convolution is converted to a
    channels-last copy, and saving that input for the backward keeps the copy.
    """
    try:
        from torch._inductor.graph import GraphLowering

        return bool(GraphLowering.decide_layout_opt(gm, is_inference=False))
    except (ImportError, AttributeError, TypeError, KeyError) as error:
        log.debug("cannot ask Inductor about layout optimisation (%s); assuming none", error)
        return False


def inductor_scatter_sum_is_library_call(self_dtype: torch.dtype, src_dtype: torch.dtype, device_type: str) -> bool:
    """Whether Inductor runs a scatter-add (``scatter_add``, ``scatter_reduce`` with ``"sum"``) as aten's call.

    Inductor's lowering falls back to ``aten.scatter_reduce_`` in several
    cases (``torch._inductor.utils.use_scatter_fallback``): on the CPU with
    more than one thread while ``config.cpp.fallback_scatter_reduce_sum`` is
    set (the default), for dtypes a GPU's atomic add lacks, and under
    deterministic algorithms.  The call then reads its index and source as
    buffers and writes into a buffer of its own.  Asked with the thread count
    and settings of the moment, as Inductor asks when it lowers the graph.
    """
    try:
        from torch._inductor.utils import use_scatter_fallback

        return bool(
            use_scatter_fallback(torch.ops.aten.scatter_reduce_.two, "sum", self_dtype, src_dtype, device_type, True)
        )
    except (ImportError, AttributeError, TypeError) as error:
        log.debug("cannot ask Inductor whether a scatter-add is a library call (%s); assuming a kernel", error)
        return False


def inductor_assumes_unaligned_fallback_output() -> bool:
    """Whether Inductor marks every output of aten's own kernels unaligned (``assume_unaligned_fallback_output``).

    Off by default (``TORCHINDUCTOR_ASSUME_UNALIGNED_FALLBACK_OUTPUT``);
    without the setting (older torch) only outputs computed from an
    unaligned input are.
    """
    try:
        from torch._inductor import config as inductor_config
    except ImportError:
        return False
    return bool(getattr(inductor_config, "assume_unaligned_fallback_output", False))


def rng_state_bytes(value: Any) -> int:
    """Bytes of the generator state torch saves to replay a random op on ``value``'s device."""
    tensors = [v for v in (value if isinstance(value, (tuple, list)) else [value]) if isinstance(v, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    if device.type == "cuda":
        return int(torch.cuda.get_rng_state(device).numel())
    return int(torch.get_rng_state().numel())


def aot_module_without_kernels(
    module: torch.nn.Module, partition_fn: Any, *, keep_inference_input_mutations: bool = False
) -> Callable[..., Any]:
    """``module`` through AOTAutograd with Inductor's decompositions and no-op compilers.

    The joint graph reaches ``partition_fn`` as Inductor's partitioner would
    see it, and no kernel is compiled, so tracing takes well under a second.
    Tied parameters and shared buffers are graph inputs once, as Dynamo lifts
    them: torch's ``aot_module`` passes each of their names and
    ``functional_call`` refuses tied names given twice.
    """
    from torch._dynamo.utils import assert_no_fake_params_or_buffers
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.compilers import nop
    from torch._inductor import lowering  # noqa: F401  (max pooling's decomposition asks it; compiling imports it)
    from torch._inductor.decomposition import select_decomp_table

    assert_no_fake_params_or_buffers(module)
    params: dict[str, torch.Tensor] = dict(module.named_parameters())  # a tied tensor once, under its first name
    buffers = dict(module.named_buffers())

    def functional_call(
        params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], *args: Any, **kwargs: Any
    ) -> Any:
        return torch.func.functional_call(module, {**params, **buffers}, args, kwargs, tie_weights=True)

    traced = aot_function(
        functional_call,
        fw_compiler=nop,
        bw_compiler=nop,
        partition_fn=partition_fn,
        decompositions=select_decomp_table(),
        num_params_buffers=len(params) + len(buffers),
        keep_inference_input_mutations=keep_inference_input_mutations,
    )
    return functools.partial(traced, params, buffers)


def aot_simplified_without_kernels(gm: fx.GraphModule, example_inputs: Sequence[Any], partition_fn: Any) -> Any:
    """A Dynamo graph through AOTAutograd as Inductor sends it, with no-op compilers.

    The body of a ``torch.compile`` backend: Inductor's decompositions, input
    mutations kept in the graph, and the joint graph handed to
    ``partition_fn``.  Unlike :func:`aot_module_without_kernels` it takes the
    graph Dynamo captured, so it works on fake tensors and on modules whose
    buffers are shared.
    """
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.compilers import nop
    from torch._inductor.decomposition import select_decomp_table

    return aot_module_simplified(
        gm,
        list(example_inputs),
        fw_compiler=nop,
        bw_compiler=nop,
        partition_fn=partition_fn,
        decompositions=select_decomp_table(),
        keep_inference_input_mutations=True,
    )


def fake_tensor_mode() -> Any:
    """A new ``FakeTensorMode``: tensors inside it have shapes, dtypes and devices but no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def real_tensors() -> Any:
    """A context in which new tensors are real, even while a compile's fake-tensor mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def run_and_get_code(fn: Any, *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)`` and the source of every module Inductor generated meanwhile."""
    from torch._inductor.utils import run_and_get_code as run

    result, code = run(fn, *args)
    return result, list(code)


def dynamo_counters() -> Any:
    """Dynamo's event counters (``counters["stats"]["unique_graphs"]`` counts compiled graphs)."""
    from torch._dynamo.utils import counters

    return counters


def compilation_seconds(keys: Iterable[str]) -> float:
    """Seconds torch's compile-time metrics recorded under ``keys`` so far in this process."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(sum(compilation_time_metrics.get(key, [])) for key in keys))


def inputs_mutated_after_forward(joint_module: fx.GraphModule) -> list[tuple[fx.Node, Any]] | None:
    """The joint graph's inputs that AOTAutograd's runtime wrapper mutates after the forward.

    Each is paired with the joint-graph value holding its new contents (the
    forward output AOTAutograd copies back into it).  Read from the output
    descriptors (``InputMutationAOTOutput``) that AOTAutograd stores in the
    output node's ``meta["desc"]`` (torch 2.9 and newer).  None when the
    graph carries no descriptors, so the caller cannot know.
    """
    try:
        from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput
    except ImportError:
        return None
    output = next(iter(reversed(joint_module.graph.nodes)), None)
    if output is None or output.op != "output":
        return None
    descs = output.meta.get("desc")
    values = output.args[0] if output.args else None
    if not isinstance(descs, (list, tuple)) or not isinstance(values, (list, tuple)) or len(descs) != len(values):
        return None
    placeholders = [n for n in joint_module.graph.nodes if n.op == "placeholder" and "desc" in n.meta]
    mutated: list[tuple[fx.Node, Any]] = []
    for desc, value in zip(descs, values):
        if not isinstance(desc, InputMutationAOTOutput):
            continue
        matches = [n for n in placeholders if n.meta["desc"] == desc.mutated_input]
        if len(matches) != 1:
            log.info("ckpt: no single graph input matches the mutation descriptor %s; not constraining it", desc)
            continue
        mutated.append((matches[0], value))
    return mutated


def aot_default_partition(
    joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """AOTAutograd's default ``partition_fn``: the forward saves what eager autograd would."""
    static = kwargs.get("static_lifetime_input_indices")
    return _partitioners().default_partition(
        joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=static
    )


def profiled_cpu_allocations(step: Any) -> list[int]:
    """Run ``step()`` under the profiler; the signed sizes of its CPU allocations and frees, in time order.

    The allocation events live in the profiler's event tree (``kineto_results``),
    which is private; ``prof.events()`` misses most of them.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocation = torch._C._profiler._EventType.Allocation
    found: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == allocation:
            fields = event.extra_fields
            if fields.device.type == torch.device("cpu").type:
                found.append((event.start_time_ns, len(found), int(fields.alloc_size)))
        stack.extend(event.children)
    found.sort()
    return [size for _, _, size in found]


# ---------------------------------------------------------------------------
# Module paths: where Dynamo found a graph input, and which module a node runs in.

_SOURCE_ROOT = re.compile(r"^([A-Za-z_]+\[['\"][^'\"]*['\"]\]|[A-Za-z_][A-Za-z0-9_]*)")
_SOURCE_ATTR = re.compile(r"\._(?:modules|parameters|buffers)\[['\"]([^'\"]*)['\"]\]")
_SOURCE_INDEX = re.compile(r"\[['\"]?([^'\"\]]*)['\"]?\]")


def module_path(text: str) -> str:
    """A Dynamo source or ``nn_module_stack`` path in one dotted form: ``L['self'].layers.0.mlp``.

    torch writes the same path as ``L['self']._modules['layers']._modules['0']``
    (2.9), ``L['self'].layers[0]`` or ``L['self'].layers.0`` (2.13); the first
    component (the frame's local or global the path starts from) is kept as is.
    """
    match = _SOURCE_ROOT.match(text)
    if match is None:
        return text
    root, rest = match.group(1), text[match.end() :]
    rest = _SOURCE_ATTR.sub(r".\1", rest)
    rest = _SOURCE_INDEX.sub(r".\1", rest)
    return root + rest


def placeholder_sources(gm: fx.GraphModule) -> list[str | None]:
    """For each placeholder of a Dynamo graph, the module path of the value Dynamo bound to it, if known."""
    sources: list[str | None] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        name = getattr(getattr(grapharg, "source", None), "name", None)
        name = name() if callable(name) else name  # a method before torch 2.11, a property after
        sources.append(module_path(name) if isinstance(name, str) else None)
    return sources


def node_module_stack(node: fx.Node) -> list[tuple[str, type]]:
    """The modules whose forward produced ``node``, outermost first: (path, class)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    return [(module_path(path), cls) for path, cls in stack.values() if isinstance(path, str) and isinstance(cls, type)]


def node_module_path(node: fx.Node) -> str | None:
    """The innermost module whose forward produced ``node`` (None outside any submodule).

    A node of the backward's formulas (which the plan may compute in the
    forward and save) names the module of the forward op it differentiates.
    """
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return module_path(path) if isinstance(path, str) else None
