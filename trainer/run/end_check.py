"""The end check: a run that attempted every step but learned nothing fails instead of succeeding.

The divergence guard (:mod:`trainer.run.guard`) stops a run once ``max_consecutive_skips``
skipped steps (or ``max_consecutive_nonfinite_losses`` non-finite losses) follow each
other, but a run shorter than those limits never reaches them: a 10-step fp16 job whose
every step overflowed would end ``succeeded`` with its initial weights. After the last
step, once its rows are flushed and before the final evaluation, the final checkpoint and
the ``end`` record, the loop calls :func:`check_updates_applied` with host-side counts it
already has (the guard's counters and the cumulative skipped-step count of the last row),
so the check costs the training step nothing. It fails the run with:

* ``no_update_applied`` when no step of the job applied an update: ``max_steps`` minus the
  skipped steps is 0, counted over the job's whole trajectory (the skipped-step counter is
  restored on a resume and kept across a precision switch);
* the guard's own reason (``nonfinite_loss``, then ``loss_scale_collapsed`` or
  ``nonfinite_gradients``) when the run *ended* inside a stretch of non-finite losses or of
  skipped steps at least :func:`final_stretch_limit` long: the guard's limit scaled down to
  the run, a tenth of ``max_steps`` but never under :data:`MIN_FINAL_STRETCH`, so a healthy
  fp16 run whose last one or two steps overflowed (the dynamic scaler skips a step after
  each growth, ``hysteresis`` steps at most) still succeeds.

Every rank holds the same counters, so every rank fails alike; the failure is a divergence
like the guard's, so ``on_divergence: "fallback_bf16"`` answers it (:mod:`trainer.run.fallback`).
"""

from __future__ import annotations

from halfcast.contracts.status import FailureReason
from trainer.errors import DivergenceError
from trainer.run.guard import DivergenceGuard

#: A final stretch shorter than this never fails a run (unless the guard's own limit is lower).
MIN_FINAL_STRETCH = 3
#: The final-stretch limit is ``max_steps`` divided by this, rounded up (a tenth of the run).
FINAL_STRETCH_DIVISOR = 10


def final_stretch_limit(limit: int, max_steps: int) -> int:
    """The shortest final stretch that fails a run of ``max_steps``: ``min(limit, max(3, ceil(max_steps / 10)))``.

    ``limit`` is the guard's (``max_consecutive_skips`` or ``max_consecutive_nonfinite_losses``);
    a long run's limit is the guard's, which the guard enforces itself.
    """
    return min(limit, max(MIN_FINAL_STRETCH, -(-max_steps // FINAL_STRETCH_DIVISOR)))


def check_updates_applied(guard: DivergenceGuard, max_steps: int, skipped_steps: int, empty_windows: int = 0) -> None:
    """Raise :class:`DivergenceError` if the run that ended at ``max_steps`` learned nothing (see the module docstring).

    ``guard``: the run's guard, after the last flush; ``skipped_steps``: the job's cumulative
    skipped steps at ``max_steps``; ``empty_windows``: its windows without a loss-bearing element
    (no update either).
    """
    applied = max_steps - skipped_steps - empty_windows
    if applied <= 0:
        if empty_windows:
            what = f"of {max_steps} attempted steps {skipped_steps} were skipped (non-finite gradients) and "
            what += f"{empty_windows} held no supervised token"
        else:
            what = f"all {max_steps} attempted steps were skipped (non-finite gradients)"
        msg = f"no update was applied: {what}, so the model is still its initialisation"
        raise DivergenceError(FailureReason.NO_UPDATE_APPLIED, msg)
    losses, loss_limit = guard.consecutive_nonfinite_losses, final_stretch_limit(guard.max_nonfinite_losses, max_steps)
    if losses >= loss_limit:
        raise DivergenceError(
            FailureReason.NONFINITE_LOSS, f"the loss was non-finite for {_final_stretch(losses, max_steps, loss_limit)}"
        )
    skips, skip_limit = guard.consecutive_skips, final_stretch_limit(guard.max_skips, max_steps)
    if skips >= skip_limit:
        raise guard.skip_failure(_final_stretch(skips, max_steps, skip_limit, f", after {applied} applied updates"))


def _final_stretch(length: int, max_steps: int, limit: int, after: str = "") -> str:
    """``the last N of M steps (why that fails)``, for the failure message."""
    return (
        f"the last {length} of {max_steps} steps (the run ended inside the stretch{after}; "
        f"{limit} in a row fail a {max_steps}-step run)"
    )
