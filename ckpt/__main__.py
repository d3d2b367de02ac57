"""Command line: ``python -m ckpt demo``, ``calibrate``, ``explain``, ``pareto`` and ``validate``.

``explain``, ``pareto`` and ``validate`` take a model factory as
``module:function``: a function of no arguments returning
``(model, (inputs...))`` or ``(model, input)`` (see :mod:`ckpt.tools.factory`).
"""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from ckpt.tools.demo import format_rows, run_demo

    rows = run_demo(steps=args.steps, device=args.device)
    print(format_rows(rows, args.steps))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import torch

    if args.device == "cpu":
        from ckpt.cost_model.calibrate import cpu_profile

        profile = cpu_profile(recalibrate=True)
    else:
        if not torch.cuda.is_available():
            print(f"--device {args.device}: no CUDA device is available here", file=sys.stderr)
            return 2
        from ckpt.cost_model.gpu_calibrate import gpu_profile

        profile = gpu_profile(torch.device(args.device), recalibrate=True)
    print(f"{profile.name} profile: {profile.source}")
    for dtype, rate in profile.peak_flops:
        print(f"  peak {dtype}: {rate / 1e9:.1f} GFLOP/s")
    print(f"  bandwidth: {profile.bandwidth / 1e9:.1f} GB/s")
    print(f"  kernel overhead: {profile.kernel_overhead * 1e6:.2f} us")
    if profile.cache_bytes:
        print(f"  cache tier: {profile.cache_bandwidth / 1e9:.1f} GB/s up to {profile.cache_bytes / 2**20:.0f} MiB")
    print(f"  convolution efficiency: {profile.conv_efficiency:.2f} of the matrix rate")
    print(
        f"  fused work per element: {profile.element_seconds * 1e9:.4f} ns simple, "
        f"{profile.transcendental_seconds * 1e9:.3f} ns transcendental, "
        f"{profile.seconds_per_element(False, random=True) * 1e9:.3f} ns per random draw"
    )
    if profile.byte_store_seconds or profile.byte_load_seconds:
        print(
            f"  bool tensors in fused kernels: {profile.byte_store_seconds * 1e9:.2f} ns per element written, "
            f"{profile.byte_load_seconds * 1e9:.2f} ns read"
        )
    return 0


def _device_arg(text: str) -> str:
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a device; give cpu, cuda or cuda:N")


def _budget_arg(text: str) -> str:
    from ckpt.config import parse_budget

    try:
        return str(parse_budget(text, "--budget"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _budget_list_arg(text: str) -> list[str]:
    from ckpt.config import parse_budget

    budgets = [b.strip() for b in text.split(",") if b.strip()]
    if not budgets:
        raise argparse.ArgumentTypeError(
            f"{text!r} holds no budget; give a comma-separated list such as none,0.5,0.25,0"
        )
    try:
        return [str(parse_budget(b, "budget")) for b in budgets]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _steps_arg(text: str) -> int:
    try:
        steps = int(text)
    except ValueError:
        steps = -1
    if steps < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid number of steps; give an integer >= 1")
    return steps


def _model(parser: argparse.ArgumentParser, spec: str) -> tuple:
    from ckpt.tools.factory import FactoryError, call_factory

    try:
        return call_factory(spec)
    except FactoryError as error:
        parser.error(str(error))
        raise  # parser.error exits; this keeps type checkers content


def _explain(args: argparse.Namespace) -> int:
    import json

    from ckpt.tools.explainer import explain

    model, inputs = _model(args.parser, args.factory)
    report = explain(model, *inputs, budget=args.budget)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.to_markdown(max_rows=args.rows))
    return 0


def _pareto(args: argparse.Namespace) -> int:
    from ckpt.tools.common import require_matplotlib
    from ckpt.tools.tradeoff import pareto

    try:
        require_matplotlib()
    except ImportError as error:
        args.parser.error(str(error))
    _allocator(args.malloc)
    model, inputs = _model(args.parser, args.factory)
    print(
        pareto(
            model,
            *inputs,
            budget=args.budget,
            path=args.out,
            measure=args.measure,
            steps=args.steps,
            statistic=args.statistic,
        )
    )
    return 0


def _allocator(mode: str) -> None:
    """Timing commands: ``--malloc`` applied (:func:`ckpt.measure.set_malloc`)."""
    from ckpt.measure import set_malloc

    set_malloc(mode)


def _validate(args: argparse.Namespace) -> int:
    from ckpt.tools.tradeoff import validate_time_model

    _allocator(args.malloc)
    model, inputs = _model(args.parser, args.factory)
    print(validate_time_model(model, *inputs, budgets=args.budgets, steps=max(args.steps, 2), statistic=args.statistic))
    return 0


def _add_model_commands(commands: argparse._SubParsersAction) -> None:
    factory_help = "model factory as module:function, returning (model, (inputs...)) or (model, input)"
    statistic_help = "summary of the timed steps: median (default), or min on a machine shared with other work"
    malloc_help = (
        "keep (default): glibc's malloc keeps freed memory, so no step pays page faults for memory given back "
        "between steps (ckpt.measure.keep_freed_memory); default: glibc's own thresholds"
    )
    explain = commands.add_parser(
        "explain", help="compile a model with ckpt, run one step, print what was saved and recomputed"
    )
    explain.add_argument("factory", help=factory_help)
    explain.add_argument(
        "--budget", type=_budget_arg, default=None, help="memory budget (default: CKPT_MEMORY_BUDGET, else none)"
    )
    explain.add_argument("--rows", type=_steps_arg, default=40, help="rows per table (default 40)")
    explain.add_argument("--json", action="store_true", help="print the report as JSON")
    explain.set_defaults(run=_explain, parser=explain)
    pareto = commands.add_parser(
        "pareto", help="plot predicted and measured step time against activation bytes across budgets"
    )
    pareto.add_argument("factory", help=factory_help)
    pareto.add_argument("--budget", type=_budget_arg, default="0.5", help="the budget to mark (default 0.5)")
    pareto.add_argument("--out", default="ckpt-pareto.png", help="PNG path (default ckpt-pareto.png)")
    pareto.add_argument(
        "--measure",
        type=_budget_list_arg,
        default=["none", "0.5", "0.25", "0"],
        help="budgets to compile and measure (default none,0.5,0.25,0)",
    )
    pareto.add_argument("--steps", type=_steps_arg, default=5, help="timed steps per budget (default 5)")
    pareto.add_argument("--statistic", choices=["median", "min"], default="median", help=statistic_help)
    pareto.add_argument("--malloc", choices=["keep", "default"], default="keep", help=malloc_help)
    pareto.set_defaults(run=_pareto, parser=pareto)
    validate = commands.add_parser(
        "validate", help="measured against predicted step-time change from recomputation, and step peak"
    )
    validate.add_argument("factory", help=factory_help)
    validate.add_argument(
        "--budgets",
        type=_budget_list_arg,
        default=["0.5", "0.25", "0"],
        help="budgets to compare with no cap (default 0.5,0.25,0)",
    )
    validate.add_argument(
        "--steps", type=_steps_arg, default=15, help="timed steps per budget (default 15, at least 2)"
    )
    validate.add_argument("--statistic", choices=["median", "min"], default="median", help=statistic_help)
    validate.add_argument("--malloc", choices=["keep", "default"], default="keep", help=malloc_help)
    validate.set_defaults(run=_validate, parser=validate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small GPT under default torch.compile and ckpt budgets")
    demo.add_argument("--steps", type=int, default=8, help="training steps per setting (default 8)")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    demo.set_defaults(run=_demo)
    calibrate = commands.add_parser(
        "calibrate", help="measure this machine's CPU rates (or a GPU's) for the cost model, replacing the cached ones"
    )
    calibrate.add_argument("--device", type=_device_arg, default="cpu", help="cpu (default), cuda or cuda:N")
    calibrate.set_defaults(run=_calibrate)
    _add_model_commands(commands)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
