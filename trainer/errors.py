"""Typed trainer failures (docs/architecture.md, "Typed failure reasons").

A :class:`TrainerError` carries one of :data:`REASONS`; ``python -m trainer`` turns it
into ``<run_dir>/error.json`` and exit status 3, and the worker records the reason. A
:class:`DivergenceError` is the kind the divergence guard and the end check raise: the
training loop answers it with the bf16 fallback when the job opts in (:mod:`trainer.run.fallback`).
"""

from __future__ import annotations

from halfcast.contracts.status import FailureReason

#: The typed failure reasons a trainer rank may report (of :class:`halfcast.contracts.status.FailureReason`).
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
        FailureReason.EXPORT_FAILED,
    }
)
#: The reasons of a run that diverged (:mod:`trainer.run.guard`, :mod:`trainer.run.end_check`).
DIVERGENCE_REASONS: frozenset[FailureReason] = frozenset(
    {
        FailureReason.NONFINITE_LOSS,
        FailureReason.LOSS_SCALE_COLLAPSED,
        FailureReason.NONFINITE_GRADIENTS,
        FailureReason.NO_UPDATE_APPLIED,
    }
)


class TrainerError(Exception):
    """A failure with a typed ``reason`` (one of :data:`REASONS`) and a human ``message``.

    Every raise site names its reason as a :class:`~halfcast.contracts.status.FailureReason` member
    (``tests/contracts/test_contracts_status.py`` refuses a string). Raises ``ValueError``
    when constructed with a reason a trainer may not report, so none reaches the worker.
    """

    def __init__(self, reason: FailureReason, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown trainer failure reason {reason!r}")
        super().__init__(f"{reason}: {message}")
        self.reason: FailureReason = FailureReason(reason)
        self.message = message


class DivergenceError(TrainerError):
    """The run diverged: non-finite losses, skipped steps, or no update applied (one of :data:`DIVERGENCE_REASONS`).

    Raises ``ValueError`` when constructed with another reason.
    """

    def __init__(self, reason: FailureReason, message: str) -> None:
        if reason not in DIVERGENCE_REASONS:
            raise ValueError(f"{reason!r} is not a divergence reason")
        super().__init__(reason, message)
