"""Explain reports, the Pareto curve, and their command line.

Most tests build partition records from a traced joint graph (no Inductor
compile, well under a second).  The few marked ``compile`` run the real
backend: explain's measured bytes, the CKPT_EXPLAIN directory reports, the
command line, and one small Pareto run.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
import torch.nn as nn

from ckpt.config import parse_budget
from ckpt.partitioner.solver import solve
from ckpt.partitioner.torch_plan import plan_from_saved_names, torch_default_saved_names
from ckpt.records import PartitionRecord
from ckpt.tools.common import loss_of
from ckpt.tools.explainer import emit_explain, explain
from ckpt.tools.factory import FactoryError, call_factory, check_factory_result, load_factory
from ckpt.tools.formatting import short_source
from ckpt.tools.report import ExplainReport, graph_report
from ckpt.tools.tradeoff import ParetoResult, pareto, plot_pareto, predicted_curve, validate_time_model
from tests.joint import TEST_PROFILE, trace_joint


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(x))  # SOURCE-UP
        return self.down(h).sin().sum()  # SOURCE-DOWN


def tiny_factory() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyMLP(), torch.randn(8, 16)


def _line_of(marker: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if marker in line and "_line_of" not in line)


def make_record(budget: str = "0.5", model: nn.Module | None = None, x: torch.Tensor | None = None) -> PartitionRecord:
    """A record as the backend makes it, from a traced joint graph and the test profile."""
    if model is None:
        model, x = tiny_factory()
    joint = trace_joint(model, x)
    parsed = parse_budget(budget)
    cap = parsed.resolve(joint.analysis.reference_bytes)
    plan = solve(joint.analysis.problem, cap)
    names = torch_default_saved_names(joint.graph, joint.num_fwd_outputs)
    torch_plan = plan_from_saved_names(joint.analysis, names)
    analysis = joint.analysis
    return PartitionRecord("tiny_joint_0", analysis, plan, parsed, cap, TEST_PROFILE, 0.002, torch_plan=torch_plan)


@pytest.fixture(scope="module")
def record() -> PartitionRecord:
    return make_record("0.5")


# --- the report's contents ---------------------------------------------------------------


class TinyConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)).square().mean()


@pytest.mark.parametrize("budget", ["none", "0.5", "0"])
@pytest.mark.parametrize("model_name", ["mlp", "conv"])
def test_saved_rows_add_up_to_the_plan(model_name, budget):
    if model_name == "mlp":
        rec = make_record(budget)
    else:
        torch.manual_seed(0)
        rec = make_record(budget, TinyConv(), torch.randn(2, 3, 8, 8))
    report = ExplainReport((graph_report(rec),), budget=budget, measured_bytes=None)
    (graph,) = report.graphs
    assert sum(t.bytes for t in graph.saved) == graph.plans["ckpt"].bytes == rec.plan.bytes
    # Inputs that cost nothing are summarised; everything with bytes is a table row.
    text = str(report)
    assert all(f"| {t.name} " in text for t in graph.saved if t.bytes)
    assert all(t.op.startswith("input") for t in graph.saved if t.is_input)


def test_saved_tensors_name_shape_and_bytes(record):
    report = graph_report(record)
    activations = [t for t in report.saved if not t.is_input]
    assert activations, "at budget 0.5 the tiny MLP saves at least one activation"
    assert sum(t.bytes for t in activations) == report.plans["ckpt"].bytes == record.plan.bytes
    by_name = {t.name: t for t in activations}
    first = by_name[next(iter(by_name))]
    assert first.op.startswith("aten.") and first.dtype == "float32"
    assert first.bytes == 4 * eval("*".join(first.shape))  # contiguous float32
    assert all(t.bytes == 0 for t in report.saved if t.is_input)
    # Source lines come from Dynamo's stack traces: see test_explain_end_to_end.


def test_recomputed_values_carry_their_cost(record):
    report = graph_report(record)
    assert report.recomputed, "at budget 0.5 the tiny MLP recomputes something"
    assert all(r.cost_ps > 0 for r in report.recomputed)
    assert sum(r.cost_ps for r in report.recomputed) == report.plans["ckpt"].recompute_ps
    assert any(r.library_call for r in report.recomputed) == (report.plans["ckpt"].recompute_library_ps > 0)


def test_totals_compare_with_no_recompute_and_torch_default(record):
    plans = graph_report(record).plans
    ckpt_plan, baseline, torch_default = plans["ckpt"], plans["no_recompute"], plans["torch_default"]
    assert ckpt_plan.bytes <= record.budget_bytes < baseline.bytes
    assert torch_default is not None and torch_default.bytes > ckpt_plan.bytes
    assert baseline.recompute_ps == 0 and ckpt_plan.extra_ps == record.plan.time
    fixed = record.analysis.fixed_seconds
    assert ckpt_plan.step_seconds == pytest.approx(fixed + record.plan.time * 1e-12)


@pytest.mark.parametrize(
    "budget, lam",
    [("none", "zero"), ("0.5", "positive"), ("0", "none")],
    ids=["not-binding", "binding", "below-minimum"],
)
def test_solver_lambda(budget, lam):
    facts = graph_report(make_record(budget)).solver
    assert facts.solve_seconds == 0.002 and facts.solver
    if lam == "zero":
        assert facts.lambda_ps_per_byte == 0.0
    elif lam == "positive":
        assert facts.lambda_ps_per_byte > 0
    else:
        model, x = tiny_factory()
        minimum = solve(trace_joint(model, x).analysis.problem, 0).bytes
        assert facts.over_budget == (minimum > 0) and (facts.lambda_ps_per_byte is None) == (minimum > 0)


@pytest.mark.parametrize(
    "meta, expected",
    [
        (
            {"stack_trace": '  File "/src/model.py", line 7, in forward\n    y = self.up(x)\n'},
            "model.py:7 y = self.up(x)",
        ),
        ({"nn_module_stack": {"a": ("L['self'].up", nn.Linear)}}, "module up (Linear)"),
        ({"fwd_nn_module_stack": {"a": ("L['fn']", nn.Sequential), "b": ("L['fn'].1", nn.GELU)}}, "module 1 (GELU)"),
        ({}, ""),
    ],
    ids=["stack-trace", "module-stack", "forward-module-stack", "nothing"],
)
def test_source_of_a_value(meta, expected):
    from ckpt.tools.report import _source, describe_value

    graph = torch.fx.Graph()
    node = graph.call_function(torch.ops.aten.relu.default, (graph.placeholder("x"),))
    node.meta.update(meta)
    assert short_source(_source(node, describe_value(node))) == expected


def test_report_text_and_json(record):
    report = ExplainReport((graph_report(record),), budget="0.5", measured_bytes=record.plan.bytes, loss="sum")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["predicted_bytes"] == data["measured_bytes"] == record.plan.bytes and data["bytes_error"] == 0
    graph = data["graphs"][0]
    assert graph["graph"] == "tiny_joint_0"
    assert set(graph["plans"]) == {"ckpt", "autograd", "no_recompute", "torch_default"}
    assert {"name", "op", "shape", "dtype", "bytes", "source"} <= set(graph["saved"][0])
    text = str(report)
    for expected in (
        "## graph tiny_joint_0",
        "Saved tensors",
        "Recomputed values",
        "torch default partition",
        "lambda =",
        f"Costs: the {record.profile.name} profile; 0 of ",
        "library calls timed on the device",
        "measured - predicted",
        "| node",
    ):
        assert expected in text


def test_report_without_measurement_says_so(record):
    report = ExplainReport((graph_report(record),), budget="0.5", measured_bytes=None)
    assert report.bytes_error is None and "Predictions only" in report.to_markdown()


def test_fallback_graph_is_reported():
    failed = PartitionRecord("g", None, None, parse_budget("0.5"), None, TEST_PROFILE, 0.0, "ValueError: boom")
    report = ExplainReport((graph_report(failed),), budget="0.5", measured_bytes=None)
    assert "fell back to torch's partition: ValueError: boom" in str(report)


# --- CKPT_EXPLAIN outputs ----------------------------------------------------------------


def test_explain_log_summary_at_info(record, caplog):
    with caplog.at_level(logging.INFO, logger="ckpt"):
        emit_explain(record, "log")
    (message,) = [r for r in caplog.records if r.name == "ckpt"]
    assert message.levelno == logging.INFO and "graph tiny_joint_0: saved" in message.getMessage()


def test_explain_directory_writes_json_and_markdown(record, tmp_path):
    emit_explain(record, str(tmp_path / "reports"))
    data = json.loads((tmp_path / "reports" / "tiny_joint_0.json").read_text())
    assert data["measured_bytes"] is None and data["predicted_bytes"] == record.plan.bytes
    assert "Predictions only" in (tmp_path / "reports" / "tiny_joint_0.md").read_text()


def test_explain_directory_that_cannot_be_written_warns(record, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.INFO, logger="ckpt"):
        emit_explain(record, str(blocker))
    assert any(r.levelno == logging.WARNING and "could not write" in r.getMessage() for r in caplog.records)


# --- Pareto curve and plot -----------------------------------------------------------------


def test_curve_trades_time_for_memory(record):
    curve = predicted_curve([record], points=11)
    assert curve[0].budget == "none" and len(curve) == 12
    fractions = curve[1:]  # 1.0 down to 0
    assert all(a.bytes >= b.bytes for a, b in zip(fractions, fractions[1:]))
    assert curve[0].extra_ps == min(p.extra_ps for p in curve)
    assert fractions[-1].bytes == min(p.bytes for p in curve)


def _result(record, path=None) -> ParetoResult:
    curve = predicted_curve([record], points=5)
    return ParetoResult("0.5", curve[3], tuple(curve), (), path)


def test_plot_is_written(record, tmp_path):
    pytest.importorskip("matplotlib")
    path = plot_pareto(_result(record), tmp_path / "plots" / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_matplotlib_names_the_extra(record, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'torch-ckpt\[plot\]'"):
        plot_pareto(_result(record), tmp_path / "curve.png")
    model, x = tiny_factory()
    with pytest.raises(ImportError, match=r"torch-ckpt\[plot\]"):  # before any compile
        pareto(model, x, path=tmp_path / "curve.png")


# --- bad arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, x: explain(lambda t: t, x), TypeError, "model must be a torch.nn.Module, got function"),
        (lambda m, x: explain(m, x, budget="lots"), ValueError, "budget='lots' is not a valid memory budget"),
        (lambda m, x: explain(m, x, budget=1.5), ValueError, "budget=1.5"),
        (lambda m, x: explain(m, x, options={"colour": 1}), ValueError, "unknown ckpt option.*'colour'"),
        (lambda m, x: pareto(m, x, budget="-1", path=None), ValueError, "budget='-1'"),
        (lambda m, x: pareto(m, x, measure="0.5", path=None), ValueError, "measure='0.5' is not a list"),
        (lambda m, x: pareto(m, x, measure=["none", "big"], path=None), ValueError, r"measure\[1\]='big'"),
        (lambda m, x: pareto(m, x, statistic="mean", path=None), ValueError, "statistic='mean'"),
        (lambda m, x: pareto(m, x, steps=-1, path=None), ValueError, "steps=-1"),
        (lambda m, x: validate_time_model(m, x, steps=1), ValueError, "steps=1 is too few"),
        (lambda m, x: validate_time_model(m, x, budgets=["x"]), ValueError, r"budgets\[0\]='x'"),
        (lambda m, x: predicted_curve([]), ValueError, "records holds no planned graph"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_arguments_are_named(call, error, match):
    model, x = tiny_factory()
    with pytest.raises(error, match=match):
        call(model, x)


def test_curve_points_must_be_at_least_two(record):
    with pytest.raises(ValueError, match="points=1 is too few"):
        predicted_curve([record], points=1)


@pytest.mark.parametrize(
    "output, expected",
    [
        ("scalar", "itself"),
        ("tuple", "sum"),
        ("dict", "sum"),
    ],
)
def test_loss_rule(output, expected):
    a = torch.ones(2, requires_grad=True)
    values = {"scalar": (a * 3).sum(), "tuple": (a * 2, torch.arange(3)), "dict": {"y": a * 2, "z": a}}
    loss = loss_of(values[output])
    assert loss.dim() == 0
    assert loss.item() == {"scalar": 6.0, "tuple": 4.0, "dict": 6.0}[output]


def test_loss_needs_something_that_requires_grad():
    with pytest.raises(ValueError, match="no floating-point tensor that requires grad"):
        loss_of((torch.ones(2), torch.arange(3)))
    with pytest.raises(ValueError, match="does not require grad"):
        loss_of(torch.tensor(1.0))


# --- model factories -----------------------------------------------------------------------


def not_a_function_value() -> None:
    pass


NOT_CALLABLE = 3


def returns_three() -> tuple:
    return TinyMLP(), torch.ones(1), 3


def returns_no_model() -> tuple:
    return "model", (torch.ones(1),)


def returns_bad_inputs() -> tuple:
    return TinyMLP(), 7


def needs_arguments(size: int) -> tuple:
    return TinyMLP(), torch.ones(size)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no_colon", "is not of the form 'module:factory'"),
        ("a:b:c", "is not of the form"),
        ("tests.test_explain:", "is not of the form"),
        ("no_such_module_xyz:make", "no module named 'no_such_module_xyz'"),
        ("tests.test_explain:missing", "has no attribute 'missing'"),
        ("tests.test_explain:NOT_CALLABLE", "is a int, not a function"),
        ("tests.test_explain:needs_arguments", "must take no arguments"),
        ("tests.test_explain:returns_three", "returned a tuple of length 3"),
        ("tests.test_explain:returns_no_model", "returned a str as the model"),
        ("tests.test_explain:returns_bad_inputs", "returned a int as the inputs"),
        ("tests.test_explain:not_a_function_value", "returned a NoneType"),
    ],
)
def test_bad_factories(spec, match):
    with pytest.raises(FactoryError, match=match):
        call_factory(spec)


def test_factory_with_one_input_is_normalised():
    model, inputs = call_factory("tests.test_explain:tiny_factory")
    assert isinstance(model, TinyMLP) and len(inputs) == 1 and inputs[0].shape == (8, 16)
    assert check_factory_result("f", [model, [inputs[0]]])[1] == (inputs[0],)
    assert callable(load_factory(" ckpt.tools.factory:demo_factory "))


@pytest.mark.parametrize(
    "argv, match",
    [
        (["explain", "no_colon"], "is not of the form"),
        (["explain", "tests.test_explain:tiny_factory", "--budget", "2"], "argument --budget: --budget='2'"),
        (["pareto", "tests.test_explain:tiny_factory", "--measure", "none,huge"], "argument --measure: budget='huge'"),
        (["pareto", "tests.test_explain:tiny_factory", "--steps", "0"], "argument --steps: '0'"),
        (["validate", "tests.test_explain:returns_three"], "returned a tuple of length 3"),
        (["validate", "tests.test_explain:tiny_factory", "--statistic", "mean"], "--statistic: invalid choice"),
        (["validate", "tests.test_explain:tiny_factory", "--malloc", "jemalloc"], "--malloc: invalid choice"),
    ],
)
def test_command_line_rejects_bad_arguments(argv, match, capsys):
    from ckpt.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err


def test_explain_and_pareto_stay_functions_after_their_modules_are_imported():
    import ckpt.tools.explainer
    import ckpt.tools.tradeoff

    assert ckpt.explain is explain and ckpt.pareto is pareto


# --- end to end through Inductor ------------------------------------------------------------


@pytest.mark.compile
def test_explain_end_to_end(tmp_path):
    model, x = tiny_factory()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = explain(model, x, budget="0.5", options={"explain": str(tmp_path)})
    # Prediction is exact: both count the same saved storages.
    assert report.measured_bytes == report.predicted_bytes > 0 and report.bytes_error == 0
    (graph,) = report.graphs
    assert graph.fallback_reason is None and graph.plans["torch_default"] is not None
    assert graph.recomputed and graph.saved and graph.solver.lambda_ps_per_byte > 0
    # The step's peak: predicted per graph, measured on a second step, both in the report.
    assert graph.peak is not None and graph.peak["phase"] in ("forward", "backward")
    assert report.measured_peak_bytes is not None and report.measured_peak_bytes >= report.measured_bytes
    assert report.to_dict()["measured_peak_bytes"] == report.measured_peak_bytes
    assert "Step peak:" in str(report) and "Predicted peak" in str(report)
    # Every saved activation points at the user's line that computed it.
    lines = {f"test_explain.py:{_line_of('SOURCE-UP')} ", f"test_explain.py:{_line_of('SOURCE-DOWN')} "}
    activations = [t for t in graph.saved if not t.is_input]
    assert activations and all(any(line in short_source(t.source) for line in lines) for t in activations)
    assert f"test_explain.py:{_line_of('SOURCE-UP')} h = torch.nn.functional.gelu" in str(report)
    # The user's model and inputs are untouched.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and x.grad is None
    # CKPT_EXPLAIN=path wrote the predicted report for the same graph.
    written = json.loads((tmp_path / f"{graph.graph}.json").read_text())
    assert written["predicted_bytes"] == report.predicted_bytes and written["measured_bytes"] is None
    # A later torch.compile of the user's model compiles afresh, at its own budget. (Inductor's
    # on-disk caches stay off: a run of the suite before this one may have cached this graph.)
    from ckpt._torch_compat import compile_caches_disabled
    from ckpt.records import record_partitions

    with compile_caches_disabled(), record_partitions() as records:
        torch.compile(model, backend="ckpt", options={"memory_budget": "none"})(x).backward()
    assert [str(r.budget) for r in records] == ["none"]


@pytest.mark.compile
def test_command_line_explain_prints_the_report(capsys):
    from ckpt.__main__ import main

    assert main(["explain", "tests.test_explain:tiny_factory", "--budget", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "# ckpt explain: budget 0.3" in out and "ckpt plan (measured, one step)" in out
    assert "| measured - predicted" in out and "0 B (+0.0%)" in out


@pytest.mark.compile
def test_pareto_end_to_end(tmp_path):
    pytest.importorskip("matplotlib")
    model, x = tiny_factory()
    result = pareto(model, x, budget="0", measure=["none"], steps=2, points=5, path=tmp_path / "p.png")
    assert [m.budget for m in result.measured] == ["none", "0"]
    assert all(m.measured_bytes == m.predicted_bytes for m in result.measured)
    assert result.measured[1].measured_bytes < result.measured[0].measured_bytes
    assert all(len(m.step_seconds) == 2 for m in result.measured)
    assert (tmp_path / "p.png").exists() and result.path == str(tmp_path / "p.png")
    assert json.loads(json.dumps(result.to_dict()))["chosen"]["bytes"] == result.chosen.bytes


def test_validate_puts_the_measured_peak_next_to_the_predicted_one():
    model, x = tiny_factory()
    result = validate_time_model(model, x, budgets=["0"], steps=2)
    (check,) = result.checks
    assert result.baseline.measured_peak and check.measured_peak
    assert abs(check.peak_error) < 0.10, (check.predicted_peak, check.measured_peak)
    assert "measured peak" in str(result) and "peak_error" in result.to_dict()["checks"][0]
