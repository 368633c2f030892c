"""Overflow forensics: which parameters had non-finite gradients, and on which rank.

:class:`OverflowForensics` is a step observer (:mod:`trainer.numerics.observers`). On every step
the precision step already computes each gradient's local L2 norm (one ``_foreach_norm``,
reused for the global norm and clipping), and from it each gradient's kind (0 finite, 1
infinite, 2 NaN; :func:`trainer.numerics.overflow.nonfinite_kinds`). The observer lays those kinds
out by parameter (``P`` floats, 0 for a parameter without a gradient) and they ride in the
cross-rank reduction the step makes anyway (:func:`trainer.numerics.overflow.agree_across_ranks`:
``W + P`` floats instead of ``W``), then into the device step log. One process makes no
kinds on the device: the norms themselves are laid out and logged, and the host tells
their kinds when it reads the rows (:mod:`trainer.run.telemetry`). Names are decoded on
the host only for the overflow rows of a flush (:func:`describe_overflow`), so a clean step
pays a few microseconds and no synchronisation.

Which rank: under DDP every rank holds the all-reduced gradient, so a non-finite value
from any replica shows on every rank; under FSDP2 (sharded gradients) and for a
rank-local fault only the ranks whose gradients (or shards) held it are named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.numerics.observers import Gradients

#: Parameters named per overflow step record (the count gives the rest).
MAX_NAMED_PARAMETERS = 8
_KIND_NAMES = {1: "inf", 2: "nan"}


class OverflowForensics:
    """Step observer: the kind of every trainable parameter's gradient, agreed over the ranks.

    The laid-out values come back as the step outcome's ``param_evidence`` (float32 ``[P]``, model
    order): the worst kind over ranks, or one process's gradient norms; its ``param_kinds`` reads
    kinds from either. The per-rank kinds are the agreement's own.
    """

    def evidence(self, values: Tensor, grads: Gradients) -> Tensor:
        """float32 ``[P]``: ``values`` (kinds or norms) at their parameters' positions, 0 (finite) where a
        parameter has no gradient."""
        if grads.present is None:
            return values
        full = torch.zeros(grads.count, dtype=torch.float32, device=values.device)
        if grads.present:
            full[torch.tensor(grads.present, device=values.device)] = values
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


def describe_overflow(
    names: Sequence[str], rank_kinds: Sequence[float], param_kinds: Sequence[float]
) -> OverflowReport:
    """Decode the kinds read back from the step log (``names[i]`` names ``param_kinds[i]``)."""
    flagged = [(name, int(kind)) for name, kind in zip(names, param_kinds, strict=True) if kind > 0]
    return OverflowReport(
        ranks=[rank for rank, kind in enumerate(rank_kinds) if kind > 0],
        parameters=[{"name": name, "kind": _KIND_NAMES[kind]} for name, kind in flagged[:MAX_NAMED_PARAMETERS]],
        count=len(flagged),
    )
