"""Language models for the benchmarks: GPT-2 style and Llama style."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.model_base import BlockModel, token_batch
from ckpt.tools.demo import GPTBlock

__all__ = ["GPT", "GPTConfig", "Llama", "LlamaConfig"]


# ---------------------------------------------------------------- GPT-2 style


@dataclass(frozen=True)
class GPTConfig:
    layers: int
    dim: int
    heads: int
    seq: int
    batch: int
    vocab: int
    dropout: float = 0.1


class GPT(BlockModel):
    """GPT-2 style language model: learned positions, LayerNorm, GELU MLP, dropout."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.tokens = nn.Embedding(c.vocab, c.dim)
        self.positions = nn.Embedding(c.seq, c.dim)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(GPTBlock(c.dim, c.heads, c.dropout) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def embed(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tokens(idx) + self.positions(positions))

    def loss(self, x: torch.Tensor, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def make_inputs(self, generator, device, dtype):
        return token_batch(self.config, generator, device)


# ---------------------------------------------------------------- Llama style


@dataclass(frozen=True)
class LlamaConfig:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    batch: int
    vocab: int


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, rotary grouped-query attention, RMSNorm, SwiGLU MLP."""

    def __init__(self, c: LlamaConfig, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.heads, c.kv_heads, c.dim // c.heads
        self.norm1 = RMSNorm(c.dim)
        self.q = nn.Linear(c.dim, c.dim, bias=False)
        self.kv = nn.Linear(c.dim, 2 * c.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(c.dim, c.dim, bias=False)
        self.norm2 = RMSNorm(c.dim)
        self.gate = nn.Linear(c.dim, c.ffn, bias=False)
        self.up = nn.Linear(c.dim, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.dim, bias=False)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, repeat, t, self.head_dim).reshape(b, self.heads, t, self.head_dim)
        v = v[:, :, None].expand(b, self.kv_heads, repeat, t, self.head_dim).reshape(b, self.heads, t, self.head_dim)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(BlockModel):
    """Llama style language model: RMSNorm, SwiGLU, rotary embeddings, grouped-query attention."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        if c.heads % c.kv_heads:
            raise ValueError(f"LlamaConfig.heads={c.heads} must be a multiple of kv_heads={c.kv_heads}")
        self.config = c
        head_dim = c.dim // c.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(c.seq).float(), inv_freq).repeat(1, 2)
        cos, sin = angles.cos(), angles.sin()
        self.tokens = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(LlamaBlock(c, cos, sin) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def embed(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.tokens(idx)

    def loss(self, x: torch.Tensor, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def make_inputs(self, generator, device, dtype):
        return token_batch(self.config, generator, device)
