"""What the measurements share: the machine's CPU model, a file lock, and atomic writes to the cache.

Measurements are cached as JSON under :func:`ckpt.config.cache_dir`.  A file
lock makes processes that start together (the ranks of one job on one
machine) share one measurement: the first measures while the others wait,
then they read its result.  Writes go to a temporary file that replaces the
cached one, so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from ckpt.cost_model.profiles import DeviceProfile

__all__ = ["cached_profile", "cpu_model", "locked", "write_atomically"]

log = logging.getLogger(__name__)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its directory) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            import fcntl
        except ImportError:  # not on POSIX: no cross-process lock
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step."""
    tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cached_profile(
    path: Path, measure: Callable[[], DeviceProfile], *, recalibrate: bool = False, announce: str = ""
) -> DeviceProfile:
    """The device profile cached at ``path``, or ``measure()`` stored there if there is none (or ``recalibrate``).

    ``announce`` is logged at INFO before measuring, with the path for its
    ``%s``.  Without a usable cache (a read-only home, a full disk) it
    measures without caching, with a warning.
    """
    directory = path.parent
    try:
        with locked(directory / "calibrate.lock"):
            profile = None
            if not recalibrate and path.exists():
                profile = DeviceProfile.from_json(path.read_text(encoding="utf-8"))
            if profile is None:
                if announce:
                    log.info(announce, path)
                profile = measure()
                write_atomically(path, profile.to_json())
            return profile
    except OSError as error:
        log.warning("ckpt: cannot use the calibration cache at %s (%s); measuring without it", directory, error)
        return measure()
