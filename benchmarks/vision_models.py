"""Vision models for the benchmarks: ViT and ResNet style."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.model_base import BlockModel, class_labels

__all__ = ["ResNet", "ResNetConfig", "ViT", "ViTConfig"]


# ---------------------------------------------------------------- ViT


@dataclass(frozen=True)
class ViTConfig:
    layers: int
    dim: int
    heads: int
    image: int
    patch: int
    batch: int
    classes: int


class ViTBlock(nn.Module):
    """Pre-LayerNorm bidirectional attention and GELU MLP."""

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.dim)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)
        self.ln2 = nn.LayerNorm(c.dim)
        self.fc = nn.Linear(c.dim, 4 * c.dim)
        self.out = nn.Linear(4 * c.dim, c.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ViT(BlockModel):
    """Vision transformer: convolutional patch embedding, encoder blocks, mean pooling."""

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        if c.image % c.patch:
            raise ValueError(f"ViTConfig.image={c.image} must be a multiple of patch={c.patch}")
        self.config = c
        self.patches = nn.Conv2d(3, c.dim, kernel_size=c.patch, stride=c.patch)
        self.positions = nn.Parameter(torch.randn(1, (c.image // c.patch) ** 2, c.dim) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.classes)

    def embed(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.patches(images).flatten(2).transpose(1, 2) + self.positions

    def loss(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.ln(x).mean(1)).float(), labels)

    def make_inputs(self, generator, device, dtype):
        c = self.config
        images = torch.randn(c.batch, 3, c.image, c.image, generator=generator).to(device, dtype)
        return images, class_labels(c, generator, device)


# ---------------------------------------------------------------- ResNet style


@dataclass(frozen=True)
class ResNetConfig:
    widths: tuple[int, ...]
    depth: int  # residual blocks per stage
    image: int
    batch: int
    classes: int


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the (projected, when the shape changes) input, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(BlockModel):
    """ResNet style classifier: convolutions, BatchNorm, ReLU, residuals, stride-2 stages."""

    def __init__(self, c: ResNetConfig) -> None:
        super().__init__()
        self.config = c
        self.stem = nn.Sequential(nn.Conv2d(3, c.widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(c.widths[0]))
        blocks = []
        cin = c.widths[0]
        for stage, width in enumerate(c.widths):
            for index in range(c.depth):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and index == 0 else 1))
                cin = width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(cin, c.classes)

    def embed(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.relu(self.stem(images))

    def loss(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(x.mean((2, 3))).float(), labels)

    def make_inputs(self, generator, device, dtype):
        c = self.config
        images = torch.randn(c.batch, 3, c.image, c.image, generator=generator).to(device, dtype)
        return images, class_labels(c, generator, device)
