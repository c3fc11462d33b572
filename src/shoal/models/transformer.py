"""A byte-level decoder-only transformer (pre-norm, causal attention): shoal's language workload.

Sized by ``model.options``: the default preset fits a 2-core machine (2
layers, width 64, about 0.17 M parameters with 256 byte classes and a
context of 64); ``{layers = 4, width = 256, heads = 8}`` with a context of
128 is the GPU preset (about 3.3 M). Input: token ids (N, T); output: logits
(N, T, vocabulary), which shoal's cross-entropy and bits-per-byte metric
take as they are. Positions are learned, so the context is the input's T.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from shoal.errors import ConfigError


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention: the fused kernel, or plain math inside a torch.func transform (the batched simulator's
    vmap), where the fused kernels' backward has no batching rule and would run one worker at a time."""
    if not torch._C._functorch.is_functorch_wrapped_tensor(q):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attended = causal_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(n, t, w))
        return x + self.mlp(self.norm2(x))


class ByteTransformer(nn.Module):
    """Token and position embeddings, ``layers`` pre-norm blocks, a final norm and a linear head."""

    def __init__(self, vocab: int, context: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.embed(x.long()) + self.position[:t]
        return self.head(self.norm(self.blocks(h)))


def byte_transformer(input_shape: tuple[int, ...], num_classes: int, *, hidden: list[int] | None = None,
                     layers: int = 2, width: int = 64, heads: int = 4) -> nn.Module:
    """The transformer for token windows of ``input_shape = (context,)`` over ``num_classes`` symbols."""
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ConfigError(f"model transformer: input must be token windows (context,), got shape {tuple(input_shape)}"
                          "; use a text data set such as stdlib")
    for name, value in (("layers", layers), ("width", width), ("heads", heads)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"model.options.{name}: must be a whole number >= 1, got {value!r}")
    if width % heads:
        raise ConfigError(f"model.options: width {width} must be a multiple of heads {heads}")
    return ByteTransformer(num_classes, input_shape[0], layers, width, heads)


byte_transformer.token_input = True  # type: ignore[attr-defined]  # it reads (N, T) token ids, not images
