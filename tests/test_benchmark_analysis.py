"""The benchmark verdicts on made-up measurements: noise, dominance, matched memory."""

from __future__ import annotations

from benchmarks.analysis import analyze_model, evaluate_targets
from benchmarks.harness import ModelResult, SettingResult
from benchmarks.settings import SETTINGS


def _model(samples: dict[str, list[float]], mib: dict[str, float]) -> ModelResult:
    settings = [
        SettingResult(SETTINGS[key], activation_bytes=int(mib[key] * 2**20), samples_s=list(times))
        for key, times in samples.items()
    ]
    return ModelResult("m", "M", transformer=True, size="cpu", params=1, config={}, settings=settings)


def test_noise_is_at_least_the_gap_and_grows_with_the_spread():
    steady = [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00]
    noisy = [1.00, 1.20, 0.85, 1.10, 0.90, 1.15, 0.80, 1.05, 0.95, 1.25]
    mib = {"compile": 10.0, "compile-repeat": 10.0}
    calm = analyze_model(_model({"compile": steady, "compile-repeat": steady[::-1]}, mib))
    rough = analyze_model(_model({"compile": noisy, "compile-repeat": noisy[::-1]}, mib))
    assert calm.noise is not None and rough.noise is not None
    # Equal medians: the gap is 0, and the noise comes from the spread of the rounds.
    assert 0.0 < calm.noise < 0.02
    assert rough.noise > 3 * calm.noise
    assert analyze_model(_model({"compile": noisy, "compile-repeat": noisy[::-1]}, mib)).noise == rough.noise
    shifted = analyze_model(_model({"compile": [t * 1.3 for t in steady], "compile-repeat": steady}, mib))
    assert shifted.noise is not None and shifted.noise >= 0.3 - 1e-9


def test_a_ckpt_point_beaten_on_both_axes_is_dominated_beyond_noise():
    steady = [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00]
    samples = {
        "compile": steady,
        "compile-repeat": steady,
        "torch-0.5": [t * 1.05 for t in steady],
        "ckpt-0.5": [t * 1.20 for t in steady],
    }
    mib = {"compile": 100.0, "compile-repeat": 100.0, "torch-0.5": 40.0, "ckpt-0.5": 50.0}
    verdict = analyze_model(_model(samples, mib))
    beaten = [d for d in verdict.dominated if d["setting"] == "ckpt 0.5" and d["by"] == "torch 0.5"]
    assert beaten and beaten[0]["beyond_noise"]
    matched = {m["setting"]: m for m in verdict.matched}
    assert abs(matched["ckpt 0.5"]["ratio"] - 1.20 / 1.05) < 1e-9


def _peaked(key: str, peak_mib: float, seconds: float, **graph: float) -> SettingResult:
    graphs = [{k: int(v * 2**20) for k, v in graph.items()}] if graph else []
    return SettingResult(
        SETTINGS[key], activation_bytes=2**20, samples_s=[seconds] * 5, step_peak=int(peak_mib * 2**20), graphs=graphs
    )


def test_peak_targets_catch_a_rise_a_broken_cap_a_bad_prediction_and_a_slower_point():
    settings = [
        _peaked("compile", 100.0, 1.0),
        _peaked("compile-repeat", 100.0, 1.0),
        _peaked("torch-0.5", 60.0, 1.05),
        _peaked("ckpt-none", 70.0, 1.0, predicted_peak=69.0),
        _peaked("ckpt-0.5", 60.0, 1.10, predicted_peak=59.0),  # slower than torch 0.5 at the same peak
        _peaked("ckpt-0.25", 65.0, 1.10, predicted_peak=64.0),  # 5% of the no-recompute peak above ckpt 0.5
        _peaked("ckpt-0.1", 55.0, 1.2, predicted_peak=40.0),  # predicted 27% low
        _peaked("ckpt-peak-0.5", 53.0, 1.2, predicted_peak=52.0, peak_cap_bytes=50.0),  # 6% over its cap
    ]
    model = ModelResult("resnet", "R", transformer=False, size="cpu", params=1, config={}, settings=settings)
    targets = {t.name: t for t in evaluate_targets([model], [analyze_model(model)])}
    assert targets["peak monotone in the budget"].met is False
    assert "ckpt 0.25" in targets["peak monotone in the budget"].misses[0]
    assert targets["peak cap kept"].met is False
    assert targets["peak predicted"].met is False and "ckpt 0.1" in targets["peak predicted"].misses[0]
    assert targets["time at matched peak"].met is False
    assert any("ckpt 0.5" in miss for miss in targets["time at matched peak"].misses)
    assert targets["ResNet peak"].met is True  # 0.55x, and no eager checkpoint point to compare with
