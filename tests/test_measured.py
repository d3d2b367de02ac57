"""Measured library-call costs: what is timed, the cache, the fallback, and their use in planning."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import warnings

import pytest
import torch
import torch.nn as nn

from ckpt.config import CkptConfig
from ckpt.cost_model import measured
from ckpt.cost_model.measured import MeasurementWarning, OpCosts, cached_costs, cached_or_measured, plan_costs
from ckpt.partitioner.analysis import analyze_joint, to_picoseconds
from tests.joint import TEST_PROFILE, CausalSelfAttention, trace_joint

# The timing, the fake-tensor escape and the collective differ across torch versions.
pytestmark = pytest.mark.compat

CPU = torch.device("cpu")


def _mlp_joint():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    return trace_joint(model, torch.randn(8, 16))


@pytest.fixture(scope="module")
def joint():
    return _mlp_joint()


def _calls(joint):
    """The joint graph's timeable calls, by node name (the analysis hands the same ones to ``measure``)."""
    seen = {}

    def capture(calls):
        seen.update(calls)
        return {}

    analyze_joint(joint.graph, joint.num_fwd_outputs, TEST_PROFILE, measure=capture)
    return seen


def _costs():
    """The measured costs a graph alone in its process plans with."""
    return plan_costs(CPU, TEST_PROFILE)[0]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True)
def no_scratch(monkeypatch):
    """No call allocates working memory, unless a test says otherwise (the profiler is slow to start)."""
    monkeypatch.setattr(measured, "_measure_scratch", lambda call: 0)


@pytest.fixture
def timings(monkeypatch):
    """Count the calls timed, and give each a fixed time (the roofline's, times two)."""
    timed = []

    def fake(call):
        timed.append(call.signature)
        return 2 * call.roofline_seconds

    monkeypatch.setattr(measured, "_time_call", fake)
    return timed


def test_every_matmul_is_timed_once_per_distinct_call(joint):
    calls = _calls(joint)
    targets = {str(c.target) for c in calls.values()}
    assert {"aten.addmm.default", "aten.mm.default"} <= targets, targets
    matmuls = [n for n in joint.graph.graph.nodes if "mm" in str(n.target)]
    assert set(calls) == {n.name for n in matmuls}
    assert len({c.signature for c in calls.values()}) <= len(calls)


def test_the_signature_tells_strides_and_dtypes_apart():
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    node = graph.call_function(torch.ops.aten.mm.default, (a, b))
    sizes = measured.SizeEvaluator()

    def signature(x, y):
        a.meta["val"], b.meta["val"] = x, y
        node.meta["val"] = x @ y
        return measured.call_signature(node, sizes).signature

    x, y = torch.randn(8, 4), torch.randn(4, 6)
    assert signature(x, y) == signature(x.clone(), y.clone())
    assert signature(x, y) != signature(x, y.t().contiguous().t())
    assert signature(x, y) != signature(x.double(), y.double())


def test_convolutions_are_timed_at_channels_last_when_inductor_makes_them_so():
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    arguments = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    node = graph.call_function(torch.ops.aten.convolution.default, arguments)
    x.meta["val"], w.meta["val"] = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    node.meta["val"] = torch.randn(2, 4, 8, 8)
    sizes = measured.SizeEvaluator()
    plain = measured.call_signature(node, sizes)
    channels_last = measured.call_signature(node, sizes, channels_last=True)
    assert plain.args[0].stride == (192, 64, 8, 1)
    assert channels_last.args[0].stride == (192, 1, 24, 3)
    assert plain.signature != channels_last.signature
    assert measured._time_call(channels_last) > 0


def test_a_real_timing_is_positive_and_leaves_the_global_random_state_alone(joint):
    call = next(iter(_calls(joint).values()))
    state = torch.get_rng_state()
    seconds = measured._time_call(call)
    assert 0 < seconds < 1
    assert torch.equal(torch.get_rng_state(), state)


def test_a_hit_measures_nothing_and_a_miss_measures_only_what_is_new(joint, cache, timings):
    calls = list(_calls(joint).values())
    first = cached_or_measured(calls[:2])
    assert len(timings) == len({c.signature for c in calls[:2]})
    again = cached_or_measured(calls[:2])
    assert again == first and len(timings) == len(first)
    everything = cached_or_measured(calls)
    assert len(timings) == len({c.signature for c in calls})
    assert {k: everything[k] for k in first} == first
    assert cached_costs(CPU) == everything


def test_a_corrupt_cache_is_replaced_with_a_warning(joint, cache, timings, caplog):
    calls = list(_calls(joint).values())
    path = cache / f"op-costs-{measured.device_key(CPU)}.json"
    path.write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ckpt.cost_model.measured"):
        costs = cached_or_measured(calls)
    assert "unreadable measured-cost cache" in caplog.text and str(path) in caplog.text
    assert len(costs) == len({c.signature for c in calls})
    assert json.loads(path.read_text(encoding="utf-8"))["costs"] == costs


def _measure_in_a_process(cache_dir: str, which: str, queue) -> None:  # pragma: no cover - runs in a child
    import os

    os.environ["CKPT_CACHE_DIR"] = cache_dir
    calls = list(_calls(_mlp_joint()).values())
    calls = sorted(calls, key=lambda c: c.signature)
    part = calls[:2] if which == "first" else calls[1:]
    queue.put(cached_or_measured(part))


def test_concurrent_writers_keep_each_others_entries_and_share_a_common_call(joint, cache):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_measure_in_a_process, args=(str(cache), w, queue)) for w in ("first", "rest")]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    stored = cached_costs(CPU)
    assert set(stored) == set(results[0]) | set(results[1])
    shared = set(results[0]) & set(results[1])
    assert shared, "the two processes must ask for one call in common"
    for signature in shared:  # measured once, under the lock: bit-identical in both
        assert results[0][signature] == results[1][signature] == stored[signature]


def test_a_call_that_cannot_be_timed_keeps_its_roofline_with_one_warning(joint, cache, monkeypatch):
    calls = _calls(joint)

    def broken(call):
        raise RuntimeError("no kernel for this call")

    monkeypatch.setattr(measured, "_time_call", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        analysis = analyze_joint(joint.graph, joint.num_fwd_outputs, TEST_PROFILE, measure=_costs())
    messages = [str(w.message) for w in caught if issubclass(w.category, MeasurementWarning)]
    assert len(messages) == 1 and "no kernel for this call" in messages[0], messages
    assert analysis.measured_seconds == {}
    assert analysis.problem == joint.analysis.problem
    assert cached_costs(CPU) == {}
    assert calls


def test_measured_times_replace_the_roofline_in_the_problem(joint, cache, timings):
    analysis = analyze_joint(joint.graph, joint.num_fwd_outputs, TEST_PROFILE, measure=_costs())
    roofline = joint.analysis
    assert set(analysis.measured_seconds) == set(_calls(joint))
    changed = 0
    for i, name in enumerate(analysis.problem.names):
        if name in analysis.measured_seconds and roofline.problem.recompute_time[i]:
            assert analysis.problem.recompute_time[i] == to_picoseconds(analysis.measured_seconds[name])
            changed += 1
    assert changed, "some matmul must be a value the plan could recompute"
    library = sum(analysis.measured_seconds.values())
    assert analysis.fixed_seconds > roofline.fixed_seconds
    assert analysis.fixed_seconds - roofline.fixed_seconds == pytest.approx(library / 2, rel=1e-6)


def test_the_time_limit_leaves_the_rest_at_the_roofline(joint, cache, monkeypatch):
    calls = list({c.signature: c for c in _calls(joint).values()}.values())
    assert len(calls) > 1

    now = [0.0]

    def one_second(call):
        now[0] += 1.0
        return 1.0

    monkeypatch.setattr(measured, "_time_call", one_second)
    monkeypatch.setattr(measured.time, "perf_counter", lambda: now[0])
    costs = measured.measure_calls(calls, seconds=1.0)
    largest = min(calls, key=lambda c: (-c.roofline_seconds, c.signature))
    assert list(costs) == [largest.signature]


CPU_PROFILE = dataclasses.replace(TEST_PROFILE, name="cpu")


@pytest.fixture
def slowdowns(monkeypatch):
    """The busy check's readings, in order (the reference matmul's time over its calibrated time)."""
    readings: list[float] = []
    monkeypatch.setattr(measured, "_slowdown", lambda expected: readings.pop(0))
    monkeypatch.setattr(measured, "_busy_warned", False)
    return readings


def _busy_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, MeasurementWarning) and "busy" in str(w.message)]


def test_the_busy_check_runs_on_the_cpu_under_its_own_calibrated_profile_only():
    expected = 2 * 512**3 / CPU_PROFILE.flops_per_second("fp32")
    assert measured.canary_seconds(CPU, CPU_PROFILE) == pytest.approx(expected)
    assert measured.canary_seconds(CPU, TEST_PROFILE) is None  # planning with a GPU's rates
    assert measured.canary_seconds(torch.device("meta"), CPU_PROFILE) is None
    assert plan_costs(CPU, CPU_PROFILE)[0].canary == pytest.approx(expected)
    quiet = measured._slowdown(expected)
    assert quiet > 0


def test_a_busy_cpu_times_nothing_caches_nothing_and_warns_once(joint, cache, timings, slowdowns):
    calls = list(_calls(joint).values())
    canary = measured.canary_seconds(CPU, CPU_PROFILE)
    slowdowns.extend([12.0, 3.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cached_or_measured(calls, canary=canary) == {}
        assert cached_or_measured(calls, canary=canary) == {}
    assert timings == [] and cached_costs(CPU) == {}
    messages = _busy_warnings(caught)
    assert len(messages) == 1 and "12.0x slower than calibrated" in messages[0], messages
    slowdowns.extend([1.1, 1.2])  # quiet again: the next compile measures and caches
    costs = cached_or_measured(calls, canary=canary)
    assert len(timings) == len({c.signature for c in calls}) and cached_costs(CPU) == costs


def test_timings_taken_as_the_cpu_became_busy_are_dropped(joint, cache, timings, slowdowns):
    calls = list(_calls(joint).values())
    slowdowns.extend([1.1, 2.5])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cached_or_measured(calls, canary=1e-3) == {}
    assert timings, "the calls were timed before the check after them"
    assert cached_costs(CPU) == {}
    assert len(_busy_warnings(caught)) == 1


def test_a_cpu_that_becomes_busy_between_the_calls_keeps_no_timing(joint, cache, slowdowns, monkeypatch):
    calls = list({c.signature: c for c in _calls(joint).values()}.values())
    assert len(calls) > 2
    now = [0.0]
    timed = []

    def slow_call(call):  # each call takes 0.3 s of measuring: a check falls after the second
        now[0] += 0.3
        timed.append(call.signature)
        return 1e-3

    monkeypatch.setattr(measured, "_time_call", slow_call)
    monkeypatch.setattr(measured, "_measure_scratch", lambda call: 0)
    monkeypatch.setattr(measured.time, "perf_counter", lambda: now[0])
    # Quiet before; beside one busy process (one core of two taken) the run of matmuls read 2.0-2.3x here.
    slowdowns.extend([1.1, 1.8])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cached_or_measured(calls, canary=1e-3, seconds=10.0) == {}
    assert len(timed) == 2, "the check runs once CHECK_EVERY seconds of timing have passed, and stops there"
    assert cached_costs(CPU) == {} and not slowdowns
    messages = _busy_warnings(caught)
    assert len(messages) == 1 and "while timing library calls" in messages[0], messages


def test_the_busy_check_times_a_run_of_matmuls_spanning_several_time_slices():
    expected = measured.canary_seconds(CPU, CPU_PROFILE)
    assert measured.canary_repeats(expected) * expected >= measured.CANARY_WINDOW
    assert measured.canary_repeats(1.0) == 1  # a slow machine's single matmul already spans the window


def test_a_busy_cpu_leaves_the_roofline_in_the_plan(joint, cache, timings, slowdowns):
    slowdowns.append(4.0)
    costs = OpCosts(CPU, {}, use_fresh=True, canary=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MeasurementWarning)
        analysis = analyze_joint(joint.graph, joint.num_fwd_outputs, TEST_PROFILE, measure=costs)
    assert analysis.measured_seconds == {} and analysis.problem == joint.analysis.problem
    assert not slowdowns and timings == []


def test_measuring_is_on_by_default_and_can_be_turned_off():
    assert CkptConfig.from_sources(environ={}).measure_ops
    assert not CkptConfig.from_sources(environ={"CKPT_MEASURE_OPS": "0"}).measure_ops
    assert not CkptConfig.from_sources({"measure_ops": False}, environ={}).measure_ops
    with pytest.raises(ValueError, match="CKPT_MEASURE_OPS='sometimes' is not a boolean"):
        CkptConfig.from_sources(environ={"CKPT_MEASURE_OPS": "sometimes"})


def test_only_the_device_at_hand_is_measured():
    from ckpt.backend import measured_op_costs

    x = torch.randn(2)

    def costs(config, inputs):
        op_costs, profile = measured_op_costs(config, inputs, TEST_PROFILE)
        assert profile is TEST_PROFILE  # alone in its process, the profile is its own
        return op_costs

    assert costs(CkptConfig(), [x]) is not None
    assert costs(CkptConfig(device="cpu"), [x]) is not None
    assert costs(CkptConfig(device="h100"), [x]) is None  # planning for another device
    assert costs(CkptConfig(measure_ops=False), [x]) is None
    assert costs(CkptConfig(), []) is None


@pytest.fixture
def small_gpu_calibration(monkeypatch):
    """The GPU calibration's code, run on the CPU at small sizes, for a device named like an L4."""
    from ckpt.cost_model import gpu_calibrate

    monkeypatch.setattr(gpu_calibrate, "_device_name", lambda device: "NVIDIA L4")
    monkeypatch.setattr(gpu_calibrate, "_MATMUL", 128)
    monkeypatch.setattr(gpu_calibrate, "_FP64_MATMUL", 64)
    monkeypatch.setattr(gpu_calibrate, "_COPY_BYTES", 2**20)
    monkeypatch.setattr(gpu_calibrate, "_TINY_KERNELS", 20)
    monkeypatch.setattr(gpu_calibrate, "_conv_rate", lambda device: 1e9)  # a 32x256x56x56 conv is slow here
    runs = []
    real = gpu_calibrate.calibrate_gpu
    monkeypatch.setattr(gpu_calibrate, "calibrate_gpu", lambda device: runs.append(device) or real(device))
    return runs


def test_an_unknown_gpu_gets_a_measured_profile_of_its_own_cached(cache, small_gpu_calibration):
    from ckpt.cost_model.gpu_calibrate import gpu_profile
    from ckpt.cost_model.profiles import GPU_PROFILES

    profile = gpu_profile(CPU)
    assert profile.name == "nvidia-l4" and profile.source.startswith("measured on this GPU (NVIDIA L4)")
    assert profile.flops_per_second("bf16") > 0 and profile.bandwidth > 0 and profile.kernel_overhead > 0
    assert profile.key() not in {p.key() for p in GPU_PROFILES.values()}
    assert gpu_profile(CPU) == profile and len(small_gpu_calibration) == 1  # the second read is the cache's
    (path,) = cache.glob("gpu-profile-*.json")
    path.write_text("{", encoding="utf-8")  # corrupt: measured again
    assert gpu_profile(CPU).name == "nvidia-l4" and len(small_gpu_calibration) == 2


def test_a_gpu_that_cannot_be_measured_gets_its_datasheet_profile_with_one_warning(monkeypatch):
    from ckpt import backend
    from ckpt.cost_model import gpu_calibrate
    from ckpt.cost_model.profiles import GPU_PROFILES

    def broken(device):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(gpu_calibrate, "gpu_profile", broken)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(backend, "graph_device", lambda inputs: torch.device("cuda", 0))
    monkeypatch.setattr(backend, "_gpu_warnings", set())
    with pytest.warns(backend.ProfileWarning, match="could not measure the NVIDIA H100 80GB HBM3.*out of memory"):
        assert backend.resolve_profile(CkptConfig(), []) is GPU_PROFILES["h100"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backend.resolve_profile(CkptConfig(), []) is GPU_PROFILES["h100"]  # warned once
    assert backend.resolve_profile(CkptConfig(device="a100"), []) is GPU_PROFILES["a100"]  # CKPT_DEVICE overrides


def test_recalibrating_a_gpu_measures_it_again(cache, small_gpu_calibration):
    from ckpt.cost_model.gpu_calibrate import gpu_profile

    gpu_profile(CPU)
    gpu_profile(CPU, recalibrate=True)
    assert len(small_gpu_calibration) == 2


def test_the_calibrate_command_names_a_missing_gpu_and_rejects_other_devices(capsys, monkeypatch):
    from ckpt.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["calibrate", "--device", "cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["calibrate", "--device", "gpu"])
    assert "'gpu' is not a device; give cpu, cuda or cuda:N" in capsys.readouterr().err


def test_inputs_of_every_dtype_are_drawn_within_the_unit_range_or_zero():
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int64, torch.bool):
        spec = measured._TensorSpec((4, 3), (1, 4), 2, dtype, CPU)  # transposed, with an offset
        tensor = measured._materialise(spec, lambda device: generator)
        assert tensor.dtype == dtype and tensor.shape == (4, 3) and tensor.stride() == (1, 4)
        values = tensor.float()
        assert values.abs().max() <= 1 and (values.abs().sum() > 0) == dtype.is_floating_point


def test_attention_without_dropout_is_timed_forward_and_backward():
    """Its schema is tagged as seeded (it may draw dropout), but with dropout 0 it draws nothing: a library call."""
    torch.manual_seed(0)
    joint = trace_joint(CausalSelfAttention(16, heads=2), torch.randn(2, 8, 16))
    targets = {str(c.target) for c in _calls(joint).values()}
    attention = {t for t in targets if "scaled_dot_product" in t}
    assert any(not t.endswith("_backward.default") for t in attention), targets
    assert any(t.endswith("_backward.default") for t in attention), targets


def test_scratch_is_what_a_call_allocates_beyond_its_outputs_while_it_runs():
    def run() -> None:
        working = torch.ones(2**18)  # 1 MiB alive only during the call
        working.sum()  # the call's output: 4 bytes

    call = measured.MeasuredCall("sum", torch.ops.aten.sum.default, (), {}, CPU, output_bytes=4)
    scratch = measured._scratch_bytes(run, call)
    assert 2**20 <= scratch < 2**20 + 4096


def test_measured_scratch_is_cached_and_reaches_the_peak_model(joint, cache, timings, monkeypatch):
    from ckpt.partitioner.peak import simulate_peak
    from ckpt.partitioner.peak_analysis import build_peak_graph

    monkeypatch.setattr(measured, "_measure_scratch", lambda call: 3 * 2**20)
    analysis = analyze_joint(joint.graph, joint.num_fwd_outputs, TEST_PROFILE, measure=_costs())
    assert analysis.scratch_bytes == dict.fromkeys(_calls(joint), 3 * 2**20)
    stored = cached_costs(CPU)
    assert all(stored[measured.scratch_key(c.signature)] == 3 * 2**20 for c in _calls(joint).values())

    with_scratch = build_peak_graph(joint.graph, analysis, joint.num_fwd_outputs)
    without = build_peak_graph(joint.graph, joint.analysis, joint.num_fwd_outputs)
    everything = with_scratch.problem_index
    saved, recomputed = [everything[i] for i in analysis.no_recompute_saved], []
    plain = simulate_peak(without, saved, recomputed)
    counted = simulate_peak(with_scratch, saved, recomputed)
    # The working memory is alive only while its call runs: it adds at most one call's worth.
    assert plain.peak_bytes < counted.peak_bytes <= plain.peak_bytes + 3 * 2**20
    assert any(name.endswith("(scratch)") for name, _ in counted.alive)
