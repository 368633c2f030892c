"""Response bodies of the HTTP API (docs/api.md, docs/results.md). Request bodies are ``trainer.spec.JobSpec``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from server.db.job_reads import AttemptView, JobView
from server.db.models import Attempt, Job, StepRecord
from server.timeutil import as_utc, as_utc_or_none

#: Job statuses (same values, same order as ``server.db.models.STATUSES``; a test checks it).
JobStatus = Literal["queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled"]
#: How an attempt ended (same values, same order as ``server.db.models.ATTEMPT_STATUSES``; a test checks it):
#: ``requeued`` is an attempt a graceful worker shutdown stopped, handing the job back to the queue.
AttemptStatus = Literal["succeeded", "failed", "cancelled", "requeued"]
#: How a job's spec scales its loss: fp16's ``loss_scale.mode`` (default ``dynamic``); ``none`` for
#: fp32, bf16 and fp8, whose step records carry ``loss_scale`` 1 (``trainer.spec.JobSpec.effective_loss_scale``).
LossScaling = Literal["dynamic", "static", "none"]
#: What a starting job is doing (the resource's ``phase``).
StartupPhase = Literal["launching", "loading data", "building model", "first step"]
#: The resource's ``phase`` of a ``running`` job by the trainer's last ``phase`` record (``training``: none).
RUNNING_PHASES: dict[str, StartupPhase] = {
    "data": "loading data", "model": "building model", "first_step": "first step",
}  # fmt: skip


class JobError(BaseModel):
    """Why a job failed: a typed ``reason`` (see docs/architecture.md) and a human ``message``."""

    reason: str
    message: str


class AttemptPublic(BaseModel):
    """One launch attempt: who ran it, when, and how it ended (``ended_at``, ``status``, ``reason`` null while it runs)."""

    attempt: int = Field(description="1-based attempt number (the lease's fencing token)")
    worker_id: str = Field(description="The worker that ran it, as <hostname>/<pid>")
    started_at: datetime
    ended_at: datetime | None
    status: AttemptStatus | None = Field(
        description="How it ended: the job's terminal status, or requeued (a graceful worker shutdown stopped it "
        "and queued the job again, not counted against max_attempts; reason worker_shutdown)"
    )
    reason: str | None = Field(description="The typed reason it ended with (e.g. worker_lost, worker_shutdown)")
    gpus: list[int] | None = Field(default=None, description="GPU indices on the worker's host it was given; null: CPU")
    resumed_from_step: int | None = Field(
        default=None,
        description="A retry: the step of the earlier attempts' checkpoint it resumed from (0: none, it started over); "
        "null for a first attempt",
    )

    @classmethod
    def from_row(cls, row: Attempt | AttemptView) -> AttemptPublic:
        """Build from an ``attempts`` row."""
        return cls(
            attempt=row.attempt,
            worker_id=row.worker_id,
            started_at=as_utc(row.started_at),
            ended_at=as_utc_or_none(row.ended_at),
            status=row.status,  # type: ignore[arg-type]  # the column only holds these values
            reason=row.reason,
            gpus=row.gpus,
            resumed_from_step=row.resumed_from_step,
        )


class StoppedEarlyPublic(BaseModel):
    """Early stopping ended the job: at ``step``, on ``metric``, whose best evaluation was ``best_value`` at ``best_step``."""

    step: int
    metric: str
    best_step: int | None = None
    best_value: float | None = None


class StartupPublic(BaseModel):
    """Seconds each start-up phase of the current attempt took, as its trainer reported them (docs/api.md, "Start-up").

    Null until the phase has ended (and ``launch_s``/``imports_s`` when the trainer could not time them).
    """

    launch_s: float | None = Field(default=None, description="From the worker starting torchrun to the trainer's Python")
    imports_s: float | None = Field(default=None, description="Then to the training loop (imports, spec, process group)")
    data_s: float | None = Field(default=None, description="Then to the dataset built (a resumed run's checkpoint read)")
    model_s: float | None = Field(default=None, description="Then to the model, optimizer and schedule built")
    first_step_s: float | None = Field(default=None, description="Then to the first step's record written")

    @classmethod
    def from_column(cls, startup: dict[str, Any] | None) -> StartupPublic | None:
        """The times of a stored ``jobs.startup``; ``None`` when there is none (or it does not validate)."""
        try:
            return cls.model_validate(startup) if isinstance(startup, dict) else None
        except ValidationError:
            return None


def current_phase(status: str, startup: dict[str, Any] | None) -> StartupPhase | None:
    """What a starting job is doing: ``launching`` while ``starting`` (no trainer record yet), then while
    ``running`` the phase of its trainer's newest ``phase`` record until its first step is done; else ``None``."""
    if status == "starting":
        return "launching"
    reported = (startup or {}).get("phase")
    return RUNNING_PHASES.get(reported) if status == "running" and isinstance(reported, str) else None


class JobPublic(BaseModel):
    """The job resource (``GET /jobs/{id}``). Timestamps are UTC; ``step`` is the latest attempted step."""

    id: str
    name: str | None
    status: JobStatus
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: JobError | None
    step: int
    max_steps: int
    world_size: int
    latest: dict[str, Any] | None = Field(description="The newest step record, or null")
    eval: dict[str, Any] | None = Field(description="The newest evaluation record, or null")
    attempt: int = Field(description="Launch attempts so far (0 while queued)")
    attempts: list[AttemptPublic] = Field(default_factory=list, description="Every launch attempt, oldest first")
    precision_switches: list[dict[str, Any]] = Field(
        default_factory=list,
        description='Precision switches of the run (on_divergence "fallback_bf16"), oldest first: '
        "{step, from, to, reason, message, rewound_to_step, time}",
    )
    effective_precision: str = Field(
        default="fp32", description="The precision the job computes in: the spec's, or the last switch's 'to'"
    )
    loss_scaling: LossScaling = Field(
        default="none",
        description="How the spec's precision scales the loss: fp16's loss_scale.mode (dynamic or static); "
        "none for fp32, bf16 and fp8 (their records' loss_scale is 1). After a switch to bf16 the steps "
        "trained in bf16 are not scaled either (loss_scale 1)",
    )
    applied_steps: int = Field(
        default=0, description="Attempted steps up to `step` that applied an update (`step` minus `skipped_steps`)"
    )
    skipped_steps: int = Field(
        default=0, description="Attempted steps up to `step` skipped for non-finite gradients (the latest record's count)"
    )
    stopped_early: StoppedEarlyPublic | None = Field(
        default=None, description="Set when early stopping ended the succeeded job before `max_steps`"
    )
    exported_step: int | None = Field(
        default=None, description="The step whose weights the job's exports hold (the best evaluation with `keep_best`)"
    )
    phase: StartupPhase | None = Field(
        default=None,
        description="While the job starts, what it is doing: `launching` (status `starting`), then, `running` before "
        "its first step, `loading data`, `building model`, `first step`; null otherwise",
    )
    startup: StartupPublic | None = Field(
        default=None, description="The current attempt's start-up phase times so far; null before its trainer reported one"
    )

    @classmethod
    def from_row(cls, job: Job | JobView) -> JobPublic:
        """Build the resource from a ``jobs`` row (an ORM object, or the columns :mod:`server.db.job_reads` reads)."""
        applied, skipped = step_counts(job.latest)
        error = None
        if job.error_reason is not None:
            error = JobError(reason=job.error_reason, message=job.error_message or "")
        return cls(
            id=job.id,
            name=job.name,
            status=job.status,  # type: ignore[arg-type]  # the column only holds JobStatus values
            spec=job.spec,
            created_at=as_utc(job.created_at),
            started_at=as_utc_or_none(job.started_at),
            finished_at=as_utc_or_none(job.finished_at),
            error=error,
            step=job.step,
            max_steps=job.max_steps,
            world_size=job.world_size,
            latest=job.latest,
            eval=job.eval,
            attempt=job.attempt,
            attempts=[AttemptPublic.from_row(row) for row in job.attempts],
            precision_switches=list(job.precision_switches or []),
            effective_precision=effective_precision(job),
            loss_scaling=loss_scaling(job.spec),
            applied_steps=applied,
            skipped_steps=skipped,
            stopped_early=stopped_early(job.end_info),
            exported_step=_count_or_none((job.end_info or {}).get("exported_step")),
            phase=current_phase(job.status, job.startup),
            startup=StartupPublic.from_column(job.startup),
        )


def stopped_early(end_info: dict[str, Any] | None) -> StoppedEarlyPublic | None:
    """The ``stopped_early`` of a succeeded run's stored ``end`` record, if it has a valid one."""
    found = (end_info or {}).get("stopped_early")
    try:
        return StoppedEarlyPublic.model_validate(found) if isinstance(found, dict) else None
    except ValidationError:
        return None


def _count_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def effective_precision(job: Job | JobView) -> str:
    """The precision ``job`` computes in: its last precision switch's ``to``, else the spec's ``precision``."""
    switches = job.precision_switches or []
    if switches and isinstance(switches[-1].get("to"), str):
        return str(switches[-1]["to"])
    return str(job.spec.get("precision") or "fp32")


def loss_scaling(spec: dict[str, Any]) -> LossScaling:
    """How the stored ``spec`` scales its loss, as ``JobSpec.effective_loss_scale`` decides (read from the dict, not validated)."""
    if (spec.get("precision") or "fp32") != "fp16":
        return "none"
    block = spec.get("loss_scale")
    return "static" if isinstance(block, dict) and block.get("mode") == "static" else "dynamic"


def step_counts(latest: dict[str, Any] | None) -> tuple[int, int]:
    """``(applied, skipped)`` steps of the job's trajectory up to its newest step record ``latest``.

    The record's ``skipped_steps`` is cumulative and the stored records are one trajectory
    (a retry or a precision switch rewinds ``latest`` with them), so no other row is read.
    """
    if not latest:
        return 0, 0
    step, skipped = latest.get("step"), latest.get("skipped_steps")
    step = step if isinstance(step, int) else 0
    skipped = min(max(skipped, 0), step) if isinstance(skipped, int) else 0
    return step - skipped, skipped


class JobList(BaseModel):
    """A page of jobs, newest first. Pass ``next_cursor`` as ``cursor`` for the next page (null: last page)."""

    jobs: list[JobPublic]
    next_cursor: str | None


def step_point(record: StepRecord) -> dict[str, Any]:
    """A stored step record as the API returns it (``step`` and ``time`` always present)."""
    point = dict(record.data)
    point.setdefault("step", record.step)
    point.setdefault("time", record.time)
    return point


#: Largest step number a query may name (``step_records.step`` is a 64-bit integer; larger ones crashed the query).
MAX_STEP_NUMBER = 2**63 - 1


class MetricsPage(BaseModel):
    """Step records of one job in step order (``GET /jobs/{id}/metrics``).

    Page on by passing the last point's ``step`` as ``after_step``; an empty or short
    page means no more records yet.
    """

    job_id: str
    points: list[dict[str, Any]]


class EvalList(BaseModel):
    """Every evaluation of one job in step order (``GET /jobs/{id}/evals``): its validation curve.

    Each is ``{"step", "time", "loss", "accuracy"|"perplexity"}``; the job resource's
    ``eval`` is the last of them.
    """

    job_id: str
    evals: list[dict[str, Any]]


class ErrorBody(BaseModel):
    """Body of every non-422 error: ``{"detail": "..."}`` (``job_id`` where one job is concerned)."""

    detail: str
    job_id: str | None = None


class QuotaErrorBody(ErrorBody):
    """Body of a ``429``: the job would take its owner over ``limit``, whose value is ``value``."""

    limit: Literal["max_active_jobs", "max_gpus", "max_queued_jobs", "max_storage_bytes"]
    value: int
