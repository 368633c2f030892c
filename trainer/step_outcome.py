"""What one precision step did: device tensors for the step log, or a host reading for tests and tools."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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


@dataclass(frozen=True)
class StepOutcome:
    """What happened at one optimizer step, as 0-d tensors on the device (nothing is read on the host).

    Attributes:
        overflow: float32, 1.0 if non-finite gradients were found on some rank and the
            update was skipped, else 0.0 (``bool(outcome.overflow)`` reads it).
        applied: bool, true if the optimizer applied the update: ``not overflow``, and false
            for a window without loss-bearing elements (see
            :meth:`trainer.precision.PrecisionPolicy.step`).
        overflow_kind: float32, 0 clean, 1 only infinities, 2 a NaN was present
            (max over ranks; the divergence guard tells NaN from overflow with it).
        loss_scale: float32, the scale used for this step's backward passes (1.0 without scaling).
        grad_norm: float32, global L2 norm of the unscaled gradients before clipping;
            non-finite on an overflow step.
        skipped_steps: float64 (an exact count), skipped steps so far, this one included.
        underflow_fraction: float32, fraction of gradient values zero or subnormal in
            fp16 before unscaling (:mod:`trainer.underflow`); NaN on steps not sampled.
        rank_kinds: float32 ``[world size]``, per rank the worst kind (0, 1 inf, 2 NaN)
            its gradients held (:mod:`trainer.overflow`).
        param_kinds: float32 ``[P]``, per trainable parameter (model order) the worst
            kind over ranks (:mod:`trainer.forensics`); empty without forensics.
    """

    overflow: Tensor
    applied: Tensor
    overflow_kind: Tensor
    loss_scale: Tensor
    grad_norm: Tensor
    skipped_steps: Tensor
    underflow_fraction: Tensor
    rank_kinds: Tensor
    param_kinds: Tensor

    def to_host(self) -> HostStepOutcome:
        """Read every field with one batched copy (a host synchronisation)."""
        flag, kind, scale, norm, skipped = (
            torch.stack([self.overflow, self.overflow_kind, self.loss_scale, self.grad_norm, self.skipped_steps])
            .to(torch.float64)
            .tolist()
        )
        overflow = flag > 0.0
        return HostStepOutcome(
            applied=not overflow,
            overflow=overflow,
            nan=kind >= 2.0,
            loss_scale=scale,
            grad_norm=None if overflow else norm,
            skipped_steps=int(skipped),
        )
