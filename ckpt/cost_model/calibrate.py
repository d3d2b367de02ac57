"""Measure this machine's CPU rates for the ``cpu`` profile, and cache them.

The calibration times three things with the thread count torch uses:

* an fp32 and a bf16 matmul of 1024 x 1024 (peak matrix FLOP/s);
* a copy of a 64 MiB buffer (bytes read plus bytes written per second);
* a tiny elementwise op (the fixed cost of one kernel).

Each is the median of a few repetitions after a warm-up, and the whole run
takes about a second.  The result is cached as JSON under the cache directory
(``CKPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/ckpt``, else ``~/.cache/ckpt``),
keyed by CPU model, thread count and torch version.  A file lock makes
processes that start together (for example the ranks of one job) share one
measurement, so they plan alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ckpt.cost_model.profiles import DeviceProfile

__all__ = ["cache_dir", "calibrate_cpu", "cpu_profile"]

log = logging.getLogger(__name__)

_FORMAT_VERSION = 1


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    environ = dict(os.environ) if environ is None else environ
    if environ.get("CKPT_CACHE_DIR"):
        return Path(environ["CKPT_CACHE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ckpt"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _machine_key() -> str:
    text = f"{_cpu_model()}|threads={torch.get_num_threads()}|torch={torch.__version__}|v{_FORMAT_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _round(value: float) -> float:
    """Three significant digits, so tiny run-to-run jitter in a cache miss matters less."""
    return float(f"{value:.3g}")


def calibrate_cpu() -> DeviceProfile:
    """Measure the CPU rates now (about a second) and return the profile."""
    n = 1024
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    fp32 = 2 * n**3 / _median_seconds(lambda: torch.mm(a, b), 5)
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16 = 2 * n**3 / _median_seconds(lambda: torch.mm(a16, b16), 5)
    src = torch.empty(16 * 2**20)  # 64 MiB of fp32
    dst = torch.empty_like(src)
    copy_seconds = _median_seconds(lambda: dst.copy_(src), 5)
    bandwidth = 2 * src.numel() * src.element_size() / copy_seconds
    tiny = torch.empty(256)
    tiny_out = torch.empty_like(tiny)
    overhead = _median_seconds(lambda: torch.add(tiny, tiny, out=tiny_out), 200)
    return DeviceProfile(
        name="cpu",
        peak_flops=(("fp32", _round(fp32)), ("bf16", _round(bf16)), ("fp16", _round(bf16)), ("fp64", _round(fp32 / 2))),
        bandwidth=_round(bandwidth),
        kernel_overhead=_round(overhead),
        source=(
            f"measured on this machine ({_cpu_model()}, {torch.get_num_threads()} threads): "
            "1024x1024 fp32/bf16 matmul, 64 MiB copy, tiny elementwise op"
        ),
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
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


def _load(path: Path) -> DeviceProfile | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return DeviceProfile(
            name=data["name"],
            peak_flops=tuple((str(k), float(v)) for k, v in data["peak_flops"]),
            bandwidth=float(data["bandwidth"]),
            kernel_overhead=float(data["kernel_overhead"]),
            source=str(data["source"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cpu_profile(*, recalibrate: bool = False) -> DeviceProfile:
    """The cached ``cpu`` profile for this machine, measuring it on first use."""
    directory = cache_dir()
    path = directory / f"cpu-profile-{_machine_key()}.json"
    try:
        with _locked(directory / "calibrate.lock"):
            profile = None if recalibrate else _load(path)
            if profile is None:
                log.info("ckpt: calibrating the cpu profile (about a second); cached at %s", path)
                profile = calibrate_cpu()
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(
                    json.dumps(
                        {
                            "name": profile.name,
                            "peak_flops": list(profile.peak_flops),
                            "bandwidth": profile.bandwidth,
                            "kernel_overhead": profile.kernel_overhead,
                            "source": profile.source,
                        },
                        indent=2,
                    ),
                    encoding="utf-8",
                )
                os.replace(tmp, path)
            return profile
    except OSError as error:  # read-only home, full disk: measure without caching
        log.warning("ckpt: cannot use the calibration cache at %s (%s); measuring without it", directory, error)
        return calibrate_cpu()
