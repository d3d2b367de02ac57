"""Mutation: in-place ops, buffers and inputs written in the forward.

A recompute in the backward must never write a buffer a second time, and
must never read a tensor after the forward has overwritten it.  Plain
``torch.compile`` recomputes ``buf + 1`` below after ``buf.mul_(2)`` and gets
the gradient of ``w`` wrong (NOTES.md); ckpt must save such a value.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ckpt import _torch_compat as compat
from ckpt.records import record_partitions
from tests.robustness.helpers import BUDGETS, assert_runs_close, assert_within_budget, ckpt_compile, run_steps

pytestmark = pytest.mark.compile

DIM = 16


class InPlaceNet(nn.Module):
    """``relu_``, ``add_`` and ``index_put_`` on activations that require grad."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)
        self.shift = nn.Parameter(torch.linspace(-0.5, 0.5, DIM))

    def forward(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h.add_(self.shift)
        h.relu_()
        g = h * 2
        g.index_put_((rows,), torch.tanh(h[rows]), accumulate=True)
        g.add_(torch.sigmoid(h))
        return self.fc2(g).sin().sum()


class BatchNormNet(nn.Module):
    """BatchNorm in training mode: the forward updates running_mean, running_var and num_batches_tracked."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.bn = nn.BatchNorm1d(DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.bn(self.fc1(x)))).square().mean()


class MutatedBufferRead(nn.Module):
    """NOTES.md's trap: the forward reads ``buf`` into a recomputable value, then doubles ``buf``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, DIM))
        self.register_buffer("buf", torch.linspace(-1.0, 1.0, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (self.w * (self.buf + 1)).sin() * x
        self.buf.mul_(2)
        return y.sum()


class MutatedInputRead(nn.Module):
    """An input (no grad) is read, updated in place, and read again."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, DIM))

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        y = (self.w * (state + 1)).sin() * x
        h = torch.tanh(self.fc(y))
        state.mul_(0.5).add_(h.detach().mean(0))
        return (h * state).sum() + y.sum()


def _batches(*extra: torch.Tensor, steps: int = 2) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [[torch.randn(8, DIM, generator=generator, requires_grad=True), *extra] for _ in range(steps)]


def test_in_place_ops():
    torch.manual_seed(0)
    model = InPlaceNet()
    rows = torch.tensor([0, 3, 3, 5])  # a repeated row: index_put_ accumulates twice into it
    batches = _batches(rows, steps=1)
    want, _ = run_steps(model, batches)
    for budget in BUDGETS:
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget))
        assert_runs_close(got, want)
        assert_within_budget(got[0], graphs=1)


def test_batchnorm_running_stats_update_once_per_step():
    """After two SGD steps the running statistics equal eager's: a recompute never updates them again."""
    torch.manual_seed(0)
    model = BatchNormNet()
    batches = _batches()
    want, eager_model = run_steps(model, batches, lr=0.1)
    assert int(eager_model.bn.num_batches_tracked) == 2
    for budget in BUDGETS:
        got, trained = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget), lr=0.1)
        assert_runs_close(got, want)
        assert int(trained.bn.num_batches_tracked) == 2, f"budget {budget}"
        torch.testing.assert_close(trained.bn.running_mean, eager_model.bn.running_mean)
        torch.testing.assert_close(trained.bn.running_var, eager_model.bn.running_var)
        assert_within_budget(got[0], graphs=1)


def _gradient_of_w(buf: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    w = w.detach().clone().requires_grad_(True)
    ((w * (buf + 1)).sin() * x).sum().backward()
    assert w.grad is not None
    return w.grad


@pytest.mark.compat
def test_read_of_a_buffer_the_forward_mutates_is_not_recomputed():
    """Gradients of ``w`` and the buffer after two steps equal eager's."""
    torch.manual_seed(0)
    model = MutatedBufferRead()
    batches = _batches()
    # The case only tests something if a recompute from the doubled buffer gives a different gradient.
    x = batches[0][0].detach()
    assert not torch.allclose(_gradient_of_w(model.buf, model.w, x), _gradient_of_w(2 * model.buf, model.w, x))
    want, eager_model = run_steps(model, batches, lr=0.1)
    for budget in BUDGETS:
        got, trained = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget), lr=0.1)
        assert_runs_close(got, want)
        torch.testing.assert_close(trained.buf, eager_model.buf)
        assert_within_budget(got[0], graphs=1)


def test_input_mutated_in_place():
    """An input the forward reads, updates in place and reads again: gradients and the updated input equal eager's."""
    torch.manual_seed(0)
    model = MutatedInputRead()
    state = torch.linspace(-1.0, 1.0, DIM)
    batches = _batches(state, steps=1)
    eager_inputs: list[list[torch.Tensor]] = []
    want, _ = run_steps(model, batches, used_inputs=eager_inputs)
    assert not torch.equal(eager_inputs[0][1], state), "the model must write its input"
    for budget in BUDGETS:
        compiled_inputs: list[list[torch.Tensor]] = []
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget), used_inputs=compiled_inputs)
        assert_runs_close(got, want)
        torch.testing.assert_close(compiled_inputs[0][1], eager_inputs[0][1])
        assert_within_budget(got[0], graphs=1)


class TwoCalls(nn.Module):
    """Calls the compiled module twice before one backward (a siamese loss): two forwards mutate in turn."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 0.7 * self.inner(a) + self.inner(b)


def _compile_inner(budget: str):
    def compile_fn(model: TwoCalls) -> TwoCalls:
        model.inner = ckpt_compile(model.inner, budget)
        return model

    return compile_fn


@pytest.mark.parametrize("inner_class", [pytest.param(MutatedBufferRead, marks=pytest.mark.compat), BatchNormNet])
def test_two_forwards_before_one_backward(inner_class):
    """Each backward uses the values of its own forward, though the second forward mutated the buffers again."""
    torch.manual_seed(0)
    model = TwoCalls(inner_class())
    generator = torch.Generator().manual_seed(4)
    batches = [[torch.randn(8, DIM, generator=generator, requires_grad=True) for _ in range(2)] for _ in range(2)]
    want, eager_model = run_steps(model, batches, lr=0.1)
    for budget in BUDGETS:
        got, trained = run_steps(model, batches, compile_fn=_compile_inner(budget), lr=0.1)
        assert_runs_close(got, want)
        for (name, got_buffer), (_, want_buffer) in zip(trained.named_buffers(), eager_model.named_buffers()):
            torch.testing.assert_close(got_buffer, want_buffer, msg=lambda m: f"budget {budget}, {name}: {m}")
        assert_within_budget(got[0], graphs=1, calls=2)


def _update_non_leaf(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b = (a + w).sin()
    a.mul_(2)
    return (b * a).sum()


def test_non_leaf_input_that_requires_grad_mutated_in_place():
    """Inductor leaves this mutation to AOTAutograd's runtime wrapper (after the forward): the input is never saved.

    torch's own partitioner saves it, and autograd raises "modified by an inplace operation".
    """
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(4, DIM, generator=generator)
    w = torch.randn(DIM, generator=generator)

    def grads(fn):
        leaves = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
        a = leaves[0] * 1
        fn(a, leaves[1]).backward()
        return [leaf.grad for leaf in leaves] + [a.detach()]

    want = grads(_update_non_leaf)
    for budget in BUDGETS:
        torch.compiler.reset()
        with compat.compile_caches_disabled(), record_partitions() as records:
            got = grads(ckpt_compile(_update_non_leaf, budget))
        for got_value, want_value in zip(got, want):
            torch.testing.assert_close(got_value, want_value, msg=lambda m: f"budget {budget}: {m}")
        assert [r.fallback_reason for r in records] == [None]
