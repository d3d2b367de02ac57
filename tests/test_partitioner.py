"""The partitioner on traced joint graphs: constraints, baselines and extraction, no C++ compile."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ckpt import _torch_compat as compat
from ckpt.cost_model.ops import classify
from ckpt.measure import saved_activations
from ckpt.partitioner import evaluate, solve
from ckpt.partitioner.joint_graph import read_roots
from ckpt.partitioner.torch_plan import plan_from_saved_names, torch_default_saved_names
from tests.joint import trace_joint
from tests.robustness.helpers import run_python
from tests.test_end_to_end import TinyModel


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
        )

    def forward(self, x):
        return self.layers(x).mean()


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(F.dropout(F.silu(self.fc1(x)), 0.2)).square().mean()


class MutatesBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))
        self.register_buffer("buf", torch.randn(8))

    def forward(self, x):
        y = (self.w * (self.buf + 1)).sin() * x
        self.buf.mul_(2)
        return y.sum()


MODELS = {
    "transformer": lambda: (TinyModel(), torch.randn(2, 16, 32, requires_grad=True)),
    "convnet": lambda: (ConvNet(), torch.randn(2, 3, 8, 8, requires_grad=True)),
    "dropout_mlp": lambda: (DropoutMLP(), torch.randn(4, 16, requires_grad=True)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_cap_plan_is_never_slower_than_torch_default(name):
    torch.manual_seed(0)
    model, x = MODELS[name]()
    joint = trace_joint(model, x)
    ours = solve(joint.analysis.problem, None)
    theirs = plan_from_saved_names(joint.analysis, torch_default_saved_names(joint.graph, joint.num_fwd_outputs))
    assert ours.time <= theirs.time


@pytest.mark.parametrize("name", sorted(MODELS))
def test_budgets_walk_down_monotonically_to_the_minimum(name):
    torch.manual_seed(0)
    joint = trace_joint(*MODELS[name]())
    problem, full = joint.analysis.problem, joint.analysis.no_recompute_bytes
    assert full > 0
    previous_bytes, previous_time = None, None
    for fraction in (1.0, 0.75, 0.5, 0.25, 0.1, 0.0):
        plan = solve(problem, int(fraction * full), effort=1000.0)
        assert plan.bytes <= int(fraction * full) or plan.over_budget
        if previous_bytes is not None:
            assert plan.bytes <= previous_bytes
            assert plan.time >= previous_time
        previous_bytes, previous_time = plan.bytes, plan.time


def test_random_masks_are_never_recomputed():
    with torch._inductor.config.patch(fallback_random=True):
        joint = trace_joint(*MODELS["dropout_mlp"]())
    analysis = joint.analysis
    random_values = [n for n in analysis.problem.names if "dropout" in n or "rand" in n]
    assert random_values, analysis.problem.names
    for name in random_values:
        assert not analysis.problem.can_recompute[analysis.problem.names.index(name)]
    plan = solve(analysis.problem, 0)
    assert not set(plan.recomputed) & {analysis.problem.names.index(n) for n in random_values}


def test_seed_lookups_become_reads_of_their_own_tensors_with_the_same_values():
    """The forward's seed lookups are replaced by one split of the seeds tensor; each draw gets the same seed."""
    import torch._inductor.inductor_prims  # noqa: F401  (registers Inductor's random prims)
    from torch.fx.experimental.proxy_tensor import make_fx

    from ckpt.partitioner.extract import share_seed_kernels

    prims = torch.ops.prims

    def seeds_of_draws() -> tuple[torch.Tensor, ...]:
        seeds = prims.inductor_seeds.default(3, torch.device("cpu"))
        picked = [prims.inductor_lookup_seed.default(seeds, i) for i in (2, 0, 1)]
        draws = [prims.inductor_random.default([5], seed, "rand") for seed in picked]
        return (*picked, *draws)  # eagerly a draw ignores its seed: the seeds are what is compared

    traced = make_fx(seeds_of_draws, tracing_mode="fake")()
    torch.manual_seed(7)
    expected = traced()[:3]
    assert len(set(map(int, expected))) == 3, expected
    split = share_seed_kernels(traced)
    targets = [node.target for node in split.graph.nodes if node.op == "call_function"]
    assert prims.inductor_lookup_seed.default not in targets
    assert targets.count(torch.ops.ckpt.unbind_seeds.default) == 1
    torch.manual_seed(7)
    got = split()[:3]
    assert [int(seed) for seed in got] == [int(seed) for seed in expected]
    assert all(seed.dim() == 0 and seed.dtype == torch.int64 for seed in got)


def test_reads_of_a_buffer_the_forward_mutates_are_never_recomputed():
    torch.manual_seed(0)
    joint = trace_joint(MutatesBuffer(), torch.randn(8, requires_grad=True))
    analysis = joint.analysis
    reasons = analysis.reasons
    assert any(reason == "reads a graph input that the forward mutates" for reason in reasons.values()), reasons
    plan = solve(analysis.problem, 0)
    for i in plan.recomputed:
        assert f"{analysis.problem.names[i]}:recompute" not in reasons


def test_no_recompute_plan_saves_everything_the_backward_reads():
    torch.manual_seed(0)
    joint = trace_joint(*MODELS["transformer"]())
    analysis = joint.analysis
    time, memory, recomputed = evaluate(analysis.problem, analysis.no_recompute_saved)
    assert memory == analysis.no_recompute_bytes
    # Only values that cannot be saved (multi-output ops) are recomputed.
    assert all(not analysis.problem.can_save[i] for i in recomputed)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_fraction_reference_is_what_autograd_saves(name):
    """A fraction's base equals the bytes that AOTAutograd's default partition saves, measured.

    Graph inputs are left out: for Inductor, ckpt charges the channels-last
    copy of a convolution's input or weight that saving it would keep alive
    where it cannot save the input itself, a copy this path without Inductor
    does not make.
    """
    torch.manual_seed(0)
    model, x = MODELS[name]()
    joint = trace_joint(model, x)

    def default_partition(gm, joint_inputs, *, num_fwd_outputs, **kwargs):
        return compat.aot_default_partition(gm, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    traced = compat.aot_module_without_kernels(model, default_partition, keep_inference_input_mutations=True)
    with saved_activations(model, x) as saved:
        loss = traced(x)
    loss.backward()
    analysis = joint.analysis
    saved_inputs = [i for i in analysis.reference_saved if analysis.nodes[i].op == "placeholder"]
    inputs = sum(analysis.problem.save_bytes[i] for i in saved_inputs)
    assert saved.bytes > 0 and saved.bytes == analysis.reference_bytes - inputs


class TiedLanguageModel(nn.Module):
    """An embedding tied to the output head, and one buffer shared by two blocks (as rotary tables are)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight
        scale = torch.linspace(0.5, 1.5, 16)
        for block in self.blocks:
            block.register_buffer("scale", scale)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + torch.tanh(block(h)) * block.scale
        return F.cross_entropy(self.head(h).flatten(0, 1), tokens.flatten())


@pytest.mark.compat
def test_a_model_with_tied_weights_and_shared_buffers_traces_with_each_tensor_once():
    """torch's aot_module refuses tied names; the tracer lifts each tensor once and its gradients match eager."""
    torch.manual_seed(0)
    model = TiedLanguageModel()
    tokens = torch.randint(0, 50, (4, 8))
    joint = trace_joint(model, tokens)
    primals = [n for n in joint.graph.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
    # embed (tied to head), two blocks' weight and bias, the shared buffer, the tokens
    assert len(primals) == 1 + 4 + 1 + 1

    model(tokens).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    def default_partition(gm, joint_inputs, *, num_fwd_outputs, **kwargs):
        return compat.aot_default_partition(gm, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    compat.aot_module_without_kernels(model, default_partition)(tokens).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], msg=name)


def test_a_view_s_symbolic_sizes_are_read_by_whatever_reads_the_view():
    """Recomputing past ``view(x, [s, 4])`` needs ``s`` in the backward, though only the view takes it."""
    graph = fx.Graph()
    size = graph.placeholder("s")
    x = graph.placeholder("x")
    mm = graph.call_function(torch.ops.aten.mm.default, (x, x))
    view = graph.call_function(torch.ops.aten.view.default, (mm, [size, 4]))
    picked = graph.call_function(torch.ops.aten.unbind.int, (view,))
    first = graph.call_function(operator.getitem, (picked, 0))
    tanh = graph.call_function(torch.ops.aten.tanh.default, (first,))
    kinds = {node: classify(node) for node in graph.nodes}
    assert set(read_roots(tanh, kinds)) == {mm, size}
    assert set(read_roots(view, kinds)) == {mm, size}


@pytest.mark.compat
@pytest.mark.compile
def test_a_traced_joint_graph_is_the_one_the_backend_partitions():
    """The tracer runs Inductor's joint-graph passes too: dropout becomes a seeded draw the backward can repeat.

    So the tools (explain, the solver benchmark) plan the values the backend
    plans, and a traced plan is the backend's.
    """
    from ckpt.backend import CkptPartitioner
    from ckpt.config import CkptConfig, parse_budget
    from ckpt.partitioner.peak_analysis import build_peak_graph
    from ckpt.records import record_partitions

    torch.manual_seed(0)
    model, x = MODELS["dropout_mlp"]()
    options = {"memory_budget": "0.3", "device": "h100", "measure_ops": False}
    with torch._inductor.config.patch(fallback_random=False):
        joint = trace_joint(model, x)
        with compat.compile_caches_disabled(), record_partitions() as records:
            torch.compile(model, backend="ckpt", options=options)(x).sum().backward()
    (record,) = records

    def values(analysis, indices):  # graph inputs by size: Dynamo numbers the parameters in another order
        nodes = analysis.nodes
        return sorted(
            ("input" if nodes[i].op == "placeholder" else str(nodes[i].target), analysis.problem.save_bytes[i])
            for i in indices
        )

    traced = values(joint.analysis, range(len(joint.analysis.nodes)))
    assert any("inductor_random" in target for target, _ in traced), traced
    assert traced == values(record.analysis, range(len(record.analysis.nodes)))
    graph = build_peak_graph(joint.graph, joint.analysis, joint.num_fwd_outputs)
    partitioner = CkptPartitioner(CkptConfig(budget=parse_budget("0.3")), record.profile)
    planned, budget_bytes, _, _ = partitioner.plan("traced", joint.analysis, graph)
    assert budget_bytes == record.budget_bytes
    assert values(joint.analysis, planned.saved) == values(record.analysis, record.plan.saved)


@pytest.mark.compat
def test_a_pooling_net_traces_in_a_fresh_process():
    """Inductor's max-pooling decomposition asks its lowerings, which only compiling imports; tracing imports them."""
    out = run_python(
        """
        import torch
        from ckpt.cost_model.profiles import GPU_PROFILES
        from ckpt.tools.joint import trace_joint
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        joint = trace_joint(model, torch.randn(2, 3, 8, 8), profile=GPU_PROFILES["h100"])
        print(sum("max_pool" in str(node.target) for node in joint.graph.graph.nodes))
        """
    )
    assert int(out.split()[-1]) >= 1


class ResidualStack(nn.Module):
    """Pre-norm blocks on a residual stream: ``x = x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self, width: int = 32, blocks: int = 4) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.fc1 = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(blocks))

    def forward(self, x):
        for norm, fc1, fc2 in zip(self.norms, self.fc1, self.fc2):
            x = x + fc2(F.gelu(fc1(norm(x))))
        return x.square().mean()


def _residual_sums(joint) -> list[fx.Node]:
    """The stream between blocks: the sums that the next block's norm and the next sum read."""
    forward = joint.analysis.forward_names
    return [
        n
        for n in joint.graph.graph.nodes
        if n.name in forward
        and n.target is torch.ops.aten.add.Tensor
        and any(u.target is torch.ops.aten.add.Tensor for u in n.users)
        and any(u.target is torch.ops.aten.var_mean.correction for u in n.users)
    ]


def _blocks(joint) -> dict[str, int]:
    """Each forward value's block: how many norms start at or before it, less one."""
    blocks, norms = {}, -1
    for n in joint.graph.graph.nodes:
        if n.name not in joint.analysis.forward_names:
            continue
        norms += n.target is torch.ops.aten.var_mean.correction
        blocks[n.name] = norms
    return blocks


def test_the_residual_stream_is_saved_and_every_block_is_planned_alike():
    # The stream is read by a block's norm and again, after the block's matmuls, by the next sum:
    # the forward holds it in memory anyway, so saving it costs the backward's read only, as for
    # a matmul's output of the same size.  A plan that recomputed it instead would rebuild the
    # whole chain of sums in every block's kernels, each block's different from the others'.
    torch.manual_seed(0)
    joint = trace_joint(ResidualStack(), torch.randn(4, 16, 32, requires_grad=True))
    problem, analysis = joint.analysis.problem, joint.analysis
    index = {name: i for i, name in enumerate(problem.names)}
    sums = [index[n.name] for n in _residual_sums(joint)]
    assert len(sums) == 3  # between the four blocks
    matmul_out = [
        i
        for i, n in enumerate(analysis.nodes)
        if n.target is torch.ops.aten.addmm.default and problem.save_bytes[i] == problem.save_bytes[sums[0]]
    ]
    assert matmul_out
    for i in sums:
        assert problem.save_time[i] == problem.save_time[matmul_out[0]]
    # A value the norm reads inside its own kernel still costs its write as well.
    inner = [
        i
        for i, n in enumerate(analysis.nodes)
        if n.target is torch.ops.aten.sub.Tensor and n.name in analysis.forward_names and problem.can_save[i]
    ]
    assert inner and all(problem.save_time[i] > problem.save_time[sums[0]] for i in inner)

    plan = solve(problem, None)
    assert set(sums) <= set(plan.saved)
    blocks = _blocks(joint)
    recomputed = [
        sorted(str(analysis.nodes[i].target) for i in plan.recomputed if blocks.get(problem.names[i]) == b)
        for b in range(4)
    ]
    assert recomputed[1] == recomputed[2]  # the inner blocks recompute the same values


@pytest.mark.parametrize("name", ["residual_stack", "convnet"])
def test_without_a_budget_norm_statistics_are_saved_not_recomputed(name):
    # Recomputing a norm's mean and variance reads the whole activation once more, in a loop of
    # its own; saving them costs a few bytes per row or channel.
    torch.manual_seed(0)
    if name == "residual_stack":
        joint = trace_joint(ResidualStack(), torch.randn(4, 16, 32, requires_grad=True))
    else:
        joint = trace_joint(*MODELS[name]())
    analysis = joint.analysis
    statistics = [i for i, n in enumerate(analysis.nodes) if n.target is torch.ops.aten.var_mean.correction]
    assert statistics
    plan = solve(analysis.problem, None)
    assert not set(statistics) & set(plan.recomputed)
