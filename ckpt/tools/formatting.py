"""Plain-text formatting shared by the reports: sizes, times, source lines and aligned Markdown tables."""

from __future__ import annotations

import re

from ckpt import config

__all__ = ["clip_rows", "format_bytes", "format_ps", "short_source", "table"]


def format_bytes(nbytes: float) -> str:
    """``nbytes`` for a table: ``config.format_bytes`` without the exact count."""
    return config.format_bytes(nbytes, exact=False)


def format_ps(ps: float) -> str:
    if abs(ps) < 1e6:
        return f"{ps / 1e3:.1f} ns"
    if abs(ps) < 1e9:
        return f"{ps / 1e6:.2f} us"
    return f"{ps / 1e9:.3f} ms"


_SOURCE_RE = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in \S+\s*(?P<code>.*)')


def short_source(source: str, width: int = 60) -> str:
    """``file.py:12 code`` from ``describe_value``'s source."""
    match = _SOURCE_RE.match(source)
    if not match:
        return source
    text = f"{match['path'].rsplit('/', 1)[-1]}:{match['line']} {match['code'].strip()}"
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    """An aligned Markdown table: readable as plain text and as Markdown."""
    cells = [[c.replace("|", "\\|") for c in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def clip_rows(rows: list[list[str]], max_rows: int | None, ncols: int) -> list[list[str]]:
    if max_rows is None or len(rows) <= max_rows:
        return rows
    return rows[:max_rows] + [[f"... {len(rows) - max_rows} more"] + [""] * (ncols - 1)]
