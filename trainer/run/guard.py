"""Divergence guard: a job that cannot learn fails with a typed reason instead of running on.

The guard reads the step rows that the loop copies from the device once per logging
interval (:mod:`trainer.run.telemetry`), so it costs the training step nothing; a job
therefore fails at the first flush at or after the step where a limit is reached
(at most ``log_interval - 1`` steps later), and the error names that step. A run too short
to reach a limit is judged after its last step by :mod:`trainer.run.end_check`, from the same
counters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from halfcast.contracts.status import FailureReason
from trainer.errors import DivergenceError
from trainer.run.telemetry import StepRow


class DivergenceGuard:
    """Counts consecutive skipped steps and consecutive non-finite losses over step rows.

    Reasons, for the first row (in step order) at which a limit is reached:

    * ``nonfinite_loss``: ``max_nonfinite_losses`` consecutive window losses were NaN or
      infinite (checked first);
    * ``loss_scale_collapsed``: ``max_skips`` consecutive steps were skipped, the
      scaler is dynamic (``min_scale`` given), the scale used at that step was already
      ``min_scale`` and no step of the run had a NaN gradient: only infinities, which
      no remaining scale can avoid;
    * ``nonfinite_gradients``: ``max_skips`` consecutive steps were skipped otherwise
      (a NaN among them, a static or no scaler, or a scale still above ``min_scale``).

    A clean step (a finite loss) resets the matching counter.

    Args:
        max_skips, max_nonfinite_losses: the limits (>= 1).
        min_scale: the dynamic scaler's lower bound, or ``None`` without a dynamic scaler.
    """

    def __init__(self, max_skips: int, max_nonfinite_losses: int, min_scale: float | None = None) -> None:
        self.max_skips = max_skips
        self.max_nonfinite_losses = max_nonfinite_losses
        self.min_scale = min_scale
        self.consecutive_skips = 0
        self.consecutive_nonfinite_losses = 0
        self.nan_skips_in_run = 0
        self.last_step = 0
        #: The loss scale of the last row seen (``None`` before the first).
        self.last_loss_scale: float | None = None

    @property
    def failing_run_start(self) -> int:
        """First step of the current run of skipped steps or non-finite losses (the earlier of the two).

        After a failure this is where the run that reached the limit began; it is
        ``last_step + 1`` when no run is going on. Counters restored from a checkpoint
        count too, so the start may lie before the resumed step.
        """
        return self.last_step - max(self.consecutive_skips, self.consecutive_nonfinite_losses) + 1

    def observe(self, rows: Iterable[StepRow]) -> None:
        """Account for ``rows`` (in step order); raise :class:`DivergenceError` once a limit is reached."""
        for row in rows:
            self._update(row)

    def _update(self, row: StepRow) -> None:
        self.last_step, self.last_loss_scale = row.step, row.loss_scale
        if row.overflow:
            self.consecutive_skips += 1
            self.nan_skips_in_run += int(row.nan)
        else:
            self.consecutive_skips = 0
            self.nan_skips_in_run = 0
        finite = math.isfinite(row.loss)
        self.consecutive_nonfinite_losses = 0 if finite else self.consecutive_nonfinite_losses + 1
        if self.consecutive_nonfinite_losses >= self.max_nonfinite_losses:
            msg = f"the loss was non-finite for {self.consecutive_nonfinite_losses} consecutive steps (at step {row.step})"
            raise DivergenceError(FailureReason.NONFINITE_LOSS, msg)
        if self.consecutive_skips >= self.max_skips:
            raise self.skip_failure(f"{self.consecutive_skips} consecutive steps (at step {row.step})")

    def skip_failure(self, stretch: str) -> DivergenceError:
        """The failure of the current run of skipped steps, described as ``stretch`` ("N consecutive steps ...").

        ``loss_scale_collapsed`` when the last row's scale was already ``min_scale`` and the
        run held only infinities, else ``nonfinite_gradients``.
        """
        run = f"{stretch}; every update was skipped"
        scale = self.last_loss_scale
        collapsed = (
            self.min_scale is not None and scale is not None and scale <= self.min_scale and self.nan_skips_in_run == 0
        )
        if collapsed:
            msg = (
                f"the loss scale collapsed to min_scale {self.min_scale:g} and gradients still overflowed "
                f"(infinities, no NaN) for {run}"
            )
            return DivergenceError(FailureReason.LOSS_SCALE_COLLAPSED, msg)
        kinds = "NaN" if self.nan_skips_in_run else "infinite"
        return DivergenceError(FailureReason.NONFINITE_GRADIENTS, f"gradients were non-finite ({kinds}) for {run}")

    def state_dict(self) -> dict[str, int]:
        """The counters, for checkpoints."""
        return {
            "consecutive_skips": self.consecutive_skips,
            "consecutive_nonfinite_losses": self.consecutive_nonfinite_losses,
            "nan_skips_in_run": self.nan_skips_in_run,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore counters saved by :meth:`state_dict` (``nan_skips_in_run`` defaults to 0 for older checkpoints)."""
        self.consecutive_skips = int(state["consecutive_skips"])
        self.consecutive_nonfinite_losses = int(state["consecutive_nonfinite_losses"])
        self.nan_skips_in_run = int(state.get("nan_skips_in_run", 0))
