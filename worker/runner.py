"""The state machine of one job attempt: claim, prepare, launch, supervise, finish.

::

    queued ──claim──> starting ──first record──> running ──exit 0 + "end"──> succeeded
                          │                         │ ──error.json──────────> failed (its reason)
                          │                         │ ──other exit──────────> failed (rank_failed)
                          └──── cancelling ─────────┴──stop the group──────> cancelled

Every claimed attempt ends in a terminal status: the supervision runs under
``try``/``finally``, and anything unexpected kills the process group and fails the
job with reason ``worker_error``. A message whose claim fails (redelivered,
duplicate, or the job was cancelled while queued) is logged and dropped.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from server.settings import Settings
from trainer.spec import JobSpec
from worker.checkpoints import CheckpointUnavailable, resolve_resume
from worker.launch import RunProcess, build_command, build_environment, log_tail, start_run
from worker.store import Claim, JobStore, Progress
from worker.tail import RecordTail

log = logging.getLogger(__name__)

#: Lines of ``launcher.log`` quoted in a failure message.
LOG_TAIL_LINES = 50
#: Longest failure message stored.
MAX_MESSAGE_CHARS = 16_000

CommandBuilder = Callable[[JobSpec, Path, Path], list[str]]


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: a terminal status and, for failures, a typed reason and message."""

    status: str
    reason: str | None = None
    message: str | None = None


@dataclass
class RunnerContext:
    """What the runner needs from its worker: settings, database, identity, shutdown flag."""

    settings: Settings
    store: JobStore
    worker_id: str
    build_command: CommandBuilder = build_command
    shutdown: threading.Event = field(default_factory=threading.Event)


def run_job(job_id: str, context: RunnerContext) -> Outcome | None:
    """Run one attempt of ``job_id``; ``None`` when the job could not be claimed (dropped)."""
    claim = context.store.claim(job_id, context.worker_id, context.settings.runs_dir)
    if claim is None:
        log.info("job %s is not queued (redelivered, duplicate or cancelled): message dropped", job_id)
        return None
    log.info("job %s: attempt %d claimed by %s in %s", job_id, claim.attempt, context.worker_id, claim.run_dir)
    return Attempt(claim, context).run()


class Attempt:
    """One claimed attempt of a job, from its run directory to its terminal status."""

    def __init__(self, claim: Claim, context: RunnerContext) -> None:
        self.claim = claim
        self.context = context
        self.store = context.store
        self.run_dir = claim.run_dir
        self.tail = RecordTail(self.run_dir / "records.jsonl")
        self.process: RunProcess | None = None
        self.running = False
        self.ended = False

    def run(self) -> Outcome:
        """Run the attempt to its end and record the terminal status.

        Never leaves the job non-terminal: any exception becomes ``worker_error``
        (after the process group is stopped), and the status is written even when
        a ``BaseException`` propagates.
        """
        outcome = Outcome("failed", "worker_error", "the worker stopped supervising the job unexpectedly")
        try:
            outcome = self._run()
        except Exception as exc:
            log.exception("job %s: worker error", self.claim.job_id)
            outcome = Outcome("failed", "worker_error", f"{type(exc).__name__}: {exc}")
        finally:
            outcome = self._ensure_stopped(outcome)
            self._finish(outcome)
        return outcome

    def _ensure_stopped(self, outcome: Outcome) -> Outcome:
        try:
            self._stop_process()
        except Exception as exc:
            log.exception("job %s: could not stop its run", self.claim.job_id)
            return Outcome("failed", "worker_error", f"the run could not be stopped: {exc}")
        return outcome

    def _run(self) -> Outcome:
        spec = self._prepare()
        if isinstance(spec, Outcome):
            return spec
        if self.store.cancel_requested(self.claim.job_id):
            return Outcome("cancelled", None, "cancelled before launch")
        try:
            command = self._command(spec)
        except CheckpointUnavailable as exc:
            return Outcome("failed", "checkpoint_unavailable", str(exc))
        try:
            self.process = start_run(command, self.run_dir, build_environment(spec, self.context.settings))
        except OSError as exc:
            return Outcome("failed", "launch_failed", f"torchrun could not be started: {exc}")
        return self._supervise(self.process)

    def _prepare(self) -> JobSpec | Outcome:
        """Create the run directory and write the re-validated ``spec.json``."""
        try:
            spec = JobSpec.model_validate(self.claim.spec)
        except ValidationError as exc:
            return Outcome("failed", "spec_invalid", f"the stored spec does not validate on the worker:\n{exc}")
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / "spec.json").write_text(spec.model_dump_json(indent=2))
        return spec

    def _command(self, spec: JobSpec) -> list[str]:
        """The launch command; with ``resume_from``, the resolved checkpoint is passed on."""
        command = self.context.build_command(spec, self.run_dir / "spec.json", self.run_dir)
        if spec.resume_from is not None:
            checkpoint = resolve_resume(spec.resume_from, self.context.settings.runs_dir)
            command += ["--resume-from", str(checkpoint)]
        return command

    def _supervise(self, process: RunProcess) -> Outcome:
        poll_s = self.context.settings.worker_poll_interval_s
        while True:
            self._ingest()
            code = process.poll()
            if code is not None:
                self._ingest()
                return self._exit_outcome(code)
            if self.store.cancel_requested(self.claim.job_id):
                return self._stop_for("cancelled", None, "cancelled by request")
            if self.context.shutdown.is_set():
                return self._stop_for("failed", "worker_lost", "the worker shut down while the job ran")
            self.context.shutdown.wait(poll_s)

    def _stop_for(self, status: str, reason: str | None, message: str) -> Outcome:
        log.info("job %s: stopping run (%s)", self.claim.job_id, message)
        self._stop_process()
        self._ingest()
        return Outcome(status, reason, message)

    def _stop_process(self) -> None:
        if self.process is not None and self.process.members():
            if not self.process.stop(self.context.settings.cancel_grace_s):
                raise RuntimeError(f"processes of run {self.process.pid} survived SIGKILL")

    def _ingest(self) -> None:
        """Move new records from ``records.jsonl`` into the database."""
        records = self.tail.drain()
        if not records:
            return
        progress = self._progress(records)
        if not self.running:
            self.store.mark_running(self.claim.job_id, self.claim.attempt)
            self.running = True
        self.store.record_progress(self.claim.job_id, self.claim.attempt, progress)

    def _progress(self, records: list[dict[str, Any]]) -> Progress:
        steps: list[dict[str, Any]] = []
        evaluation: dict[str, Any] | None = None
        world_size: int | None = None
        for record in records:
            kind = record.get("type")
            body = {key: value for key, value in record.items() if key != "type"}
            if kind == "step" and isinstance(body.get("step"), int):
                steps.append(body)
            elif kind == "eval":
                evaluation = body
            elif kind == "start" and isinstance(body.get("world_size"), int):
                world_size = body["world_size"]
            elif kind == "end":
                self.ended = True
        return Progress(steps=steps, eval=evaluation, world_size=world_size)

    def _exit_outcome(self, code: int) -> Outcome:
        if code == 0 and self.ended:
            return Outcome("succeeded")
        error = read_error(self.run_dir / "error.json")
        tail = log_tail(self.run_dir / "logs" / "launcher.log", LOG_TAIL_LINES)
        if error is not None:
            reason, message = error
            return Outcome("failed", reason, _with_tail(message, tail))
        what = "exited 0 without an end record" if code == 0 else f"exited with {_describe_exit(code)}"
        return Outcome("failed", "rank_failed", _with_tail(f"the trainer {what}", tail))

    def _finish(self, outcome: Outcome) -> None:
        job_id, attempt = self.claim.job_id, self.claim.attempt
        message = outcome.message[-MAX_MESSAGE_CHARS:] if outcome.message else outcome.message
        try:
            done = self.store.finish(job_id, attempt, outcome.status, outcome.reason, message)
        except Exception:
            log.exception("job %s: could not record its outcome %s", job_id, outcome.status)
            return
        if done:
            log.info("job %s: %s%s", job_id, outcome.status, f" ({outcome.reason})" if outcome.reason else "")
        else:
            log.warning("job %s: already terminal, outcome %s not recorded", job_id, outcome.status)


def read_error(path: Path) -> tuple[str, str] | None:
    """``(reason, message)`` from a rank's ``error.json``; ``None`` if absent or unreadable."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("unreadable %s", path)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str) or not data["reason"]:
        log.warning("%s has no reason: %.200r", path, data)
        return None
    rank = data.get("rank")
    message = str(data.get("message") or "")
    return data["reason"], f"{message} (rank {rank})" if rank is not None else message


def _with_tail(message: str, tail: str) -> str:
    if not tail:
        return message
    return f"{message}\n--- last lines of logs/launcher.log ---\n{tail}"


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
