"""Overflow forensics: which parameters had non-finite gradients, and on which rank.

On every step the precision step already computes each gradient's local L2 norm (one
``_foreach_norm``, reused for the global norm and clipping). A norm is NaN iff the
gradient holds a NaN and infinite iff it holds an infinity (or overflows fp32 when
squared), so the per-parameter *kinds* (0 finite, 1 infinite, 2 NaN) cost one
elementwise pass over ``P`` norms. They travel in the cross-rank flag reduction the
step makes anyway, as one MAX ``all_reduce`` of ``[this rank's kind per rank slot,
kind per parameter]`` (``W + P`` floats instead of one), and into the device step log.
Names are decoded on the host only for the overflow rows of a flush, so a clean step
pays a few microseconds and no synchronisation.

Which rank: under DDP every rank holds the all-reduced gradient, so a non-finite value
from any replica shows on every rank; under FSDP2 (sharded gradients) and for a
rank-local fault only the ranks whose gradients (or shards) held it are named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

#: Parameters named per overflow step record (the count gives the rest).
MAX_NAMED_PARAMETERS = 8
_KIND_NAMES = {1: "inf", 2: "nan"}


@dataclass(frozen=True)
class OverflowVerdict:
    """The agreed overflow evidence of one step, as device tensors (nothing read on the host).

    ``rank_kinds``: float32 ``[W]``, per rank the worst kind its gradients held (0 finite,
    1 infinite, 2 NaN); ``param_kinds``: float32 ``[P]``, per parameter the worst kind over
    ranks (0 for parameters without a gradient).
    """

    rank_kinds: Tensor
    param_kinds: Tensor

    @property
    def kind(self) -> Tensor:
        """0-d float32, the worst kind over all ranks."""
        return self.rank_kinds.max()


def nonfinite_kinds(norms: Tensor) -> Tensor:
    """Per-tensor kind from per-tensor norms: float32 like ``norms``; 2 NaN, 1 infinite, else 0."""
    return torch.where(norms.isnan(), 2.0, norms.isinf().float())


def agree_across_ranks(
    local_kind: Tensor, param_kinds: Tensor, present: Sequence[int] | None, num_params: int
) -> OverflowVerdict:
    """Max-reduce this rank's evidence over the default process group (one ``all_reduce``; none alone).

    Args:
        local_kind: 0-d float32, this rank's worst kind (gradients, plus other overflow sources).
        param_kinds: float32 ``[G]``, kinds of the gradients that exist on this rank.
        present: for each of those ``G`` gradients its index among the ``num_params``
            parameters, or ``None`` when every parameter has a gradient (``G == P``).
        num_params: ``P``, the number of trainable parameters.

    Every rank must call this at the same step (a collective when distributed).
    """
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    device = local_kind.device
    ranks = torch.zeros(world, dtype=torch.float32, device=device)
    ranks[rank] = local_kind
    params = param_kinds if present is None else _scatter(param_kinds, present, num_params)
    evidence = torch.cat([ranks, params.to(device)])
    if distributed:
        dist.all_reduce(evidence, op=dist.ReduceOp.MAX)
    return OverflowVerdict(rank_kinds=evidence[:world], param_kinds=evidence[world:])


def _scatter(kinds: Tensor, present: Sequence[int], size: int) -> Tensor:
    full = torch.zeros(size, dtype=torch.float32, device=kinds.device)
    if present:
        full[torch.tensor(list(present), device=kinds.device)] = kinds
    return full


@dataclass(frozen=True)
class OverflowReport:
    """Host-side description of one overflow step, for its step record.

    ``ranks``: ranks whose gradients held non-finite values; ``parameters``: the first
    :data:`MAX_NAMED_PARAMETERS` as ``{"name": module path, "kind": "inf" | "nan"}`` in
    model order; ``count``: how many parameters were non-finite in all.
    """

    ranks: list[int]
    parameters: list[dict[str, str]]
    count: int


def describe_overflow(names: Sequence[str], rank_kinds: Sequence[float], param_kinds: Sequence[float]) -> OverflowReport:
    """Decode the kinds read back from the step log (``names[i]`` names ``param_kinds[i]``)."""
    flagged = [(name, int(kind)) for name, kind in zip(names, param_kinds, strict=True) if kind > 0]
    return OverflowReport(
        ranks=[rank for rank, kind in enumerate(rank_kinds) if kind > 0],
        parameters=[{"name": name, "kind": _KIND_NAMES[kind]} for name, kind in flagged[:MAX_NAMED_PARAMETERS]],
        count=len(flagged),
    )
