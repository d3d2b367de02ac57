"""Random ops (dropout, ``rand_like``): the backward uses the forward's draws, and the RNG stream stays eager's.

torch's own budgeted partitioner recomputes dropout with fresh randomness
(pytorch#190758), and a random op copied into the backward as dead code still
advances the global generator.  Both show up here as wrong gradients or as a
different mask on the next step.
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
import torch.nn.functional as F

from ckpt import _torch_compat as compat
from tests.robustness.helpers import (
    BUDGETS,
    assert_runs_close,
    assert_within_budget,
    ckpt_compile,
    inductor_kernels,
    run_steps,
)

pytestmark = pytest.mark.compile

DIM = 16
P_DROP = 0.4


class DropoutNet(nn.Module):
    """Dropout and ``rand_like`` noise between two Linear layers; returns the loss.

    ``noise_of_dropout_output`` draws the noise with the shape of the dropout
    output, so the noise's only input is that output; otherwise it takes the
    shape of the activation before dropout.
    """

    def __init__(self, noise_of_dropout_output: bool = False) -> None:
        super().__init__()
        self.noise_of_dropout_output = noise_of_dropout_output
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.tanh(self.fc1(x))
        h = F.dropout(a, p=P_DROP, training=True)
        noise = torch.rand_like(h if self.noise_of_dropout_output else a)
        h = h * (noise + 0.5)
        return self.fc2(h).sin().sum()


class MaskProbe(nn.Module):
    """Dropout whose output and noise are returned, so the test can rebuild the gradient from them."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, DIM))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = F.dropout(torch.tanh(x * self.w), p=P_DROP, training=True)
        noise = torch.rand_like(y)
        loss = (torch.sin(y) * noise).sum()
        return y.detach(), noise.detach(), loss


def _batches(steps: int = 2) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [[torch.randn(8, DIM, generator=generator, requires_grad=True)] for _ in range(steps)]


@pytest.mark.compat
@pytest.mark.parametrize(
    "noise_of_dropout_output", [False, True], ids=["noise_of_activation", "noise_of_dropout_output"]
)
def test_fallback_random_matches_eager_and_leaves_the_same_rng_state(noise_of_dropout_output):
    """With eager's RNG in Inductor, two steps draw the same masks as eager and leave the generator where eager does.

    The generator state after the steps also shows that no random op ran in
    the backward, not even as dead code.
    """
    torch.manual_seed(0)
    model = DropoutNet(noise_of_dropout_output)
    batches = _batches()
    with inductor_config.patch(fallback_random=True):
        want, _ = run_steps(model, batches, seed=123)
        want_state = torch.get_rng_state()
        for budget in BUDGETS:
            got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, budget), seed=123)
            got_state = torch.get_rng_state()
            assert_runs_close(got, want)
            assert torch.equal(got_state, want_state), f"budget {budget}: the RNG stream after two steps differs"
            assert_within_budget(got[0], graphs=1)


def _gradient_from_forward_draws(
    x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """d/dw of sum(sin(y) * noise) for y = dropout(tanh(x * w)), with the mask read off the forward's y."""
    keep = (y != 0).to(x.dtype)
    w = w.detach().clone().requires_grad_(True)
    y_again = torch.tanh(x.detach() * w) * keep / (1 - P_DROP)
    torch.testing.assert_close(y_again.detach(), y)
    (torch.sin(y_again) * noise).sum().backward()
    assert w.grad is not None
    return w.grad


def _check_mask_reuse(model: MaskProbe, x: torch.Tensor) -> None:
    for budget in BUDGETS:
        outputs = []

        def loss_of(out: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
            outputs.append(out)
            return out[2]

        (step,), trained = run_steps(
            model, [[x]], compile_fn=lambda m: ckpt_compile(m, budget), loss_fn=loss_of, seed=7
        )
        ((y, noise, _),) = outputs
        assert 0 < int((y == 0).sum()) < y.numel(), "the probe must drop some elements and keep others"
        want = _gradient_from_forward_draws(x, trained.w, y, noise)
        torch.testing.assert_close(step.grads[0], want, msg=lambda m: f"budget {budget}: {m}")
        assert_within_budget(step, graphs=1)


@pytest.mark.parametrize(
    "fallback_random", [False, pytest.param(True, marks=pytest.mark.compat)], ids=["inductor_rng", "eager_rng"]
)
def test_backward_uses_the_mask_drawn_in_the_forward(fallback_random):
    """The gradient equals the one rebuilt from the mask and noise the forward returned, at every budget."""
    torch.manual_seed(0)
    x = torch.rand(8, DIM) + 0.5  # tanh(x * w) is never exactly 0, so y == 0 marks a dropped element
    with inductor_config.patch(fallback_random=fallback_random):
        _check_mask_reuse(MaskProbe(), x)


def test_inductor_rng_matches_default_compile_over_two_steps():
    """With Inductor's RNG, ckpt at every budget gives default torch.compile's exact losses and gradients.

    Inductor draws one seed tensor per graph call from the global generator,
    so equal results on the second step also mean the first step left the
    generator where default torch.compile leaves it.
    """
    torch.manual_seed(0)
    dropout_net = DropoutNet(noise_of_dropout_output=True)
    batches = _batches()
    want, _ = run_steps(dropout_net, batches, compile_fn=lambda m: torch.compile(m, backend="inductor"), seed=5)
    want_state = torch.get_rng_state()
    for budget in BUDGETS:
        got, _ = run_steps(dropout_net, batches, compile_fn=lambda m: ckpt_compile(m, budget), seed=5)
        assert torch.equal(torch.get_rng_state(), want_state), f"budget {budget}: the RNG stream differs"
        assert_runs_close(got, want, rtol=0.0, atol=0.0)
        assert_within_budget(got[0], graphs=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: functionalised (philox) RNG")
def test_functionalized_rng_on_gpu_may_recompute_dropout():
    """On CUDA torch replays dropout from a saved philox seed and offset: a recompute must reuse the forward's mask."""
    import torch._functorch.config as functorch_config

    torch.manual_seed(0)
    x = (torch.rand(8, DIM) + 0.5).cuda()
    with functorch_config.patch(functionalize_rng_ops=True):
        _check_mask_reuse(MaskProbe().cuda(), x)


class DropoutStack(nn.Module):
    """``depth`` identical blocks, each ``x + dropout(gelu(linear(x)))``; returns the loss."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + F.dropout(F.gelu(layer(x)), P_DROP, training=True)
        return (x * x).sum()


@pytest.mark.compat
def test_blocks_that_draw_masks_share_their_kernels():
    """Alike blocks that draw dropout masks compile one kernel, in the forward and in the backward.

    Inductor writes a seed lookup's index into the kernel that computes it, so
    each block would compile a kernel of its own.  At budget 0 the backward
    draws every block's mask again from the seed the forward saved (8 bytes),
    and the forward reads each block's seed from a tensor of its own
    (``ckpt::unbind_seeds``): the blocks' kernels are one.
    """
    from ckpt.records import record_partitions

    depth = 4
    torch.manual_seed(0)
    model, x = DropoutStack(depth), torch.randn(8, DIM)
    compiled = ckpt_compile(model, "0")

    def step():
        compiled(x).backward()

    with inductor_config.patch(fallback_random=False), compat.compile_caches_disabled(), record_partitions() as records:
        _, codes = compat.run_and_get_code(step)
    (record,) = records
    analysis, plan = record.analysis, record.plan
    seeds = {i for i, node in enumerate(analysis.nodes) if compat.is_inductor_seed_lookup(node.target)}
    draws = {i for i, node in enumerate(analysis.nodes) if compat.is_inductor_random(node.target)}
    assert len(seeds) == len(draws) == depth
    assert draws <= set(plan.recomputed), "budget 0 recomputes the draws"
    assert seeds <= set(plan.saved), "the seeds the backward draws from are saved, not looked up again"
    assert "seed lookup" in analysis.reasons[f"{analysis.nodes[min(seeds)].name}:recompute"]
    backward = inductor_kernels(codes[-1])
    # Distinct sources: each is compiled once (torch 2.9 names a repeated source again, later ones reuse it).
    regenerating = {body for body in backward.values() if "rand" in body}
    assert 1 <= len(regenerating) < depth, sorted(backward)
    forward = inductor_kernels(codes[0])
    assert "ckpt.unbind_seeds" in codes[0]
    drawing = {body for body in forward.values() if "rand" in body}
    assert 1 <= len(drawing) < depth, sorted(forward)
