"""Response bodies of the HTTP API (docs/api.md, docs/results.md), and the job resource built from its database rows.

The job resource and its pages are :mod:`halfcast.contracts.resources` (the client reads them too); this
module builds them from the rows (:func:`job_public`) and adds the error bodies. Request bodies are
``halfcast.contracts.spec.JobSpec``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ValidationError

from halfcast.common.timeutil import as_utc, as_utc_or_none
from halfcast.contracts.records import DataReport, StartupTimes
from halfcast.contracts.resources import (
    AttemptPublic,
    EvalList,
    JobError,
    JobList,
    JobPublic,
    LossScaling,
    MemberPublic,
    MetricsPage,
    StartupPhase,
    StoppedEarlyPublic,
    ThroughputPublic,
)
from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import AttemptStatus, JobStatus
from halfcast.core.db.job_reads import AttemptView, JobView, MemberView
from halfcast.core.db.models import Attempt, Job, JobMember, StepRow
from halfcast.core.db.stored_spec import stored_spec

log = logging.getLogger(__name__)

__all__ = [
    "MAX_STEP_NUMBER",
    "AttemptPublic",
    "AttemptStatus",
    "ErrorBody",
    "EvalList",
    "JobError",
    "JobList",
    "JobPublic",
    "JobStatus",
    "LossScaling",
    "MemberPublic",
    "MetricsPage",
    "QuotaErrorBody",
    "StartupPhase",
    "StartupTimes",
    "StoppedEarlyPublic",
    "ThroughputPublic",
    "attempt_public",
    "current_phase",
    "effective_precision",
    "job_public",
    "loss_scaling",
    "members_public",
    "startup_public",
    "step_counts",
    "step_point",
    "stopped_early",
    "throughput",
]

#: The resource's ``phase`` of a ``running`` job by the trainer's last ``phase`` record (``training``: none).
RUNNING_PHASES: dict[str, StartupPhase] = {
    "data": "loading data",
    "model": "building model",
    "first_step": "first step",
}


def attempt_public(row: Attempt | AttemptView) -> AttemptPublic:
    """An attempt of the resource from its ``attempts`` row."""
    return AttemptPublic(
        attempt=row.attempt,
        worker_id=row.worker_id,
        started_at=as_utc(row.started_at),
        ended_at=as_utc_or_none(row.ended_at),
        status=row.status,
        reason=row.reason,
        gpus=row.gpus,
        resumed_from_step=row.resumed_from_step,
    )


def startup_public(startup: Mapping[str, object] | None) -> StartupTimes | None:
    """The times of a stored ``jobs.startup``; ``None`` when there is none (or it does not validate)."""
    try:
        return StartupTimes.model_validate(startup) if isinstance(startup, dict) else None
    except ValidationError:
        return None


def current_phase(status: str, startup: Mapping[str, object] | None) -> StartupPhase | None:
    """What a starting job is doing: ``launching`` while ``starting`` (no trainer record yet), then while
    ``running`` the phase of its trainer's newest ``phase`` record until its first step is done; else ``None``."""
    if status == JobStatus.STARTING:
        return "launching"
    reported = (startup or {}).get("phase")
    return RUNNING_PHASES.get(reported) if status == JobStatus.RUNNING and isinstance(reported, str) else None


def job_public(job: Job | JobView) -> JobPublic:
    """The resource of a ``jobs`` row (an ORM object, or the columns :mod:`halfcast.core.db.job_reads` reads).

    ``spec`` is the stored dict as it is; ``nodes``, ``effective_precision`` and ``loss_scaling`` come from
    it validated (:func:`halfcast.core.db.stored_spec.stored_spec`, cached), and take the resource's defaults
    (1, the last switch's ``to`` else ``fp32``, ``none``) for a stored spec that no longer validates.
    """
    spec = stored_spec(job.id, job.spec)
    applied, skipped = step_counts(job.latest)
    ended = _count_or_none((job.end_info or {}).get("applied_steps"))
    applied = applied if ended is None else min(applied, ended)  # the end record also leaves out empty windows
    error = None
    if job.error_reason is not None:
        error = JobError(reason=job.error_reason, message=job.error_message or "")
    return JobPublic(
        id=job.id,
        name=job.name,
        status=job.status,
        spec=job.spec,
        created_at=as_utc(job.created_at),
        started_at=as_utc_or_none(job.started_at),
        finished_at=as_utc_or_none(job.finished_at),
        error=error,
        step=job.step,
        max_steps=job.max_steps,
        world_size=job.world_size,
        nodes=spec.nodes if spec is not None else 1,
        members=members_public(job.members, job.attempt),
        latest=job.latest,
        eval=job.eval,
        attempt=job.attempt,
        attempts=[attempt_public(row) for row in job.attempts],
        precision_switches=list(job.precision_switches or []),
        effective_precision=effective_precision(spec, job.precision_switches),
        loss_scaling=loss_scaling(spec),
        applied_steps=applied,
        skipped_steps=skipped,
        stopped_early=stopped_early(job.end_info),
        exported_step=_count_or_none((job.end_info or {}).get("exported_step")),
        throughput=throughput(job.end_info),
        data=data_report(job.data_report),
        phase=current_phase(job.status, job.startup),
        startup=startup_public(job.startup),
    )


def members_public(rows: Sequence[JobMember | MemberView], attempt: int) -> list[MemberPublic]:
    """The gang memberships of attempt ``attempt`` (the job's current one), by node rank."""
    current = sorted((row for row in rows if row.attempt == attempt), key=lambda row: row.node_rank)
    return [
        MemberPublic(
            node_rank=row.node_rank,
            worker_id=row.worker_id,
            host_address=row.host_address,
            status=row.status,
            exit_code=row.exit_code,
            joined_at=as_utc(row.joined_at),
            ended_at=as_utc_or_none(row.ended_at),
        )
        for row in current
    ]


def data_report(stored: Mapping[str, object] | None) -> DataReport | None:
    """The job's stored data report (a stored one that no longer validates is shown as none, logged)."""
    if stored is None:
        return None
    try:
        return DataReport.model_validate(stored)
    except ValidationError as exc:
        log.warning("stored data report does not validate: %s", exc)
        return None


def throughput(end_info: Mapping[str, object] | None) -> ThroughputPublic | None:
    """The end record's whole-run throughput, when the trainer measured it."""
    samples = (end_info or {}).get("samples_per_second")
    if not isinstance(samples, int | float):
        return None
    tokens = (end_info or {}).get("tokens_per_second")
    return ThroughputPublic(
        samples_per_second=samples, tokens_per_second=tokens if isinstance(tokens, int | float) else None
    )


def stopped_early(end_info: Mapping[str, object] | None) -> StoppedEarlyPublic | None:
    """The ``stopped_early`` of a succeeded run's stored ``end`` record, if it has a valid one."""
    found = (end_info or {}).get("stopped_early")
    try:
        return StoppedEarlyPublic.model_validate(found) if isinstance(found, dict) else None
    except ValidationError:
        return None


def _count_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def effective_precision(spec: JobSpec | None, switches: Sequence[Mapping[str, object]] | None) -> str:
    """The precision the job computes in: its last precision switch's ``to``, else ``spec``'s ``precision``
    (``fp32`` for a stored spec that does not validate, ``spec`` ``None``)."""
    if switches and isinstance(switches[-1].get("to"), str):
        return str(switches[-1]["to"])
    return spec.precision if spec is not None else "fp32"


def loss_scaling(spec: JobSpec | None) -> LossScaling:
    """How ``spec`` scales its loss: its ``effective_loss_scale``'s mode, ``none`` without one (or without a spec)."""
    scale = spec.effective_loss_scale if spec is not None else None
    return "none" if scale is None else scale.mode


def step_counts(latest: Mapping[str, object] | None) -> tuple[int, int]:
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


def step_point(record: StepRow) -> dict[str, object]:
    """A stored step record as the API returns it (``step`` and ``time`` always present)."""
    point = dict(record.data)
    point.setdefault("step", record.step)
    point.setdefault("time", record.time)
    return point


#: Largest step number a query may name (``step_records.step`` is a 64-bit integer; larger ones crashed the query).
MAX_STEP_NUMBER = 2**63 - 1


class ErrorBody(BaseModel):
    """Body of every non-422 error: ``{"detail": "..."}`` (``job_id`` where one job is concerned)."""

    detail: str
    job_id: str | None = None


class QuotaErrorBody(ErrorBody):
    """Body of a ``429``: the job would take its owner over ``limit``, whose value is ``value``."""

    limit: Literal["max_active_jobs", "max_gpus", "max_queued_jobs", "max_storage_bytes"]
    value: int
