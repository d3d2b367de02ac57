"""The benchmark models and their sizes: the registry the runner reads.

Every model is a :class:`BlockModel`: ``embed`` the inputs, run a stack of
``blocks`` that each map one tensor to one tensor, then compute the loss.  That
shape lets the eager-checkpoint setting wrap every block in
``torch.utils.checkpoint`` without a second copy of the model, and it keeps the
models free of graph breaks, so each compiles into one joint graph.  The
language models live in :mod:`benchmarks.language_models`, the vision models
in :mod:`benchmarks.vision_models`, the deep MLP here.

Sizes: ``tiny`` compiles in seconds (``--quick`` and the smoke test), ``cpu``
takes well under a second per step on two cores, and ``gpu`` is sized for one
H200 in bf16 (GPT-2 medium: 24 layers, width 1024, sequence 1024, batch 8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.language_models import GPT, GPTConfig, Llama, LlamaConfig
from benchmarks.model_base import BlockModel, class_labels
from benchmarks.vision_models import ResNet, ResNetConfig, UNet, UNetConfig, ViT, ViTConfig

__all__ = ["MODELS", "SIZES", "BlockModel", "DeepMLP", "ModelSpec", "model_spec", "parameter_count"]

SIZES = ("tiny", "cpu", "gpu")


# ---------------------------------------------------------------- deep MLP


@dataclass(frozen=True)
class MLPConfig:
    layers: int
    width: int
    batch: int
    classes: int


class MLPBlock(nn.Module):
    """Linear, LayerNorm, ReLU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.fc(x)))


class DeepMLP(BlockModel):
    """A deep plain MLP classifier: a stack of Linear-LayerNorm-ReLU layers."""

    def __init__(self, c: MLPConfig) -> None:
        super().__init__()
        self.config = c
        self.blocks = nn.ModuleList(MLPBlock(c.width) for _ in range(c.layers))
        self.head = nn.Linear(c.width, c.classes)

    def embed(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return x

    def loss(self, x: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(x).float(), labels)

    def make_inputs(self, generator, device, dtype):
        c = self.config
        x = torch.randn(c.batch, c.width, generator=generator).to(device, dtype)
        return x, class_labels(c, generator, device)


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class ModelSpec:
    name: str
    title: str
    transformer: bool
    factory: Callable[[Any], BlockModel]
    sizes: Mapping[str, Any]

    def build(self, size: str) -> BlockModel:
        if size not in self.sizes:
            raise ValueError(
                f"size={size!r} is not a size of model {self.name!r}; accepted sizes are {', '.join(self.sizes)}"
            )
        return self.factory(self.sizes[size])


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "gpt2",
            "GPT-2 style",
            True,
            GPT,
            {
                "tiny": GPTConfig(layers=2, dim=64, heads=4, seq=32, batch=2, vocab=128),
                "cpu": GPTConfig(layers=6, dim=256, heads=4, seq=128, batch=8, vocab=2048),
                "gpu": GPTConfig(layers=24, dim=1024, heads=16, seq=1024, batch=8, vocab=50304),
            },
        ),
        ModelSpec(
            "llama",
            "Llama style",
            True,
            Llama,
            {
                "tiny": LlamaConfig(layers=2, dim=64, heads=4, kv_heads=2, ffn=172, seq=32, batch=2, vocab=128),
                "cpu": LlamaConfig(layers=6, dim=256, heads=8, kv_heads=2, ffn=688, seq=128, batch=8, vocab=2048),
                "gpu": LlamaConfig(layers=16, dim=2048, heads=16, kv_heads=4, ffn=5632, seq=1024, batch=4, vocab=32000),
            },
        ),
        ModelSpec(
            "vit",
            "ViT",
            True,
            ViT,
            {
                "tiny": ViTConfig(layers=2, dim=64, heads=4, image=32, patch=8, batch=2, classes=10),
                "cpu": ViTConfig(layers=6, dim=256, heads=4, image=64, patch=8, batch=16, classes=100),
                "gpu": ViTConfig(layers=12, dim=768, heads=12, image=224, patch=16, batch=64, classes=1000),
            },
        ),
        ModelSpec(
            "resnet",
            "ResNet style",
            False,
            ResNet,
            {
                "tiny": ResNetConfig(widths=(8, 16), depth=1, image=16, batch=2, classes=10),
                "cpu": ResNetConfig(widths=(32, 64, 128, 256), depth=2, image=32, batch=32, classes=100),
                "gpu": ResNetConfig(widths=(64, 128, 256, 512), depth=2, image=224, batch=64, classes=1000),
            },
        ),
        ModelSpec(
            "unet",
            "U-Net",
            False,
            UNet,
            {
                "tiny": UNetConfig(widths=(8, 16), image=16, batch=2, classes=4),
                "cpu": UNetConfig(widths=(16, 32, 64, 128), image=64, batch=8, classes=8),
                "gpu": UNetConfig(widths=(64, 128, 256, 512), image=256, batch=16, classes=19),
            },
        ),
        ModelSpec(
            "mlp",
            "Deep MLP",
            False,
            DeepMLP,
            {
                "tiny": MLPConfig(layers=4, width=64, batch=16, classes=10),
                "cpu": MLPConfig(layers=16, width=512, batch=512, classes=100),
                "gpu": MLPConfig(layers=32, width=4096, batch=8192, classes=1000),
            },
        ),
    )
}


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"model {name!r} is unknown; accepted models are {', '.join(MODELS)}")
    return MODELS[name]


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
