"""Optimizer and learning-rate schedule from the job spec.

The optimizers are Halfcast's device-skipping ``AdamW`` / ``SGD``
(:mod:`trainer.optim.skipping`); the schedule is a device-side function of the count of
*applied* steps (:mod:`trainer.optim.schedule`), advanced by the step's ``applied`` flag,
so a skipped step never moves it (docs/trainer.md, "Numerics of one optimizer step";
pytorch#44511).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from halfcast.contracts.spec import LRSchedulerSpec, OptimizerSpec
from trainer.optim.schedule import DeviceLRSchedule, LRMultiplier, build_lr_schedule
from trainer.optim.skipping import SGD, AdamW, Implementation, fused_supported

__all__ = ["LRMultiplier", "build_lr_scheduler", "build_optimizer", "resolve_implementation"]


def resolve_implementation(requested: str, parameters: list[torch.nn.Parameter], name: str = "adamw") -> Implementation:
    """``auto`` → ``fused`` where the parameters' device has fused kernels (CPU, CUDA), else ``foreach``.

    Fused kernels are the fastest sync-free path (one launch per step, skip by
    ``found_inf``); the masked ``foreach`` update is the portable one.
    """
    if requested == "auto":
        if name == "sgd" and any(isinstance(p, DTensor) for p in parameters):
            return "foreach"  # torch 2.13: aten._fused_sgd_ has no DTensor (FSDP2) sharding rule
        return "fused" if fused_supported(parameters) else "foreach"
    if requested not in ("plain", "foreach", "fused"):
        raise ValueError(f"unknown optimizer implementation {requested!r}")
    return requested  # type: ignore[return-value]


def build_optimizer(spec: OptimizerSpec, parameters: Iterable[torch.nn.Parameter]) -> AdamW | SGD:
    """``AdamW`` (lr, betas, eps, weight_decay) or ``SGD`` (lr, momentum, weight_decay), device-skipping.

    ``implementation``: ``plain`` (one op per tensor), ``foreach`` (``torch._foreach_*``),
    ``fused`` (PyTorch's fused kernels), ``auto`` (see :func:`resolve_implementation`).
    PyTorch raises ``RuntimeError`` at the first step when fused kernels do not support
    the parameters' device or dtype.
    """
    params = list(parameters)
    implementation = resolve_implementation(spec.implementation, params, spec.name)
    if spec.name == "adamw":
        return AdamW(
            params,
            lr=spec.lr,
            betas=spec.betas,
            eps=spec.eps,
            weight_decay=spec.weight_decay,
            implementation=implementation,
        )
    return SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, implementation=implementation
    )


def build_lr_scheduler(spec: LRSchedulerSpec, optimizer: torch.optim.Optimizer, total_steps: int) -> DeviceLRSchedule:
    """The device-side schedule of ``spec`` over ``total_steps`` (the job's ``max_steps``)."""
    return build_lr_schedule(spec, optimizer, total_steps)
