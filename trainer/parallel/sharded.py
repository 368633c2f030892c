"""Gradient helpers for the precision step that work on sharded (FSDP2) and replicated gradients.

Under FSDP2 every gradient is a ``DTensor`` whose local tensor is this rank's shard
(``Shard(0)``); under DDP or a single process they are plain tensors, identical on
every rank after the all-reduce. The precision step needs three things that differ:

* unscale and the non-finite check run on **local shards** (:func:`local_tensors`):
  ``torch._amp_foreach_non_finite_check_and_unscale_`` on plain tensors, writing
  through to the DTensor gradients; the resulting flag is rank-local, so the step
  must max-reduce it across ranks before deciding (it already does);
* the gradient norm is **global** (:func:`global_grad_norm`): the sum of squares of
  the local shards, summed over ranks in one all-reduce, plus that of replicated
  gradients counted once; the same value on every rank, non-finite on every rank if
  any shard is;
* clipping multiplies the local shards by one coefficient (:func:`clip_grads_`).

None of these synchronises the host. For plain (unsharded) gradients the norm is
``torch.nn.utils.get_total_norm``, exactly as before.

Checkpoints of a sharded model need full (unsharded) state dicts, gathered by every
rank together: :func:`gather_state_dicts` and :func:`load_state_dicts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate, Shard

#: Added to the norm before dividing, as ``torch.nn.utils.clip_grads_with_norm_`` does.
CLIP_EPS = 1e-6


def local_tensor(tensor: Tensor) -> Tensor:
    """This rank's part of ``tensor``: the local shard of a DTensor (a view sharing its storage), else ``tensor``."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_tensors(tensors: Iterable[Tensor]) -> list[Tensor]:
    """:func:`local_tensor` of each tensor, in order (inlined: the step calls this for every tensor list)."""
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def is_sharded(tensor: Tensor) -> TypeGuard[DTensor]:
    """True for a DTensor with a ``Shard`` placement (its ranks hold different parts).

    Raises:
        TypeError: a DTensor placement that is neither ``Shard`` nor ``Replicate``
            (a pending ``Partial`` reduction is not a gradient the step can use).
    """
    if not isinstance(tensor, DTensor):
        return False
    for placement in tensor.placements:
        if not isinstance(placement, Shard | Replicate):
            raise TypeError(f"unsupported gradient placement {placement}")
    return any(isinstance(p, Shard) for p in tensor.placements)


def _sharded_group(tensors: Sequence[Tensor]) -> dist.ProcessGroup:
    meshes = {id(t.device_mesh): t.device_mesh for t in tensors if isinstance(t, DTensor)}
    if len(meshes) != 1 or next(iter(meshes.values())).ndim != 1:
        raise ValueError("sharded gradients must share one 1-D device mesh")
    return next(iter(meshes.values())).get_group()


@dataclass(frozen=True)
class GradNorms:
    """Per-tensor and global L2 norms of a list of gradients.

    ``per_tensor``: float32 ``[len(grads)]``, the norm of each gradient's **local**
    part on this rank (its shard under FSDP2), in order; ``total``: float32 0-d, the
    global norm over all ranks (see :func:`global_grad_norm`).
    """

    per_tensor: Tensor
    total: Tensor


def grad_norms(grads: Sequence[Tensor], device: torch.device) -> GradNorms:
    """Per-tensor local norms (one ``_foreach_norm``) and the global norm of ``grads`` on ``device``.

    Sharded DTensors contribute their local shards' squares, summed over the mesh's
    ranks in one ``all_reduce`` (a collective: every rank must call this at the same
    step); replicated and plain gradients contribute once. Non-finite values give a
    non-finite global norm on every rank. Without sharded gradients there is no
    collective and ``total`` equals ``torch.nn.utils.get_total_norm`` (the norm of the
    per-tensor norms). 0 for no gradients.

    Raises:
        ValueError: sharded gradients on different or multi-dimensional meshes.
    """
    if not grads:
        return GradNorms(
            torch.zeros(0, dtype=torch.float32, device=device), torch.zeros((), dtype=torch.float32, device=device)
        )
    local = [t.float() if t.dtype != torch.float32 else t for t in local_tensors(grads)]
    per_tensor = torch.stack(torch._foreach_norm(local, 2.0))  # float32, on the gradients' device
    if per_tensor.device != device:
        per_tensor = per_tensor.to(device)
    sharded = torch.tensor([is_sharded(g) for g in grads], device=device) if any(map(is_sharded, grads)) else None
    if sharded is None:
        return GradNorms(per_tensor, torch.linalg.vector_norm(per_tensor, 2.0))
    group = _sharded_group([g for g in grads if is_sharded(g)])
    squares = per_tensor.double().square()
    sharded_squares = torch.where(sharded, squares, 0.0).sum()
    dist.all_reduce(sharded_squares, op=dist.ReduceOp.SUM, group=group)
    total = (sharded_squares + torch.where(sharded, 0.0, squares).sum()).sqrt().float()
    return GradNorms(per_tensor, total)


def global_grad_norm(grads: Sequence[Tensor], device: torch.device) -> Tensor:
    """Global L2 norm of ``grads`` (DTensor and/or plain) as a 0-d float32 tensor on ``device``.

    ``grad_norms(grads, device).total``; a collective when some gradients are sharded.
    """
    return grad_norms(grads, device).total


def clip_grads_(grads: Sequence[Tensor], max_norm: float, total_norm: Tensor) -> None:
    """Scale ``grads`` (their local shards) in place by ``min(1, max_norm / (total_norm + 1e-6))``.

    ``total_norm`` is the 0-d global norm from :func:`global_grad_norm`; same
    coefficient on every rank, no host sync. A non-finite norm gives a coefficient of
    0 or NaN: call it only on steps that will be applied, or skip them anyway.
    """
    local = local_tensors(grads)
    if not local:
        return
    coefficient = (max_norm / (total_norm.float() + CLIP_EPS)).clamp(max=1.0)
    torch._foreach_mul_(local, coefficient.to(local[0].device))


# ----------------------------------------------------------------------------- checkpoint state


def gather_state_dicts(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:  # open mappings: torch's model and optimizer state_dicts
    """``(model state, optimizer state)`` for a checkpoint.

    FSDP2 (``model`` is an ``FSDPModule``): a **collective**, every rank must call it;
    rank 0 gets full, unsharded CPU tensors (``StateDictOptions(full_state_dict=True,
    cpu_offload=True)``), the other ranks empty dicts. The optimizer state is keyed by
    parameter names (``torch.distributed.checkpoint.state_dict`` format). Otherwise:
    ``model.state_dict()`` and ``optimizer.state_dict()``, no collective.
    """
    if not isinstance(model, FSDPModule):
        return model.state_dict(), optimizer.state_dict()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def gather_model_state(model: nn.Module) -> dict[str, Any]:  # open mapping: a torch state_dict
    """The model part of :func:`gather_state_dicts`: under FSDP2 a collective (full CPU tensors on
    rank 0, an empty dict elsewhere), otherwise ``model.state_dict()``."""
    if not isinstance(model, FSDPModule):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_state_dicts(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: Mapping[str, Any],
    optimizer_state: Mapping[str, Any],
) -> None:
    """Restore what :func:`gather_state_dicts` returned on rank 0, in place.

    FSDP2: a collective; every rank passes the full dicts (each rank read the same
    checkpoint file) and keeps its own shard. Otherwise ``load_state_dict`` of each.
    Raises whatever ``load_state_dict`` raises for mismatching keys or shapes.
    """
    if not isinstance(model, FSDPModule):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(dict(optimizer_state))
        return
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, dict(model_state), options=options)
    set_optimizer_state_dict(model, optimizer, dict(optimizer_state), options=options)
