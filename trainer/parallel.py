"""Data-parallel wrapping and gradient-sync control (DDP).

Gradients are all-reduced only on the last micro-batch of an accumulation window: every
earlier micro-batch runs forward and backward inside ``DistributedDataParallel.no_sync()``
(the pattern of nanoGPT's ``require_backward_grad_sync``).
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.distributed import DistContext


def wrap_model(model: nn.Module, dist_ctx: DistContext) -> nn.Module:
    """``model`` in DDP when a process group is initialised, else ``model`` itself.

    DDP broadcasts rank 0's parameters and buffers at construction, so every rank
    starts identical.
    """
    if not dist_ctx.is_distributed:
        return model
    device_ids = [dist_ctx.device.index] if dist_ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or ``model`` itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
    """Context for one micro-batch's forward and backward: ``no_sync()`` unless ``sync`` (or not DDP)."""
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()
