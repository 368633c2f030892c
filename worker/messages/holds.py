"""Message holds: which worker has taken a queued job's broker message, so a dead holder strands nothing.

A queued job's message is unacknowledged while the task that took it runs before
the claim (waiting for a free GPU, say); the claim acknowledges it. If that worker
dies meanwhile (SIGKILL, a lost host), Redis delivers the message again only after
its visibility timeout (an hour by default), and the job would wait ``queued`` that
long although other workers are free.

So the task records its hold on the job row first (``jobs.held_by``: its worker id
``<hostname>/<pid>``, the same id as its roster row and its leases;
``jobs.held_at``), and the claim (or the hand-back of the message) clears it. Every
worker's reaper looks for queued jobs held by a worker that is not live (no
roster row, or a heartbeat older than ``HALFCAST_WORKER_LIVE_S``) since longer than
that same window, clears the hold with a compare-and-set (so one reaper wins) and
sends a new message. A duplicate message (the old one delivered again after all) is
dropped by the claim's compare-and-set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, or_, select

from halfcast.contracts.status import JobStatus
from halfcast.core.db.engine import WRITE_TRANSACTION
from halfcast.core.db.models import Job, Worker, utcnow
from halfcast.core.db.transitions import Expected, compare_and_set

log = logging.getLogger(__name__)

#: Sends a job id to the workers (``halfcast.run_job``).
Enqueue = Callable[[str], None]


@dataclass(frozen=True)
class StrandedHold:
    """A queued job whose message is held by a worker that is not live."""

    job_id: str
    held_by: str
    held_at: datetime | None


class MessageHolds:
    """Records, clears and recovers the holds of queued jobs' messages in ``jobs``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def hold(self, job_id: str, worker_id: str) -> bool:
        """Record that ``worker_id`` holds the message of ``job_id``; ``False`` if the job is not queued."""
        with self.engine.execution_options(**WRITE_TRANSACTION).begin() as conn:
            return compare_and_set(conn, job_id, Expected.of(JobStatus.QUEUED), held_by=worker_id, held_at=utcnow())

    def release(self, job_id: str, worker_id: str) -> bool:
        """Clear the hold of ``worker_id`` (not another worker's) on ``job_id``; ``False`` if it held none."""
        with self.engine.execution_options(**WRITE_TRANSACTION).begin() as conn:
            return _clear(conn, job_id, worker_id)

    def stranded(self, live_s: float, now: datetime | None = None) -> list[StrandedHold]:
        """Queued jobs held for over ``live_s`` seconds by a worker with no heartbeat in the last ``live_s``."""
        since = (now or utcnow()) - timedelta(seconds=live_s)
        live = select(Worker.id).where(Worker.heartbeat_at >= since)
        query = select(Job.id, Job.held_by, Job.held_at).where(
            Job.status == "queued",
            Job.held_by.is_not(None),
            or_(Job.held_at.is_(None), Job.held_at < since),
            Job.held_by.not_in(live),
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        # held_by is never None here (the WHERE above), but the column is nullable
        return [StrandedHold(job_id, held_by, held_at) for job_id, held_by, held_at in rows if held_by is not None]

    def resend(self, stranded: StrandedHold, enqueue: Enqueue) -> bool:
        """Take the stranded hold over (compare-and-set) and send the job a new message; ``False`` if lost."""
        with self.engine.execution_options(**WRITE_TRANSACTION).begin() as conn:
            if not _clear(conn, stranded.job_id, stranded.held_by, queued=True):
                return False
        try:
            enqueue(stranded.job_id)
        except Exception:
            self._restore(stranded)  # the next pass tries again
            raise
        log.warning(
            "job %s: its message was held by %s, which is not live: sent again", stranded.job_id, stranded.held_by
        )
        return True

    def _restore(self, stranded: StrandedHold) -> None:
        """Put a stranded hold back after its new message could not be sent (unless the job moved on)."""
        unheld = Expected.of(JobStatus.QUEUED, where=(Job.held_by.is_(None),))
        with self.engine.execution_options(**WRITE_TRANSACTION).begin() as conn:
            compare_and_set(conn, stranded.job_id, unheld, held_by=stranded.held_by, held_at=stranded.held_at)

    def recover(self, live_s: float, enqueue: Enqueue) -> list[str]:
        """Send a new message for every stranded hold this reaper wins; the job ids."""
        return [hold.job_id for hold in self.stranded(live_s) if self.resend(hold, enqueue)]


def _clear(conn: Connection, job_id: str, worker_id: str, queued: bool = False) -> bool:
    """Clear the hold if ``worker_id`` holds ``job_id`` (and, with ``queued``, it is queued); whether it did."""
    held = Expected(frozenset({JobStatus.QUEUED}) if queued else None, where=(Job.held_by == worker_id,))
    return compare_and_set(conn, job_id, held, held_by=None, held_at=None)
