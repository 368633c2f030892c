"""The state machine of one job attempt: claim, prepare, launch, supervise, finish.

::

    queued ──claim + lease──> starting ──first record──> running ──exit 0 + "end"──> succeeded
                                  │                         │ ──"end" with no update applied──> failed (no_update_applied)
                                  │                         │ ──error.json / known cause──> failed (its reason)
                                  │                         │ ──other exit─────────────> failed (rank_failed)
                                  │                         │ ──past max_runtime_s─────> failed (deadline_exceeded)
                                  └──── cancelling ─────────┴──stop the run───────────> cancelled
                  worker shutting down: stop the run ──> queued again (worker_shutdown, not counted)
                  lease lost (recovered elsewhere): stop the run, write nothing

Every claimed attempt ends in a terminal status or hands the job back: the
supervision runs under ``try``/``finally``, and anything unexpected stops the run
and fails the job with reason ``worker_error``. A message whose claim fails
(redelivered, duplicate, or the job was cancelled while queued) is logged and
dropped. The loop renews the attempt's lease (:mod:`worker.lifecycle.lease`); every write is
fenced by attempt and owner (:mod:`worker.store`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError

from halfcast.contracts.records import EndRecord
from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason, JobStatus
from halfcast.core.settings import Settings
from worker.launch.oomwatch import oom_kill_count
from worker.launch.process_tree import RunProcess, build_command, build_environment, start_run
from worker.lifecycle.checkpoints import CheckpointUnavailable, resolve_resume, retry_checkpoint
from worker.lifecycle.deadline import Deadline
from worker.lifecycle.finished_attempt import finished_attempt
from worker.lifecycle.lease import Lease
from worker.lifecycle.outcomes import Outcome, ended_outcome, exit_outcome
from worker.lifecycle.reasons import RETRY_POLICY
from worker.lifecycle.recovery import Enqueue, Recovery
from worker.lifecycle.registered_inputs import RefError, resolve_inputs
from worker.records.ingest import end_info, ingest, parse_lines
from worker.records.pacing import JobRowPacing, Plan
from worker.records.tail import RecordTail, step_records_up_to
from worker.store import Claim, JobStore, Progress
from worker.warm.pool import WarmPool

__all__ = ["Attempt", "Outcome", "RunnerContext", "run_job"]

log = logging.getLogger(__name__)

#: Longest failure message stored.
MAX_MESSAGE_CHARS = 16_000
#: Seconds between retries of a write that must not be lost (last records, outcome) while the database is down.
DB_RETRY_S = 1.0

T = TypeVar("T")

CommandBuilder = Callable[[JobSpec, Path, Path], list[str]]


def _nothing() -> object:
    return None


@dataclass
class RunnerContext:
    """What the runner needs from its worker: settings, database, identity, shutdown flag, broker.

    ``enqueue`` sends a job id to the workers (for a retry; without it nothing is
    retried); ``on_claimed`` is called right after a successful claim (the task
    acknowledges its message there); ``gpus`` are the host GPU indices the task
    allocated for the attempt (empty for a CPU job) and ``gpu_lock_fds`` the locked
    descriptors of their lock files, which the run inherits (:mod:`worker.resources.gpu_locks`).
    """

    settings: Settings
    store: JobStore
    worker_id: str
    build_command: CommandBuilder = build_command
    shutdown: threading.Event = field(default_factory=threading.Event)
    enqueue: Enqueue | None = None
    on_claimed: Callable[[], object] = _nothing
    gpus: tuple[int, ...] = ()
    gpu_lock_fds: tuple[int, ...] = ()
    #: The worker's warm standby (:mod:`worker.warm`); ``None``: every run starts cold.
    warm: WarmPool | None = None


def run_job(job_id: str, context: RunnerContext) -> Outcome | None:
    """Run one attempt of ``job_id``; ``None`` when the job could not be claimed (dropped)."""
    claim = context.store.claim(
        job_id, context.worker_id, context.settings.runs_dir, context.settings.lease_ttl_s, gpus=context.gpus
    )
    if claim is None:
        log.info("job %s is not queued (redelivered, duplicate or cancelled): message dropped", job_id)
        return None
    log.info("job %s: attempt %d claimed by %s in %s", job_id, claim.attempt, context.worker_id, claim.run_dir)
    try:
        context.on_claimed()
    except Exception:
        log.exception("job %s: could not acknowledge its message after the claim", job_id)
    return Attempt(claim, context).run()


class Attempt:
    """One claimed attempt of a job, from its run directory to its terminal status."""

    def __init__(self, claim: Claim, context: RunnerContext) -> None:
        self.claim = claim
        self.context = context
        self.store = context.store
        self.fence = claim.fence
        self.run_dir = claim.run_dir
        self.rundir = RunDir(claim.run_dir)
        self.lease = Lease(context.store, claim.fence, context.settings.lease_ttl_s)
        self.deadline = Deadline.for_spec(claim.spec, claim.runtime_used_s)
        self.tail = RecordTail(self.rundir.records)
        self.process: RunProcess | None = None
        self.oom_kills_at_launch: int | None = None
        self.running = False
        #: The counts of the run's ``end`` record, once read.
        self.end: EndRecord | None = None
        self.max_steps: int | None = None  # the spec's, once validated
        #: Records read from ``records.jsonl`` but not stored yet (the database was unreachable).
        self.pending: list[dict[str, object]] = []  # JSON objects of record lines, parsed when stored
        self.pacing = JobRowPacing(context.settings.worker_progress_interval_s)
        self.database_error: str | None = None

    def run(self) -> Outcome:
        """Run the attempt to its end and record the outcome.

        Never leaves the job non-terminal while it owns it: any exception becomes
        ``worker_error`` (after the run is stopped), and the outcome is written even
        when a ``BaseException`` propagates.
        """
        outcome = Outcome(
            JobStatus.FAILED, FailureReason.WORKER_ERROR, "the worker stopped supervising the job unexpectedly"
        )
        try:
            outcome = self._run()
        except Exception as exc:
            log.exception("job %s: worker error", self.claim.job_id)
            outcome = Outcome(JobStatus.FAILED, FailureReason.WORKER_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            outcome = self._ensure_stopped(outcome)
            self._finish(outcome)
        return outcome

    def _ensure_stopped(self, outcome: Outcome) -> Outcome:
        try:
            self._stop_process()
        except Exception as exc:
            log.exception("job %s: could not stop its run", self.claim.job_id)
            return Outcome(JobStatus.FAILED, FailureReason.WORKER_ERROR, f"the run could not be stopped: {exc}")
        return outcome

    def _run(self) -> Outcome:
        spec = self._prepare()
        if isinstance(spec, Outcome):
            return spec
        if self.store.cancel_requested(self.claim.job_id):
            return Outcome(JobStatus.CANCELLED, None, "cancelled before launch")
        if self.deadline.passed():
            return Outcome(JobStatus.FAILED, FailureReason.DEADLINE_EXCEEDED, self.deadline.message())
        if (finished := self._finished_before()) is not None:
            return finished
        try:
            command = self._command(spec)
        except CheckpointUnavailable as exc:
            return Outcome(JobStatus.FAILED, FailureReason.CHECKPOINT_UNAVAILABLE, str(exc))
        if not self.lease.renew_if_due():
            return self._lost()
        if (held := self._before_launch()) is not None:
            return held
        self.oom_kills_at_launch = oom_kill_count()
        try:
            environment = self._environment(spec)
            self.process = self._start_run(command, environment)
        except OSError as exc:
            return Outcome(JobStatus.FAILED, FailureReason.LAUNCH_FAILED, f"torchrun could not be started: {exc}")
        return self._supervise(self.process)

    def _start_run(self, command: list[str], environment: dict[str, str]) -> RunProcess:
        """Start the run: forked from the worker's warm standby where it can be (:mod:`worker.warm`), else torchrun."""
        launch = start_run if self.context.warm is None else self.context.warm.start_run
        return launch(command, self.run_dir, environment, pass_fds=self.context.gpu_lock_fds)

    def _prepare(self) -> JobSpec | Outcome:
        """Create the run directory and write the re-validated ``spec.json`` (registered inputs filled in)."""
        try:
            spec = JobSpec.model_validate(resolve_inputs(self.store.engine, self.claim.job_id, self.claim.spec))
        except RefError as exc:
            message = f"{exc.message} (deleted since the job was submitted, or not the job owner's to read)"
            return Outcome(JobStatus.FAILED, exc.reason, message)
        except ValidationError as exc:
            return Outcome(
                JobStatus.FAILED, FailureReason.SPEC_INVALID, f"the stored spec does not validate on the worker:\n{exc}"
            )
        self.rundir.logs.mkdir(parents=True, exist_ok=True)
        self.rundir.spec.write_text(spec.model_dump_json(indent=2))
        self.max_steps = spec.max_steps
        return spec

    def _command(self, spec: JobSpec) -> list[str]:
        """The launch command, resuming a retry from the newest checkpoint of the earlier attempts.

        Without one, a ``resume_from`` in the spec is resolved and passed on. Step
        records after the resume point are dropped (the retry writes them again).
        """
        command = self.context.build_command(spec, self.rundir.spec, self.run_dir)
        checkpoint: Path | None = None
        if self.claim.attempt > 1:
            job_dir = self.context.settings.runs_dir / self.claim.job_id
            found = retry_checkpoint(job_dir, self.claim.attempt, spec.max_steps)
            checkpoint, step = found if found is not None else (None, 0)
            log.info(
                "job %s: attempt %d resumes from %s", self.claim.job_id, self.claim.attempt, checkpoint or "the start"
            )
            if checkpoint is not None:
                self._backfill(checkpoint, step)
            if not self.store.rewind(self.fence, step):
                self.lease.mark_lost("the job was taken over before launch")
        if checkpoint is None and spec.resume_from is not None:
            checkpoint = resolve_resume(spec.resume_from, self.context.settings.runs_dir)
        if checkpoint is not None:
            command += ["--resume-from", str(checkpoint)]
        return command

    def _finished_before(self) -> Outcome | None:
        """An earlier attempt's success whose outcome was never recorded, recorded now instead of training again.

        Its step records are backfilled and its ``end`` record's counts kept (:mod:`worker.lifecycle.finished_attempt`).
        """
        if self.claim.attempt <= 1:
            return None
        job_dir = self.context.settings.runs_dir / self.claim.job_id
        done = finished_attempt(job_dir, self.claim.attempt, self.max_steps or 0)
        if done is None:
            return None
        log.warning(
            "job %s: attempt %d had finished every step (final.pt and its end record) but its outcome was never "
            "recorded; attempt %d records it instead of training again",
            self.claim.job_id,
            done.attempt,
            self.claim.attempt,
        )
        self._backfill(done.run.final_checkpoint, done.end.steps)
        self.end = done.end
        message = (
            f"attempt {done.attempt} finished every step; its outcome was recorded by attempt {self.claim.attempt}"
        )
        return Outcome(JobStatus.SUCCEEDED, None, message)

    def _backfill(self, checkpoint: Path, step: int) -> None:
        """Store the earlier attempt's step records up to the checkpoint this attempt resumes from.

        A run that lost its worker can still write its last records and a checkpoint (it
        gets SIGTERM and checkpoints the step in flight) after nobody tails it any more;
        without this, the steps between the last stored record and the checkpoint would
        be missing from the job for good.
        """
        records = step_records_up_to(RunDir(checkpoint.parents[1]).records, step)
        if records and not self.store.record_progress(self.fence, Progress(steps=records)):
            self.lease.mark_lost("the job was taken over before launch")

    def _supervise(self, process: RunProcess) -> Outcome:
        poll_s = self.context.settings.worker_poll_interval_s
        while True:
            self._tolerant(self._ingest, None)
            code = process.poll()
            if code is not None:
                self._drain_last()
                return exit_outcome(code, self.end, self.run_dir, self._oom_killed(), self.max_steps)
            if not self.lease.renew_if_due():
                return self._stop_for(self._lost())
            if (peer := self._peer_outcome()) is not None:
                return self._stop_for(peer)
            if self._tolerant(lambda: self.store.cancel_requested(self.claim.job_id), False):
                return self._stop_for(Outcome(JobStatus.CANCELLED, None, "cancelled by request"))
            if self.context.shutdown.is_set():
                return self._stop_for(
                    Outcome(JobStatus.FAILED, FailureReason.WORKER_SHUTDOWN, "the worker shut down while the job ran")
                )
            if self.deadline.passed():
                return self._stop_for(
                    Outcome(JobStatus.FAILED, FailureReason.DEADLINE_EXCEEDED, self.deadline.message())
                )
            self.context.shutdown.wait(poll_s)

    # Hooks of a multi-node job's node 0 (worker.gang.attempt.Node0Attempt); a one-node attempt has no peers.

    def _before_launch(self) -> Outcome | None:
        """Called once the run is prepared, right before its launch: an outcome ends the attempt there."""
        return None

    def _environment(self, spec: JobSpec) -> dict[str, str]:
        """The run's environment (:func:`worker.launch.process_tree.build_environment`)."""
        return build_environment(spec, self.context.settings, gpus=self.context.gpus)

    def _peer_outcome(self) -> Outcome | None:
        """Called on every poll of the run: an outcome stops the run for it (a peer node failed)."""
        return None

    def _lost(self) -> Outcome:
        return Outcome(JobStatus.FAILED, FailureReason.WORKER_LOST, f"lease lost: {self.lease.lost_reason}")

    def _oom_killed(self) -> bool:
        before, after = self.oom_kills_at_launch, oom_kill_count()
        return before is not None and after is not None and after > before

    def _stop_for(self, outcome: Outcome) -> Outcome:
        """Stop the run for ``outcome``; a run that had already written its ``end`` record ended as that record says.

        The ``end`` record follows the final checkpoint and evaluation, so a cancel, a
        deadline or a worker shutdown that meets a run tearing down after it stops only
        the tear-down: the job did all it was asked, and says so (``succeeded``, or
        ``no_update_applied`` when the record counts no applied update).
        """
        log.info("job %s: stopping run (%s)", self.claim.job_id, outcome.message)
        self._stop_process()
        self._drain_last()
        if self.end is None or self.lease.lost:
            return outcome
        log.info("job %s: the run had finished every step before it was stopped", self.claim.job_id)
        ended = ended_outcome(self.end, self.max_steps)
        if ended.status == JobStatus.SUCCEEDED:
            return Outcome(JobStatus.SUCCEEDED, None, f"finished before it was stopped ({outcome.message})")
        return ended

    def _tolerant(self, action: Callable[[], T], default: T) -> T:
        """``action()``, or ``default`` when the database cannot be reached: the next poll tries again.

        The run goes on meanwhile; the lease (renewed on this worker's clock) bounds
        how long: once it would have expired, the attempt stops its run (self-fencing).
        """
        try:
            result = action()
        except DBAPIError as exc:
            if self.database_error is None:
                log.warning(
                    "job %s: database unreachable; the run goes on while the lease holds: %s", self.claim.job_id, exc
                )
            self.database_error = str(exc)
            return default
        if self.database_error is not None:
            log.info("job %s: database reachable again", self.claim.job_id)
            self.database_error = None
        return result

    def _retrying(self, action: Callable[[], T]) -> T:
        """``action()``, retried every ``DB_RETRY_S`` through database errors while the lease holds.

        Raises the last ``DBAPIError`` once the lease is lost (a reaper may have recovered the job).
        """
        while True:
            try:
                return action()
            except DBAPIError:
                if not self.lease.renew_if_due():
                    raise
                log.warning("job %s: database unreachable; retrying in %.0f s", self.claim.job_id, DB_RETRY_S)
                time.sleep(DB_RETRY_S)

    def _drain_last(self) -> None:
        """Store the run's remaining records, retrying through a database outage while the lease holds."""
        try:
            self._retrying(lambda: self._ingest(last=True))
        except DBAPIError:
            log.warning("job %s: lease lost while its last records could not be stored", self.claim.job_id)

    def _stop_process(self) -> None:
        if (
            self.process is not None
            and self.process.members()
            and not self.process.stop(self.context.settings.cancel_grace_s, tick=self.lease.renew_if_due)
        ):
            raise RuntimeError(f"processes of run {self.process.pid} survived SIGKILL")

    def _ingest(self, *, last: bool = False) -> None:
        """Move new records from ``records.jsonl`` into the database (fenced by the lease).

        The job row's step follows at most every ``HALFCAST_WORKER_PROGRESS_INTERVAL_S``
        (:mod:`worker.records.pacing`); ``last`` (the run is over): at once.
        """
        if self.lease.lost:
            return
        self.pending += self.tail.drain()
        if not self.pending:
            if (plan := self.pacing.pending(now=last)) is not None:
                self._store(plan)
            return
        first = not self.running
        plan = self.pacing.plan(self._progress(self.pending), now=first or last)
        self.running = True
        self._store(plan, start_running=first)
        self.pending = []  # stored (kept on an error above, to be written again: insert-or-ignore)

    def _store(self, plan: Plan, *, start_running: bool = False) -> None:
        if not self.store.record_progress(self.fence, plan.progress, start_running=start_running, job_row=plan.job_row):
            self.lease.mark_lost("a progress write matched no row: the job is no longer this attempt's")
        self.pacing.written(plan)

    def _progress(self, lines: list[dict[str, object]]) -> Progress:
        """The progress of the record lines ``lines`` in file order (:func:`worker.records.ingest.ingest`).

        Keeps their ``end`` record."""
        ingested = ingest(parse_lines(lines))
        self.end = ingested.end if ingested.end is not None else self.end
        return ingested.progress

    def _finish(self, outcome: Outcome) -> None:
        """Record the outcome: a retryable failure goes through the retry policy; nothing if the lease is lost."""
        job_id = self.claim.job_id
        if self.lease.lost:
            log.warning(
                "job %s: attempt %d no longer owns the job; outcome %s not recorded",
                job_id,
                self.claim.attempt,
                outcome.status,
            )
            return
        message = outcome.message[-MAX_MESSAGE_CHARS:] if outcome.message else outcome.message
        try:
            done, what = self._retrying(lambda: self._record(outcome, message))
        except Exception:
            log.exception("job %s: could not record its outcome %s", job_id, outcome.status)
            return
        if done:
            log.info("job %s: %s", job_id, what)
        else:
            log.warning(
                "job %s: no longer owned by attempt %d; outcome %s not recorded", job_id, self.claim.attempt, what
            )

    def _record(self, outcome: Outcome, message: str | None) -> tuple[bool, str]:
        """Write the outcome once (fenced); return whether it was written and what it was."""
        if outcome.status == JobStatus.FAILED and outcome.reason and RETRY_POLICY.get(outcome.reason, False):
            result = Recovery(self.store, self.context.enqueue).release(self.fence, outcome.reason, message or "")
            return result is not None, f"{result} ({outcome.reason})"
        kept = end_info(self.end) if outcome.status == JobStatus.SUCCEEDED and self.end is not None else None
        done = self.store.finish(self.fence, outcome.status, outcome.reason, message, kept)
        return done, outcome.status + (f" ({outcome.reason})" if outcome.reason else "")
