"""Optimizer and learning-rate schedule from the job spec.

The schedule is a ``LambdaLR`` over *applied* optimizer steps: the loop calls
``scheduler.step()`` only when the optimizer stepped (DESIGN.md §4; pytorch#44511).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer.spec import LRSchedulerSpec, OptimizerSpec

_IMPLEMENTATION_KWARGS: dict[str, dict[str, bool]] = {
    "auto": {},
    "plain": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def build_optimizer(spec: OptimizerSpec, parameters: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """``AdamW`` (lr, betas, eps, weight_decay) or ``SGD`` (lr, momentum, weight_decay).

    ``implementation``: ``plain`` -> ``foreach=False``, ``foreach`` -> ``foreach=True``,
    ``fused`` -> ``fused=True``, ``auto`` -> PyTorch's default. PyTorch raises
    ``RuntimeError`` when fused kernels do not support the parameters' device or dtype.
    """
    params = list(parameters)
    kwargs: dict[str, Any] = dict(_IMPLEMENTATION_KWARGS[spec.implementation])
    if spec.name == "adamw":
        return torch.optim.AdamW(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay, **kwargs
        )
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, **kwargs)


@dataclass
class LRMultiplier:
    """The factor on the base learning rate after ``applied`` optimizer steps.

    Linear warm-up ``(applied + 1) / warmup_steps`` for the first ``warmup_steps``; then
    ``constant``: 1; ``cosine``: ``r + (1 - r) * (1 + cos(pi * p)) / 2``; ``linear``:
    ``1 - (1 - r) * p``, with ``r = min_lr_ratio`` and ``p`` the fraction of the
    ``total_steps - warmup_steps`` decay steps done (clamped to [0, 1]); ``step``:
    ``gamma ** ((applied - warmup_steps) // step_size)``. A plain dataclass (not a
    closure) so ``LambdaLR.state_dict`` stores its fields.
    """

    name: str
    total_steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    step_size: int = 1
    gamma: float = 0.1

    def __call__(self, applied: int) -> float:
        if applied < self.warmup_steps:
            return (applied + 1) / self.warmup_steps
        done = applied - self.warmup_steps
        if self.name == "step":
            return self.gamma ** (done // self.step_size)
        if self.name == "constant":
            return 1.0
        progress = min(1.0, done / max(1, self.total_steps - self.warmup_steps))
        ratio = self.min_lr_ratio
        if self.name == "cosine":
            return ratio + (1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - (1.0 - ratio) * progress


def build_lr_scheduler(spec: LRSchedulerSpec, optimizer: torch.optim.Optimizer, total_steps: int) -> LambdaLR:
    """A ``LambdaLR`` with :class:`LRMultiplier` over ``total_steps`` (the job's ``max_steps``)."""
    multiplier = LRMultiplier(
        name=spec.name,
        total_steps=total_steps,
        warmup_steps=spec.warmup_steps,
        min_lr_ratio=spec.min_lr_ratio,
        step_size=spec.step_size,
        gamma=spec.gamma,
    )
    return LambdaLR(optimizer, lr_lambda=multiplier)
