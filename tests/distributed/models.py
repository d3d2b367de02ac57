"""Tiny models, global batches and the single-process eager reference for the distributed tests.

Every distributed run trains a model built from a fixed seed on a global batch
that the ranks split evenly, so the mean of the ranks' losses is the global
loss, and data-parallel gradients (averaged over ranks) are the gradients of
the global loss.  :func:`eager_reference` trains the same model on the whole
batch in this process; the tests compare the ranks' losses and gathered
gradients with it after every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

__all__ = [
    "BATCH",
    "LR",
    "STEPS",
    "Block",
    "Net",
    "Step",
    "assert_steps_close",
    "eager_reference",
    "global_batches",
    "make_net",
]

BATCH = 8  # global batch; each of two ranks takes half
STEPS = 3
LR = 0.1
SEED = 0


class Block(nn.Module):
    """Pre-LayerNorm residual MLP: ``x + fc2(tanh(fc1(norm(x))))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Two blocks and a linear head; the forward returns the mean loss of its batch."""

    def __init__(self, dim: int, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return torch.sigmoid(self.head(x)).square().mean()


def make_net(dim: int) -> Net:
    torch.manual_seed(SEED)
    return Net(dim)


def global_batches(dim: int, steps: int = STEPS) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED + 1)
    return [torch.randn(BATCH, dim, generator=generator) for _ in range(steps)]


@dataclass
class Step:
    loss: torch.Tensor  # the global loss: the mean over ranks of each rank's mean loss
    grads: dict[str, torch.Tensor]  # full (gathered) gradients by parameter name, before the optimizer step
    saved_bytes: int = 0  # activation bytes this rank saved for the backward


def eager_reference(model: nn.Module, batches: list[torch.Tensor], lr: float = LR) -> list[Step]:
    """Train ``model`` in this process, one SGD step per batch; each step's loss and gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = []
    for x in batches:
        loss = model(x)
        loss.backward()
        steps.append(Step(loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}))
        optimizer.step()
        optimizer.zero_grad()
    return steps


def assert_steps_close(got: list[Step], want: list[Step], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Losses and every gradient equal, step by step, within float32 tolerance."""
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a.loss, b.loss, rtol=rtol, atol=atol, msg=lambda m: f"step {index} loss: {m}")
        assert a.grads.keys() == b.grads.keys()
        for name in b.grads:
            torch.testing.assert_close(
                a.grads[name], b.grads[name], rtol=rtol, atol=atol, msg=lambda m: f"step {index} grad {name}: {m}"
            )
