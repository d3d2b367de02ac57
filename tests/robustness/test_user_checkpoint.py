"""User checkpointing inside the model: ``checkpoint`` blocks, selective-checkpoint policies, autograd.Function.

ckpt plans around what the user asked for: a value tagged ``MUST_SAVE`` is
never recomputed and one tagged ``MUST_RECOMPUTE`` is never saved, at every
budget; a custom ``backward`` is used as written.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ckpt import _torch_compat as compat
from tests.robustness.helpers import BUDGETS, assert_runs_close, assert_within_budget, ckpt_compile, run_steps

pytestmark = pytest.mark.compile

DIM = 16
aten = torch.ops.aten


class Block(nn.Module):
    """A residual MLP block; with ``dropout``, dropout after the activation (the usual transformer layout)."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.fc1(x)).sin()
        if self.dropout:
            h = F.dropout(h, p=self.dropout, training=True)
        return x + self.fc2(h)


def save_matmuls_recompute_sigmoid(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if op in (aten.mm.default, aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    if op is aten.sigmoid.default:
        return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.PREFER_RECOMPUTE


class CheckpointedNet(nn.Module):
    """Two blocks under ``checkpoint``; with ``selective``, under a save-matmuls policy."""

    def __init__(self, selective: bool, dropout: float = 0.0) -> None:
        super().__init__()
        self.selective = selective
        self.blocks = nn.ModuleList([Block(dropout), Block(dropout)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.selective:
                context_fn = functools.partial(create_selective_checkpoint_contexts, save_matmuls_recompute_sigmoid)
                x = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
            else:
                x = checkpoint(block, x, use_reentrant=False)
        return x.tanh().square().sum()


class ClippedStraightThrough(torch.autograd.Function):
    """sign(x) forward; the gradient passes through where |x| <= 1 (autograd alone would give zero)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.sign(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


class CustomFunctionNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x)) * 1.5
        return self.fc2(ClippedStraightThrough.apply(h) * h).sin().sum()


def _input() -> torch.Tensor:
    return torch.randn(8, DIM, generator=torch.Generator().manual_seed(2), requires_grad=True)


def _assert_policy_kept(record) -> int:
    """Nothing tagged to be saved is recomputed, nothing tagged to be recomputed is saved.

    Returns how many MUST_SAVE values the plan saves.
    """
    nodes = record.analysis.nodes
    saved_must_save = 0
    for index in record.plan.saved:
        assert compat.recompute_tag(nodes[index]) != "recompute", f"{nodes[index].name} is tagged to be recomputed"
        saved_must_save += nodes[index].meta.get("recompute") is CheckpointPolicy.MUST_SAVE
    for index in record.plan.recomputed:
        assert compat.recompute_tag(nodes[index]) != "save", f"{nodes[index].name} is tagged to be saved"
    return saved_must_save


@pytest.mark.compat
@pytest.mark.parametrize("selective", [False, True], ids=["checkpoint", "selective_policy"])
def test_checkpoint_regions(selective):
    torch.manual_seed(0)
    model = CheckpointedNet(selective)
    batches = [[_input()]]
    want, _ = run_steps(model, batches)
    for budget in BUDGETS:
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget))
        assert_runs_close(got, want)
        (record,) = assert_within_budget(got[0], graphs=1)
        saved_must_save = _assert_policy_kept(record)
        if selective:
            assert saved_must_save > 0, f"budget {budget}: no MUST_SAVE matmul was saved"


@pytest.mark.compat
@pytest.mark.parametrize("selective", [False, True], ids=["checkpoint", "selective_policy"])
def test_dropout_inside_checkpoint_regions_with_eager_rng(selective):
    """Eager's checkpoint replays the forward's RNG state; compiled, the masks and the RNG stream must match it."""
    torch.manual_seed(0)
    model = CheckpointedNet(selective, dropout=0.3)
    batches = [[_input()], [_input()]]
    with inductor_config.patch(fallback_random=True):
        want, _ = run_steps(model, batches, seed=4, lr=0.1)
        want_state = torch.get_rng_state()
        for budget in BUDGETS:
            got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget), seed=4, lr=0.1)
            assert torch.equal(torch.get_rng_state(), want_state), f"budget {budget}: the RNG stream differs"
            assert_runs_close(got, want)
            assert_within_budget(got[0], graphs=1)


def test_dropout_inside_checkpoint_regions_with_inductor_rng():
    """With Inductor's RNG, ckpt gives default torch.compile's exact losses and gradients over two steps."""
    torch.manual_seed(0)
    model = CheckpointedNet(selective=False, dropout=0.3)
    batches = [[_input()], [_input()]]
    want, _ = run_steps(model, batches, compile_fn=lambda m: torch.compile(m, backend="inductor"), seed=4, lr=0.1)
    for budget in BUDGETS:
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget), seed=4, lr=0.1)
        assert_runs_close(got, want, rtol=0.0, atol=0.0)
        assert_within_budget(got[0], graphs=1)


def test_custom_autograd_function():
    torch.manual_seed(0)
    model = CustomFunctionNet()
    batches = [[_input()]]
    want, _ = run_steps(model, batches)
    for budget in BUDGETS:
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget))
        assert_runs_close(got, want)
        assert_within_budget(got[0], graphs=1)
