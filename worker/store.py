"""The worker's side of the database: claiming a job, recording progress, finishing it.

Ownership lives in the database, not the broker (DESIGN.md §7, celery#5935): a job
is claimed with a compare-and-set from ``queued``, so a redelivered or duplicate
message, or one for a job cancelled while queued, updates no row and is dropped.
Every later write is guarded by the claimed ``attempt`` and a non-terminal status,
so a terminal status is never overwritten and a stale attempt writes nothing.
Step records are inserted with insert-or-ignore on ``(job_id, step)``, so
re-reading records never duplicates or fails.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Insert, insert, select, update

from server.db.models import TERMINAL_STATUSES, Job, StepRecord, utcnow

log = logging.getLogger(__name__)

#: Step records per INSERT statement.
BATCH_SIZE = 500
#: Longest ``error_reason`` the schema stores.
MAX_REASON_CHARS = 64
#: Statuses in which the claimed attempt may still write progress.
LIVE_STATUSES = ("starting", "running", "cancelling")


@dataclass(frozen=True)
class Claim:
    """A job this worker now owns: its attempt number, run directory and stored spec."""

    job_id: str
    attempt: int
    run_dir: Path
    spec: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    """What one poll of the step records adds to a job."""

    steps: Sequence[dict[str, Any]] = ()
    eval: dict[str, Any] | None = None
    world_size: int | None = None


class JobStore:
    """Database operations of the worker, each in its own short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def claim(self, job_id: str, worker_id: str, runs_dir: Path) -> Claim | None:
        """Move a ``queued`` job to ``starting`` for this worker; ``None`` if it is not queued.

        The new attempt is ``attempt + 1``; its run directory is
        ``<runs_dir>/<job_id>/attempt-<n>`` (recorded, not created).
        """
        with self._begin() as conn:
            row = conn.execute(select(Job.status, Job.attempt, Job.spec).where(Job.id == job_id)).one_or_none()
            if row is None or row.status != "queued":
                return None
            attempt = row.attempt + 1
            run_dir = runs_dir / job_id / f"attempt-{attempt}"
            claimed = conn.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == "queued", Job.attempt == row.attempt)
                .values(status="starting", worker_id=worker_id, attempt=attempt, started_at=utcnow(), run_dir=str(run_dir))
            ).rowcount
        return Claim(job_id, attempt, run_dir, row.spec) if claimed == 1 else None

    def mark_running(self, job_id: str, attempt: int) -> bool:
        """``starting`` → ``running`` for this attempt; ``False`` if the status moved on."""
        with self._begin() as conn:
            return conn.execute(self._guarded(job_id, attempt, ("starting",)).values(status="running")).rowcount == 1

    def record_progress(self, job_id: str, attempt: int, progress: Progress) -> None:
        """Store new step records (insert-or-ignore) and update ``step``/``latest``/``eval``/``world_size``."""
        values = _progress_values(progress)
        if not values and not progress.steps:
            return
        with self._begin() as conn:
            for start in range(0, len(progress.steps), BATCH_SIZE):
                rows = [_step_row(job_id, record) for record in progress.steps[start : start + BATCH_SIZE]]
                if (statement := _insert_ignore(conn, rows)) is not None:
                    conn.execute(statement)
            if values:
                conn.execute(self._guarded(job_id, attempt, LIVE_STATUSES).values(**values))

    def status(self, job_id: str) -> str | None:
        """The job's current status; ``None`` if there is no such job."""
        with self.engine.connect() as conn:
            return conn.execute(select(Job.status).where(Job.id == job_id)).scalar_one_or_none()

    def cancel_requested(self, job_id: str) -> bool:
        """Whether the API asked to cancel the job (its status is ``cancelling``)."""
        return self.status(job_id) == "cancelling"

    def finish(self, job_id: str, attempt: int, status: str, reason: str | None = None, message: str | None = None) -> bool:
        """Give the attempt its terminal ``status`` and typed error; ``False`` if it was already terminal."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"{status!r} is not a terminal status")
        live = tuple(sorted({"queued", *LIVE_STATUSES}))
        with self._begin() as conn:
            statement = self._guarded(job_id, attempt, live).values(
                status=status,
                error_reason=reason[:MAX_REASON_CHARS] if reason else None,
                error_message=message,
                finished_at=utcnow(),
            )
            return conn.execute(statement).rowcount == 1

    @staticmethod
    def _guarded(job_id: str, attempt: int, statuses: Sequence[str]) -> Any:
        return update(Job).where(Job.id == job_id, Job.attempt == attempt, Job.status.in_(statuses))


def _progress_values(progress: Progress) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if progress.steps:
        latest = max(progress.steps, key=lambda record: int(record["step"]))
        values["latest"] = json_safe(latest)
        values["step"] = int(latest["step"])
    if progress.eval is not None:
        values["eval"] = json_safe(progress.eval)
    if progress.world_size is not None:
        values["world_size"] = progress.world_size
    return values


def _step_row(job_id: str, record: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job_id, "step": int(record["step"]), "time": float(record.get("time") or 0.0), "data": json_safe(record)}


def _insert_ignore(conn: Connection, rows: list[dict[str, Any]]) -> Insert | None:
    """INSERT of ``rows`` that skips steps already stored (``None``: nothing to insert)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(StepRecord).values(rows).on_conflict_do_nothing(index_elements=["job_id", "step"])
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(StepRecord).values(rows).on_conflict_do_nothing(index_elements=["job_id", "step"])
    steps = [row["step"] for row in rows]
    query = select(StepRecord.step).where(StepRecord.job_id == rows[0]["job_id"], StepRecord.step.in_(steps))
    existing = set(conn.execute(query).scalars())
    fresh = [row for row in rows if row["step"] not in existing]
    return insert(StepRecord).values(fresh) if fresh else None


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (strict JSON, Postgres ``json``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    return value
