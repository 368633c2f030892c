"""Which spec changes a resumed job may make, and where it starts again."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

#: Spec fields that may differ between the checkpointed run and the resumed one; any
#: other difference would change the trajectory, so it is refused.
MAY_CHANGE = frozenset(
    {
        "name",
        "max_steps",
        "checkpoint_interval",
        "eval_interval",
        "log_interval",
        "faults",
        "resume_from",
        "max_consecutive_skips",
        "max_consecutive_nonfinite_losses",
        "max_attempts",
        "max_runtime_s",
        "on_divergence",
    }
)
#: Checkpoint entry of a job that fell back from fp16 to bf16 (:mod:`trainer.run.fallback`).
PRECISION_SWITCH_KEY: Final = "precision_switch"


def check_resumable(payload: Mapping[str, Any], spec: JobSpec, path: Path) -> int:
    """Return the attempted steps the checkpoint ``payload`` had done.

    Raises:
        TrainerError: ``spec_invalid`` if the checkpoint's spec differs from ``spec``
            in a field outside :data:`MAY_CHANGE`, it already reached ``max_steps``, or it
            was written after a switch to bf16 (:data:`PRECISION_SWITCH_KEY`) and ``spec``
            does not allow it (``on_divergence`` is not ``fallback_bf16``): such a
            checkpoint resumes in bf16, never silently.
    """
    saved = JobSpec.model_validate(payload["spec"]).model_dump(mode="json")
    wanted = spec.model_dump(mode="json")
    changed = sorted(k for k in wanted if k not in MAY_CHANGE and saved.get(k) != wanted[k])
    if changed:
        raise TrainerError(FailureReason.SPEC_INVALID, f"cannot resume from {path}: the spec changed {changed}")
    switch = payload.get(PRECISION_SWITCH_KEY)
    if switch is not None and spec.on_divergence != "fallback_bf16":
        msg = (
            f"cannot resume from {path}: the job switched from {switch.get('from')} to {switch.get('to')} "
            f"at step {switch.get('step')}; resume it with on_divergence 'fallback_bf16'"
        )
        raise TrainerError(FailureReason.SPEC_INVALID, msg)
    done = int(payload["step"])
    if done >= spec.max_steps:
        raise TrainerError(
            FailureReason.SPEC_INVALID, f"checkpoint {path} is at step {done}, not before max_steps {spec.max_steps}"
        )
    return done
