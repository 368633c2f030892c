"""Typed trainer failures (docs/architecture.md, "Typed failure reasons").

A :class:`TrainerError` carries one of :data:`REASONS`; ``python -m trainer`` turns it
into ``<run_dir>/error.json`` and exit status 3, and the worker records the reason.
"""

from __future__ import annotations

from contracts.status import FailureReason

#: The typed failure reasons a trainer rank may report (of :class:`contracts.status.FailureReason`).
REASONS: frozenset[FailureReason] = frozenset(
    {
        FailureReason.SPEC_INVALID,
        FailureReason.PRECISION_UNSUPPORTED,
        FailureReason.GPU_UNAVAILABLE,
        FailureReason.DATA_UNAVAILABLE,
        FailureReason.MODEL_UNAVAILABLE,
        FailureReason.LAUNCH_FAILED,
        FailureReason.NONFINITE_LOSS,
        FailureReason.LOSS_SCALE_COLLAPSED,
        FailureReason.NONFINITE_GRADIENTS,
        FailureReason.NO_UPDATE_APPLIED,
    }
)


class TrainerError(Exception):
    """A failure with a typed ``reason`` (one of :data:`REASONS`) and a human ``message``.

    Raises ``ValueError`` when constructed with an unknown reason, so a typo cannot
    reach the worker as a reason it does not know.
    """

    def __init__(self, reason: FailureReason | str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown trainer failure reason {reason!r}")
        super().__init__(f"{reason}: {message}")
        self.reason = str(reason)
        self.message = message
