"""Training FLOPs per token, for model FLOPs utilisation (MFU), full fine-tuning and LoRA alike.

Per token, a weight matrix of ``n`` parameters costs ``2n`` FLOPs forward (one multiply-add
per weight), ``2n`` backward for the gradient of its input (the activations' gradient) and
``2n`` backward for the gradient of its weight: the ``6N`` of Kaplan et al., "Scaling Laws for
Neural Language Models" (arXiv:2001.08361, section 2.1), and PaLM's MFU (Chowdhery et al.,
arXiv:2204.02311, appendix B), which adds ``12 * n_layer * seq_len * d_model`` for the two
attention matmuls (``QK^T`` and ``AV``: forward and both backward gradients; causal masking is
not subtracted, by that convention).

With LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685)
the frozen base still runs forward (``2N``) and backpropagates activation gradients through
every layer down to the lowest adapter (``2N``), but computes no weight gradient for itself:
only the adapters' ``N_trainable`` do (``2 N_trainable``). Hence, per token::

    flops = 4 * N_matmul + 2 * N_trainable_matmul + 12 * n_layer * seq_len * d_model

with ``N_matmul`` every ``nn.Linear`` weight (adapters included, a tied head once) and
``N_trainable_matmul`` those that train; for full training (``N_trainable = N``) it is PaLM's
``6N + 12 L T d``. Embedding lookups, norms, biases and the softmax are not counted (they are
not matmuls), so MFU is, if anything, slightly understated. ``mfu = flops * tokens_per_s /
peak``; fp8 is divided by the same (bf16) peak as the others.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from torch import nn


class FlopCount(BaseModel):
    """The terms of one model's training FLOPs per token (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    matmul_params: int
    trainable_matmul_params: int
    attention_flops: int

    @property
    def per_token(self) -> int:
        """``4 N + 2 N_trainable + attention``."""
        return 4 * self.matmul_params + 2 * self.trainable_matmul_params + self.attention_flops


def count_flops(model: nn.Module, n_layer: int, seq_len: int, d_model: int) -> FlopCount:
    """The :class:`FlopCount` of ``model`` (each distinct Linear weight once) for sequences of ``seq_len``."""
    seen: dict[int, tuple[int, bool]] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight
            seen[id(weight)] = (weight.numel(), weight.requires_grad)
    return FlopCount(
        matmul_params=sum(n for n, _ in seen.values()),
        trainable_matmul_params=sum(n for n, trains in seen.values() if trains),
        attention_flops=12 * n_layer * seq_len * d_model,
    )


def mfu(flops_per_token: int, tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak."""
    return flops_per_token * tokens_per_s / peak_flops
