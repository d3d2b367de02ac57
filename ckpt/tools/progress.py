"""A one-line progress bar on stderr, with no dependency: the demo and the benchmarks draw it."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``[#####.....] 12/40  1m03s  gpt2: compile ckpt 0.5`` redrawn in place.

    On a stream that is not a terminal (a CI log), each update is a line of
    its own, so the log stays readable.
    """

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.started = time.perf_counter()
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    def add_total(self, extra: int) -> None:
        self.total = max(self.total + extra, self.done, 1)

    def update(self, label: str, advance: int = 1) -> None:
        self.done = min(self.done + advance, self.total)
        filled = int(self.width * self.done / self.total)
        elapsed = int(time.perf_counter() - self.started)
        text = (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{elapsed // 60}m{elapsed % 60:02d}s  {label}"
        )
        if self.interactive:
            self.stream.write("\r" + text[:120].ljust(120))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()
