"""The shape every benchmark model has: embed, a stack of blocks, a loss."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

__all__ = ["BlockModel", "class_labels", "token_batch"]


class BlockModel(nn.Module):
    """``embed`` -> ``blocks`` -> ``loss``; subclasses fill in the three parts."""

    blocks: nn.ModuleList

    def embed(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, x: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def make_inputs(
        self, generator: torch.Generator, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def forward(self, *inputs: torch.Tensor, checkpoint_blocks: bool = False) -> torch.Tensor:
        x = self.embed(*inputs)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if checkpoint_blocks else block(x)
        return self.loss(x, *inputs)


def token_batch(config: Any, generator: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, config.vocab, (config.batch, config.seq + 1), generator=generator)
    return data[:, :-1].contiguous().to(device), data[:, 1:].contiguous().to(device)


def class_labels(config: Any, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randint(0, config.classes, (config.batch,), generator=generator).to(device)
