"""``/jobs``: submit, list, page step records, cancel (reading one job: :mod:`server.routes.job_resource`).

Every route needs a token (:mod:`server.auth`). A job belongs to the owner of the
token that created it; another owner gets the same 404 as for a missing job on
every route keyed by a job, and ``GET /jobs`` lists only the caller's jobs (an
admin's: everyone's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import JobStatus
from halfcast.core.db import audit, pending_cancels, requeue
from halfcast.core.db import jobs as repo
from halfcast.core.db.models import Job
from halfcast.core.db.paging import InvalidCursor
from halfcast.core.db.quota_check import QuotaExceeded
from halfcast.core.db.quotas import QuotaLimits
from halfcast.core.settings import Settings
from server.access import visible_job_or_404
from server.auth import PrincipalDep, authenticate
from server.capacity import check_gpu_capacity
from server.deps import QueueDep, SessionDep, SettingsDep
from server.http.errors import ApiError
from server.http.idempotency import IdempotencyKey, key_mismatch
from server.http.strict_body import StrictJSONRoute, strict_types
from server.queue import JobQueue
from server.quotas import QUOTA_RESPONSE, QuotaApiError, default_limits
from server.registry.spec_check import registered_inputs_check
from server.schemas import MAX_STEP_NUMBER, ErrorBody, EvalList, JobList, JobPublic, MetricsPage, job_public, step_point

log = logging.getLogger(__name__)

#: Bodies are strict JSON: UTF-8 only, NaN, Infinity and 1e309 a 422 at their field, and JSON's types taken
#: strictly (``"5"`` or ``true`` for a number is a 422 at the field) (:mod:`server.http.strict_body`).
router = APIRouter(
    prefix="/jobs",
    tags=["jobs"],
    dependencies=[Depends(authenticate), Depends(strict_types)],
    route_class=StrictJSONRoute,
)

_NOT_FOUND: dict[int | str, dict[str, object]] = {404: {"model": ErrorBody, "description": "Unknown job"}}
#: The ``status`` query parameter: a :class:`~halfcast.contracts.status.JobStatus` value, as a ``Literal`` of the values so
#: that a bad one is the 422 it always was (``literal_error``) and the parameter's schema stays inline.
if TYPE_CHECKING:  # mypy cannot evaluate a Literal built at run time: to it, the parameter is a str
    StatusQuery = str
else:
    StatusQuery = Literal[tuple(member.value for member in JobStatus)]


def _reject_faults(spec: JobSpec, settings: Settings) -> None:
    """A ``faults`` block is test-only: 422 at ``body.faults`` unless the server allows faults."""
    if spec.faults is None or settings.allow_faults:
        return
    raise RequestValidationError(
        [
            {
                "type": "value_error",
                "loc": ("body", "faults"),
                "msg": "fault injection is disabled on this server (HALFCAST_ALLOW_FAULTS=1 enables it)",
                "input": spec.faults.model_dump(mode="json"),
            }
        ]
    )


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    responses={
        200: {"model": JobPublic, "description": "The job this Idempotency-Key created before"},
        429: QUOTA_RESPONSE,
        503: {"model": ErrorBody, "description": "The job could not be queued; it is stored as failed"},
    },
)
def submit_job(
    spec: JobSpec,
    session: SessionDep,
    queue: QueueDep,
    settings: SettingsDep,
    response: Response,
    principal: PrincipalDep,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic:
    """Store the job (committed first), then enqueue its id. ``Location`` points at the new job.

    If the broker refuses the message, the job is marked ``failed`` with reason
    ``enqueue_failed`` and the answer is 503. With an ``Idempotency-Key`` already
    used for the same spec, nothing is stored or sent: the answer is 200 with that
    job; used for a different spec, 422 at ``["header", "Idempotency-Key"]``. A GPU
    job no registered worker can hold is 422 at ``["body", "gpus"]`` (:mod:`server.capacity`).
    The job belongs to the caller; idempotency keys are per owner. A job that would take
    the caller over a quota limit is 429 (:mod:`server.quotas`; a replay is not counted).
    A replay of a job whose message never reached the broker (``failed``/``enqueue_failed``,
    never claimed) puts it back to ``queued`` and sends it again (:mod:`halfcast.core.db.requeue`).
    A ``dataset_id`` or ``model_id`` the caller cannot see is a 422 at that field, as is a spec
    that does not validate once the registered dataset's format is filled in
    (:mod:`server.registry.spec_check`).
    """
    _reject_faults(spec, settings)
    check_gpu_capacity(session, spec, settings, idempotency_key, principal.owner)
    defaults = default_limits(settings)
    try:
        job, created = repo.create_job(
            session,
            spec,
            idempotency_key,
            owner=principal.owner,
            quota_defaults=defaults,
            check_inputs=registered_inputs_check(spec, principal),
        )
    except repo.IdempotencyMismatch as exc:
        raise key_mismatch(str(exc), idempotency_key) from None
    except QuotaExceeded as exc:
        raise QuotaApiError(exc) from None
    response.headers["Location"] = f"/jobs/{job.id}"
    if not created:
        response.status_code = 200
        if not _requeue_if_never_sent(session, job, spec, principal.owner, defaults):
            return job_public(repo.get_job(session, job.id))
    _send(session, queue, job.id)
    return job_public(repo.get_job(session, job.id))


def _record_pending_cancel(session: Session, job_id: str, actor: str, owner: str | None) -> JobPublic:
    """Record a cancel the job's locked row kept from being applied; the job as it reads now (not blocked)."""
    pending_cancels.record(session, job_id, actor)
    log.warning("job %s: its row is locked; the cancel is recorded for the worker to apply", job_id)
    job = repo.get_job(session, job_id)
    session.commit()
    audit.record(session, actor, "job.cancel", job_id, {"owner": owner, "status": job.status, "pending": True})
    return job_public(job)


def _requeue_if_never_sent(session: Session, job: Job, spec: JobSpec, owner: str, defaults: QuotaLimits) -> bool:
    """On a replay, put a job whose message never reached the broker back to ``queued``; 429 at a quota limit."""
    if not requeue.never_sent(job):
        return False
    try:
        requeued = requeue.requeue_never_sent(
            session, job.id, owner=owner, gpus=spec.total_gpus, quota_defaults=defaults
        )
    except QuotaExceeded as exc:
        raise QuotaApiError(exc) from None
    if requeued:
        log.info("job %s requeued: its Idempotency-Key was replayed after the broker refused it", job.id)
    return requeued


def _send(session: Session, queue: JobQueue, job_id: str) -> None:
    """Send the job's id to the broker; on any failure fail the job and raise 503 (:func:`_record_enqueue_failure`)."""
    try:
        queue.enqueue(job_id)
    except Exception as exc:  # noqa: BLE001  # any broker failure: the job must not stay queued forever
        _record_enqueue_failure(session, job_id, exc)


def _record_enqueue_failure(session: Session, job_id: str, exc: Exception) -> None:
    """Fail the job with ``enqueue_failed`` and raise 503; keep it if a worker already took it."""
    log.exception("could not enqueue job %s", job_id)
    message = f"could not send the job to the broker: {type(exc).__name__}: {exc}"
    if repo.mark_enqueue_failed(session, job_id, message):
        raise ApiError(
            503, f"job {job_id} could not be queued ({message})", job_id=job_id, headers={"Retry-After": "5"}
        )
    log.warning("job %s left 'queued' despite the enqueue error; keeping it", job_id)


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    principal: PrincipalDep,
    status: Annotated[StatusQuery | None, Query(description="Only jobs in this status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=512, description="next_cursor of the previous page")] = None,
) -> JobList:
    """The caller's jobs (an admin's: every job), newest first."""
    owner = None if principal.admin else principal.owner
    try:
        page = repo.list_jobs(session, status=status, limit=limit, cursor=cursor, owner=owner)
    except InvalidCursor as exc:
        raise RequestValidationError(
            [{"type": "value_error", "loc": ("query", "cursor"), "msg": str(exc), "input": cursor}]
        ) from None
    return JobList(jobs=[job_public(job) for job in page.jobs], next_cursor=page.next_cursor)


@router.get("/{job_id}/metrics", response_model=MetricsPage, responses=_NOT_FOUND)
def get_job_metrics(
    job_id: str,
    session: SessionDep,
    principal: PrincipalDep,
    after_step: Annotated[
        int, Query(ge=0, le=MAX_STEP_NUMBER, description="Return records with step > after_step")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> MetricsPage:
    """Step records of the job in step order."""
    visible_job_or_404(session, job_id, principal)
    session.commit()  # end the read
    try:
        records = repo.list_step_records(session, job_id, after_step=after_step, limit=limit)
    except repo.JobNotFound:
        raise ApiError(404, f"job {job_id} not found", job_id=job_id) from None
    return MetricsPage(job_id=job_id, points=[step_point(record) for record in records])


@router.get("/{job_id}/evals", response_model=EvalList, responses=_NOT_FOUND)
def get_job_evals(job_id: str, session: SessionDep, principal: PrincipalDep) -> EvalList:
    """Every evaluation of the job in step order (the job resource's ``eval`` is the newest)."""
    visible_job_or_404(session, job_id, principal)
    session.commit()  # end the read
    try:
        records = repo.list_eval_records(session, job_id)
    except repo.JobNotFound:
        raise ApiError(404, f"job {job_id} not found", job_id=job_id) from None
    return EvalList(job_id=job_id, evals=[record.data for record in records])


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobPublic,
    responses={**_NOT_FOUND, 409: {"model": ErrorBody, "description": "The job already ended"}},
)
def cancel_job(job_id: str, session: SessionDep, principal: PrincipalDep) -> JobPublic:
    """Cancel: a queued job ends ``cancelled`` now; a starting or running one goes ``cancelling``.

    Each accepted request is audited (``job.cancel`` by the caller). When another session holds the
    job's row over a second (PostgreSQL), the request is recorded and answered at once, the job as
    it reads now; the worker applies it (:mod:`halfcast.core.db.pending_cancels`).
    """
    owner = visible_job_or_404(session, job_id, principal).owner
    session.commit()  # end the read before the compare-and-set writes (SQLite)
    try:
        job = repo.request_cancel(session, job_id, lock_wait_s=pending_cancels.CANCEL_LOCK_WAIT_S)
    except OperationalError as exc:
        if not pending_cancels.row_was_locked(exc):
            raise
        session.rollback()
        return _record_pending_cancel(session, job_id, principal.owner, owner)
    except repo.JobNotFound:
        raise ApiError(404, f"job {job_id} not found", job_id=job_id) from None
    except repo.JobConflict as exc:
        raise ApiError(409, str(exc), job_id=job_id) from None
    audit.record(session, principal.owner, "job.cancel", job_id, {"owner": owner, "status": job.status})
    return job_public(job)
