"""Steady CPU step times: glibc's malloc keeps freed memory, and page faults are counted.

glibc's ``malloc`` gives memory back to the operating system when the free
space at the top of its heap passes a threshold (``M_TRIM_THRESHOLD``, which
it raises and lowers by itself), and serves large requests with ``mmap``,
unmapped on free.  A training step frees most of what it allocated, so
whether the next step finds its memory mapped or faults it in page by page
depends on the step's peak and on where its buffers happened to land.
Measured on the CPU benchmark's ViT without a budget: 2,016 page faults in
each forward and 1,280-1,792 in each backward, 5-8 ms per step that the
settings with a lower peak did not pay; with the heap kept, none.  That cost
is the allocator's, not the plan's, and it makes a plan's measured time
depend on which side of glibc's threshold its peak falls.

:func:`keep_freed_memory` sets both thresholds for the running process (as
``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_`` would at start),
as PyTorch's own CPU launcher does by preloading jemalloc or tcmalloc.
:func:`minor_faults` counts the process's page faults, so a run shows
whether any setting still pays them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory", "minor_faults"]

log = logging.getLogger(__name__)

# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 2**31 - 1  # bytes of free heap top kept: mallopt takes an int
MMAP_THRESHOLD = 32 * 2**20  # requests from this size are mmapped: glibc's largest on 64-bit systems


def keep_freed_memory() -> str | None:
    """Make glibc's malloc keep freed memory for the process's life; a description, or None if not glibc.

    Requests below :data:`MMAP_THRESHOLD` come from the heap, and the heap
    is given back only when more than :data:`TRIM_THRESHOLD` bytes at its
    top are free.  Elsewhere (macOS, musl) nothing is changed.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.info("not glibc (%s, %s): malloc's settings are left as they are", platform.system(), platform.libc_ver())
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    for parameter, name, value in (
        (_M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", TRIM_THRESHOLD),
        (_M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", MMAP_THRESHOLD),
    ):
        if mallopt(parameter, value) != 1:
            raise RuntimeError(f"mallopt({name}, {value}) failed: glibc {platform.libc_ver()[1]} refused the value")
    return (
        f"glibc malloc keeps freed memory (M_TRIM_THRESHOLD {TRIM_THRESHOLD / 2**30:.0f} GiB, "
        f"M_MMAP_THRESHOLD {MMAP_THRESHOLD >> 20} MiB)"
    )


def minor_faults() -> int | None:
    """The process's minor page faults so far (memory first touched or mapped again), or None where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
