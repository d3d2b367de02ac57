"""Smoke test of the benchmark runner: one tiny model, three settings.

It checks structure only (files written, rows present, bytes within budget),
never timings: step times on a shared CI machine mean nothing.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.compile


def test_quick_run_writes_table_json_and_plot(tmp_path):
    from benchmarks.plot import matplotlib_available
    from benchmarks.run import main

    argv = ["--quick", "--models", "mlp", "--settings", "eager,compile,ckpt-0.5,ckpt-peak-0.5", "--rounds", "1"]
    assert main([*argv, "--out", str(tmp_path), "--name", "smoke", "--plot", "auto"]) == 0

    table = (tmp_path / "smoke.md").read_text()
    for row in ("| eager |", "| compile |", "| ckpt 0.5 |", "## Targets", "| within budget |"):
        assert row in table
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
    ]
    assert data["targets"][0]["met"] is True
