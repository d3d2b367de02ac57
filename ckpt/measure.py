"""Measure what a training step keeps in memory: saved activations and the peak.

**Saved activations.**

This counts exactly what ckpt's budget counts: the storages of the tensors
that autograd (eager or compiled) saves, each storage once, leaving out the
storages of tensors that live anyway (parameters, buffers, the inputs).  It
uses :class:`torch.autograd.graph.saved_tensors_hooks`.

Modules are read at the moment each tensor is saved, not once at the start:
under FSDP2 a module holds its unsharded parameters only while its forward
runs, and those are parameters, not activations.  Distributed tensors count
by their local shard.

**Peak.**  :func:`peak_memory` measures the most bytes a step holds at once,
above what is resident when the step starts.  On a GPU that is
``torch.cuda.max_memory_allocated() - memory_allocated()`` after a reset of the
peak statistics.  On the CPU there is no allocator statistic, so the step runs
under ``torch.profiler`` with ``profile_memory=True``, which records every CPU
allocation and free, Inductor's own buffers included; the allocation events of
the event tree, in time order, give a running sum whose maximum is the peak.
(``prof.events()`` misses most of them, so the tree is walked.)

**Steady step times on the CPU.**  glibc's ``malloc`` gives memory back to
the system when the free space at the top of its heap passes a threshold
(``M_TRIM_THRESHOLD``, which it raises and lowers by itself), and serves
large requests with ``mmap``, unmapped on free.  A training step frees most
of what it allocated, so whether the next step finds its memory mapped or
faults it in page by page depends on the step's peak and on where its
buffers landed.  Measured on the CPU benchmark's ViT without a budget: 2,016
page faults in each forward and 1,280-1,792 in each backward, 5-8 ms per
step that its settings with a lower peak did not pay; with the heap kept,
none.  That cost is the allocator's, not the plan's.
:func:`keep_freed_memory` sets both thresholds for the running process (as
``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_`` would at start);
PyTorch's CPU launcher gets the same by preloading jemalloc or tcmalloc.
:func:`release_freed_memory` gives the kept memory back (between workloads
that should not share a heap), and :func:`minor_faults` counts the
process's page faults.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from ckpt import _torch_compat as compat

__all__ = [
    "MALLOC_CHOICES",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "PeakMemory",
    "SavedActivations",
    "glibc_malloc",
    "keep_freed_memory",
    "live_storages",
    "minor_faults",
    "peak_memory",
    "release_freed_memory",
    "saved_activations",
    "set_malloc",
]

log = logging.getLogger(__name__)

Live = Iterable[torch.Tensor] | torch.nn.Module | torch.Tensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor: its shard on this rank
    return to_local() if callable(to_local) else tensor


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr())


def live_storages(*groups: Live) -> set[tuple[str, int]]:
    """Storage keys of tensors that live anyway: pass modules, tensors or iterables of tensors."""
    keys: set[tuple[str, int]] = set()
    for group in groups:
        if isinstance(group, torch.nn.Module):
            tensors: Iterable[torch.Tensor] = [*group.parameters(), *group.buffers()]
        elif isinstance(group, torch.Tensor):
            tensors = [group]
        else:
            tensors = group
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                keys.add(_storage_key(_local(tensor)))
    return keys


@dataclass
class SavedActivations:
    """The unique storages saved for backward while the context was open."""

    excluded: set[tuple[str, int]]
    modules: list[torch.nn.Module] = field(default_factory=list)
    storages: dict[tuple[str, int], int] = field(default_factory=dict)
    tensors: int = 0

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.tensors += 1
        key = _storage_key(tensor)
        if key not in self.excluded and (not self.modules or key not in live_storages(*self.modules)):
            self.storages[key] = tensor.untyped_storage().nbytes()
        return tensor


@contextlib.contextmanager
def saved_activations(*live: Live) -> Iterator[SavedActivations]:
    """Count saved activation bytes inside the block.

    ``live`` names what lives anyway (the model, the inputs); its storages are
    not counted::

        with saved_activations(model, x) as saved:
            loss = model(x)
        print(saved.bytes)
    """
    modules = [group for group in live if isinstance(group, torch.nn.Module)]
    others = [group for group in live if not isinstance(group, torch.nn.Module)]
    record = SavedActivations(excluded=live_storages(*others), modules=modules)
    # The hook can run inside compiled code; Dynamo must not trace it.
    pack = torch.compiler.disable(record._pack)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield record


@dataclass(frozen=True)
class PeakMemory:
    """A step's peak bytes above what was resident before it, and how it was measured."""

    bytes: int
    device: str  # "cpu" (profiler allocation events) or "cuda" (allocator statistics)
    allocations: int = 0  # allocation events seen (CPU only)

    @property
    def mib(self) -> float:
        return self.bytes / 2**20


def peak_memory(step: Callable[[], object], device: str | torch.device = "cpu") -> PeakMemory:
    """Run ``step()`` once and measure its peak bytes above what was resident before it.

    Set gradients to None before calling, so that the gradients the step
    produces count, as they do in training::

        model.zero_grad(set_to_none=True)
        peak = peak_memory(lambda: model(x).sum().backward())
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return PeakMemory(torch.cuda.max_memory_allocated(device) - before, "cuda")
    if device.type != "cpu":
        raise ValueError(f"peak_memory: device={str(device)!r} is not supported; use 'cpu' or 'cuda'")
    deltas = compat.profiled_cpu_allocations(step)
    running = peak = 0
    for delta in deltas:
        running += delta
        peak = max(peak, running)
    return PeakMemory(peak, "cpu", allocations=sum(1 for d in deltas if d > 0))


# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 2**31 - 1  # bytes of free heap top kept: mallopt takes an int
MMAP_THRESHOLD = 32 * 2**20  # requests from this size are mmapped: glibc's largest on 64-bit systems


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (whose malloc these settings are for), else None; looked up once."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.info("not glibc (%s, %s): malloc's settings are left as they are", platform.system(), platform.libc_ver())
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    return libc


def glibc_malloc() -> bool:
    """Whether the process's ``malloc`` is glibc's: the one :func:`keep_freed_memory` and its kin act on."""
    return _glibc() is not None


def keep_freed_memory() -> str | None:
    """Make glibc's malloc keep freed memory for the process's life; a description, or None if not glibc.

    Requests below :data:`MMAP_THRESHOLD` come from the heap, and the heap
    is given back only when more than :data:`TRIM_THRESHOLD` bytes at its
    top are free.  Elsewhere (macOS, musl) nothing is changed.
    """
    libc = _glibc()
    if libc is None:
        return None
    for parameter, name, value in (
        (_M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", TRIM_THRESHOLD),
        (_M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", MMAP_THRESHOLD),
    ):
        if libc.mallopt(parameter, value) != 1:
            raise RuntimeError(f"mallopt({name}, {value}) failed: glibc {platform.libc_ver()[1]} refused the value")
    return (
        f"glibc malloc keeps freed memory (M_TRIM_THRESHOLD {TRIM_THRESHOLD / 2**30:.0f} GiB, "
        f"M_MMAP_THRESHOLD {MMAP_THRESHOLD >> 20} MiB)"
    )


MALLOC_CHOICES = ("keep", "default")  # the timing commands' --malloc: python -m ckpt pareto|validate, benchmarks.run


def set_malloc(mode: str) -> str:
    """Apply a ``--malloc`` choice (:data:`MALLOC_CHOICES`); what the process's malloc now does, for reports.

    ``keep`` calls :func:`keep_freed_memory` and returns its description;
    ``default`` changes nothing, and nor does ``keep`` where malloc is not
    glibc's: both return ``"default"``.
    """
    if mode not in MALLOC_CHOICES:
        raise ValueError(f"malloc mode {mode!r}: expected one of {', '.join(MALLOC_CHOICES)}")
    return (keep_freed_memory() if mode == "keep" else None) or "default"


def release_freed_memory() -> bool:
    """Give the freed memory glibc's malloc holds back to the system (``malloc_trim(0)``); False if not glibc.

    After :func:`keep_freed_memory`, a process that runs several workloads
    one after another (the benchmark's models) would run each later one in
    the heap the earlier ones left: on the CPU
    benchmark, the U-Net's steps took 20-23% longer after four other models
    than in a run of its own under default compile and torch's budgets, and
    22-36% longer under ckpt's settings.  Called between workloads, it lets
    each start from a compact heap; the memory is then kept again.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def minor_faults() -> int | None:
    """The process's minor page faults so far (memory first touched or mapped again), or None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
