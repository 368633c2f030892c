"""API-side reads of the worker roster (``workers``, written by ``worker/roster.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from halfcast.common.timeutil import as_utc
from halfcast.core.db.models import ACTIVE_STATUSES, Job, Worker


@dataclass(frozen=True)
class WorkerState:
    """A registered worker, whether it is live, and the ids of its jobs that are not terminal."""

    row: Worker
    live: bool
    running_jobs: Sequence[str]


def list_workers(
    session: Session, now: datetime, live_s: float, forget_s: float, *, owner: str | None = None
) -> list[WorkerState]:
    """Workers that heartbeat within ``forget_s`` seconds of ``now``, by id; live if within ``live_s``.

    ``running_jobs`` lists only ``owner``'s jobs when ``owner`` is given (every job when ``None``).
    """
    since = now - timedelta(seconds=forget_s)
    rows = session.scalars(select(Worker).where(Worker.heartbeat_at >= since).order_by(Worker.id)).all()
    jobs: dict[str, list[str]] = {row.id: [] for row in rows}
    if jobs:
        query = select(Job.worker_id, Job.id).where(Job.worker_id.in_(jobs), Job.status.in_(ACTIVE_STATUSES))
        if owner is not None:
            query = query.where(Job.owner == owner)
        for worker_id, job_id in session.execute(query.order_by(Job.created_at, Job.id)):
            if worker_id is not None:  # never None (the IN above), but the column is nullable
                jobs[worker_id].append(job_id)
    live_since = now - timedelta(seconds=live_s)
    return [WorkerState(row, as_utc(row.heartbeat_at) >= live_since, jobs[row.id]) for row in rows]


def largest_gpu_count(session: Session, now: datetime, forget_s: float) -> int | None:
    """Most GPUs of one worker that heartbeat within ``forget_s`` seconds of ``now``; ``None`` if there is none."""
    since = now - timedelta(seconds=forget_s)
    gpus = session.scalars(select(Worker.gpus).where(Worker.heartbeat_at >= since)).all()
    return max((len(listed or []) for listed in gpus), default=None)
