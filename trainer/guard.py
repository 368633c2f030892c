"""Divergence guard: a job that cannot learn fails with a typed reason instead of running on."""

from __future__ import annotations

import math

from trainer.errors import TrainerError


class DivergenceGuard:
    """Counts consecutive skipped steps and consecutive non-finite losses.

    :meth:`update` raises :class:`TrainerError` with reason ``nonfinite_gradients`` when
    ``max_skips`` consecutive steps were skipped (overflow), and ``nonfinite_loss`` when
    ``max_nonfinite_losses`` consecutive window losses were NaN or infinite. A clean
    step (or a finite loss) resets the matching counter.
    """

    def __init__(self, max_skips: int, max_nonfinite_losses: int) -> None:
        self.max_skips = max_skips
        self.max_nonfinite_losses = max_nonfinite_losses
        self.consecutive_skips = 0
        self.consecutive_nonfinite_losses = 0

    def update(self, step: int, overflow: bool, loss: float) -> None:
        """Account for attempted step ``step``; raise once a limit is reached."""
        self.consecutive_skips = self.consecutive_skips + 1 if overflow else 0
        finite = math.isfinite(loss)
        self.consecutive_nonfinite_losses = 0 if finite else self.consecutive_nonfinite_losses + 1
        if self.consecutive_nonfinite_losses >= self.max_nonfinite_losses:
            msg = f"the loss was non-finite for {self.consecutive_nonfinite_losses} consecutive steps (at step {step})"
            raise TrainerError("nonfinite_loss", msg)
        if self.consecutive_skips >= self.max_skips:
            msg = (
                f"gradients were non-finite for {self.consecutive_skips} consecutive steps (at step {step}); "
                "every update was skipped"
            )
            raise TrainerError("nonfinite_gradients", msg)

    def state_dict(self) -> dict[str, int]:
        """The counters, for checkpoints."""
        return {
            "consecutive_skips": self.consecutive_skips,
            "consecutive_nonfinite_losses": self.consecutive_nonfinite_losses,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore counters saved by :meth:`state_dict`."""
        self.consecutive_skips = int(state["consecutive_skips"])
        self.consecutive_nonfinite_losses = int(state["consecutive_nonfinite_losses"])
