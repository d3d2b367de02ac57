"""Measure saved activations and the step's peak under several settings, and the predicted peak.

``python -m benchmarks.peak_probe --model resnet --settings compile,ckpt-none,ckpt-0.5``

Each setting compiles a fresh function (after ``torch._dynamo.reset()``, with
the compile caches off), runs one warm-up step, then one step under
:func:`ckpt.measure.saved_activations` and one under
:func:`ckpt.measure.peak_memory`, gradients set to None before each.  For ckpt
settings it also prints the peak that :mod:`ckpt.partitioner.peak` predicts for
the recorded plans.  Settings:

* ``eager``, ``eager-checkpoint`` (every block under ``torch.utils.checkpoint``);
* ``compile`` (Inductor's own partitioner), ``compile-noreorder`` (the same with
  ``reorder_for_peak_memory`` off);
* ``ckpt-none`` and ``ckpt-<budget>``; ``ckpt-<budget>@<peak>`` adds a peak cap.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.language_models import GPT, GPTConfig
from benchmarks.model_base import BlockModel
from benchmarks.models import MODELS as BENCHMARK_MODELS
from benchmarks.vision_models import ResNet, ResNetConfig
from ckpt.measure import peak_memory, saved_activations
from ckpt.records import record_partitions

MODELS = {
    # The net of issue 10: 6 residual blocks, 32 channels, 64x64, batch 8, BatchNorm.
    "resnet": lambda: ResNet(ResNetConfig(widths=(32,), depth=6, image=64, batch=8, classes=10)),
    "gpt": lambda: GPT(GPTConfig(layers=4, dim=128, heads=4, seq=128, batch=4, vocab=512, dropout=0.0)),
    # The benchmark's models at their CPU size, as ``<name>-cpu``.
    **{f"{name}-cpu": functools.partial(spec.build, "cpu") for name, spec in BENCHMARK_MODELS.items()},
}


@contextlib.contextmanager
def _inductor_patch(**values: Any) -> Iterator[None]:
    import torch._inductor.config as inductor_config

    with inductor_config.patch(**values):
        yield


def _compiled(setting: str, model: BlockModel) -> tuple[Any, Any]:
    """The step function for ``setting`` and a context to run it in."""
    checkpoint = setting == "eager-checkpoint"

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        return model(*inputs, checkpoint_blocks=checkpoint)

    if setting.startswith("eager"):
        return run, contextlib.nullcontext
    if setting == "compile":
        return torch.compile(run), contextlib.nullcontext
    if setting == "compile-noreorder":
        return torch.compile(run), lambda: _inductor_patch(reorder_for_peak_memory=False)
    budget, _, peak = setting.removeprefix("ckpt-").partition("@")
    options: dict[str, Any] = {"memory_budget": budget}
    if peak:
        options["peak_memory"] = peak
    return torch.compile(run, backend="ckpt", options=options), contextlib.nullcontext


def measure(model_name: str, setting: str) -> dict[str, Any]:
    from ckpt import _torch_compat as compat

    torch.manual_seed(0)
    model = MODELS[model_name]()
    inputs = model.make_inputs(torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)
    torch._dynamo.reset()
    run, context = _compiled(setting, model)
    with compat.compile_caches_disabled(), context(), record_partitions() as records:
        run(*inputs).backward()
    row: dict[str, Any] = {"model": model_name, "setting": setting}
    with context():
        model.zero_grad(set_to_none=True)
        with saved_activations(model, *inputs) as saved:
            loss = run(*inputs)
        loss.backward()
        del loss
        model.zero_grad(set_to_none=True)
        peak = peak_memory(lambda: run(*inputs).backward())
    row["saved_mib"] = saved.bytes / 2**20
    row["peak_mib"] = peak.mib
    predicted = _predicted(records)
    if predicted is not None:
        row.update(predicted)
    return row


def _predicted(records: list[Any]) -> dict[str, Any] | None:
    """The predicted peak of the recorded graphs (one graph: its peak)."""
    plans = [r for r in records if r.peak is not None]
    if not records:
        return None
    if len(plans) != 1:
        return {"graphs": len(records)}
    prediction = plans[0].peak
    return {
        "predicted_mib": prediction.peak_bytes / 2**20,
        "predicted_at": f"{prediction.phase}:{prediction.node}",
        "plan_bytes_mib": plans[0].plan.bytes / 2**20,
        "peak_cap_mib": None if plans[0].peak_cap_bytes is None else plans[0].peak_cap_bytes / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet")
    parser.add_argument("--settings", default="compile,ckpt-none,ckpt-0.5,ckpt-0.15,ckpt-0.05,ckpt-0.0")
    parser.add_argument("--json", help="append one JSON line per setting to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    for setting in args.settings.split(","):
        row = measure(args.model, setting.strip())
        line = json.dumps(row)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if args.json:
            with open(args.json, "a") as stream:
                stream.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
