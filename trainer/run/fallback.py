"""``on_divergence: "fallback_bf16"``: an fp16 job whose divergence guard trips goes on in bf16 once.

When the guard (:mod:`trainer.run.guard`), or the end check after the last step
(:mod:`trainer.run.end_check`: no update applied, or a final stretch of skipped steps), raises
a :class:`trainer.errors.DivergenceError` in an fp16 job that opted in, the loop catches it
and asks :meth:`PrecisionFallback.fall_back` where to start again instead of failing:

1. the **healthy checkpoint** is the newest checkpoint written at a step *before* the
   failing run began (the earlier start of the current run of skipped steps and of
   non-finite losses, :attr:`DivergenceGuard.failing_run_start`): this run's
   ``checkpoints/step-<N>.pt`` (``N`` a multiple of ``checkpoint_interval`` after the
   step it started from) or the checkpoint it resumed from; with none, step 0 (the
   freshly initialised model of the same seed);
2. a ``precision_switch`` record names the step where the guard tripped, ``from``
   ``fp16``, ``to`` ``bf16``, the guard's typed reason and message and
   ``rewound_to_step``; later step records carry ``"precision": "bf16"``;
3. rank 0 deletes this run's checkpoints after ``rewound_to_step`` (they hold the
   abandoned fp16 trajectory, and a retry must never resume from them);
4. the loop rebuilds its components from a bf16 copy of the spec (no loss scaler) and
   restores the checkpoint's model, optimizer, LR schedule, guard counters, RNG and
   data position (the stream starts at the checkpoint's offset; the skipped-step and
   empty-window counters carry over; the fp16 scaler state is dropped), then trains on to
   ``max_steps``.

Every rank sees the same step rows, so every rank trips at the same flush and takes the
same decision from the same numbers (no collective is needed to agree); the rebuild's
collectives (DDP's broadcast, FSDP2's state-dict loads) then run on all ranks alike.
A job switches at most once: a guard failure in bf16 fails the job as usual.

Checkpoints written after the switch keep the user's spec and add
``precision_switch``; resuming from one (a retry or ``resume_from``) runs in bf16
again and repeats the switch in the ``start`` record (:meth:`PrecisionFallback.begin`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from halfcast.contracts.records import PrecisionSwitch
from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from trainer.errors import DivergenceError
from trainer.inputs import INPUTS_KEY, check_inputs_unchanged
from trainer.numerics.loss_scale import NoOpLossScaler
from trainer.numerics.precision import PrecisionState
from trainer.records import RecordSink
from trainer.run.checkpoint import CheckpointPayload, load_checkpoint, step_path
from trainer.run.guard import DivergenceGuard
from trainer.run.resume import PRECISION_SWITCH_KEY, check_resumable

log = logging.getLogger(__name__)

FALLBACK_PRECISION = "bf16"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read from ``path`` (``payload``: what :func:`trainer.run.checkpoint.load_checkpoint` returns)."""

    path: Path
    payload: CheckpointPayload

    @property
    def step(self) -> int:
        """Attempted steps done when it was written."""
        return int(self.payload["step"])


@dataclass(frozen=True)
class RunStart:
    """Where a run (or its continuation after a switch) starts.

    ``effective_spec``: the spec to build the components from and compute with (the job's,
    or its bf16 copy after a switch); ``checkpoint``: what to restore (``None``: step 0);
    ``precision_switch``: the switch once the job has switched (checkpoints and the ``start``
    record repeat it).
    """

    effective_spec: JobSpec
    checkpoint: Checkpoint | None = None
    precision_switch: PrecisionSwitch | None = None


def bf16_spec(spec: JobSpec) -> JobSpec:
    """``spec`` computing in bf16 without loss scaling (a copy; not re-validated, never stored)."""
    return spec.model_copy(update={"precision": FALLBACK_PRECISION, "loss_scale": None})


class PrecisionFallback:
    """Decides and records the one switch from fp16 to bf16 of a job (see the module docstring).

    Args:
        job_spec: the job's spec, as the user gave it.
        run_dir: this run's directory (its ``checkpoints/``).
        main: this is rank 0 (deletes stale checkpoints).
    """

    def __init__(self, job_spec: JobSpec, run_dir: Path, main: bool) -> None:
        self.job_spec = job_spec
        self.run_dir = run_dir
        self.main = main
        self.resumed: Checkpoint | None = None
        self.switched = False

    def begin(self, resume_from: Path | None) -> RunStart:
        """Where training starts: scratch, or ``resume_from`` (checked), in bf16 if it was written after a switch.

        Raises:
            TrainerError: ``spec_invalid`` from :func:`trainer.run.resume.check_resumable`; ``model_unavailable``
                or ``data_unavailable`` when an input file changed (:mod:`trainer.inputs`).
            FileNotFoundError: no file at ``resume_from``.
        """
        if resume_from is None:
            return RunStart(self.job_spec)
        self.resumed = Checkpoint(resume_from, load_checkpoint(resume_from))
        check_resumable(self.resumed.payload, self.job_spec, resume_from)
        check_inputs_unchanged(self.resumed.payload.get(INPUTS_KEY), self.job_spec, resume_from)
        record = self.resumed.payload.get(PRECISION_SWITCH_KEY)
        if record is None:
            return RunStart(self.job_spec, self.resumed)
        self.switched = True
        switch = PrecisionSwitch.model_validate(record)
        log.info("resuming in %s: the job switched precision at step %s", switch.to, switch.step)
        return RunStart(bf16_spec(self.job_spec), self.resumed, switch)

    def fall_back(self, divergence: DivergenceError, guard: DivergenceGuard, records: RecordSink) -> RunStart | None:
        """The bf16 restart after ``divergence``, or ``None`` when the job must fail with it.

        Falls back only for an fp16 job with ``on_divergence: "fallback_bf16"`` that has
        not switched yet. Writes the ``precision_switch`` record, marks later step lines
        ``precision: bf16`` and (rank 0) deletes the checkpoints of the abandoned trajectory.
        """
        if not self._may_fall_back():
            return None
        checkpoint = self._healthy_checkpoint(guard.failing_run_start)
        switch = PrecisionSwitch(
            step=guard.last_step,
            from_=self.job_spec.precision,
            to=FALLBACK_PRECISION,
            reason=divergence.reason.value,  # a plain string: checkpoints are loaded with weights_only
            message=divergence.message,
            rewound_to_step=0 if checkpoint is None else checkpoint.step,
            time=time.time(),
        )
        log.warning(
            "divergence at step %d (%s); rewinding to step %d and continuing in %s",
            switch.step,
            switch.reason,
            switch.rewound_to_step,
            FALLBACK_PRECISION,
        )
        records.precision_switch(switch.body())
        if self.main:
            self._delete_checkpoints_after(switch.rewound_to_step)
        self.switched = True
        restored = None if checkpoint is None else Checkpoint(checkpoint.path, _as_bf16(checkpoint.payload))
        return RunStart(bf16_spec(self.job_spec), restored, switch)

    def _may_fall_back(self) -> bool:
        return (
            self.job_spec.on_divergence == "fallback_bf16" and self.job_spec.precision == "fp16" and not self.switched
        )

    def _healthy_checkpoint(self, failing_run_start: int) -> Checkpoint | None:
        """The newest checkpoint written before step ``failing_run_start``, or ``None``.

        Computed from the spec, not by listing files, so every rank picks the same one.
        """
        resumed_step = self.resumed.step if self.resumed is not None else 0
        interval = self.job_spec.checkpoint_interval
        if interval is not None:
            newest = (failing_run_start - 1) // interval * interval
            if newest > resumed_step:
                path = step_path(self.run_dir, newest)
                return Checkpoint(path, load_checkpoint(path))
        if self.resumed is not None and resumed_step < failing_run_start:
            return self.resumed
        return None

    def _delete_checkpoints_after(self, step: int) -> None:
        for number, path in RunDir(self.run_dir).step_checkpoints():
            if number > step:
                path.unlink(missing_ok=True)
                log.info("deleted %s (abandoned fp16 trajectory)", path)


def _as_bf16(payload: CheckpointPayload) -> CheckpointPayload:
    """``payload`` with its precision state replaced by bf16's: no scaler, the skipped-step and empty-window
    counts kept (both count the job's trajectory up to the checkpoint, whatever precision computed it)."""
    state = payload["precision"]
    precision: PrecisionState = {
        "precision": FALLBACK_PRECISION,
        "scaler": NoOpLossScaler().state_dict(),
        "skipped_steps": int(state["skipped_steps"]),
        "empty_windows": int(state["empty_windows"]),
    }
    return {**payload, "precision": precision}
