"""Per-module budgets: ckpt.set_budget, the options' path mapping, graph breaks, guards and caching.

Most tests plan Dynamo graphs through AOTAutograd with no-op compilers (the
partitioner is the backend's; no kernel is compiled), so they take a second
each.  The model computes tensors of a different width in each module, so a
saved tensor's width says which module computed it, and the measured saved
bytes of each module can be compared with its cap.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn

import ckpt
from ckpt import _torch_compat as compat
from ckpt.backend import BudgetWarning, make_partitioner
from ckpt.config import Budget, CkptConfig, parse_budgets
from ckpt.module_budgets import ModuleBudgetWarning, clear_budgets, module_budgets, set_budget
from ckpt.partitioner.problem import region_bytes
from ckpt.records import PartitionRecord, record_partitions

WIDTHS = {48: "up", 24: "down", 40: "head"}  # the width of every tensor each module computes


class Up(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x))


class Down(nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(48, 24)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.graph_break:
            torch._dynamo.graph_break()
        return h.tanh() * h.sigmoid()


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(24, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sin()


class Chain(nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.up, self.down, self.head = Up(), Down(graph_break), Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(self.up(x))).square().mean()


@pytest.fixture(autouse=True)
def _no_budgets():
    clear_budgets()
    yield
    clear_budgets()


def kernel_free(options: dict[str, Any]) -> Callable[..., Any]:
    """backend="ckpt" without Inductor: the same partitioner, with no-op compilers."""
    config = CkptConfig.from_sources({"device": "h100", **options})

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return compat.aot_simplified_without_kernels(gm, example_inputs, make_partitioner(gm, example_inputs, config))

    return backend


def step(
    model: nn.Module, backend: Any, x: torch.Tensor, options: dict[str, Any] | None = None, caches: bool = False
) -> tuple[dict[str, int], list[PartitionRecord], list]:
    """One forward and backward: the saved bytes of each module (by width), the records, the gradients.

    ``backend`` None runs eagerly; ``options`` go to ``torch.compile``; with ``caches``, Inductor's and
    AOTAutograd's caches stay on.
    """
    live = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    by_module: dict[str, int] = defaultdict(int)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key not in live and tensor.dim() > 0:
            live.add(key)
            by_module[WIDTHS.get(tensor.shape[-1], f"width {tensor.shape[-1]}")] += tensor.untyped_storage().nbytes()
        return tensor

    compiled = model if backend is None else torch.compile(model, backend=backend, options=options)
    model.zero_grad(set_to_none=True)
    caching = contextlib.nullcontext() if caches else compat.compile_caches_disabled()
    with caching, record_partitions() as records:
        with torch.autograd.graph.saved_tensors_hooks(torch.compiler.disable(pack), lambda t: t):
            loss = compiled(x)
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return dict(by_module), list(records), grads


def predicted_by_region(records: list[PartitionRecord]) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for record in records:
        assert record.plan is not None and record.analysis is not None, record.fallback_reason
        for cap in record.region_caps:
            total[cap.label] += region_bytes(
                record.analysis.problem, record.plan.saved, record.plan.recomputed, cap.members
            )
    return dict(total)


def caps_by_region(records: list[PartitionRecord]) -> dict[str, tuple[int, int]]:
    """label -> (sum of caps, sum of what autograd saves there) over the graphs."""
    total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in records:
        for cap in record.region_caps:
            total[cap.label][0] += cap.max_bytes
            total[cap.label][1] += cap.reference_bytes
    return {label: (a, b) for label, (a, b) in total.items()}


@pytest.fixture
def chain_and_input():
    torch.manual_seed(0)
    return Chain(), torch.randn(8, 16)


def _check_up_and_down_caps(model: nn.Module, x: torch.Tensor, run: Callable[[], Any]) -> dict[str, int]:
    """``up`` at 0.5 and ``down`` at 0.0, one step through ``run()``: gradients, caps and bytes as promised."""
    eager, _, want = step(model, None, x)
    set_budget(model.up, 0.5)
    set_budget(model.down, 0.0)
    measured, records, grads = run()
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected)
    # A fraction is of what autograd saves for the module's values: eager's saved bytes there.
    caps = caps_by_region(records)
    assert caps == {"up": (eager["up"] // 2, eager["up"]), "down": (0, eager["down"])}
    assert measured.get("up", 0) <= caps["up"][0] and measured.get("down", 0) == 0
    assert predicted_by_region(records) == {"up": measured.get("up", 0), "down": 0}
    return measured


@pytest.mark.compat
def test_each_module_keeps_its_own_cap_on_measured_bytes(chain_and_input):
    model, x = chain_and_input
    measured = _check_up_and_down_caps(model, x, lambda: step(model, kernel_free({}), x))
    # The head has no budget and the default is none: it saves what the plan without a budget saves there.
    clear_budgets()
    unbudgeted, _, _ = step(model, kernel_free({}), x)
    assert measured["head"] == unbudgeted["head"] > 0
    assert sum(measured.values()) < sum(unbudgeted.values())


def test_the_most_specific_module_wins_and_the_rest_takes_the_default(chain_and_input):
    model, x = chain_and_input
    free, _, _ = step(model, kernel_free({}), x)
    set_budget(model, 0.0)  # the whole model ...
    set_budget(model.head, "none")  # ... but the head keeps what it likes
    measured, records, _ = step(model, kernel_free({}), x)
    assert measured.get("up", 0) == measured.get("down", 0) == 0
    assert measured["head"] == free["head"]
    # The same by the options: the default budget for the rest, a path for the head.
    clear_budgets()
    by_options, _, _ = step(model, kernel_free({"memory_budget": {"": 0.0, "head": "none"}}), x)
    assert by_options == measured
    by_text, _, _ = step(model, kernel_free({"memory_budget": "0,head=none"}), x)
    assert by_text == measured


def test_options_paths_override_set_budget(chain_and_input):
    model, x = chain_and_input
    set_budget(model.up, 0.0)
    _, records, _ = step(model, kernel_free({"memory_budget": {"up": "none", "down": 0.0}}), x)
    (record,) = records
    assert {cap.label: cap.budget for cap in record.region_caps} == {"down": "0"}


@pytest.mark.compat
def test_a_graph_break_inside_a_budgeted_module_keeps_its_budget_in_each_part():
    torch.manual_seed(0)
    model, x = Chain(graph_break=True), torch.randn(8, 16)
    eager, _, want = step(model, None, x)
    set_budget(model.down, 0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured, records, grads = step(model, kernel_free({}), x)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected)
    # down's forward is split: its linear layer in one graph, its activation in the next.
    down_graphs = [r for r in records if r.region_caps]
    assert len(down_graphs) == 2, [r.graph for r in records]
    assert all(len(r.region_caps) == 1 for r in down_graphs)
    for record in down_graphs:
        (cap,) = record.region_caps
        assert cap.reference_bytes > 0 and cap.max_bytes == cap.reference_bytes // 2
    assert measured["down"] <= sum(r.region_caps[0].max_bytes for r in down_graphs) < eager["down"]
    # The activation's graph holds none of down's parameters: ckpt says that Dynamo would reuse it.
    assert any(issubclass(w.category, ModuleBudgetWarning) and "Down" in str(w.message) for w in caught)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).tanh())


class Blocks(nn.Module):
    """Blocks that Dynamo compiles one frame each (a graph break in the loop), all reading the input."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(())
        for block in self.blocks:
            total = total + block(x).square().mean()
            torch._dynamo.graph_break()
        return total


@pytest.mark.compat
def test_a_graph_is_reused_only_for_modules_under_the_same_budgets():
    torch.manual_seed(0)
    model, x = Blocks(4), torch.randn(8, 16)
    free, records, _ = step(model, kernel_free({}), x)
    (block_plan,) = [r.plan.bytes for r in records]  # one graph, run by every block
    torch.compiler.reset()
    set_budget([model.blocks[0], model.blocks[2]], 0.0)
    set_budget(model.blocks[1], "1KiB")
    measured, records, _ = step(model, kernel_free({}), x)
    budgets = sorted(tuple(c.budget for c in r.region_caps) for r in records)
    # One graph per distinct budget: block 2 runs block 0's, block 3 (no budget) gets its own.
    assert budgets == [(), ("0",), ("1024B",)], budgets
    per_graph = {tuple(c.budget for c in r.region_caps): r.plan.bytes for r in records}
    assert per_graph[("0",)] == 0
    assert per_graph[()] == block_plan
    # Measured: blocks 0 and 2 save nothing, block 1 its capped plan, block 3 the free plan (and the
    # loop's eager code what it saved before).
    assert measured["width 16"] == free["width 16"] - 3 * block_plan + per_graph[("1024B",)]


def test_deep_copies_keep_budgets_and_pickles_drop_them(chain_and_input):
    model, x = chain_and_input
    set_budget(model.down, 0.0)
    twin = copy.deepcopy(model)
    budgets = {id(m): b for m, b in module_budgets()}
    assert budgets[id(twin.down)] == Budget(fraction=0.0)
    measured, _, _ = step(twin, kernel_free({}), x)
    assert measured.get("down", 0) == 0
    restored = pickle.loads(pickle.dumps(model))
    assert id(restored.down) not in {id(m) for m, _ in module_budgets()}


def test_clearing_budgets_removes_the_hooks():
    model = Chain()
    before = {name: (len(m._forward_pre_hooks), len(m._forward_hooks)) for name, m in model.named_modules()}
    set_budget(model, {"down": 0.1, "head": "1MiB"})
    assert len(model.down.fc._forward_pre_hooks) == 1
    assert len(model_budgets := module_budgets()) == 2, model_budgets
    clear_budgets(model.down)
    assert [m for m, _ in module_budgets()] == [model.head]
    assert not model.down.fc._forward_pre_hooks
    clear_budgets()
    after = {name: (len(m._forward_pre_hooks), len(m._forward_hooks)) for name, m in model.named_modules()}
    assert after == before
    assert not any("_ckpt" in key for m in model.modules() for key in vars(m))


def test_bad_input_names_what_is_wrong():
    model = Chain()
    with pytest.raises(ValueError, match=r"'dwon'.*closest module paths: down"):
        set_budget(model, {"dwon": 0.1})
    with pytest.raises(ValueError, match=r"'ups\.fc'.*closest module paths: up\.fc"):
        set_budget(model, {"ups.fc": 0.1})
    with pytest.raises(ValueError, match="not a valid memory budget"):
        set_budget(model.up, "10 percent")
    with pytest.raises(ValueError, match="not a module path"):
        set_budget(model, {"layers[0]": 0.1})
    with pytest.raises(TypeError, match="torch.nn.Module"):
        set_budget("up", 0.1)
    with pytest.raises(ValueError, match="no parameters or buffers"):
        set_budget(nn.GELU(), 0.1)
    assert module_budgets() == []  # nothing was half set


def test_budgets_by_path_parse_in_every_form():
    assert parse_budgets("0.5") == (Budget(fraction=0.5), ())
    expected = (Budget(fraction=0.5), (("layers.*.attn", Budget(fraction=0.5)), ("layers.*.mlp", Budget(fraction=0.1))))
    assert parse_budgets("0.5,layers.*.mlp=0.1,layers.*.attn=0.5") == expected
    assert parse_budgets({"": "0.5", "layers.*.mlp": 0.1, "layers.*.attn": "0.5"}) == expected
    assert parse_budgets({"head": "1MiB"}) == (Budget(), (("head", Budget(max_bytes=2**20)),))
    for bad, message in [
        ("0.5,,mlp=0.1", "empty item"),
        ("mlp=0.1,mlp=0.2", "more than once"),
        ("mlp=lots", r"CKPT_MEMORY_BUDGET\['mlp'\]='lots' is not a valid memory budget"),
        ({"a..b": 0.1}, "not a module path"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_budgets(bad)


def test_unmatched_option_paths_warn_with_the_closest(chain_and_input):
    model, x = chain_and_input
    with pytest.warns(ModuleBudgetWarning, match=r"'hed'.*closest module paths: head"):
        step(model, kernel_free({"memory_budget": {"hed": 0.0}}), x)


def test_a_cap_no_plan_keeps_is_reported_with_the_bytes():
    # After the graph break, down's activation reads the linear layer's output as a graph input,
    # which the backward needs and no plan can drop: a cap of 0 bytes cannot hold there.
    torch.manual_seed(0)
    model, x = Chain(graph_break=True), torch.randn(8, 16)
    set_budget(model.down, "0B")
    with pytest.warns(
        BudgetWarning, match=r"per-module budgets of 'Down \(whole graph\)' \(budget 0B: 0 bytes; the plan keeps [1-9]"
    ):
        step(model, kernel_free({}), x)


def test_the_package_exports_the_budget_functions():
    assert ckpt.set_budget is set_budget
    assert ckpt.clear_budgets is clear_budgets


def test_regions_are_in_the_cache_key_and_the_fingerprint(chain_and_input):
    model, x = chain_and_input
    keys, prints = [], []
    for options in ({}, {"memory_budget": {"down": 0.0}}, {"memory_budget": {"down": 0.5}}):
        config = CkptConfig.from_sources({"device": "h100", **options})
        captured: list[str] = []

        def backend(gm, example_inputs, config=config, captured=captured):
            partitioner = make_partitioner(gm, example_inputs, config)
            captured.append(partitioner.uuid())
            return compat.aot_simplified_without_kernels(gm, example_inputs, partitioner)

        torch.compiler.reset()
        _, records, _ = step(model, backend, x)
        keys.append(captured[0])
        prints.append(records[0].fingerprint)
    assert len(set(keys)) == 3
    assert len(set(prints)) == 3


# --- Through Inductor: backend="ckpt" itself --------------------------------------------------


def _inductor_step(model: nn.Module, x: torch.Tensor, options: dict[str, Any], caches: bool = False):
    """One step through backend="ckpt"; with ``caches``, Inductor's and AOTAutograd's caches stay on."""
    torch.compiler.reset()
    return step(model, "ckpt", x, options={"device": "h100", **options}, caches=caches)


@pytest.mark.compile
@pytest.mark.compat
def test_backend_keeps_each_module_s_cap_on_measured_bytes(chain_and_input):
    model, x = chain_and_input
    _check_up_and_down_caps(model, x, lambda: _inductor_step(model, x, {}))


@pytest.mark.compile
def test_the_compile_caches_never_serve_one_region_map_s_plan_for_another(chain_and_input):
    model, x = chain_and_input
    first, _, _ = _inductor_step(model, x, {"memory_budget": {"down": 0.0, "up": 0.0}}, caches=True)
    second, _, _ = _inductor_step(model, x, {"memory_budget": {"head": 0.0}}, caches=True)
    fresh, _, _ = _inductor_step(model, x, {"memory_budget": {"head": 0.0}})
    assert second == fresh
    assert first != second and first.get("head", 0) > 0 and second.get("head", 0) == 0


def test_explain_shows_each_region_s_cap_bytes_and_recompute_time(chain_and_input):
    from ckpt.tools.explainer import summary_line
    from ckpt.tools.report import ExplainReport, graph_report

    model, x = chain_and_input
    set_budget(model.up, 0.5)
    _, records, _ = step(model, kernel_free({"memory_budget": {"": 0.0, "head": "none"}}), x)
    (record,) = records
    report = graph_report(record)
    rows = {row.label: row for row in report.regions}
    assert set(rows) == {"up", "(rest of the graph)"}  # the head has no cap
    assert rows["up"].budget == "0.5" and rows["up"].cap_bytes == rows["up"].autograd_bytes // 2
    assert all(row.kept for row in report.regions)
    assert rows["(rest of the graph)"].saved_bytes == 0 and rows["(rest of the graph)"].recompute_ps > 0
    text = ExplainReport(graphs=(report,), budget="0", measured_bytes=None).to_markdown()
    assert "Per-module budgets:" in text and "| up " in text
    assert "2 per-module caps, all kept" in summary_line(record)


@pytest.mark.compat
def test_partition_fn_applies_path_budgets_to_graphs_that_record_module_paths(chain_and_input):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.compilers import nop

    model, x = chain_and_input
    partition = ckpt.partition_fn(memory_budget={"down": 0.0, "": "none"}, device="h100")
    backend = aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=partition)
    measured, records, _ = step(model, backend, x)
    assert [c.label for c in records[0].region_caps] == ["down"]
    assert measured.get("down", 0) == 0 and measured["up"] > 0
    with pytest.warns(ModuleBudgetWarning, match="records no module paths"):
        aot_function(torch.sin, nop, nop, partition_fn=partition)(torch.randn(4, requires_grad=True)).sum().backward()


class TiedLM(nn.Module):
    """An embedding and an output layer that share one weight, as GPT-2's do."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(40, 24)
        self.mix = nn.Linear(24, 24)
        self.head = nn.Linear(24, 40, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.tokens(idx)).tanh()).sin().square().mean()


def test_a_shared_weight_never_places_a_module_where_the_other_one_runs():
    torch.manual_seed(0)
    model, idx = TiedLM(), torch.randint(0, 40, (4, 6))
    set_budget(model.head, 0.0)
    with pytest.warns(ModuleBudgetWarning, match="cannot tell where it runs"):
        _, records, _ = step(model, kernel_free({}), idx)
    assert [cap.label for r in records for cap in r.region_caps] == []  # not "tokens"
    clear_budgets()
    set_budget(model, {"head": 0.0})  # by path, it is found through the model
    _, records, _ = step(model, kernel_free({}), idx)
    assert [cap.label for r in records for cap in r.region_caps] == ["head"]
