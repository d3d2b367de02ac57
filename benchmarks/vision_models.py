"""Vision models for the benchmarks: ViT, ResNet style and a U-Net."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from benchmarks.model_base import BlockModel, class_labels

__all__ = ["ResNet", "ResNetConfig", "UNet", "UNetConfig", "ViT", "ViTConfig"]


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


# ---------------------------------------------------------------- U-Net


@dataclass(frozen=True)
class UNetConfig:
    widths: tuple[int, ...]  # channels per level, from the full-resolution one down
    image: int
    batch: int
    classes: int  # per-pixel classes


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


class DownBlock(nn.Module):
    """Half the resolution (except at the first level), then two conv-BN-ReLU."""

    def __init__(self, cin: int, cout: int, pool: bool) -> None:
        super().__init__()
        self.pool = pool
        self.convs = _double_conv(cin, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(F.max_pool2d(x, 2) if self.pool else x)


class UpBlock(nn.Module):
    """Double the resolution with a transposed convolution, join the skip connection, two conv-BN-ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        self.convs = _double_conv(2 * cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.convs(torch.cat([self.up(x), skip], dim=1))


class UNet(BlockModel):
    """A U-Net segmenter: an irregular graph, every encoder level's output is read again by the decoder.

    The blocks are the encoder levels, then the decoder levels; each decoder
    level reads the output of the encoder level at its resolution (a long
    skip connection), so the activations alive at once are not a chain.
    """

    def __init__(self, c: UNetConfig) -> None:
        super().__init__()
        self.config = c
        self.stem = nn.Sequential(nn.Conv2d(3, c.widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(c.widths[0]))
        downs = [DownBlock(c.widths[0], c.widths[0], pool=False)]
        downs += [DownBlock(cin, cout, pool=True) for cin, cout in zip(c.widths, c.widths[1:])]
        ups = [UpBlock(cin, cout) for cin, cout in zip(c.widths[:0:-1], c.widths[-2::-1])]
        self.levels = len(downs)
        self.blocks = nn.ModuleList(downs + ups)
        self.head = nn.Conv2d(c.widths[0], c.classes, 1)

    def embed(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.relu(self.stem(images))

    def loss(self, x: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(x).float(), labels)

    def forward(self, *inputs: torch.Tensor, checkpoint_blocks: bool = False) -> torch.Tensor:
        def run(block: nn.Module, *args: torch.Tensor) -> torch.Tensor:
            return checkpoint(block, *args, use_reentrant=False) if checkpoint_blocks else block(*args)

        x = self.embed(*inputs)
        skips = []
        for block in self.blocks[: self.levels]:
            x = run(block, x)
            skips.append(x)
        skips.pop()  # the lowest level feeds the decoder directly
        for block in self.blocks[self.levels :]:
            x = run(block, x, skips.pop())
        return self.loss(x, *inputs)

    def make_inputs(self, generator, device, dtype):
        c = self.config
        images = torch.randn(c.batch, 3, c.image, c.image, generator=generator).to(device, dtype)
        labels = torch.randint(0, c.classes, (c.batch, c.image, c.image), generator=generator).to(device)
        return images, labels
