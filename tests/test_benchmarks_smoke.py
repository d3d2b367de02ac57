"""Smoke test of the benchmark runner: one tiny model, three settings.

It checks structure only (files written, rows present, bytes within budget),
never timings: step times on a shared CI machine mean nothing.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.compile


def test_quick_run_writes_table_json_and_plot(tmp_path):
    from benchmarks.plot import matplotlib_available
    from benchmarks.run import main
    from ckpt.measure import glibc_malloc, minor_faults

    argv = ["--quick", "--models", "mlp", "--settings", "eager,compile,ckpt-0.5,ckpt-peak-0.5", "--rounds", "1"]
    assert main([*argv, "--out", str(tmp_path), "--name", "smoke", "--plot", "auto"]) == 0

    table = (tmp_path / "smoke.md").read_text()
    for row in ("| eager |", "| compile |", "| ckpt 0.5 |", "## Targets", "| within budget |"):
        assert row in table
    if glibc_malloc():
        assert "Memory allocator: glibc malloc keeps freed memory" in table
    assert (tmp_path / "smoke.png").exists() == matplotlib_available()
    assert (tmp_path / "smoke-peak.png").exists() == matplotlib_available()

    data = json.loads((tmp_path / "smoke.json").read_text())
    (model,) = data["models"]
    assert model["name"] == "mlp" and model["size"] == "tiny"
    settings = {s["setting"]["key"]: s for s in model["settings"]}
    assert list(settings) == ["eager", "compile", "ckpt-0.5", "ckpt-peak-0.5"]
    for key, result in settings.items():
        assert result["error"] is None, f"{key}: {result['error']}"
        assert result["activation_bytes"] > 0 and result["step_peak"] > 0
        assert len(result["samples_s"]) == 1
        assert len(result["page_faults"]) == (1 if minor_faults() is not None else 0)
    capped = settings["ckpt-peak-0.5"]  # the tiny MLP's peak is its gradients: the cap is out of reach
    assert all(0 < g["peak_cap_bytes"] < g["predicted_peak"] for g in capped["graphs"])

    ckpt = settings["ckpt-0.5"]
    assert ckpt["graphs"], "the ckpt partitioner ran on no graph (a compile cache served the plan?)"
    assert all(g["fallback_reason"] is None for g in ckpt["graphs"])
    budget = sum(g["budget_bytes"] for g in ckpt["graphs"])
    assert ckpt["activation_bytes"] <= budget
    assert ckpt["activation_bytes"] < settings["compile"]["activation_bytes"]
    assert [t["name"] for t in data["targets"]] == [
        "within budget",
        "not dominated",
        "time at matched memory",
        "budget 0.5 vs compile",
        "peak predicted",
        "peak cap kept",
        "peak monotone in the budget",
        "time at matched peak",
        "ResNet peak",
        "time predicted",
    ]
    assert data["targets"][0]["met"] is True


def test_plan_at_scale_on_fake_tensors_gives_consistent_rows():
    from benchmarks.models import model_spec
    from benchmarks.plan_at_scale import markdown, plan_model
    from ckpt.cost_model.profiles import GPU_PROFILES

    profile = GPU_PROFILES["h200"]
    result = plan_model(
        "llama tiny", lambda: model_spec("llama").build("tiny"), profile=profile, budgets=(None, 0.5, 0.0), peaks=(0.5,)
    )
    # fake CPU tensors trace the fused attention kernel, which never materialises seq x seq
    assert any("flash_attention" in op for op in result.attention_ops)
    assert result.square_values == 0
    assert result.joint_nodes > 0 and result.fixed_seconds > 0

    rows = {r.setting: r for r in result.rows}
    assert list(rows) == ["autograd", "budget none", "budget 0.5", "budget 0", "peak 0.5"]
    assert rows["autograd"].saved_bytes == result.reference_bytes > 0
    assert rows["autograd"].peak_bytes == result.reference_peak
    assert rows["budget 0.5"].budget_bytes == result.reference_bytes // 2
    assert rows["peak 0.5"].peak_cap_bytes == result.reference_peak // 2
    for row in result.rows:
        assert row.peak_bytes >= row.saved_bytes >= 0 and row.peak_bytes > 0, row
        if row.budget_bytes is not None:
            assert row.saved_bytes <= row.budget_bytes or row.over_budget, row
        if row.setting != "autograd":
            assert row.torch is not None and row.torch.error is None, row
            assert row.torch.saved_bytes is not None and row.torch.peak_bytes is not None
            assert row.torch.peak_bytes >= row.torch.saved_bytes
    assert rows["budget 0.5"].torch.knob == 0.5 and rows["budget none"].torch.knob == 1.0

    table = markdown([result], "python -m benchmarks.plan_at_scale", profile)
    for text in ("## llama tiny", "| budget 0.5 |", "| peak 0.5 |", torch.__version__):
        assert text in table


def test_solver_speed_rows_time_the_solve_and_the_planning_step():
    from benchmarks.solver_speed import FRACTIONS, measure_layers
    from ckpt.cost_model.profiles import GPU_PROFILES

    rows = measure_layers(1, GPU_PROFILES["h100"])
    assert [r.fraction for r in rows] == list(FRACTIONS)
    for row in rows:
        assert row.plan_s > 0 and row.peak_bytes > 0
        within = row.budget_bytes is None or row.plan_bytes <= row.budget_bytes or row.minimum_bytes is not None
        assert within, row


def test_module_budgets_table_splits_each_plan_by_region():
    from benchmarks.module_budgets import to_markdown

    mib = 2**20
    row = {"error": None, "spread": 0.02, "peak_bytes": 30 * mib, "predicted_peak_bytes": 29 * mib}
    data = {
        "size": "cpu",
        "rounds": 20,
        "regions": "none,blocks.*.attn=0.5,blocks.*.mlp=0.1",
        "caps": [
            {"label": "blocks.0.attn", "budget": "0.5", "cap": 4 * mib, "autograd": 8 * mib},
            {"label": "blocks.0.mlp", "budget": "0.1", "cap": 1 * mib, "autograd": 10 * mib},
        ],
        "rows": [
            {**row, "setting": "compile", "saved_bytes": 20 * mib, "step_s": 0.100},
            {
                **row,
                "setting": "ckpt regions (attn 0.5, mlp 0.1)",
                "saved_bytes": 6 * mib,
                "step_s": 0.110,
                "predicted_extra_s": 0.008,
                "by_region": {"attn": 4 * mib, "mlp": 1 * mib, "rest": 1 * mib},
            },
        ],
    }
    text = to_markdown(data)
    assert "| ckpt regions (attn 0.5, mlp 0.1) |      6.00 |     4.00 |    1.00 |     1.00 |" in text
    assert "0.909" in text  # compile's step over the regional one
    assert "| mlp    |    1.00 |              10.00 |" in text


def test_peak_accuracy_writes_predicted_and_measured_peaks(tmp_path):
    from benchmarks.peak_accuracy import main

    out = tmp_path / "peak.md"
    assert main(["--models", "mlp", "--settings", "0.5,peak-0.5", "--size", "tiny", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Predicted within 10% of measured:" in text and "of 2;" in text
    rows = [line for line in text.splitlines() if line.startswith("| mlp |")]
    assert [row.split(" | ")[1] for row in rows] == ["0.5", "peak-0.5"]
    assert all(float(row.split(" | ")[4]) > 0 for row in rows)  # a measured peak in MiB


def test_compile_cost_takes_any_benchmark_model_and_names_what_it_accepts(capsys):
    from benchmarks.compile_cost import _build, _case, _markdown, main

    assert _case("gpt2:4") == ("gpt2", 4)
    assert _case("resnet") == ("resnet", None)
    assert _build("gpt2", 3).config.layers == 3  # the cpu size, its depth replaced
    assert _build("unet", None).config.widths == (16, 32, 64, 128)
    for text, message in (
        ("resnet:4", "model 'resnet' has no depth to set"),
        ("gpt2:0", "must be a whole number of layers"),
        ("bert", "accepted models are gpt2, llama"),
    ):
        with pytest.raises(SystemExit):
            main(["--models", text])
        assert message in capsys.readouterr().err
    row = {"compile_s": 10.0, "partition_s": 0.5, "plan_s": 0.2, "kernels": 30}
    table = _markdown(
        {
            ("gpt2", 4): {"inductor": [dict(row, layers=4)], "ckpt-none": [dict(row, layers=4, compile_s=11.0)]},
            ("unet", None): {"inductor": [dict(row, layers=None)], "ckpt-0.5": [dict(row, layers=None)]},
        },
        1,
    )
    assert "| gpt2 | 4 | ckpt-none | 11.0 | 1.100 | 0.50 | 0.20 | 30 |" in table
    assert "| unet | - | inductor | 10.0 | 1.000 | 0.50 | - | 30 |" in table
