"""Data-parallel wrapping and gradient-sync control: DDP or FSDP2.

``ddp``: ``DistributedDataParallel``; every rank holds the whole model. Gradients are
all-reduced only on the last micro-batch of an accumulation window: every earlier
micro-batch runs forward and backward inside ``no_sync()`` (the pattern of nanoGPT's
``require_backward_grad_sync``).

``fsdp``: FSDP2, ``torch.distributed.fsdp.fully_shard``. Parameters, gradients and
optimizer state are sharded over the ranks (``Shard(0)`` DTensors); the sharded
parameters stay float32 (master weights). A ``MixedPrecisionPolicy`` all-gathers each
unit's parameters in the precision's compute dtype for its forward and backward
(``param_dtype``; ``None`` for fp32) and reduce-scatters gradients in float32
(``reduce_dtype``). Sharding units are the transformer blocks (children of any
``nn.ModuleList``) and every other ``nn.Linear`` whose parameters are not shared with
a module outside it (a tied head stays with its embedding in the root), then the root.
Gradient sync for accumulation: ``set_requires_gradient_sync(False)`` on every
micro-batch but the last; FSDP2 then accumulates the unsharded gradients in
``reduce_dtype`` (float32) until the last micro-batch reduce-scatters them. Both
wrappers average gradients over ranks, so the loop's loss normalisation is the same.

References: PyTorch FSDP2 docs (``fully_shard``, ``MixedPrecisionPolicy``,
``FSDPModule.set_requires_gradient_sync``); torchtitan's per-block ``fully_shard``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from trainer.parallel.distributed import DistContext

log = logging.getLogger(__name__)

Parallelism = Literal["ddp", "fsdp"]

#: The dtype FSDP2 all-gathers parameters in, per precision (fp8 layers compute from bf16).
_FSDP_PARAM_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}


def wrap_model(
    model: nn.Module, dist_ctx: DistContext, parallelism: Parallelism = "ddp", precision_name: str = "fp32"
) -> nn.Module:
    """``model`` wrapped for data parallelism when a process group is initialised, else ``model``.

    ``ddp`` returns a DDP wrapper; DDP broadcasts rank 0's parameters and buffers at
    construction. ``fsdp`` shards ``model`` in place (see :func:`shard_model`) and
    returns it; build the optimizer from its parameters *after* this call (they are
    replaced by DTensors).

    Raises:
        ValueError: unknown ``parallelism`` or ``precision_name``.
    """
    if parallelism not in ("ddp", "fsdp"):
        raise ValueError(f"unknown parallelism {parallelism!r}")
    if not dist_ctx.is_distributed:
        return model
    if parallelism == "fsdp":
        return shard_model(model, dist_ctx, precision_name)
    device_ids = [dist_ctx.device.index] if dist_ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def fsdp_mixed_precision(precision_name: str) -> MixedPrecisionPolicy:
    """FSDP2 policy for a precision: compute-dtype parameters for fp16/bf16/fp8 (``None``,
    i.e. float32, for fp32) and float32 gradient reduction.

    Raises:
        ValueError: unknown ``precision_name``.
    """
    if precision_name not in _FSDP_PARAM_DTYPES:
        raise ValueError(f"unknown precision {precision_name!r}")
    return MixedPrecisionPolicy(param_dtype=_FSDP_PARAM_DTYPES[precision_name], reduce_dtype=torch.float32)


def shard_units(model: nn.Module) -> list[str]:
    """Names of the submodules :func:`shard_model` shards on their own, in module order.

    Units: each child of an ``nn.ModuleList`` (a transformer block), and each
    ``nn.Linear`` not inside such a block; a candidate sharing a parameter with a
    module outside it (tied weights) is left to an enclosing unit or the root.
    """
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)

    def self_contained(prefix: str, module: nn.Module) -> bool:
        params = list(module.parameters())
        return bool(params) and all(name.startswith(prefix + ".") for p in params for name in owners[id(p)])

    blocks = {
        f"{name}.{child_name}" if name else child_name
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        for child_name, _ in module.named_children()
    }
    units: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(unit + ".") for unit in units):
            continue
        if (name in blocks or isinstance(module, nn.Linear)) and self_contained(name, module):
            units.append(name)
    return units


def shard_model(model: nn.Module, dist_ctx: DistContext, precision_name: str) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over all ranks of the default process group; return it.

    Every rank first takes rank 0's parameters and buffers (a broadcast, as DDP does),
    so the shards come from one model. Then each unit of :func:`shard_units` and the
    root are ``fully_shard``-ed with :func:`fsdp_mixed_precision`.
    """
    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            dist.broadcast(tensor, src=0)
    mesh = init_device_mesh(dist_ctx.device.type, (dist_ctx.world_size,))
    policy = fsdp_mixed_precision(precision_name)
    units = shard_units(model)
    for name in units:
        fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    log.info(
        "fsdp: %d units + root sharded over %d ranks (param dtype %s, reduce dtype float32): %s",
        len(units),
        dist_ctx.world_size,
        policy.param_dtype or "float32",
        units,
    )
    return model


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or ``model`` itself; FSDP2 shards in place)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
    """Context for one micro-batch's forward and backward.

    DDP: ``no_sync()`` unless ``sync``. FSDP2: ``set_requires_gradient_sync(sync)`` for
    the micro-batch, restored to ``True`` afterwards. Anything else: nothing.
    """
    model = getattr(model, "_orig_mod", model)  # through a torch.compile wrapper
    if isinstance(model, FSDPModule):
        return _fsdp_sync(model, sync)
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


@contextlib.contextmanager
def _fsdp_sync(model: FSDPModule, sync: bool) -> Iterator[None]:
    model.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
