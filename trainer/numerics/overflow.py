"""Non-finite gradients: their kinds, and the one cross-rank agreement of a precision step.

A gradient's L2 norm is NaN iff the gradient holds a NaN, and infinite iff it holds an
infinity (or overflows fp32 when squared), so the per-tensor norms the step takes anyway
tell each gradient's *kind* (0 finite, 1 infinite, 2 NaN) in one elementwise pass.

Every rank writes its worst kind into its own slot of a ``[W]`` vector and the ranks
max-reduce it in one ``all_reduce``: every rank then holds every rank's kind, and makes
the same step-or-skip decision. Evidence from the step's observers (the per-parameter
kinds of :mod:`trainer.numerics.forensics`) rides in the same reduction, appended to the slots, so
watching costs no second collective.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor


def nonfinite_kinds(norms: Tensor) -> Tensor:
    """Per-tensor kind from per-tensor norms (never negative): the dtype and shape of ``norms``; 2 NaN,
    1 infinite, else 0.

    Three elementwise ops: NaN becomes -2 and an infinity -1, ``min(·, 0)`` turns every finite norm into
    +0 (``norms`` holds no negative value), and the absolute value gives 0, 1 or 2 (+0.0, never -0.0).
    """
    return torch.nan_to_num(norms, nan=-2.0, posinf=-1.0, neginf=-1.0).clamp_(max=0.0).abs_()


def nonfinite_flag(norm: Tensor) -> Tensor:
    """1.0 where ``norm`` (never negative) is NaN or infinite, else 0.0: the dtype and shape of ``norm``.

    Two elementwise ops: ``norm * 0`` is 0 for a finite norm and NaN for a non-finite one, and
    ``nan_to_num`` turns that NaN into 1. (:func:`nonfinite_kinds` then ``min(·, 1)`` takes four.)
    """
    return torch.nan_to_num(norm * 0.0, nan=1.0)


def kinds_from_flag(flag: Tensor, grad_norm: Tensor) -> Tensor:
    """The step's kind from its overflow flag and its global gradient norm: 0 clean, 2 when the norm is NaN
    (some gradient held a NaN), else 1 (infinities, or an overflow source). Device ops; the step itself
    never needs them (the host tells the kind the same way, :func:`kind_of_step`)."""
    return torch.where(flag > 0, torch.where(torch.isnan(grad_norm), 2.0, 1.0), 0.0).to(torch.float32)


def kind_of_step(flag: float, grad_norm: float) -> float:
    """:func:`kinds_from_flag` on host values."""
    if flag <= 0.0:
        return 0.0
    return 2.0 if math.isnan(grad_norm) else 1.0


def kind_of_norm(norm: float) -> float:
    """:func:`nonfinite_kinds` on a host value: 2 NaN, 1 infinite, else 0."""
    if math.isnan(norm):
        return 2.0
    return 1.0 if math.isinf(norm) else 0.0


class OverflowVerdict(NamedTuple):
    """The agreed result of one step's cross-rank reduction, as device tensors (nothing read on the host).

    ``rank_kinds``: float32 ``[W]``, per rank the worst kind it reported (0 finite, 1
    infinite, 2 NaN); ``evidence``: the riders' part, max-reduced over the ranks
    (``None`` when nothing rode along).
    """

    rank_kinds: Tensor
    evidence: Tensor | None

    @property
    def kind(self) -> Tensor:
        """0-d float32, the worst kind over all ranks."""
        return self.rank_kinds.max()


def is_distributed() -> bool:
    """Whether the default process group spans more than one rank (else a step agrees with itself)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def agree_across_ranks(local_kind: Tensor, evidence: Tensor | None = None) -> OverflowVerdict:
    """Max-reduce this rank's kind (and ``evidence``) over the default process group: one ``all_reduce``, none alone.

    Args:
        local_kind: 0-d float32, this rank's worst kind (its gradients, plus other overflow sources).
        evidence: float32 ``[E]`` to max-reduce in the same collective (the same ``E`` on every rank), or ``None``.

    Every rank must call this at the same step (a collective when distributed).
    """
    distributed = is_distributed()
    world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    device = local_kind.device
    ranks = torch.zeros(world, dtype=torch.float32, device=device)
    ranks[rank] = local_kind
    payload = ranks if evidence is None else torch.cat([ranks, evidence.to(device)])
    if distributed:
        dist.all_reduce(payload, op=dist.ReduceOp.MAX)
    if evidence is None:
        return OverflowVerdict(rank_kinds=payload, evidence=None)
    return OverflowVerdict(rank_kinds=payload[:world], evidence=payload[world:])
