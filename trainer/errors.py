"""Typed trainer failures (docs/architecture.md, "Typed failure reasons").

A :class:`TrainerError` carries one of :data:`REASONS`; ``python -m trainer`` turns it
into ``<run_dir>/error.json`` and exit status 3, and the worker records the reason.
"""

from __future__ import annotations

#: The typed failure reasons a trainer rank may report (a subset of the worker's table).
REASONS: frozenset[str] = frozenset(
    {
        "spec_invalid",
        "precision_unsupported",
        "gpu_unavailable",
        "data_unavailable",
        "model_unavailable",
        "launch_failed",
        "nonfinite_loss",
        "loss_scale_collapsed",
        "nonfinite_gradients",
        "no_update_applied",
    }
)


class TrainerError(Exception):
    """A failure with a typed ``reason`` (one of :data:`REASONS`) and a human ``message``.

    Raises ``ValueError`` when constructed with an unknown reason, so a typo cannot
    reach the worker as a reason it does not know.
    """

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown trainer failure reason {reason!r}")
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
