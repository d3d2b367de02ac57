"""Command line: ``python -m ckpt demo`` and ``python -m ckpt calibrate``."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from ckpt.demo import format_rows, run_demo

    rows = run_demo(steps=args.steps, device=args.device)
    print(format_rows(rows, args.steps))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from ckpt.cost_model.calibrate import cpu_profile

    profile = cpu_profile(recalibrate=True)
    print(f"cpu profile: {profile.source}")
    for dtype, rate in profile.peak_flops:
        print(f"  peak {dtype}: {rate / 1e9:.1f} GFLOP/s")
    print(f"  bandwidth: {profile.bandwidth / 1e9:.1f} GB/s")
    print(f"  kernel overhead: {profile.kernel_overhead * 1e6:.2f} us")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small GPT under default torch.compile and ckpt budgets")
    demo.add_argument("--steps", type=int, default=8, help="training steps per setting (default 8)")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    demo.set_defaults(run=_demo)
    calibrate = commands.add_parser("calibrate", help="measure this machine's CPU rates for the cost model")
    calibrate.set_defaults(run=_calibrate)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
