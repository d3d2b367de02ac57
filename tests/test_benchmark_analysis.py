"""The benchmark verdicts on made-up measurements (noise, dominance, matched memory), and the allocation replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.analysis import analyze_model, evaluate_targets
from benchmarks.harness import ModelResult, SettingResult
from benchmarks.report import load_results, write_results
from benchmarks.settings import SETTINGS

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# The committed results of ``python -m benchmarks.run`` (other benchmarks write files of their own shape).
RUN_RESULTS = sorted(p.stem for p in RESULTS.glob("*.json") if "targets" in json.loads(p.read_text(encoding="utf-8")))

STEADY = [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00]  # step times of a calm setting


def _model(samples: dict[str, list[float]], mib: dict[str, float]) -> ModelResult:
    settings = [
        SettingResult(SETTINGS[key], activation_bytes=int(mib[key] * 2**20), samples_s=list(times))
        for key, times in samples.items()
    ]
    return ModelResult("m", "M", transformer=True, size="cpu", params=1, config={}, settings=settings)


def test_noise_is_at_least_the_gap_and_grows_with_the_spread():
    steady = STEADY
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
    steady = STEADY
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
        _peaked("ckpt-peak-0.5", 53.0, 1.2, predicted_peak=49.0, peak_cap_bytes=50.0),  # 6% over its cap
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


def test_a_cap_below_every_plans_peak_is_kept_by_running_the_lowest_peak():
    def model(cap_point_peak: float) -> ModelResult:
        settings = [
            _peaked("compile", 100.0, 1.0),
            _peaked("compile-repeat", 100.0, 1.0),
            _peaked("torch-0.5", 60.0, 1.05),
            _peaked("ckpt-none", 70.0, 1.0, predicted_peak=69.0),
            # the planner found no plan within 40 MiB (predicted 60) and ran its lowest
            _peaked("ckpt-peak-0.5", cap_point_peak, 1.1, predicted_peak=60.0, peak_cap_bytes=40.0),
        ]
        return ModelResult("m", "M", transformer=False, size="cpu", params=1, config={}, settings=settings)

    for peak, met in ((60.5, True), (66.0, False)):  # torch 0.5 measured 60 MiB
        m = model(peak)
        target = {t.name: t for t in evaluate_targets([m], [analyze_model(m)])}["peak cap kept"]
        assert target.met is met, (peak, target)
        assert "1 below every plan's predicted peak" in target.value
    assert "lowest measured peak" in target.misses[0]


def test_time_predicted_compares_predicted_and_measured_changes_against_no_budget():
    steady = STEADY

    def point(key: str, step: float, predicted: float) -> SettingResult:
        return SettingResult(
            SETTINGS[key],
            activation_bytes=2**20,
            samples_s=[step * t for t in steady],
            graphs=[{"predicted_extra_s": predicted}],
        )

    settings = [
        SettingResult(SETTINGS["compile"], activation_bytes=2**20, samples_s=steady),
        SettingResult(SETTINGS["compile-repeat"], activation_bytes=2**20, samples_s=steady[::-1]),
        point("ckpt-none", 1.0, 0.01),
        point("ckpt-0.5", 1.001, 0.05),  # a change of 1 ms: within the noise, not checked
        point("ckpt-0.25", 1.2, 0.22),  # predicted +0.21 s, measured +0.2 s: within 25%
        point("ckpt-0.0", 1.4, 0.81),  # predicted +0.8 s, measured +0.4 s: twice
    ]
    model = ModelResult("m", "M", transformer=True, size="cpu", params=1, config={}, settings=settings)
    target = {t.name: t for t in evaluate_targets([model], [analyze_model(model)])}["time predicted"]
    assert target.met is False
    assert target.value.startswith("1/2 points") and "1 within the noise" in target.value
    assert len(target.misses) == 1 and "ckpt 0.0" in target.misses[0] and "x2.00" in target.misses[0]


_FORWARD_CODE = """
class Runner:
    def call(self, args):
        primals_1, primals_2 = args
        args.clear()
        buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
        buf1 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
        buf2 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf0, buf0, buf0)
        buf3 = buf2[0]
        assert_size_stride(buf3, (2, 4), (4, 1), 'op')
        buf4 = buf2[1]
        assert_size_stride(buf4, (2, ), (1, ), 'op')
        del buf2
        buf5 = reinterpret_tensor(buf1, (16, ), (1, ), 0); del buf1  # reuse
        del buf0
        return (buf5, buf3, reinterpret_tensor(buf4, (2, ), (1, ), 0), None, )
"""

_BACKWARD_CODE = """
class Runner:
    def call(self, args):
        getitem, getitem_1, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cpu((8, 4), (4, 1), torch.float32)
        buf1 = buf0; del buf0  # reuse
        del getitem
        buf2 = empty_strided_cpu((2, ), (1, ), torch.float32)
        return (buf1, buf2, )
"""


def test_replay_counts_the_wrapper_codes_allocations_and_passes_saved_values_to_the_backward():
    from benchmarks.replay_allocations import call_body, replay_step

    assert call_body(_FORWARD_CODE)[0] == "primals_1, primals_2 = args"
    forward, backward = replay_step(_FORWARD_CODE, _BACKWARD_CODE)
    # buf0 and buf1 (64 bytes each), then the attention's two outputs picked out (32 and 8 bytes)
    assert forward.peak_bytes == 64 + 64 + 32 + 8
    assert forward.line.startswith("assert_size_stride(buf4")
    assert dict(forward.alive) == {"buf0": 64, "buf1": 64, "buf3": 32, "buf4": 8}
    assert forward.end_bytes == 64 + 32 + 8  # buf0 freed; buf1 lives on as buf5
    # the loss buf5 and the saved buf3 and buf4 (as getitem and getitem_1) start the backward, whose
    # 128-byte buffer is allocated before getitem goes
    assert backward.peak_bytes == 64 + 32 + 8 + 128
    assert dict(backward.alive) == {"buf5": 64, "getitem": 32, "getitem_1": 8, "buf0": 128}
    assert backward.end_bytes == 64 + 8 + 128 + 8
    with pytest.raises(ValueError, match="no `def call"):
        call_body("x = 1")


def test_replay_counts_a_library_call_that_returns_one_tensor():
    from benchmarks.replay_allocations import replay_step

    forward_code = """
class Runner:
    def call(self, args):
        primals_1, = args
        buf0 = extern_kernels.convolution(primals_1, primals_1, stride=(1, 1))
        assert_size_stride(buf0, (2, 8), (8, 1), 'torch.ops.aten.convolution.default')
        buf1 = torch.ops.ckpt.channels_last_copy.default(buf0)
        assert_size_stride(buf1, (2, 8), (8, 1), 'torch.ops.ckpt.channels_last_copy.default')
        del buf0
        return (buf1, )
"""
    backward_code = """
class Runner:
    def call(self, args):
        tangents_1, = args
        return (None, )
"""
    forward, backward = replay_step(forward_code, backward_code)
    # the convolution's 64 bytes, then the copy's 64 while the convolution's result is alive
    assert forward.peak_bytes == 128 and dict(forward.alive) == {"buf0": 64, "buf1": 64}
    assert forward.end_bytes == 64 and backward.end_bytes == 64


def test_ckpt_settings_that_made_the_same_plan_count_in_the_noise():
    steady = STEADY
    samples = {
        "compile": steady,
        "compile-repeat": steady,
        "ckpt-none": [t * 1.06 for t in steady],
        "ckpt-0.75": steady,  # the same plan as no budget, timed 6% apart
        "ckpt-0.5": steady,
    }
    mib = {"compile": 100.0, "compile-repeat": 100.0, "ckpt-none": 50.0, "ckpt-0.75": 50.0, "ckpt-0.5": 40.0}
    model = _model(samples, mib)

    def planned(prints: dict[str, str | None]) -> ModelResult:
        for point in model.settings:
            if point.setting.key in prints:
                point.graphs = [{"fingerprint": prints[point.setting.key]}]
        return model

    verdict = analyze_model(planned({"ckpt-none": "aaaa", "ckpt-0.75": "aaaa", "ckpt-0.5": "bbbb"}))
    assert verdict.noise == pytest.approx(0.06)
    beaten = [d for d in verdict.dominated if d["setting"] == "ckpt none"]
    assert beaten and not any(d["beyond_noise"] for d in beaten), "a plan is not beaten by itself beyond noise"
    # Different plans, or a graph without a fingerprint, are not copies of one program.
    assert analyze_model(planned({"ckpt-0.75": "cccc"})).noise < 0.02
    assert analyze_model(planned({"ckpt-none": None, "ckpt-0.75": None})).noise < 0.02
    assert analyze_model(planned({"ckpt-none": "aaaa", "ckpt-0.75": "aaaa"})).same_plans == [("ckpt none", "ckpt 0.75")]


def test_a_run_without_compiles_repeat_takes_its_noise_from_the_same_plan_timed_twice():
    samples = {"compile": STEADY, "ckpt-none": STEADY, "ckpt-0.5": [t * 1.04 for t in STEADY]}
    mib = {"compile": 100.0, "ckpt-none": 50.0, "ckpt-0.5": 50.0}
    model = _model(samples, mib)
    for point, fingerprint in zip(model.settings, (None, "aaaa", "aaaa")):
        point.graphs = [{"fingerprint": fingerprint}] if fingerprint else []
    verdict = analyze_model(model)
    assert verdict.noise == pytest.approx(1 - 1 / 1.04) and verdict.compile_s == pytest.approx(1.0)
    beaten = [d for d in verdict.dominated if d["setting"] == "ckpt 0.5"]
    assert beaten and not any(d["beyond_noise"] for d in beaten), "one program timed twice is not beaten by itself"
    # Two different plans and no repeat: nothing to measure the noise with.
    model.settings[2].graphs = [{"fingerprint": "bbbb"}]
    assert analyze_model(model).noise is None


@pytest.mark.parametrize("stem", RUN_RESULTS)
def test_the_committed_report_is_what_the_report_makes_of_its_results(stem, tmp_path):
    # The README quotes these files: after a change to the verdicts, or to the analysis written
    # beside a run, `python -m benchmarks.report benchmarks/results/<stem>.json` writes them again.
    analysis = RESULTS / f"{stem}-analysis.md"
    if analysis.exists():
        shutil.copy(analysis, tmp_path / analysis.name)
    meta, models = load_results(RESULTS / f"{stem}.json")
    markdown, results = write_results(tmp_path, stem, meta, models)
    assert markdown.read_text(encoding="utf-8") == (RESULTS / f"{stem}.md").read_text(encoding="utf-8")
    assert results.read_text(encoding="utf-8") == (RESULTS / f"{stem}.json").read_text(encoding="utf-8")
