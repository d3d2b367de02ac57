"""``python -m benchmarks.fsdp``: a GPT-2 style model under FSDP2, default torch.compile against ckpt.

Examples::

    python -m benchmarks.fsdp                            # two CPU ranks (gloo): results/fsdp-cpu.md
    python -m benchmarks.fsdp --size small --rounds 3    # a quicker look
    python -m benchmarks.fsdp --device cuda --out "$OUT"   # one GPU (nccl), size gpu: $OUT/fsdp-<gpu>.md

Every rank builds the model from one seed, wraps each block and the root in
``fully_shard``, and compiles each block on its own (``block.compile()``, the
form FSDP2 recommends; its hooks run eagerly, so the embedding and the loss
stay eager in every setting).  The settings are default ``torch.compile``
(Inductor) and ``backend="ckpt"`` at ``memory_budget`` 0.5, on separate model
instances.  Per setting and rank it reports:

* **activation MiB**: the unique storages saved for the backward in one step,
  leaving out the inputs, the local shards and the unsharded parameters FSDP
  holds while a block runs (read from the module when each tensor is saved:
  FSDP frees them after the forward and gathers them again for the backward);
* **step ms**: forward plus backward, the median of round-robin steps (the
  settings alternate, each round starting one later; all ranks start each step
  together after a barrier);
* on a GPU, **peak MiB**: the highest memory allocated during a step above
  what was allocated before it;
* for ckpt, the joint graphs partitioned (blocks alike share one compiled
  graph and its plan) and their caps and predicted bytes, summed.

On the CPU the ranks are ``--world-size`` processes (default 2) on the
loopback address with gloo, one thread each; on CUDA the default is one
process with nccl.  The run is killed after ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.language_models import GPT, GPTConfig
from benchmarks.model_base import token_batch
from benchmarks.models import model_spec

__all__ = ["SIZES", "main"]

MIB = 2**20
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
SIZES: dict[str, GPTConfig] = {
    "tiny": model_spec("gpt2").sizes["tiny"],
    "small": GPTConfig(layers=4, dim=128, heads=4, seq=64, batch=4, vocab=512),
    "cpu": model_spec("gpt2").sizes["cpu"],
    "gpu": model_spec("gpt2").sizes["gpu"],
}
SETTINGS: tuple[tuple[str, str | None], ...] = (("compile", None), ("ckpt-0.5", "0.5"))  # (key, ckpt budget)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class RankResult:
    rank: int
    setting: str
    activation_bytes: int
    first_step_s: float
    samples_s: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    graphs: int = 0
    budget_bytes: int | None = None
    predicted_bytes: int | None = None
    fingerprints: list[str] = field(default_factory=list)  # ckpt's plan per graph
    optimal: bool = True  # every plan proven optimal (False: a search stopped at its work limit)

    @property
    def step_s(self) -> float:
        return statistics.median(self.samples_s)


def _build(config: GPTConfig, budget: str | None, device: torch.device, dtype: torch.dtype) -> GPT:
    from torch.distributed.fsdp import fully_shard

    from ckpt.backend import ckpt_backend  # the callable, so an uninstalled checkout (PYTHONPATH=.) works too

    torch.manual_seed(0)
    model = GPT(config).to(device, dtype)
    for block in model.blocks:
        fully_shard(block)
        if budget is None:
            block.compile()
        else:
            block.compile(backend=ckpt_backend, options={"memory_budget": budget})
    fully_shard(model)
    return model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(model: GPT, inputs: tuple[torch.Tensor, ...], device: torch.device) -> float:
    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    model(*inputs).backward()
    _sync(device)
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def _prepare(key: str, model: GPT, inputs: tuple[torch.Tensor, ...], rank: int, device: torch.device) -> RankResult:
    """Compile (first step, ckpt decisions recorded) and count the activation bytes (second step)."""
    from ckpt._torch_compat import compile_caches_disabled
    from ckpt.measure import saved_activations
    from ckpt.records import record_partitions

    with compile_caches_disabled(), record_partitions() as records:
        first = _step(model, inputs, device)
    with saved_activations(model, *inputs) as saved:
        loss = model(*inputs)
    loss.backward()
    model.zero_grad(set_to_none=True)
    plans = [r for r in records if r.plan is not None]
    return RankResult(
        rank=rank,
        setting=key,
        activation_bytes=saved.bytes,
        first_step_s=first,
        graphs=len(plans),
        budget_bytes=sum(r.budget_bytes or 0 for r in plans) if plans else None,
        predicted_bytes=sum(r.plan.bytes for r in plans) if plans else None,
        fingerprints=[str(r.fingerprint) for r in plans],
        optimal=all(r.plan.optimal for r in plans),
    )


def _peak_bytes(model: GPT, inputs: tuple[torch.Tensor, ...], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    model(*inputs).backward()
    torch.cuda.synchronize(device)
    model.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated(device) - before


def _rank_main(rank: int, args: argparse.Namespace, port: int, out_dir: str) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 64  # every block of every setting compiles the same code object
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    try:
        config = SIZES[args.size]
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
        inputs = token_batch(config, generator, device)
        models = {key: _build(config, budget, device, _DTYPES[args.dtype]) for key, budget in SETTINGS}
        results = {key: _prepare(key, model, inputs, rank, device) for key, model in models.items()}
        keys = list(models)
        _step(models[keys[0]], inputs, device)  # warm-up round
        _step(models[keys[1]], inputs, device)
        for round_index in range(args.rounds):
            for offset in range(len(keys)):
                key = keys[(round_index + offset) % len(keys)]
                results[key].samples_s.append(_step(models[key], inputs, device))
        if device.type == "cuda":
            for key, model in models.items():
                results[key].peak_bytes = _peak_bytes(model, inputs, device)
        everyone: list[Any] = [None] * args.world_size
        dist.all_gather_object(everyone, [asdict(result) for result in results.values()])
        if rank == 0:
            torch.save(everyone, Path(out_dir) / "results.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(args: argparse.Namespace) -> list[RankResult]:
    with tempfile.TemporaryDirectory(prefix="ckpt-fsdp-") as out_dir:
        context = mp.start_processes(
            _rank_main, args=(args, _free_port(), out_dir), nprocs=args.world_size, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + args.timeout
        try:
            while not context.join(timeout=max(0.0, deadline - time.monotonic()), grace_period=5):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the FSDP benchmark did not finish within {args.timeout:g} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        everyone = torch.load(Path(out_dir) / "results.pt", weights_only=False)
    return [RankResult(**fields) for rank_results in everyone for fields in rank_results]


def _device_name(args: argparse.Namespace) -> str:
    if args.device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.machine()} CPU, {args.threads} thread(s) per rank"


def _plan_cell(result: RankResult) -> str:
    if not result.fingerprints:
        return "-"
    text = " ".join(result.fingerprints)
    return text if result.optimal else text + " (search stopped at its work limit)"


def _markdown(args: argparse.Namespace, results: list[RankResult], command: str) -> str:
    config = SIZES[args.size]
    gpu = args.device == "cuda"
    base = {r.rank: r for r in results if r.setting == SETTINGS[0][0]}
    lines = [
        f"# FSDP2: default torch.compile against ckpt at 0.5 ({args.device.upper()}, {args.world_size} rank(s))",
        "",
        f"Generated by `{command}` on {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}.",
        f"torch {torch.__version__}, {_device_name(args)}, {'nccl' if gpu else 'gloo'}, {args.dtype}, "
        f"GPT-2 style `{args.size}` ({config.layers} layers, width {config.dim}, {config.heads} heads, "
        f"sequence {config.seq}, batch {config.batch} per rank, vocabulary {config.vocab}, dropout {config.dropout}), "
        f"median of {args.rounds} round-robin steps.",
        "",
        "`fully_shard` on every block and the root; each block compiled on its own (`block.compile()`), so the "
        "embedding and the loss run eagerly in both settings. *activation MiB*: unique storages saved for the "
        "backward on that rank, leaving out the inputs, the local shards and the unsharded parameters FSDP holds "
        "while a block runs. *step ms*: forward plus backward, all ranks starting together. *vs compile*: step time "
        "over default torch.compile's on the same rank. *first step s*: the compiling step. *graphs*: joint graphs "
        "ckpt partitioned (blocks alike share one compiled graph and its plan); *budget MiB*, *predicted MiB*: their "
        "caps and plans, summed over those graphs (a shared graph counted once). *plan*: the plan fingerprint of "
        "each graph, equal on every rank when the ranks made the same decisions.",
        "",
        "| setting | rank | activation MiB | step ms | vs compile | first step s | "
        + ("peak MiB | " if gpu else "")
        + "graphs | budget MiB | predicted MiB | plan |",
        "|---|---:|---:|---:|---:|---:|" + ("---:|" if gpu else "") + "---:|---:|---:|---|",
    ]
    for result in sorted(results, key=lambda r: ([k for k, _ in SETTINGS].index(r.setting), r.rank)):
        ratio = result.step_s / base[result.rank].step_s
        cells = [
            result.setting,
            str(result.rank),
            f"{result.activation_bytes / MIB:.3f}",
            f"{result.step_s * 1e3:.1f}",
            f"{ratio:.2f}",
            f"{result.first_step_s:.1f}",
        ]
        if gpu:
            cells.append("-" if result.peak_bytes is None else f"{result.peak_bytes / MIB:.1f}")
        cells += [
            str(result.graphs) if result.graphs else "-",
            "-" if result.budget_bytes is None else f"{result.budget_bytes / MIB:.3f}",
            "-" if result.predicted_bytes is None else f"{result.predicted_bytes / MIB:.3f}",
            _plan_cell(result),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    description = __doc__.split("\n\n")[0].strip("`")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fsdp", description=description)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--size", choices=list(SIZES), default=None, help="GPT-2 style size (default: gpu on CUDA, else cpu)"
    )
    parser.add_argument("--world-size", type=int, default=None, help="ranks (default: 2 on the CPU, 1 on CUDA)")
    parser.add_argument(
        "--dtype", choices=sorted(_DTYPES), default=None, help="default: bfloat16 on CUDA, else float32"
    )
    parser.add_argument("--rounds", type=int, default=10, help="timed round-robin rounds (default 10)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per rank (default 1)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is killed (default 1800)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--name", default=None, help="file name stem (default fsdp-cpu, or fsdp-<gpu> on CUDA)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    args.world_size = args.world_size or (1 if args.device == "cuda" else 2)
    args.size = args.size or ("gpu" if args.device == "cuda" else "cpu")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.device == "cuda" and args.world_size > torch.cuda.device_count():
        raise SystemExit(f"--world-size {args.world_size}: only {torch.cuda.device_count()} CUDA device(s)")
    results = _run(args)
    device_name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name(0).split()[-1].lower()
    stem = args.name or f"fsdp-{device_name}"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.md"
    command = shlex.join(["python", "-m", "benchmarks.fsdp", *argv])
    path.write_text(_markdown(args, results, command), encoding="utf-8")
    print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
