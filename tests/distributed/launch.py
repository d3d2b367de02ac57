"""Run a function on several ranks of a gloo group on this machine, with a hard time limit.

``run_ranks(fn, *args, timeout=...)`` starts ``world_size`` processes with the
``spawn`` start method, joins them into one gloo process group on the loopback
address (a free port per call), calls ``fn(rank, world_size, *args)`` on each
and returns the ranks' results in rank order.  ``fn`` must be importable by
module path, and its results must be picklable (``torch.save``).

A hang never outlives ``timeout`` seconds: when the time is up the ranks are
terminated, then killed, and :class:`RanksTimedOut` names the last step each
rank reported with :func:`progress`.  A rank that raises ends the run at once
(the others are stopped, since they may be waiting for it in a collective) and
:class:`RankFailed` carries every rank's traceback.  The gloo group's own timeout is
set to the same limit, so a collective that waits for a dead peer raises
rather than blocks.

Each run gets a private ``CKPT_CACHE_DIR``: the ranks calibrate the CPU
profile once, under the cache's file lock, and share the result, as ranks on
one machine do in a real job.

Each rank writes its output to a log file, with :mod:`faulthandler` on: a
rank killed by a signal (a crash in native code, which leaves no Python
traceback) is reported with its last step and the end of its log, where
faulthandler has written every thread's Python stack.  Such a crash ends the
launch and is tried once more, with a warning that carries the report: the
ranks' Python code raising, a hang, or a second crash fails the test.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import pickle
import socket
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankCrashed", "RankCrashWarning", "RankFailed", "RanksTimedOut", "free_port", "progress", "run_ranks"]

_GRACE_SECONDS = 3.0
_LOG_TAIL_LINES = 60
_progress_file: Path | None = None


class RanksTimedOut(AssertionError):
    """The ranks did not finish within the time limit (a hang, or far too slow)."""


class RankFailed(AssertionError):
    """A rank raised, or died; the message holds every rank's traceback and last step."""


class RankCrashed(RankFailed):
    """A rank was killed by a signal: a crash in native code, with the end of its log."""


class RankCrashWarning(UserWarning):
    """A launch crashed in native code once and was tried again."""


def free_port() -> int:
    """A TCP port on the loopback address that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def progress(step: str) -> None:
    """Record the step this rank is at, for the message if the run times out."""
    if _progress_file is not None:
        with open(_progress_file, "a", encoding="utf-8") as handle:
            handle.write(step + "\n")


def _last_step(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return "(not started)"
    return lines[-1] if lines else "(started, no step reported)"


def _entry(
    rank: int, fn: Callable[..., Any], world_size: int, port: int, directory: str, timeout: float, args: tuple
) -> None:
    global _progress_file
    _progress_file = Path(directory) / f"rank{rank}.progress"
    log = open(Path(directory) / f"rank{rank}.log", "ab", buffering=0)  # noqa: SIM115 - open until the process ends
    for stream in (1, 2):
        os.dup2(log.fileno(), stream)
    faulthandler.enable(file=log, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CKPT_CACHE_DIR=str(Path(directory) / "cache"))
    torch.set_num_threads(1)  # two ranks share two cores
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # compile in the rank itself: no worker pool to outlive a killed rank
    progress("init_process_group")
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
    try:
        result = fn(rank, world_size, *args)
        progress("done")
        torch.save(result, Path(directory) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _tracebacks(context: Any) -> str:
    """Every rank's traceback: the first rank to fail may only report that its peer went away."""
    text = ""
    for rank, path in enumerate(context.error_files):
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            text += f"\n\n-- rank {rank}:\n{pickle.load(handle)}"
    return text


def _stop(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + _GRACE_SECONDS
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(empty log)"


def run_ranks(fn: Callable[..., Any], *args: Any, timeout: float, world_size: int = 2) -> list[Any]:
    """``fn(rank, world_size, *args)`` on every rank; the results in rank order.

    A launch in which a rank crashed in native code is tried once more (see the
    module's docstring); the first crash's report is given as a
    :class:`RankCrashWarning`.
    """
    try:
        return _launch(fn, args, timeout, world_size)
    except RankCrashed as crash:
        warnings.warn(f"{crash}\n\nTrying the launch once more.", RankCrashWarning, stacklevel=2)
    return _launch(fn, args, timeout, world_size)


def _launch(fn: Callable[..., Any], args: tuple, timeout: float, world_size: int) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="ckpt-ranks-") as directory:
        context = mp.start_processes(
            _entry,
            args=(fn, world_size, free_port(), directory, timeout, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout

        def steps() -> str:
            return ", ".join(
                f"rank {r}: {_last_step(Path(directory) / f'rank{r}.progress')}" for r in range(world_size)
            )

        try:
            while not context.join(timeout=max(0.0, deadline - time.monotonic()), grace_period=_GRACE_SECONDS):
                if time.monotonic() >= deadline:
                    raise RanksTimedOut(f"{fn.__name__} did not finish within {timeout:g} s; last steps: {steps()}")
        except mp.ProcessRaisedException as error:
            _stop(context.processes)
            details = _tracebacks(context) or str(error)
            raise RankFailed(
                f"{fn.__name__} failed (first seen on rank {error.error_index}; last steps: {steps()}):{details}"
            ) from None
        except mp.ProcessExitedException as error:
            _stop(context.processes)
            log = _log_tail(Path(directory) / f"rank{error.error_index}.log")
            kind = RankCrashed if error.exit_code < 0 else RankFailed
            raise kind(
                f"{fn.__name__} failed: {error} (last steps: {steps()}){_tracebacks(context)}\n\n"
                f"-- the end of rank {error.error_index}'s log:\n{log}"
            ) from None
        finally:
            _stop(context.processes)
            for path in context.error_files:  # torch leaves a rank's traceback file behind
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return [torch.load(Path(directory) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
