"""Ending an attempt that lost its worker: requeue the job (to resume), or end it.

Used by the reaper (for leases that expired: the worker died, hung or lost its
host) and by the runner itself (the worker is shutting down). The decision, taken
in one transaction on the job row, is:

- a ``cancelling`` job becomes ``cancelled`` (its run is gone with its worker);
- else, if the retry policy allows it (:mod:`worker.lifecycle.reasons`; ``worker_lost`` is
  retried up to the spec's ``max_attempts``), the job goes back to ``queued`` with no
  owner and a new message is sent; the next attempt resumes from the newest
  checkpoint of the earlier ones (:func:`worker.lifecycle.checkpoints.retry_checkpoint`);
- else it ends ``failed`` with the reason.

The attempt's own row says what became of it (:func:`attempt_status`): ``cancelled``,
``requeued`` for a graceful shutdown that handed the job back (reason ``worker_shutdown``:
stopped on purpose, not a failure, not counted), else ``failed`` (a lost worker's
attempt failed, even when the job is retried).

Each path is a compare-and-set on the observed status, attempt and owner (and, for
the reaper, on the lease still being expired), so several reapers, or a reaper and a
worker that comes back, never both act on one attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict

from sqlalchemy import Connection, func, or_, select

from halfcast.common.timeutil import as_utc
from halfcast.contracts.status import AttemptStatus, FailureReason, JobStatus
from halfcast.core.db.members import close_expired_members
from halfcast.core.db.models import Attempt, Job, utcnow
from halfcast.core.db.transitions import Expected, Owner, compare_and_set
from worker.lifecycle.reasons import UNCOUNTED_REASONS, should_retry
from worker.store import LIVE_STATUSES, MAX_REASON_CHARS, Fence, JobStore, end_attempt

log = logging.getLogger(__name__)

#: ``max_attempts`` of a stored spec that has none (the spec's default).
DEFAULT_MAX_ATTEMPTS = 3

Resolution = Literal["requeued", "failed", "cancelled"]
#: The status a job resolved so gets.
RESOLVED_STATUS: dict[Resolution, JobStatus] = {
    "requeued": JobStatus.QUEUED,
    "failed": JobStatus.FAILED,
    "cancelled": JobStatus.CANCELLED,
}
#: Sends a job id to the workers (``halfcast.run_job``); raises when the broker refuses it.
Enqueue = Callable[[str], None]


@dataclass(frozen=True)
class ExpiredLease:
    """A live job whose lease ran out: nobody is known to supervise it."""

    job_id: str
    status: str
    attempt: int
    owner: str | None
    lease_expires_at: datetime | None


class Recovery:
    """Requeues or ends attempts whose worker is gone; ``enqueue`` sends the retry's message."""

    def __init__(self, store: JobStore, enqueue: Enqueue | None) -> None:
        self.store = store
        self.enqueue = enqueue

    def expired_leases(self, now: datetime | None = None) -> list[ExpiredLease]:
        """Jobs in ``starting``/``running``/``cancelling`` whose lease expired before ``now`` (or has none)."""
        now = now or utcnow()
        query = select(Job.id, Job.status, Job.attempt, Job.worker_id, Job.lease_expires_at).where(
            Job.status.in_(LIVE_STATUSES), or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)
        )
        with self.store.engine.connect() as conn:
            return [ExpiredLease(*row) for row in conn.execute(query)]

    def recover_expired(self, lease: ExpiredLease, now: datetime | None = None) -> Resolution | None:
        """Recover a job found by :meth:`expired_leases` if its lease is still expired; ``None`` if not."""
        now = now or utcnow()
        since = "never" if lease.lease_expires_at is None else as_utc(lease.lease_expires_at).isoformat()
        message = (
            f"worker {lease.owner} stopped renewing the lease of attempt {lease.attempt} "
            f"(expired at {since}); it is presumed dead"
        )
        reason = FailureReason.WORKER_LOST
        return self._resolve(lease.job_id, lease.attempt, lease.owner, reason, message, expired_before=now)

    def release(self, fence: Fence, reason: str, message: str) -> Resolution | None:
        """End this worker's own attempt that failed with ``reason`` (retried by policy); ``None`` if not owned."""
        return self._resolve(fence.job_id, fence.attempt, fence.owner, reason, message, expired_before=None)

    def _resolve(
        self, job_id: str, attempt: int, owner: str | None, reason: str, message: str, expired_before: datetime | None
    ) -> Resolution | None:
        now = utcnow()
        with self.store.begin() as conn:
            row = conn.execute(
                select(Job.status, Job.attempt, Job.worker_id, Job.spec, Job.lease_expires_at)
                .where(Job.id == job_id)
                .with_for_update()
            ).one_or_none()
            if row is None or row.status not in LIVE_STATUSES or row.attempt != attempt or row.worker_id != owner:
                return None
            renewed = row.lease_expires_at is not None and as_utc(row.lease_expires_at) >= (expired_before or now)
            if expired_before is not None and renewed:
                return None  # renewed meanwhile: its worker is alive
            max_attempts = _max_attempts(row.spec)
            used = _counted_attempts(conn, job_id, attempt, reason)
            retry = self.enqueue is not None and should_retry(reason, used, max_attempts)
            if not retry and should_retry(reason, 0, max_attempts):
                message = f"{message} (attempt {used} of max_attempts {max_attempts}: no retry left)"
            resolution, values = _decide(row.status, reason, message, retry, now)
            observed = Expected.of(row.status, attempt=attempt, owner=Owner.NONE if owner is None else owner)
            if not compare_and_set(conn, job_id, observed, to=RESOLVED_STATUS[resolution], **values):
                return None
            end_attempt(conn, Fence(job_id, attempt, owner or ""), attempt_status(resolution, reason), reason, now)
            if expired_before is not None:  # the reaper: a multi-node attempt's memberships of dead workers
                close_expired_members(conn, job_id, attempt, now, dead_worker=owner)
        log.warning("job %s: attempt %d of worker %s ended (%s): %s", job_id, attempt, owner, reason, resolution)
        if resolution == "requeued":
            self._send(job_id, attempt)
        return resolution

    def _send(self, job_id: str, attempt: int) -> None:
        """Send the requeued job's message; if that fails, end the job ``enqueue_failed`` (never stuck queued)."""
        try:
            if self.enqueue is None:
                raise RuntimeError("this process has no broker to send it to")
            self.enqueue(job_id)
            return
        except Exception as exc:
            log.exception("job %s: could not send its retry to the broker", job_id)
            error = f"the job was requeued after attempt {attempt} but could not be sent to the broker: {exc}"
        requeued = Expected.of(JobStatus.QUEUED, attempt=attempt, owner=Owner.NONE)
        with self.store.begin() as conn:
            compare_and_set(
                conn,
                job_id,
                requeued,
                to=JobStatus.FAILED,
                error_reason=FailureReason.ENQUEUE_FAILED,
                error_message=error,
                finished_at=utcnow(),
            )


def attempt_status(resolution: Resolution, reason: str) -> AttemptStatus:
    """How the attempt that ended with ``reason`` is recorded when its job was ``resolution``.

    ``requeued`` only for an uncounted reason (:data:`worker.lifecycle.reasons.UNCOUNTED_REASONS`: the
    worker's graceful shutdown) whose job went back to the queue; without a broker to take
    it back the job failed, and so did the attempt.
    """
    if resolution == "cancelled":
        return AttemptStatus.CANCELLED
    requeued = resolution == "requeued" and reason in UNCOUNTED_REASONS
    return AttemptStatus.REQUEUED if requeued else AttemptStatus.FAILED


class _Columns(TypedDict, total=False):
    """The ``jobs`` columns :func:`_decide` sets besides the status."""

    lease_expires_at: datetime | None
    finished_at: datetime
    worker_id: str | None
    error_reason: str | None
    error_message: str | None


def _decide(status: str, reason: str, message: str, retry: bool, now: datetime) -> tuple[Resolution, _Columns]:
    """What becomes of a live job whose attempt ended with ``reason``, and the other column values for it."""
    released: _Columns = {"lease_expires_at": None}
    if status == "cancelling":
        return "cancelled", {**released, "finished_at": now}
    if retry:
        return "requeued", {**released, "worker_id": None, "error_reason": None, "error_message": None}
    return "failed", {
        **released,
        "error_reason": reason[:MAX_REASON_CHARS],
        "error_message": message,
        "finished_at": now,
    }


def _max_attempts(spec: Any) -> int:
    try:
        return max(1, int(spec.get("max_attempts", DEFAULT_MAX_ATTEMPTS)))
    except (AttributeError, TypeError, ValueError):
        return DEFAULT_MAX_ATTEMPTS


def _counted_attempts(conn: Connection, job_id: str, attempt: int, reason: str) -> int:
    """Attempts up to ``attempt`` (ending now with ``reason``) that count against ``max_attempts``.

    Attempts ended by a graceful worker shutdown (:data:`UNCOUNTED_REASONS`) do not: a
    restarted service must not use up a job's retries.
    """
    earlier = conn.execute(
        select(func.count())
        .select_from(Attempt)
        .where(Attempt.job_id == job_id, Attempt.attempt < attempt, Attempt.reason.in_(UNCOUNTED_REASONS))
    ).scalar_one()
    return attempt - int(earlier) - (1 if reason in UNCOUNTED_REASONS else 0)
