"""Per-module budgets against one uniform budget with the same total, side by side.

``python -m benchmarks.module_budgets [--model gpt2] [--regions SPEC] [--size cpu] [--rounds 20] [--out FILE]``

The benchmark GPT-2 (``blocks.*.attn`` and ``blocks.*.mlp`` are modules) runs
under four settings in one process, timed round-robin by the benchmark
harness (``--model`` and ``--regions`` name another benchmark model and
per-module budget, such as the deep MLP with ``none,blocks.*=0.5``):

* ``compile``: default ``torch.compile`` (Inductor's partitioner);
* ``ckpt none``: ckpt without a budget;
* ``ckpt regions``: the attention blocks at 0.5, the MLPs at 0.1, the
  embeddings and the loss without a cap (``none,blocks.*.attn=0.5,blocks.*.mlp=0.1``);
* ``ckpt uniform``: one absolute budget equal to what ``ckpt regions`` saves,
  so both keep the same total.

The uniform plan solves the same problem with fewer constraints, so it can
only be as fast or faster by the cost model; the table shows what the
per-module split costs, and where each plan keeps its bytes (attention, MLP,
the rest), predicted from the plans with the regions' members.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import SettingResult, prepare_step, time_round_robin
from benchmarks.models import model_spec
from benchmarks.settings import CKPT, COMPILE, Setting, make_step
from ckpt.partitioner.problem import region_bytes
from ckpt.records import PartitionRecord, record_partitions
from ckpt.tools.formatting import table
from ckpt.tools.progress import Progress

REGIONS = "none,blocks.*.attn=0.5,blocks.*.mlp=0.1"
MIB = 2**20


def _kind(label: str) -> str:
    """The column a cap's bytes go to: GPT-2's ``attn`` and ``mlp``, else its label with layer numbers as ``*``."""
    if label.endswith((".attn", ".mlp")):
        return label.rsplit(".", 1)[1]
    return re.sub(r"\.\d+(?=\.|$)", ".*", label)


def _kinds(caps: list[dict[str, Any]]) -> list[str]:
    """The capped columns, in the order of the caps, and the rest of the graph."""
    return [*dict.fromkeys(_kind(cap["label"]) for cap in caps), "rest"]


def _distribution(plan_record: PartitionRecord, regions_record: PartitionRecord) -> dict[str, int]:
    """Bytes a plan keeps in the attention blocks, the MLPs and the rest, by the regional graph's members."""
    assert plan_record.analysis is not None and plan_record.plan is not None
    assert regions_record.analysis is not None
    problem = plan_record.analysis.problem
    if problem.names != regions_record.analysis.problem.names:
        raise RuntimeError("the two settings traced different joint graphs; their plans cannot be compared by region")
    plan = plan_record.plan
    kept: dict[str, int] = defaultdict(int)
    covered: set[int] = set()
    for cap in regions_record.region_caps:
        kept[_kind(cap.label)] += region_bytes(problem, plan.saved, plan.recomputed, cap.members)
        covered |= cap.members
    rest = frozenset(range(len(problem))) - covered
    kept["rest"] += region_bytes(problem, plan.saved, plan.recomputed, rest)
    return dict(kept)


def _prepare(setting: Setting, model: Any, inputs: Any, device: torch.device) -> tuple[Any, SettingResult, list]:
    step = make_step(setting, model)
    with record_partitions() as records:
        result = prepare_step(step, model, inputs, device)
    return step, result, list(records)


def run(size: str, rounds: int, model_name: str = "gpt2", regions: str = REGIONS) -> dict[str, Any]:
    torch.manual_seed(0)
    model = model_spec(model_name).build(size)
    model.train()
    device = torch.device("cpu")
    inputs = model.make_inputs(torch.Generator().manual_seed(1), device, torch.float32)
    settings = [
        Setting("compile", "compile", COMPILE),
        Setting("ckpt-none", "ckpt none", CKPT),
        Setting("ckpt-regions", _regions_label(regions), CKPT, budget_text=regions),
    ]
    progress = Progress(len(settings) + 1 + rounds + 1)
    steps, results, records_of = [], [], []
    for setting in settings:
        step, result, records = _prepare(setting, model, inputs, device)
        steps.append(step)
        results.append(result)
        records_of.append(records)
        progress.update(f"compiled {setting.label}")
    regional = results[-1]
    if regional.error is not None or len(records_of[-1]) != 1:
        raise RuntimeError(f"the regional setting failed or made several graphs: {regional.error}")
    (regions_record,) = records_of[-1]
    assert regions_record.plan is not None
    total = regions_record.plan.bytes
    uniform = Setting("ckpt-uniform", f"ckpt uniform ({total / MIB:.2f} MiB)", CKPT, budget_text=f"{total}B")
    step, result, records = _prepare(uniform, model, inputs, device)
    steps.append(step)
    results.append(result)
    records_of.append(records)
    progress.update(f"compiled {uniform.label}")
    time_round_robin(steps, results, model, inputs, device, rounds, progress, model_name)
    rows = []
    for result, records in zip(results, records_of):
        row: dict[str, Any] = {
            "setting": result.setting.label,
            "error": result.error,
            "saved_bytes": result.activation_bytes,
            "step_s": result.step_s,
            "spread": result.spread,
            "peak_bytes": result.measured_peak,
            "predicted_peak_bytes": result.predicted_peak,
        }
        if result.setting.family == CKPT and len(records) == 1 and records[0].plan is not None:
            row["predicted_extra_s"] = records[0].plan.time * 1e-12
            row["by_region"] = _distribution(records[0], regions_record)
        rows.append(row)
    caps = [
        {"label": c.label, "budget": c.budget, "cap": c.max_bytes, "autograd": c.reference_bytes}
        for c in regions_record.region_caps
    ]
    return {"model": model_name, "size": size, "rounds": rounds, "regions": regions, "caps": caps, "rows": rows}


def _regions_label(regions: str) -> str:
    if regions == REGIONS:
        return "ckpt regions (attn 0.5, mlp 0.1)"
    return f"ckpt regions ({', '.join(part for part in regions.split(',') if '=' in part)})"


def to_markdown(data: dict[str, Any]) -> str:
    rows = data["rows"]
    regional = next(r for r in rows if r["setting"].startswith("ckpt regions"))
    model = data.get("model", "gpt2")
    kinds = _kinds(data["caps"])
    command = f"python -m benchmarks.module_budgets --size {data['size']} --rounds {data['rounds']}"
    if model != "gpt2" or data["regions"] != REGIONS:
        command += f" --model {model} --regions '{data['regions']}'"
    out = [
        f"# Per-module budgets against a uniform budget ({model}, size {data['size']})",
        "",
        f"`{command}`: one process, "
        f"settings timed round-robin ({data['rounds']} rounds, medians), torch {torch.__version__}. Regions: "
        f"`{data['regions']}`; the uniform budget is an absolute size equal to what the regional plan saves.",
        "",
    ]
    body = []
    for r in rows:
        by = r.get("by_region", {})
        ratio = r["step_s"] / regional["step_s"] if r["step_s"] and regional["step_s"] else None
        body.append(
            [
                r["setting"],
                "-" if r["saved_bytes"] is None else f"{r['saved_bytes'] / MIB:.2f}",
                *(f"{by[k] / MIB:.2f}" if k in by else "-" for k in kinds),
                "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / MIB:.1f}",
                "-" if r["step_s"] is None else f"{r['step_s'] * 1e3:.1f}",
                "-" if r["spread"] is None else f"{100 * r['spread']:.1f}%",
                "-" if ratio is None else f"{ratio:.3f}",
                "-" if r.get("predicted_extra_s") is None else f"{r['predicted_extra_s'] * 1e3:.2f}",
            ]
        )
    header = [
        "setting",
        "saved MiB",
        *(f"{k} MiB" for k in kinds),
        "peak MiB",
        "step ms",
        "IQR",
        "vs regions",
        "predicted extra ms",
    ]
    out += [table(header, body, set(range(1, len(header)))), ""]
    out += ["Caps of the regional plan (summed over blocks):", ""]
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for cap in data["caps"]:
        kind = _kind(cap["label"])
        sums[kind][0] += cap["cap"]
        sums[kind][1] += cap["autograd"]
    out += [
        table(
            ["region", "cap MiB", "autograd saves MiB"],
            [[k, f"{a / MIB:.2f}", f"{b / MIB:.2f}"] for k, (a, b) in sums.items()],
            {1, 2},
        ),
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2", help="a benchmark model (benchmarks/models.py)")
    parser.add_argument("--regions", default=REGIONS, help="the per-module budget (CKPT_MEMORY_BUDGET's form)")
    parser.add_argument("--size", default="cpu", choices=("tiny", "cpu", "gpu"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write Markdown here (and JSON beside it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    data = run(args.size, args.rounds, args.model, args.regions)
    text = to_markdown(data)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
