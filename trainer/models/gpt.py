"""A small GPT-style causal decoder (Radford et al. 2018/2019, "Language Models are
Unsupervised Multitask Learners"): token and learned position embeddings, pre-LayerNorm
blocks of causal self-attention and a GELU MLP, a final LayerNorm and a linear head,
tied to the token embedding by default (Press & Wolf 2017).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: Standard deviation of the normal weight initialisation (GPT-2).
INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position ``t`` attends to positions ``<= t``.

    Uses ``F.scaled_dot_product_attention(is_causal=True)`` (Vaswani et al. 2017).
    Raises ``ValueError`` when ``d_model`` is not divisible by ``n_head``.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, d_model]`` -> ``[B, T, d_model]``."""
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
            for t in self.qkv(x).split(width, dim=2)
        )
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        out = out.transpose(1, 2).contiguous().view(batch, length, width)
        return self.resid_dropout(self.proj(out))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``; ``[B, T, C] -> [B, T, C]``."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(),
            nn.Linear(4 * d_model, d_model),
            nn.Dropout(dropout),
        )

    def residual_projections(self) -> list[nn.Linear]:
        """The layers that write into the residual stream: attention's output projection and the MLP's last."""
        mlp_out = self.mlp[2]
        if not isinstance(mlp_out, nn.Linear):
            raise TypeError(f"expected the MLP's output Linear at index 2, got {type(mlp_out).__name__}")
        return [self.attn.proj, mlp_out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    """Causal decoder mapping int64 tokens ``[B, T]`` (``T <= context``) to logits ``[B, T, vocab_size]``.

    Weights are drawn from N(0, 0.02); the output projections of each block from
    N(0, 0.02 / sqrt(2 * n_layer)) as in GPT-2; biases start at zero.
    """

    def __init__(
        self,
        vocab_size: int,
        context: int,
        n_layer: int = 2,
        n_head: int = 4,
        d_model: int = 128,
        dropout: float = 0.0,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        self.context = context
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(context, d_model)
        self.embed_dropout = nn.Dropout(dropout)
        blocks = [Block(d_model, n_head, dropout) for _ in range(n_layer)]
        self.blocks = nn.ModuleList(blocks)
        self.ln_final = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init_weights)
        residual_std = INIT_STD / math.sqrt(2 * n_layer)
        for block in blocks:
            for layer in block.residual_projections():
                nn.init.normal_(layer.weight, std=residual_std)
        if tie_weights:
            self.head.weight = self.token_embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab_size]`` in the autocast dtype; raises ``ValueError`` if ``T > context``."""
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(f"sequence length {length} exceeds the context of {self.context}")
        positions = torch.arange(length, device=tokens.device)
        x = self.embed_dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_final(x))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
