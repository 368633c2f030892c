"""API-side job repository: create, read, list, page step records, request cancellation.

Every function takes a ``Session`` and commits its own writes. Status changes are
compare-and-sets (``UPDATE ... WHERE status IN (...)``) through :mod:`halfcast.core.db.transitions`,
so they are safe against a worker changing the same row concurrently. The worker's side (claiming,
progress, outcome) lives in ``worker/store.py``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason, JobStatus
from halfcast.core.db import audit, quota_check
from halfcast.core.db.models import ACTIVE_STATUSES, STATUSES, TERMINAL_STATUSES, EvalRow, Job, StepRow, utcnow
from halfcast.core.db.paging import newest_first
from halfcast.core.db.quota_check import begin_owner_transaction
from halfcast.core.db.quotas import UNLIMITED, QuotaLimits
from halfcast.core.db.transitions import Expected, compare_and_set

#: Statuses a cancel request moves to ``cancelling`` (the worker then stops the run, or node 0 its forming gang).
_CANCEL_RUNNING_FROM = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.GATHERING})


class JobNotFound(LookupError):
    """No job has this id."""


class JobConflict(RuntimeError):
    """The requested transition is not allowed from the job's current status."""

    def __init__(self, job: Job, message: str) -> None:
        super().__init__(message)
        self.job = job


@dataclass(frozen=True)
class JobPage:
    """One page of jobs, newest first; ``next_cursor`` is ``None`` on the last page."""

    jobs: Sequence[Job]
    next_cursor: str | None


# ----------------------------------------------------------------------------- writes


def spec_hash(spec: JobSpec) -> str:
    """SHA-256 of the validated spec's canonical JSON: two bodies that validate alike hash alike."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class IdempotencyMismatch(ValueError):
    """The ``Idempotency-Key`` was used before with a different spec."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"Idempotency-Key already used for job {job.id} with a different spec")
        self.job = job


def create_job(
    session: Session,
    spec: JobSpec,
    idempotency_key: str | None = None,
    *,
    owner: str,
    quota_defaults: QuotaLimits = UNLIMITED,
    check_inputs: Callable[[Session], None] | None = None,
) -> tuple[Job, bool]:
    """Store a new ``queued`` job of ``owner`` for a validated ``spec``, audit it, commit; return ``(job, created)``.

    The ``job.create`` audit event (actor ``owner``) is committed with the job. With an
    ``idempotency_key``, a job ``owner`` already stored under that key is returned
    instead (``created`` is ``False``; keys are per owner; a replay is never counted
    against a quota). The owner's quota (``quota_defaults`` overridden by its
    ``owner_quotas`` row) is checked in the transaction of the INSERT, under the
    owner's lock (:mod:`halfcast.core.db.quota_check`), which also serialises racing requests
    with one key; the ``(owner, key)`` unique index backs this up.

    ``check_inputs`` runs under the owner's lock before the quota check, for a new job only:
    it checks the registered datasets and models the spec names (:mod:`halfcast.core.registry.refs`;
    their deletion takes the same lock), and whatever it raises refuses the job (nothing stored).

    Raises :class:`IdempotencyMismatch` if the key's job was created from a different
    spec, and :class:`halfcast.core.db.quota_check.QuotaExceeded` (nothing stored) when the
    job would take the owner over a limit.
    """
    digest = spec_hash(spec) if idempotency_key is not None else None
    if idempotency_key is not None and (existing := _by_key(session, idempotency_key, owner)) is not None:
        return _same_request(existing, digest), False
    begin_owner_transaction(session, owner)
    try:
        existing = _find_key(session, idempotency_key, owner) if idempotency_key is not None else None
        if existing is None:
            if check_inputs is not None:
                check_inputs(session)
            quota_check.enforce(session, owner, spec.total_gpus, quota_defaults)
    except BaseException:
        session.rollback()
        raise
    if existing is not None:  # a racer with this key committed while we waited for the lock
        session.commit()
        return _same_request(existing, digest), False
    return _insert(session, _new_job(spec, idempotency_key, digest, owner), owner, digest)


def _insert(session: Session, job: Job, owner: str, digest: str | None) -> tuple[Job, bool]:
    """Add ``job`` and its ``job.create`` event to the open transaction and commit; a lost key race reads the winner."""
    session.add(job)
    audit.add_event(session, owner, "job.create", job.id, {"owner": owner, "name": job.name})
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        key = job.idempotency_key
        existing = _by_key(session, key, owner) if key is not None else None
        if existing is None:
            raise
        return _same_request(existing, digest), False
    return job, True


def _find_key(session: Session, key: str, owner: str) -> Job | None:
    return session.scalars(select(Job).where(Job.owner == owner, Job.idempotency_key == key)).one_or_none()


def _by_key(session: Session, key: str, owner: str) -> Job | None:
    job = _find_key(session, key, owner)
    session.commit()  # end the read: the INSERT that may follow starts a transaction of its own
    return job


def _same_request(job: Job, digest: str | None) -> Job:
    if job.request_hash != digest:
        raise IdempotencyMismatch(job)
    return job


def _new_job(spec: JobSpec, idempotency_key: str | None, digest: str | None, owner: str) -> Job:
    now = utcnow()
    return Job(
        id=str(uuid.uuid4()),
        owner=owner,
        name=spec.name,
        status="queued",
        spec=spec.model_dump(mode="json"),
        created_at=now,
        updated_at=now,
        step=0,
        max_steps=spec.max_steps,
        world_size=spec.world_size,
        attempt=0,
        idempotency_key=idempotency_key,
        request_hash=digest,
    )


def _compare_and_set(
    session: Session,
    job_id: str,
    from_statuses: Collection[JobStatus],
    to: JobStatus,
    lock_wait_s: float | None = None,
    **values: object,
) -> bool:
    """Move the job to ``to`` (with ``values``) if its status is one of ``from_statuses``; commit; report success.

    ``lock_wait_s`` (PostgreSQL): wait at most this long for the job's row lock (``LockNotAvailable`` after it).
    """
    if lock_wait_s is not None and session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"SET LOCAL lock_timeout = '{round(lock_wait_s * 1000)}ms'"))
    changed = compare_and_set(session, job_id, Expected(frozenset(from_statuses)), to, updated_at=utcnow(), **values)
    session.commit()
    return changed


def mark_enqueue_failed(session: Session, job_id: str, message: str) -> bool:
    """Fail a still-``queued`` job whose message never reached the broker (reason ``enqueue_failed``).

    Returns ``False`` if the job had already left ``queued`` (nothing is changed then).
    """
    now = utcnow()
    return _compare_and_set(
        session,
        job_id,
        {JobStatus.QUEUED},
        JobStatus.FAILED,
        error_reason=FailureReason.ENQUEUE_FAILED,
        error_message=message,
        finished_at=now,
    )


def request_cancel(session: Session, job_id: str, lock_wait_s: float | None = None) -> Job:
    """Cancel a job: ``queued`` → ``cancelled`` at once; ``starting``/``running`` → ``cancelling``.

    A queued job is finished here (``finished_at`` set), so the worker's claim, which
    requires ``queued``, fails and the run never launches. A running job is left to
    the worker, which stops the process group and records ``cancelled``. Asking again
    while ``cancelling`` is a no-op.

    Returns the job as it is now, with no transaction left open (so a write that follows,
    like the route's audit event, never needs a read-to-write lock upgrade on SQLite).
    Raises :class:`JobNotFound` for an unknown id and :class:`JobConflict` when the
    job is already terminal; with ``lock_wait_s`` (PostgreSQL), ``OperationalError``
    (``LockNotAvailable``) when another session holds the job's row longer than that.
    """
    wait = lock_wait_s
    for _ in range(len(STATUSES)):  # each round loses only to a real status change
        now = utcnow()
        if _compare_and_set(
            session, job_id, {JobStatus.QUEUED}, JobStatus.CANCELLED, wait, finished_at=now, cancel_requested_at=now
        ):
            break
        if _compare_and_set(session, job_id, _CANCEL_RUNNING_FROM, JobStatus.CANCELLING, wait, cancel_requested_at=now):
            break
        job = get_job(session, job_id)
        session.commit()  # end the read before the next compare-and-set (SQLite: no read-then-write upgrade)
        if job.status == "cancelling":
            return job
        if job.status in TERMINAL_STATUSES:
            raise JobConflict(job, f"job {job_id} is already {job.status}")
    job = get_job(session, job_id)
    session.commit()  # end the read: the caller's next write (the audit event) starts a transaction of its own
    return job


# ----------------------------------------------------------------------------- reads


def get_job(session: Session, job_id: str) -> Job:
    """The job with ``job_id``, freshly read. Raises :class:`JobNotFound` (also for an id with NUL, which
    PostgreSQL cannot even compare)."""
    if "\x00" in job_id:
        raise JobNotFound(job_id)
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise JobNotFound(job_id)
    return job


def list_jobs(
    session: Session, *, status: str | None = None, limit: int = 50, cursor: str | None = None, owner: str | None = None
) -> JobPage:
    """Jobs newest first (ties broken by id), optionally of one ``status`` and one ``owner``, after ``cursor``.

    ``owner=None`` lists every owner's jobs (an admin's view). Raises
    :class:`InvalidCursor` for a malformed cursor.
    """
    query = select(Job)
    if owner is not None:
        query = query.where(Job.owner == owner)
    if status is not None:
        query = query.where(Job.status == status)
    jobs, next_cursor = newest_first(session, query, Job, limit=limit, cursor=cursor)
    return JobPage(list(jobs), next_cursor)


def list_step_records(session: Session, job_id: str, *, after_step: int = 0, limit: int = 1000) -> list[StepRow]:
    """Step records of a job with ``step > after_step``, in step order, at most ``limit``.

    Raises :class:`JobNotFound` for an unknown job.
    """
    if session.get(Job, job_id) is None:
        raise JobNotFound(job_id)
    query = (
        select(StepRow).where(StepRow.job_id == job_id, StepRow.step > after_step).order_by(StepRow.step).limit(limit)
    )
    return list(session.scalars(query))


def list_eval_records(session: Session, job_id: str) -> list[EvalRow]:
    """Every evaluation record of a job, in step order (a few per job: one per ``eval_interval`` steps and the last).

    Raises :class:`JobNotFound` for an unknown job.
    """
    if session.get(Job, job_id) is None:
        raise JobNotFound(job_id)
    return list(session.scalars(select(EvalRow).where(EvalRow.job_id == job_id).order_by(EvalRow.step)))


def count_by_status(session: Session) -> dict[str, int]:
    """Number of jobs in every status (0 included)."""
    counts = dict.fromkeys(STATUSES, 0)
    for status, count in session.execute(select(Job.status, func.count()).group_by(Job.status)):
        counts[status] = count
    return counts


def live_job_latest(session: Session) -> list[tuple[str, dict[str, object] | None]]:
    """``(id, latest step record)`` of every job not yet terminal, oldest first."""
    query = select(Job.id, Job.latest).where(Job.status.in_(sorted(ACTIVE_STATUSES))).order_by(Job.created_at)
    return [(job_id, latest) for job_id, latest in session.execute(query)]
