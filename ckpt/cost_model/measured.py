"""Measured costs of the library calls that dominate a graph, timed once on its device and cached.

The roofline prices a matmul, a convolution or an attention kernel from its
FLOPs and bytes at the profile's peak rates.  Real kernels reach a share of
the peak that depends on the shapes, strides and dtype (small or skinny
matmuls, attention's softmax, a convolution's layout), so this module times
each distinct call instead:

* **What is timed.**  Every ``aten`` library call of the graph (the
  :attr:`~ckpt.cost_model.ops.OpKind.EXTERN` kind: Inductor calls the same
  kernel), on tensors of the node's shapes, strides, storage offset and
  dtype, with its other arguments as the graph has them.  Calls that write
  to an argument, draw random numbers, have sizes without a hint, or run
  collectives are never timed.  Fused element-wise work is not timed per op:
  Inductor generates its own kernels for it, priced by the profile's
  calibrated per-element costs.
* **Its key** is the op and that description of its arguments
  (:func:`call_signature`), so the 28 layers of a transformer share one
  measurement per distinct call.
* **How.**  A warm-up, then the fastest of a few runs (other work on the
  machine can only add time), timed with CUDA events on a GPU.
  The inputs are drawn from a private generator: the global random state the
  model's dropout reads is left as it was.
* **Scratch memory.**  After timing, one more run of the call measures the
  working memory it allocates beyond its outputs (a convolution's backward
  reorders its operands; on the CPU from the profiler's allocation events,
  on a GPU from the allocator's peak statistics, which it resets).  The peak
  model counts it where the call runs (:mod:`ckpt.partitioner.peak`).
* **Bounded.**  Calls are timed in order of their roofline time, largest
  first, until :data:`SECONDS_PER_GRAPH` of measuring; the rest keep the
  roofline.  A call whose tensors would need more than
  :data:`MAX_CALL_BYTES` (on a GPU, or a quarter of its free memory) is not
  timed.
* **Cached** as JSON in the cache directory, one file per device (CPU model
  and thread count, or GPU name) and torch version, under a file lock:
  processes that start together (the ranks of one job) share one
  measurement.  A corrupt file is replaced.  Later compiles hit the cache.
* **Not on a busy CPU.**  A run of 512 x 512 fp32 matmuls lasting about
  :data:`CANARY_WINDOW` is timed before the calls, between them (every
  :data:`CHECK_EVERY` seconds of measuring) and after them, and compared
  with what the calibrated ``cpu`` profile says it takes.  If it runs more
  than :data:`BUSY_FACTOR` times slower (other processes hold the cores:
  Inductor's compile workers, a data loader, another job), the calls'
  timings would be off by far more than the roofline's error (a 0.2 ms
  matmul timed at 8 ms beside a busy process, when its threads wait for a
  core), so nothing is kept or cached: the calls keep their roofline time
  in this graph, and are measured again by the next compile that needs
  them.  One warning says so.  The run spans several of the scheduler's
  time slices: one 1.3 ms matmul fits in the slices where the other
  process waits, and read 1.01 times its calibrated time beside a busy
  process that made a 3 x 3 convolution of 16 ms run at 30 (the run of
  sixteen read 2.0).  The check needs the CPU's own calibrated profile;
  it is skipped on a GPU (timed with CUDA events) and under another
  profile.
* **If measuring fails** (an error from the kernel, out of memory), the call
  keeps its roofline time and one warning says so.
* **The same numbers on every rank.**  Timings differ from rank to rank, and
  ranks whose plans differ issue different collectives and hang.  Under an
  initialised process group, the ranks join their cached tables when the
  backend receives each graph, a point every rank reaches whatever Inductor's
  caches hold (:func:`agree_across_ranks`: each call's time from the lowest
  rank that has one, and rank 0's device profile), and plan from that only.
  Calls the table lacks keep their roofline time in that graph; they are
  measured and cached for the graphs and the runs after it.  That is one
  collective per graph Dynamo hands the backend, so every rank must compile
  the same graphs in the same order, as FSDP and DDP need anyway;
  ``CKPT_MEASURE_OPS=0`` turns measuring and the collective off where they
  do not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ckpt import _torch_compat as compat
from ckpt.config import cache_dir
from ckpt.cost_model.cache_files import cpu_model, locked, write_atomically
from ckpt.cost_model.calibrate import MATMUL_SIZE
from ckpt.cost_model.node_cost import NodeEstimate, SizeEvaluator, storage_bytes_expr, tensor_values
from ckpt.cost_model.ops import OpKind, classify
from ckpt.cost_model.profiles import DeviceProfile
from ckpt.cost_model.timing import device_seconds, fastest_seconds

__all__ = [
    "BUSY_FACTOR",
    "CANARY_WINDOW",
    "CHECK_EVERY",
    "MAX_CALL_BYTES",
    "SECONDS_PER_GRAPH",
    "MeasuredCall",
    "MeasurementWarning",
    "OpCosts",
    "agree_across_ranks",
    "cached_costs",
    "cached_or_measured",
    "call_signature",
    "canary_repeats",
    "canary_seconds",
    "device_key",
    "library_calls",
    "measure_calls",
    "plan_costs",
    "scratch_key",
]

log = logging.getLogger(__name__)

# 2: with the scratch bytes of each call; 3: timed on a quiet CPU only (tables of earlier
# versions may hold timings taken beside other work, and are measured again); 4: the busy
# check times a run of matmuls, also between the calls (a single matmul missed a busy core)
_FORMAT_VERSION = 4
_SCRATCH = "scratch|"  # the key of a call's scratch bytes: _SCRATCH + its signature
SECONDS_PER_GRAPH = 1.5  # measuring time per compiled graph, at most (about; one call may overrun it)
MAX_CALL_BYTES = 2 * 2**30  # tensors of one timed call, inputs and outputs
_REPEATS = 5
_MAX_REPEAT_SECONDS = 0.25  # fewer repeats for a call slower than this
# The busy check's run of reference matmuls this many times slower than the calibrated profile
# predicts: the CPU is busy and timings are not kept.  On a quiet 2-thread Xeon the run takes
# 1.05-1.2 times the prediction (the profile scales a one-thread rate by the thread count);
# beside one busy process, which takes one of the two cores, 2.0-2.3 times.
BUSY_FACTOR = 1.5
# How long the busy check's run of matmuls lasts, about: several of the scheduler's time slices.
CANARY_WINDOW = 0.02
CHECK_EVERY = 0.5  # seconds of measuring between two busy checks
_busy_warned = False


class MeasurementWarning(UserWarning):
    """A library call could not be timed: its roofline time stands in."""


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device

    @property
    def storage_elements(self) -> int:
        if any(s == 0 for s in self.shape):
            return self.offset
        return self.offset + 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride))

    def text(self) -> str:
        return f"T({self.dtype},{list(self.shape)},{list(self.stride)},{self.offset})"


@dataclass(frozen=True)
class MeasuredCall:
    """One distinct library call to time: the op, its arguments with tensors as specs, and its key."""

    signature: str
    target: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    device: torch.device
    output_bytes: int
    roofline_seconds: float = 0.0

    @property
    def tensor_bytes(self) -> int:
        """Bytes of the call's input storages and outputs."""
        specs = [a for a in pytree.tree_leaves((self.args, self.kwargs)) if isinstance(a, _TensorSpec)]
        return self.output_bytes + sum(s.storage_elements * s.dtype.itemsize for s in specs)


class _Unmeasurable(Exception):
    """A node whose call cannot be reproduced outside the graph."""


def _concrete(value: Any, sizes: SizeEvaluator) -> Any:
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        if expr.is_Integer:
            return int(expr)
        if any(s not in sizes.hints for s in expr.free_symbols):
            raise _Unmeasurable(f"a size without a hint ({expr})")
        return sizes(expr)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        raise _Unmeasurable("a symbolic scalar argument")
    return value


def _spec(value: Any, sizes: SizeEvaluator) -> _TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise _Unmeasurable(f"an argument without a tensor value ({type(value).__name__})")
    return _TensorSpec(
        shape=tuple(_concrete(s, sizes) for s in value.shape),
        stride=tuple(_concrete(s, sizes) for s in value.stride()),
        offset=_concrete(value.storage_offset(), sizes),
        dtype=value.dtype,
        device=value.device,
    )


def _argument(value: Any, sizes: SizeEvaluator) -> Any:
    if isinstance(value, fx.Node):
        return _spec(value.meta.get("val"), sizes)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _concrete(value, sizes)
    if isinstance(value, torch.Tensor):
        raise _Unmeasurable("a constant tensor argument")
    if isinstance(value, (list, tuple)):
        return type(value)(_argument(v, sizes) for v in value)
    if value is None or isinstance(
        value, (bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format)
    ):
        return value
    raise _Unmeasurable(f"an argument of type {type(value).__name__}")


def _text(value: Any) -> str:
    if isinstance(value, _TensorSpec):
        return value.text()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return repr(value)


_CONVOLUTIONS = ("convolution", "convolution_backward")


def _channels_last(value: Any) -> Any:
    """A 4-d tensor spec at channels-last strides, as Inductor's layout optimisation hands it to a convolution."""
    if isinstance(value, _TensorSpec) and len(value.shape) == 4:
        n, c, h, w = value.shape
        return dataclasses.replace(value, stride=(h * w * c, 1, w * c, c), offset=0)
    if isinstance(value, (list, tuple)):
        return type(value)(_channels_last(v) for v in value)
    return value


def call_signature(node: fx.Node, sizes: SizeEvaluator, channels_last: bool = False) -> MeasuredCall | None:
    """The call ``node`` makes, as data that can be timed and a key for the cache; None if it cannot be timed.

    Only library calls are timed (:func:`ckpt.cost_model.ops.classify`): that
    leaves out mutations and ops that draw random numbers, while attention
    without dropout, whose schema is tagged as seeded, is timed.

    ``channels_last``: Inductor runs this graph's convolutions on channels-last
    tensors (its layout optimisation), so they are timed that way.
    """
    target = node.target
    if classify(node) is not OpKind.EXTERN or not isinstance(target, torch._ops.OpOverload):
        return None  # mutations and random draws are other kinds (attention without dropout is a library call)
    if target.namespace != "aten":
        return None
    try:
        args = tuple(_argument(a, sizes) for a in node.args)
        kwargs = {k: _argument(v, sizes) for k, v in node.kwargs.items()}
    except _Unmeasurable as reason:
        log.debug("ckpt: not timing %s: %s", node.name, reason)
        return None
    if channels_last and target.overloadpacket.__name__ in _CONVOLUTIONS:
        args, kwargs = _channels_last(args), {k: _channels_last(v) for k, v in kwargs.items()}
    specs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, _TensorSpec)]
    if not specs:
        return None
    device = specs[0].device
    if any(s.device != device for s in specs) or device.type == "meta":
        return None
    text = f"{target}(" + ",".join(_text(a) for a in args)
    text += "".join(f",{k}={_text(v)}" for k, v in sorted(kwargs.items())) + ")"
    output_bytes = sizes(sum((storage_bytes_expr(v) for v in tensor_values(node.meta.get("val"))), 0))
    return MeasuredCall(text, target, args, kwargs, device, output_bytes)


def library_calls(
    graph: fx.Graph,
    kinds: Mapping[fx.Node, OpKind],
    estimates: Mapping[fx.Node, NodeEstimate],
    roofline: Callable[[NodeEstimate], float],
    sizes: SizeEvaluator,
    channels_last: bool = False,
) -> dict[str, MeasuredCall]:
    """The graph's library calls that can be timed, by node name, each with its roofline time.

    ``channels_last``: as for :func:`call_signature`.
    """
    calls: dict[str, MeasuredCall] = {}
    for node in graph.nodes:
        if kinds.get(node) is not OpKind.EXTERN or node not in estimates:
            continue
        call = call_signature(node, sizes, channels_last)
        if call is not None:
            calls[node.name] = dataclasses.replace(call, roofline_seconds=roofline(estimates[node]))
    return calls


# --- timing ------------------------------------------------------------------------------------------------


def _materialise(value: Any, generator_for: Callable[[torch.device], torch.Generator]) -> Any:
    if isinstance(value, _TensorSpec):
        elements = max(value.storage_elements, 1)
        if value.dtype.is_floating_point or value.dtype.is_complex:
            # float8 and other narrow types have no uniform_: draw in float32 and convert
            draw = value.dtype if value.dtype.itemsize >= 2 else torch.float32
            base = torch.empty(elements, dtype=draw, device=value.device)
            base = base.uniform_(-1.0, 1.0, generator=generator_for(value.device)).to(value.dtype)
        else:
            base = torch.zeros(elements, dtype=value.dtype, device=value.device)  # indices, masks: zero is valid
        return base.as_strided(value.shape, value.stride, value.offset)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialise(v, generator_for) for v in value)
    return value


def _runner(call: MeasuredCall) -> Callable[[], None]:
    """A function that runs ``call`` once on fresh tensors of its specs and drops its result.

    Call it under ``compat.real_tensors()`` and ``torch.no_grad()``.
    """
    generators: dict[torch.device, torch.Generator] = {}

    def generator_for(device: torch.device) -> torch.Generator:
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(0)
        return generators[device]

    args = _materialise(call.args, generator_for)
    kwargs = _materialise(call.kwargs, generator_for)

    def run() -> None:
        call.target(*args, **kwargs)

    return run


def _time_call(call: MeasuredCall) -> float:
    """The fastest of a few runs of ``call`` on fresh tensors of its specs, in seconds."""
    with compat.real_tensors(), torch.no_grad():
        run = _runner(call)
        # The first timed run comes after a warm-up (first-call setup, caches, lazy initialisation).
        first = device_seconds(run, call.device, 1)
        if first >= _MAX_REPEAT_SECONDS:
            return first
        return min(first, device_seconds(run, call.device, _REPEATS))


def _measure_scratch(call: MeasuredCall) -> int:
    """The working memory ``call`` allocates beyond its outputs (:func:`_scratch_bytes` of one run)."""
    with compat.real_tensors(), torch.no_grad():
        run = _runner(call)
        run()  # first-call setup allocates once: not the call's working memory
        return _scratch_bytes(run, call)


def _scratch_bytes(run: Callable[[], None], call: MeasuredCall) -> int:
    """The bytes ``run`` (one call, its result dropped) allocates beyond the call's outputs while it runs.

    A convolution's backward reorders its operands, attention keeps
    per-thread blocks: working memory that is alive only during the call,
    but adds to the step's peak there.  On a GPU from the allocator's peak
    statistics (which this resets), on the CPU from the profiler's
    allocation events.
    """
    if call.device.type == "cuda":
        torch.cuda.synchronize(call.device)
        before = torch.cuda.memory_allocated(call.device)
        torch.cuda.reset_peak_memory_stats(call.device)
        run()
        torch.cuda.synchronize(call.device)
        peak = torch.cuda.max_memory_allocated(call.device) - before
    elif call.device.type == "cpu":
        peak = max(itertools.accumulate(compat.profiled_cpu_allocations(run)), default=0)
    else:
        return 0
    return max(0, peak - call.output_bytes)


def canary_seconds(device: torch.device, profile: DeviceProfile) -> float | None:
    """What the busy check's reference matmul takes on a quiet ``device``; None where it is not checked.

    Known on the CPU under its own calibrated ``cpu`` profile, whose fp32
    rate was measured on this matmul (:data:`~ckpt.cost_model.calibrate.MATMUL_SIZE`).
    """
    if device.type != "cpu" or profile.name != "cpu":
        return None
    return 2 * MATMUL_SIZE**3 / profile.flops_per_second("fp32")


def canary_repeats(expected_seconds: float) -> int:
    """How many reference matmuls the busy check runs back to back: about :data:`CANARY_WINDOW` of them."""
    return max(1, math.ceil(CANARY_WINDOW / expected_seconds))


def _slowdown(expected_seconds: float) -> float:
    """How many times slower than expected a run of reference matmuls is now (the faster of two runs).

    A run, not one matmul: a short kernel finds the slices of time where
    another process waits, and reads quiet beside a busy core.
    """
    repeats = canary_repeats(expected_seconds)
    with compat.real_tensors(), torch.no_grad():
        a = torch.ones(MATMUL_SIZE, MATMUL_SIZE)
        b = torch.ones(MATMUL_SIZE, MATMUL_SIZE)

        def run() -> None:
            for _ in range(repeats):
                torch.mm(a, b)

        return fastest_seconds(run, 2) / (repeats * expected_seconds)


def _busy(expected_seconds: float | None, when: str) -> bool:
    """Whether the CPU is too busy to time on (:data:`BUSY_FACTOR`); warns once per process."""
    global _busy_warned
    if expected_seconds is None:
        return False
    slowdown = _slowdown(expected_seconds)
    log.debug("ckpt: reference matmul %.2fx its calibrated time %s", slowdown, when)
    if slowdown <= BUSY_FACTOR:
        return False
    message = (
        f"ckpt: the CPU is busy {when} ({MATMUL_SIZE}x{MATMUL_SIZE} fp32 matmul {slowdown:.1f}x slower than "
        f"calibrated, above {BUSY_FACTOR:g}x): library calls keep their roofline times in this graph and nothing "
        "is cached; they are measured by a later compile on a quieter machine"
    )
    if _busy_warned:
        log.info("%s", message)
    else:
        _busy_warned = True
        warnings.warn(message, MeasurementWarning, stacklevel=3)
    return True


def _byte_limit(device: torch.device) -> int:
    """The most tensor bytes one timed call may allocate: on a GPU, also a quarter of its free memory."""
    if device.type != "cuda":
        return MAX_CALL_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return min(MAX_CALL_BYTES, int(free) // 4)


def measure_calls(
    calls: Sequence[MeasuredCall],
    *,
    seconds: float = SECONDS_PER_GRAPH,
    canary: float | None = None,
) -> dict[str, float]:
    """Time each call (largest roofline time first) until ``seconds`` are spent; by signature.

    Beside each call's seconds, the table holds its scratch bytes, where
    there are any, under :func:`scratch_key` of its signature.

    A call that fails is left out, with one :class:`MeasurementWarning`
    naming the op and the error.  With ``canary`` (:func:`canary_seconds`),
    a busy CPU before, between (every :data:`CHECK_EVERY` seconds) or after
    the calls leaves the table empty.
    """
    if _busy(canary, "before timing library calls"):
        return {}
    measured: dict[str, float] = {}
    failures: list[str] = []
    limits: dict[torch.device, int] = {}
    started = checked = time.perf_counter()
    for call in sorted(calls, key=lambda c: (-c.roofline_seconds, c.signature)):
        now = time.perf_counter()
        if now - started >= seconds:
            log.info("ckpt: measuring time is up after %d library calls; the rest keep the roofline", len(measured))
            break
        if measured and now - checked >= CHECK_EVERY:
            if _busy(canary, "while timing library calls"):
                return {}
            checked = time.perf_counter()
        if call.device not in limits:
            limits[call.device] = _byte_limit(call.device)
        limit = limits[call.device]
        if call.tensor_bytes > limit:
            log.debug("ckpt: not timing %s: its tensors exceed %d bytes", call.signature, limit)
            continue
        try:
            measured[call.signature] = _time_call(call)
            scratch = _measure_scratch(call)
            if scratch > 0:
                measured[scratch_key(call.signature)] = scratch
        except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as error:
            failures.append(f"{call.target}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    if failures:
        warnings.warn(
            f"ckpt: could not time {len(failures)} library call(s) on the device; their roofline time stands in "
            f"(first: {failures[0]}). Set CKPT_MEASURE_OPS=0 to skip measuring",
            MeasurementWarning,
            stacklevel=2,
        )
    if measured and _busy(canary, "after timing library calls"):
        return {}
    return measured


def scratch_key(signature: str) -> str:
    """Where a call's scratch bytes are kept in a table of costs, beside its seconds under ``signature``."""
    return _SCRATCH + signature


# --- the cache ---------------------------------------------------------------------------------------------


def device_key(device: torch.device) -> str:
    """The cache key of a device: its model, the threads or the GPU, and the torch version."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        text = f"cuda|{name}|{torch.version.cuda or torch.version.hip}"
    else:
        text = f"{device.type}|{cpu_model()}|threads={torch.get_num_threads()}"
    text += f"|torch={torch.__version__}|v{_FORMAT_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _load(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _FORMAT_VERSION:
            raise ValueError(f"format {data.get('format')!r}")
        costs = {str(k): float(v) for k, v in data["costs"].items()}
        if not all(v > 0 for k, v in costs.items() if not k.startswith(_SCRATCH)):
            raise ValueError("a time that is not positive")
        if not all(v >= 0 for k, v in costs.items() if k.startswith(_SCRATCH)):
            raise ValueError("negative scratch bytes")
        return costs
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("ckpt: ignoring the unreadable measured-cost cache %s (%s); it will be rewritten", path, error)
        return {}


def _store(path: Path, costs: Mapping[str, float]) -> None:
    write_atomically(path, json.dumps({"format": _FORMAT_VERSION, "costs": dict(sorted(costs.items()))}, indent=1))


def _cache_path(directory: Path, device: torch.device) -> Path:
    return directory / f"op-costs-{device_key(device)}.json"


def cached_costs(device: torch.device, directory: Path | None = None) -> dict[str, float]:
    """What the cache holds for ``device``: seconds by call signature (empty if nothing, or unreadable)."""
    directory = cache_dir() if directory is None else directory
    try:
        with locked(directory / "op-costs.lock"):
            return _load(_cache_path(directory, device))
    except OSError as error:
        log.warning("ckpt: cannot read the measured-cost cache at %s (%s)", directory, error)
        return {}


def cached_or_measured(
    calls: Sequence[MeasuredCall],
    *,
    seconds: float = SECONDS_PER_GRAPH,
    directory: Path | None = None,
    canary: float | None = None,
) -> dict[str, float]:
    """The times of ``calls`` by signature: from the cache, measuring what it lacks (then storing it).

    The cache's lock is held while measuring, so processes that start
    together measure each call once and read the same numbers.
    """
    if not calls:
        return {}
    directory = cache_dir() if directory is None else directory
    path = _cache_path(directory, calls[0].device)
    unique = list({c.signature: c for c in calls}.values())
    try:
        with locked(directory / "op-costs.lock"):
            known = _load(path)
            missing = [c for c in unique if c.signature not in known]
            if missing:
                fresh = measure_calls(missing, seconds=seconds, canary=canary)
                if fresh:
                    known.update(fresh)
                    _store(path, known)
                timed = sum(1 for c in missing if c.signature in fresh)
                log.info("ckpt: timed %d of %d new library calls on %s", timed, len(missing), calls[0].device)
    except OSError as error:  # read-only home, full disk: measure without caching
        log.warning("ckpt: cannot use the measured-cost cache at %s (%s); measuring without it", directory, error)
        known = measure_calls(unique, seconds=seconds, canary=canary)
    wanted = {c.signature for c in unique}
    wanted |= {scratch_key(signature) for signature in wanted}
    return {k: v for k, v in known.items() if k in wanted}


# --- agreement across ranks --------------------------------------------------------------------------------


def _process_group_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def agree_across_ranks(costs: Mapping[str, float], profile: DeviceProfile) -> tuple[dict[str, float], DeviceProfile]:
    """One table of costs and one device profile for every rank.

    The table holds each call's time from the lowest rank that has one; the
    profile is rank 0's.  Without an initialised process group (or with one
    rank) this returns its arguments.  Otherwise it is one
    ``all_gather_object`` over the default group, which every rank must reach.
    """
    if _process_group_size() <= 1:
        return dict(costs), profile
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (dict(costs), profile.to_json()))
    agreed: dict[str, float] = {}
    for table, _ in gathered:  # in rank order
        for signature, seconds in table.items():
            agreed.setdefault(str(signature), float(seconds))
    first = DeviceProfile.from_json(gathered[0][1])
    if first is None:  # the same ckpt on every rank writes what it reads; keep this rank's rather than fail
        log.warning("ckpt: rank 0's device profile could not be read; this rank plans with its own")
        first = profile
    elif first != profile:
        log.info("ckpt: planning with rank 0's %s profile (%s)", first.name, first.source)
    return agreed, first


def plan_costs(device: torch.device, profile: DeviceProfile, *, agree: bool = True) -> tuple[OpCosts, DeviceProfile]:
    """The measured costs and the profile a graph about to be compiled on ``device`` plans with.

    Under a process group, ``agree`` joins the ranks' tables and takes rank
    0's profile (:func:`agree_across_ranks`); ``agree=False`` there uses no
    measured costs at all and keeps this rank's profile (for callers that
    cannot reach a point every rank reaches).
    """
    canary = canary_seconds(device, profile)  # this rank's own profile: the busy check is about this machine
    if _process_group_size() <= 1:
        return OpCosts(device, cached_costs(device), use_fresh=True, canary=canary), profile
    if not agree:
        return OpCosts(device, {}, use_fresh=False, seconds=0.0), profile
    known, profile = agree_across_ranks(cached_costs(device), profile)
    return OpCosts(device, known, use_fresh=False, canary=canary), profile


@dataclass
class OpCosts:
    """The measured costs one compiled graph may use, on one device.

    Alone in its process, a graph uses the cached times and measures the
    calls the cache lacks (:func:`cached_or_measured`).  Under a process
    group, ``known`` is the table the ranks agreed on when the graph was
    handed to the backend (:func:`agree_across_ranks`); the graph uses only
    those, and what it measures goes to the cache for the graphs after it.
    :func:`plan_costs` makes one.
    """

    device: torch.device
    known: dict[str, float]
    use_fresh: bool
    seconds: float = SECONDS_PER_GRAPH
    canary: float | None = None  # the busy check's reference time (:func:`canary_seconds`); None: no check
    fresh: dict[str, float] = dataclasses.field(default_factory=dict)  # measured by this process, after ``known``
    attempted: set[str] = dataclasses.field(default_factory=set)  # signatures this process tried to measure

    def key(self) -> str:
        """What plans depend on, for cache keys: the agreed table under a process group, else nothing.

        Alone in its process, a cached plan made from other timings is still
        this process's plan; across ranks it must be everyone's.
        """
        if self.use_fresh:
            return "measured"
        text = json.dumps(sorted(self.known.items()))
        return "agreed:" + hashlib.sha256(text.encode()).hexdigest()[:16] + f":{self.seconds}"

    def __call__(self, calls: Mapping[str, MeasuredCall]) -> dict[str, float]:
        """Seconds by node name for the calls that have a usable time (see the class)."""
        usable = self._usable(calls)
        return {name: usable[c.signature] for name, c in calls.items() if c.signature in usable}

    def scratch_bytes(self, calls: Mapping[str, MeasuredCall]) -> dict[str, int]:
        """The working memory each call allocates beyond its outputs while it runs, by node name, where measured."""
        usable = self._usable(calls)
        found = {name: usable.get(scratch_key(c.signature)) for name, c in calls.items()}
        return {name: int(value) for name, value in found.items() if value}

    def _usable(self, calls: Mapping[str, MeasuredCall]) -> dict[str, float]:
        """The table to read ``calls`` from, after measuring (once) those it lacks."""
        missing = [
            c
            for c in calls.values()
            if c.signature not in self.known and c.signature not in self.attempted and c.device == self.device
        ]
        if missing and self.seconds > 0:
            self.attempted.update(c.signature for c in missing)
            self.fresh.update(cached_or_measured(missing, seconds=self.seconds, canary=self.canary))
        return {**self.known, **self.fresh} if self.use_fresh else self.known
