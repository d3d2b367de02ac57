"""``python -m benchmarks.recompute_twice``: is recomputing a value more than once worth it?

ckpt's plans recompute each value at most once, so when nothing but the
stack's input is saved the backward holds the whole recomputed forward again
(a budget of 0 peaks as high as saving everything).  Chen's sublinear schedule
and Checkmate allow recomputing a value several times instead.  This measures
the extreme of that trade in eager PyTorch on the net of issue 10 (6 residual
blocks, 32 channels, 64x64, batch 8), side by side:

* ``eager``: no recomputation;
* ``checkpoint``: every block under ``torch.utils.checkpoint`` (each block
  recomputed once, the block inputs saved);
* ``once``: only the stack's input saved, each block recomputed once in the
  backward (what a plan with budget 0 does: the backward recomputes the whole
  stack and holds it);
* ``quadratic``: only the stack's input saved; for the backward of block k,
  blocks 1..k-1 are recomputed again without keeping anything, so only one
  block's activations are alive at a time (n(n-1)/2 extra block forwards).

Each step's peak (``ckpt.measure.peak_memory``, gradients set to None first)
and its median time over round-robin rounds are printed as a Markdown table.
BatchNorm's running statistics are updated once per forward run, so the
recomputing schedules update them more often than training would; that does
not change the memory or the time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from benchmarks.vision_models import ResNet, ResNetConfig
from ckpt.measure import peak_memory

Step = Callable[[], None]


def _steps(model: ResNet, images: torch.Tensor, labels: torch.Tensor) -> dict[str, Step]:
    blocks = list(model.blocks)

    def eager() -> None:
        model(images, labels).backward()

    def per_block() -> None:
        model(images, labels, checkpoint_blocks=True).backward()

    def once() -> None:
        def stack(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = block(x)
            return x

        x = checkpoint(stack, model.embed(images, labels), use_reentrant=False)
        model.loss(x, images, labels).backward()

    def quadratic() -> None:
        x0 = model.embed(images, labels)
        with torch.no_grad():
            x = x0
            for block in blocks:
                x = block(x)
        top = x.detach().requires_grad_()
        model.loss(top, images, labels).backward()
        grad = top.grad
        for k in reversed(range(len(blocks))):
            with torch.no_grad():
                x = x0
                for block in blocks[:k]:
                    x = block(x)
            inner = x.detach().requires_grad_()
            blocks[k](inner).backward(grad)
            grad = inner.grad
        x0.backward(grad)

    return {"eager": eager, "checkpoint": per_block, "once": once, "quadratic": quadratic}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recompute_twice", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="timed round-robin rounds (default 7)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    torch.manual_seed(0)
    model = ResNet(ResNetConfig(widths=(32,), depth=6, image=64, batch=8, classes=10))
    images, labels = model.make_inputs(torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)
    steps = _steps(model, images, labels)
    peaks, times = {}, {name: [] for name in steps}
    for name, step in steps.items():
        step()  # warm-up
        model.zero_grad(set_to_none=True)
        peaks[name] = peak_memory(step).bytes
        model.zero_grad(set_to_none=True)
    names = list(steps)
    for round_index in range(args.rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            started = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
    base_peak, base_time = peaks["eager"], statistics.median(times["eager"])
    lines = ["| schedule | peak MiB | vs eager | step ms | vs eager |", "|---|---:|---:|---:|---:|"]
    for name in names:
        step_s = statistics.median(times[name])
        lines.append(
            f"| {name} | {peaks[name] / 2**20:.1f} | {peaks[name] / base_peak:.2f}x | {step_s * 1e3:.1f} "
            f"| {step_s / base_time:.2f}x |"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
