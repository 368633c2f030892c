"""What one precision step did: device tensors for the step log, or a host reading for tests and tools."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from trainer.numerics.overflow import kinds_from_flag, nonfinite_kinds


@dataclass(frozen=True)
class HostStepOutcome:
    """A :class:`StepOutcome` read on the host (for tests and tools).

    ``grad_norm`` is ``None`` when the step was skipped; ``nan`` is true when some
    rank's gradients held a NaN (not only infinities).
    """

    applied: bool
    overflow: bool
    nan: bool
    loss_scale: float
    grad_norm: float | None
    skipped_steps: int


class StepOutcome(NamedTuple):
    """What happened at one optimizer step, as 0-d tensors on the device (nothing is read on the host).

    A named tuple (built once per step, cheaper than a frozen dataclass). The step makes only
    what the step log needs; the kinds (0 finite, 1 only infinities, 2 a NaN) are told from
    them by the host (:mod:`trainer.run.telemetry`), or on the device by the properties below,
    which tests and tools read.

    Attributes:
        overflow: float32, 1.0 if non-finite gradients were found on some rank (or an
            overflow source fired) and the update was skipped, else 0.0.
        applied: bool, true if the optimizer applied the update: ``not overflow``, and false
            for a window without loss-bearing elements (see
            :meth:`trainer.numerics.precision.PrecisionPolicy.step`).
        loss_scale: float32, the scale used for this step's backward passes (1.0 without scaling).
        grad_norm: float32, global L2 norm of the unscaled gradients before clipping;
            non-finite on an overflow step of the gradients: NaN when some gradient held a NaN
            on some rank, infinite when only infinities (or squares past float32).
        skipped_steps: float64 (an exact count), skipped steps so far, this one included.
        underflow_fraction: float32, fraction of gradient values zero or subnormal in
            fp16 before unscaling (:mod:`trainer.numerics.underflow`); NaN on steps not sampled.
        agreed_rank_kinds: float32 ``[world size]``, per rank the worst kind its gradients held,
            from the cross-rank agreement (:mod:`trainer.numerics.overflow`); ``None`` for one process,
            whose one kind is the step's.
        param_evidence: float32 ``[P]``, per trainable parameter (model order, :mod:`trainer.numerics.forensics`):
            the worst kind over ranks from the agreement, or, for one process, the gradient's
            norm, whose NaN or infinity is its kind (no device op to turn it into one); empty
            without forensics.
    """

    overflow: Tensor
    applied: Tensor
    loss_scale: Tensor
    grad_norm: Tensor
    skipped_steps: Tensor
    underflow_fraction: Tensor
    agreed_rank_kinds: Tensor | None
    param_evidence: Tensor

    @property
    def overflow_kind(self) -> Tensor:
        """0-d float32 on the device: 0 clean, 1 only infinities (or an overflow source), 2 a NaN (device ops)."""
        return kinds_from_flag(self.overflow, self.grad_norm)

    @property
    def rank_kinds(self) -> Tensor:
        """float32 ``[world size]``: each rank's worst kind (one process: the step's kind)."""
        return self.overflow_kind.reshape(1) if self.agreed_rank_kinds is None else self.agreed_rank_kinds

    @property
    def param_kinds(self) -> Tensor:
        """float32 ``[P]``: each parameter's worst kind over ranks (empty without forensics)."""
        return nonfinite_kinds(self.param_evidence) if self.agreed_rank_kinds is None else self.param_evidence

    def to_host(self) -> HostStepOutcome:
        """Read every field with one batched copy (a host synchronisation)."""
        flag, scale, norm, skipped, applied = (
            torch.stack([self.overflow, self.loss_scale, self.grad_norm, self.skipped_steps, self.applied.double()])
            .to(torch.float64)  # promoted to float64
            .tolist()
        )
        overflow = flag > 0.0
        return HostStepOutcome(
            applied=applied > 0.0,  # false on an overflow and on a window without data
            overflow=overflow,
            nan=overflow and math.isnan(norm),
            loss_scale=scale,
            grad_norm=None if overflow else norm,
            skipped_steps=int(skipped),
        )
