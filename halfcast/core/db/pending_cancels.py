"""Cancels that waited on a locked job row: recorded (``cancel_requests``, migration 0014), read by the worker.

``POST /jobs/{id}/cancel`` waits at most :data:`CANCEL_LOCK_WAIT_S` for the job's row. When another
session holds it longer, the route records the request here instead and answers at once (``202``,
the job as it reads now, which a row lock does not block on PostgreSQL). The worker running the job
treats a recorded request as a cancel (:meth:`worker.store.JobStore.cancel_requested`, one query with the status) and its
fenced ``cancelled`` write goes through once the lock is gone; a job that is still ``queued`` is
cancelled before launch. The request is removed when its job ends.
"""

from __future__ import annotations

from sqlalchemy import Connection, Exists, delete, exists
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from halfcast.core.db.models import CancelRequest, utcnow

#: Seconds the cancel route waits for the job's row before it records the request instead.
CANCEL_LOCK_WAIT_S = 1.0
#: PostgreSQL's SQLSTATE of a lock wait past ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"


def row_was_locked(exc: DBAPIError) -> bool:
    """Whether ``exc`` is PostgreSQL giving up on a lock (``lock_timeout``)."""
    return getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


def record(session: Session, job_id: str, requested_by: str) -> None:
    """Record a cancel of ``job_id`` (a second one for the same job changes nothing); commits."""
    try:
        session.add(CancelRequest(job_id=job_id, requested_at=utcnow(), requested_by=requested_by))
        session.commit()
    except IntegrityError:
        session.rollback()


def pending_clause(job_id: str) -> Exists:
    """``EXISTS`` a recorded cancel of ``job_id``: a column to read along with the job's row."""
    return exists().where(CancelRequest.job_id == job_id)


def clear(conn: Connection, job_id: str) -> None:
    """Forget the recorded cancel of ``job_id`` (its job ended), inside ``conn``'s transaction."""
    conn.execute(delete(CancelRequest).where(CancelRequest.job_id == job_id))
