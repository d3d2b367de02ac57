"""``python -m ckpt demo``: train a small GPT for a few steps under each setting.

Rows: default ``torch.compile``, then ``backend="ckpt"`` with no cap and at
budgets 0.5 and 0.25.  Each row shows the measured activation MiB (saved
tensors, counted by :mod:`ckpt.measure`), the peak of one more step
(:func:`ckpt.measure.peak_memory`), the median step time, and the loss after
the last step.  Every setting starts from the same weights and the same
seed, so the losses agree: recomputation changes memory and time, not results.
The settings are trained side by side, one step of each in turn, so that the
machine's drift hits them alike.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import torch
import torch.nn as nn
import torch.nn.functional as F

from ckpt import _torch_compat as compat
from ckpt.measure import peak_memory, saved_activations
from ckpt.records import record_partitions
from ckpt.tools.common import rotation
from ckpt.tools.progress import Progress

__all__ = ["DemoGPT", "DemoRow", "GPTAttention", "GPTBlock", "GPTMLP", "run_demo"]


class GPTAttention(nn.Module):
    """Pre-LayerNorm causal self-attention (``scaled_dot_product_attention``), with dropout after the projection."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dropout(self.proj(attn.transpose(1, 2).reshape(b, t, d)))


class GPTMLP(nn.Module):
    """Pre-LayerNorm GELU MLP, four times as wide inside, with dropout after it."""

    def __init__(self, dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.out(F.gelu(self.fc(self.ln(x)))))


class GPTBlock(nn.Module):
    """A GPT-2 block: ``attn`` then ``mlp``, each added to the residual stream.

    With ``dropout > 0``, dropout after the attention projection and the MLP.
    The demo, the benchmarks' GPT-2 model and the end-to-end tests share it;
    per-module budgets name its parts (``blocks.*.attn``, ``blocks.*.mlp``).
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.attn = GPTAttention(dim, heads, dropout)
        self.mlp = GPTMLP(dim, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class DemoGPT(nn.Module):
    """A GPT-2 style language model: learned positions, LayerNorm, GELU MLP, dropout."""

    def __init__(self, vocab: int = 256, dim: int = 128, layers: int = 4, heads: int = 4, seq: int = 128) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, 0.1) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@dataclass(frozen=True)
class DemoRow:
    setting: str
    activation_mib: float
    budget_mib: float | None  # the ckpt cap, summed over the compiled graphs
    step_ms: float
    loss: float
    peak_mib: float = math.nan  # one more forward and backward, measured; no optimizer step


def _settings() -> list[tuple[str, Callable[[nn.Module], Callable[..., Any]]]]:
    def ckpt(budget: str) -> Callable[[nn.Module], Callable[..., Any]]:
        return lambda m: torch.compile(m, backend="ckpt", options={"memory_budget": budget})

    return [
        ("torch.compile (default)", lambda m: torch.compile(m)),
        ("ckpt, no cap", ckpt("none")),
        ("ckpt, budget 0.5", ckpt("0.5")),
        ("ckpt, budget 0.25", ckpt("0.25")),
    ]


@dataclass
class _Run:
    """One setting's model, compiled step, optimizer, RNG state and what it measured."""

    name: str
    model: nn.Module
    compiled: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    rng: torch.Tensor
    cuda_rng: torch.Tensor | None
    times: list[float]
    saved_bytes: int = 0
    loss: float = math.nan
    budgets: list[int | None] | None = None


def _step(run: _Run, idx: torch.Tensor, targets: torch.Tensor, device: str, timed: bool) -> None:
    """One training step of ``run``, under its own RNG stream, so that settings interleave freely."""
    torch.set_rng_state(run.rng)
    if run.cuda_rng is not None:
        torch.cuda.set_rng_state(run.cuda_rng)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    caches_off = compat.compile_caches_disabled()
    with caches_off, saved_activations(run.model, idx, targets) as saved, record_partitions() as records:
        loss = run.compiled(idx, targets)
    loss.backward()
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    if timed:
        run.times.append(time.perf_counter() - start)
    if records:  # the compiling step: one record per partitioned graph
        run.budgets = [r.budget_bytes for r in records]
    run.saved_bytes, run.loss = saved.bytes, loss.item()
    run.rng = torch.get_rng_state()
    run.cuda_rng = torch.cuda.get_rng_state() if run.cuda_rng is not None else None


def run_demo(steps: int = 8, device: str | None = None, stream: TextIO = sys.stderr) -> list[DemoRow]:
    """Train the demo model ``steps`` steps per setting and return one row per setting.

    Every setting starts from the same weights and the same RNG state (so the
    same dropout masks).  Each step runs every setting in turn, starting one
    later each step, so that the machine's drift hits all settings alike; the
    first step, which compiles, is not timed.
    """
    if steps < 2:
        raise ValueError(f"steps={steps} is too few; the demo needs at least 2 (one warm-up, one timed)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.compiler.reset()
    torch.manual_seed(0)
    base = DemoGPT().to(device)
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (steps, 8, 129), generator=generator).to(device)
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state() if device == "cuda" else None
    runs = []
    for name, make in _settings():
        model = copy.deepcopy(base)
        runs.append(_Run(name, model, make(model), torch.optim.SGD(model.parameters(), lr=0.1), rng, cuda_rng, []))
    progress = Progress(len(runs) * steps, stream)
    for step in range(steps):
        idx, targets = data[step, :, :-1], data[step, :, 1:]
        for run in rotation(runs, step):
            _step(run, idx, targets, device, timed=step > 0)
            progress.update(f"{run.name}: step {step + 1}/{steps}")
    progress.close()
    idx, targets = data[-1, :, :-1], data[-1, :, 1:]
    peaks = {run.name: _peak_mib(run, idx, targets, device) for run in runs}
    rows = []
    for run in runs:
        caps = run.budgets or []
        budget_mib = sum(c for c in caps if c is not None) / 2**20 if caps and None not in caps else None
        rows.append(
            DemoRow(
                run.name,
                run.saved_bytes / 2**20,
                budget_mib,
                statistics.median(run.times) * 1e3,
                run.loss,
                peaks[run.name],
            )
        )
    return rows


def _peak_mib(run: _Run, idx: torch.Tensor, targets: torch.Tensor, device: str) -> float:
    """The peak of one more forward and backward (gradients dropped, RNG state restored)."""
    rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state() if device == "cuda" else None
    torch.set_rng_state(run.rng)
    run.optimizer.zero_grad(set_to_none=True)
    peak = peak_memory(lambda: run.compiled(idx, targets).backward(), device)
    run.optimizer.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng)
    return peak.mib


def format_rows(rows: list[DemoRow], steps: int) -> str:
    header = f"| setting | activation MiB | budget MiB | step peak MiB | step ms (median) | loss after {steps} steps |"
    lines = [header, "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        budget = "-" if row.budget_mib is None else f"{row.budget_mib:.2f}"
        lines.append(
            f"| {row.setting} | {row.activation_mib:.2f} | {budget} | {row.peak_mib:.2f} | {row.step_ms:.1f} "
            f"| {row.loss:.6f} |"
        )
    return "\n".join(lines)
