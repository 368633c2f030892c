"""Response bodies of the HTTP API (DESIGN.md §3). Request bodies are ``trainer.spec.JobSpec``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from server.db.job_reads import AttemptView, JobView
from server.db.models import Attempt, Job, StepRecord
from server.timeutil import as_utc, as_utc_or_none

#: Job statuses (same values, same order as ``server.db.models.STATUSES``; a test checks it).
JobStatus = Literal["queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled"]


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
    status: Literal["succeeded", "failed", "cancelled"] | None = Field(description="How it ended")
    reason: str | None = Field(description="The typed reason it ended with (e.g. worker_lost)")
    gpus: list[int] | None = Field(default=None, description="GPU indices on the worker's host it was given; null: CPU")

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
        )


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

    @classmethod
    def from_row(cls, job: Job | JobView) -> JobPublic:
        """Build the resource from a ``jobs`` row (an ORM object, or the columns :mod:`server.db.job_reads` reads)."""
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
        )


def effective_precision(job: Job | JobView) -> str:
    """The precision ``job`` computes in: its last precision switch's ``to``, else the spec's ``precision``."""
    switches = job.precision_switches or []
    if switches and isinstance(switches[-1].get("to"), str):
        return str(switches[-1]["to"])
    return str(job.spec.get("precision") or "fp32")


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

    limit: Literal["max_active_jobs", "max_gpus", "max_queued_jobs"]
    value: int
