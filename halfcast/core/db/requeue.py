"""Requeue a job whose message never reached the broker, when its ``Idempotency-Key`` is replayed.

``POST /jobs`` commits the job before sending its id; if the broker refuses, the job
is stored ``failed`` with reason ``enqueue_failed`` and the answer is 503 with
``Retry-After``. No worker ever saw such a job (its ``attempt`` is 0), so a retry
with the same key may safely put it back to ``queued`` and send it again, instead
of answering the failed job forever.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from halfcast.contracts.status import FailureReason, JobStatus
from halfcast.core.db import audit, quota_check
from halfcast.core.db.models import Job, utcnow
from halfcast.core.db.quotas import QuotaLimits
from halfcast.core.db.transitions import Expected, compare_and_set

#: The error reason of a job whose message the broker refused (``halfcast.core.db.jobs.mark_enqueue_failed``).
ENQUEUE_FAILED = FailureReason.ENQUEUE_FAILED.value


def never_sent(job: Job) -> bool:
    """Whether ``job`` failed only because its message never reached the broker and no worker claimed it."""
    return job.status == "failed" and job.error_reason == ENQUEUE_FAILED and job.attempt == 0


def requeue_never_sent(session: Session, job_id: str, *, owner: str, gpus: int, quota_defaults: QuotaLimits) -> bool:
    """Move ``failed``/``enqueue_failed`` job ``job_id`` (attempt 0) of ``owner`` back to ``queued``; audit; commit.

    Compare-and-set on status, reason and attempt; clears ``error`` and ``finished_at``.
    Going back to ``queued`` counts against ``owner``'s quota like a new job of ``gpus``
    GPUs, checked under the owner's lock (:mod:`halfcast.core.db.quota_check`). The
    ``job.requeue`` audit event (actor ``owner``) is committed with the change.
    Returns ``False`` (nothing changed) when the job is not in that state, e.g. a
    racing retry requeued it first. Raises :class:`halfcast.core.db.quota_check.QuotaExceeded`
    (nothing changed) when the owner is at a limit.
    """
    quota_check.begin_owner_transaction(session, owner)
    try:
        job = session.get(Job, job_id, populate_existing=True)
        if job is None or not never_sent(job):
            session.rollback()
            return False
        quota_check.enforce(session, owner, gpus, quota_defaults)
        never_claimed = Expected.of(JobStatus.FAILED, attempt=0, where=(Job.error_reason == ENQUEUE_FAILED,))
        changed = compare_and_set(
            session,
            job_id,
            never_claimed,
            to=JobStatus.QUEUED,
            error_reason=None,
            error_message=None,
            finished_at=None,
            updated_at=utcnow(),
        )
        if changed:
            audit.add_event(session, owner, "job.requeue", job_id, {"owner": owner, "reason": ENQUEUE_FAILED})
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return bool(changed)
