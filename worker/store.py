"""The worker's side of the database: claiming a job, its lease, recording progress, finishing it.

Ownership lives in the database, not the broker (docs/worker.md, "Leases and fencing";
celery#5935): a job is claimed with a compare-and-set from ``queued``, so a redelivered
or duplicate message, or one for a job cancelled while queued, updates no row and is
dropped.
The claim also takes a lease: ``worker_id`` is the owner, ``attempt`` the fencing
token, ``lease_expires_at`` the expiry, pushed forward by the owner's heartbeat.

Every later write of an attempt is fenced: it applies only ``WHERE attempt = token
AND worker_id = owner AND status`` is live, so a terminal status is never
overwritten and a stale worker (one whose job was recovered and relaunched by
someone else) writes nothing, step records included. Step records are inserted
with insert-or-ignore on ``(job_id, step)``, so re-reading records never duplicates
or fails; a precision switch first deletes the records of the steps it trains again
(:class:`Progress`). Each write is one short transaction that starts with ``BEGIN IMMEDIATE``
on SQLite (see :mod:`halfcast.core.db.engine`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

from sqlalchemy import Connection, Engine, Insert, delete, insert, select, update

from halfcast.common.timeutil import as_utc
from halfcast.contracts import records
from halfcast.contracts.rundir import JobRuns
from halfcast.contracts.status import LIVE_STATUSES as LIVE_JOB_STATUSES
from halfcast.contracts.status import JobStatus
from halfcast.core.db import models, pending_cancels
from halfcast.core.db.engine import WRITE_TRANSACTION
from halfcast.core.db.models import TERMINAL_STATUSES, Attempt, Job, utcnow
from halfcast.core.db.transitions import Expected, Fence, compare_and_set, lock_if, write_progress

log = logging.getLogger(__name__)

#: Step records per INSERT statement.
BATCH_SIZE = 500
#: Longest ``error_reason`` the schema stores.
MAX_REASON_CHARS = 64
#: Statuses in which the claimed attempt may still write progress (:data:`halfcast.contracts.status.LIVE_STATUSES`).
LIVE_STATUSES: tuple[str, ...] = tuple(member.value for member in LIVE_JOB_STATUSES)


@dataclass(frozen=True)
class Claim:
    """A job this worker now owns: its fence, run directory, stored spec and running time used before."""

    job_id: str
    attempt: int
    run_dir: Path
    #: The stored spec, JSON as the API kept it (validated as a ``JobSpec`` once its registered inputs are resolved).
    spec: dict[str, object]
    owner: str
    runtime_used_s: float = 0.0

    @property
    def fence(self) -> Fence:
        """The fencing token of this attempt's writes."""
        return Fence(self.job_id, self.attempt, self.owner)


@dataclass(frozen=True)
class Progress:
    """What one poll of the step records adds to a job (the records as :mod:`worker.records.ingest` read them).

    ``switches``: the poll's ``precision_switch`` records (``on_divergence:
    "fallback_bf16"``), in order; each first forgets the job's step records after its
    ``rewound_to_step`` (the steps are trained again), so ``steps`` must hold only
    records written after the switch or at or before ``rewound_to_step``.
    ``known_switches``: switches a resumed run repeats in its ``start`` record (nothing
    is rewound). Both are appended to ``jobs.precision_switches`` unless already there.
    ``evals``: the poll's evaluation records (each stored in ``eval_records``; the newest
    stored one, by step, becomes ``jobs.eval``), under the same rule as ``steps``.
    ``startup``: the newest start-up phase the poll read (:func:`worker.records.ingest.startup_summary`),
    kept in ``jobs.startup``; ``None`` leaves it as it is. ``data``: the ``start`` record's data report
    (kept in ``jobs.data_report``; ``None`` leaves it as it is).
    """

    steps: Sequence[records.StepRecord] = ()
    evals: Sequence[records.EvalRecord] = ()
    world_size: int | None = None
    switches: Sequence[records.PrecisionSwitchRecord] = ()
    known_switches: Sequence[records.PrecisionSwitch] = ()
    startup: dict[str, str | float | None] | None = None
    data: dict[str, object] | None = None


class JobStore:
    """Database operations of the worker, each in its own short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit."""
        with self.engine.execution_options(**WRITE_TRANSACTION).begin() as conn:
            yield conn

    def claim(
        self,
        job_id: str,
        worker_id: str,
        runs_dir: Path,
        lease_ttl_s: float = 30.0,
        gpus: Sequence[int] = (),
        status: str = "starting",
    ) -> Claim | None:
        """Move a ``queued`` job to ``starting`` for ``worker_id`` with a lease; ``None`` if it is not queued.

        The claim also clears the job's message hold (:mod:`worker.messages.holds`): the message is
        acknowledged right after it.

        The new attempt is ``attempt + 1``; its run directory is
        ``<runs_dir>/<job_id>/attempt-<n>`` (recorded, not created). An ``attempts`` row
        is added in the same transaction, with ``gpus`` (the host indices the attempt
        was given; null when empty). ``runtime_used_s`` sums the running time of the
        job's earlier attempts (for ``max_runtime_s``). The job's ``startup`` is cleared: the
        new attempt reports its own start-up phases. ``status``: ``gathering`` for node 0 of a
        multi-node job (:mod:`worker.gang.formation`).
        """
        now = utcnow()
        with self.begin() as conn:
            row = conn.execute(select(Job.status, Job.attempt, Job.spec).where(Job.id == job_id)).one_or_none()
            if row is None or row.status != "queued":
                return None
            attempt = row.attempt + 1
            run_dir = JobRuns.of(runs_dir, job_id).attempt(attempt).path
            claimed = compare_and_set(
                conn,
                job_id,
                Expected.of(JobStatus.QUEUED, attempt=row.attempt),
                to=JobStatus(status),
                worker_id=worker_id,
                attempt=attempt,
                started_at=now,
                run_dir=str(run_dir),
                lease_expires_at=now + timedelta(seconds=lease_ttl_s),
                error_reason=None,
                error_message=None,
                held_by=None,
                held_at=None,
                startup=None,
            )
            if not claimed:
                return None
            used = _runtime_used(conn, job_id)
            conn.execute(delete(Attempt).where(Attempt.job_id == job_id, Attempt.attempt >= attempt))
            conn.execute(
                insert(Attempt).values(
                    job_id=job_id, attempt=attempt, worker_id=worker_id, started_at=now, gpus=list(gpus) or None
                )
            )
        return Claim(job_id, attempt, run_dir, row.spec, owner=worker_id, runtime_used_s=used)

    def renew_lease(self, fence: Fence, lease_ttl_s: float) -> bool:
        """Push the lease ``lease_ttl_s`` seconds ahead; ``False`` if the attempt no longer owns the job."""
        expires = utcnow() + timedelta(seconds=lease_ttl_s)
        with self.begin() as conn:
            return compare_and_set(conn, fence.job_id, Expected.fenced(fence), lease_expires_at=expires)

    def mark_running(self, fence: Fence) -> bool:
        """``starting`` → ``running`` for this attempt; ``False`` if the status moved on."""
        with self.begin() as conn:
            return compare_and_set(
                conn, fence.job_id, Expected.fenced(fence, {JobStatus.STARTING}), to=JobStatus.RUNNING
            )

    def record_progress(
        self, fence: Fence, progress: Progress, *, start_running: bool = False, job_row: bool = True
    ) -> bool:
        """Store new step and evaluation records (insert-or-ignore).

        Updates ``step``/``latest``/``eval``/``world_size``/``startup``. With ``start_running``
        (the attempt's first records) the job also goes ``starting`` → ``running`` in the same
        transaction, so no reader sees it ``running`` without the start-up phase those records
        carry (a status change that is refused, e.g. a job already ``cancelling``, stores the
        records all the same). Without ``job_row`` (step records alone, between two of
        :mod:`worker.records.pacing`'s writes) the job row is only locked, not changed.

        Returns ``False`` (and stores nothing) when the attempt no longer owns the job.
        The fenced job update (or lock) runs first, so its row lock orders this write against
        a concurrent recovery of the job. Precision switches are applied next (rewind,
        then the job's ``precision_switches``), then the poll's own values again and its
        step records, so a re-run step replaces the abandoned one instead of being
        ignored as a duplicate.
        """
        with self.begin() as conn:
            if start_running:
                compare_and_set(conn, fence.job_id, Expected.fenced(fence, {JobStatus.STARTING}), to=JobStatus.RUNNING)
            if not self._fenced_progress(conn, fence, progress, job_row):
                return False
            for table, written in ((models.StepRow, progress.steps), (models.EvalRow, progress.evals)):
                for start in range(0, len(written), BATCH_SIZE):
                    rows = [_record_row(fence.job_id, record) for record in written[start : start + BATCH_SIZE]]
                    _insert_ignore(conn, table, rows)
            if progress.evals:
                write_progress(conn, fence.job_id, eval=_newest_eval(fence.job_id))
        return True

    @staticmethod
    def _fenced_progress(conn: Connection, fence: Fence, progress: Progress, job_row: bool) -> bool:
        """The job row's part of :meth:`record_progress`: set (or, without ``job_row``, locked) if still the attempt's."""
        if not job_row:
            return lock_if(conn, fence.job_id, Expected.fenced(fence))
        values = _progress_values(progress) or {"updated_at": utcnow()}
        if not compare_and_set(conn, fence.job_id, Expected.fenced(fence), **values):
            return False
        if progress.switches or progress.known_switches:
            _record_switches(conn, fence.job_id, progress)
            write_progress(conn, fence.job_id, **values)
        return True

    def rewind(self, fence: Fence, step: int) -> bool:
        """Forget step records after ``step`` (a retry resumes from a checkpoint there; 0: it starts over).

        ``step``, ``latest`` and ``eval`` go back to what the job had at ``step``, and the
        attempt's row records ``resumed_from_step``. Returns ``False`` when the attempt no
        longer owns the job.
        """
        with self.begin() as conn:
            if not compare_and_set(conn, fence.job_id, Expected.fenced(fence), updated_at=utcnow()):
                return False
            _rewind_job(conn, fence.job_id, step)
            conn.execute(
                update(Attempt)
                .where(Attempt.job_id == fence.job_id, Attempt.attempt == fence.attempt)
                .values(resumed_from_step=step)
            )
        return True

    def queued_gpus(self, job_id: str) -> int | None:
        """The GPUs a ``queued`` job asks for (0: CPU); ``None`` if the job is not queued or does not exist.

        A spec without a valid ``gpus`` counts as 0 (the attempt then fails ``spec_invalid``).
        """
        with self.engine.connect() as conn:
            row = conn.execute(select(Job.status, Job.spec).where(Job.id == job_id)).one_or_none()
        if row is None or row.status != "queued":
            return None
        gpus = row.spec.get("gpus") if isinstance(row.spec, dict) else None
        return gpus if isinstance(gpus, int) and gpus > 0 else 0

    def status(self, job_id: str) -> str | None:
        """The job's current status; ``None`` if there is no such job."""
        with self.engine.connect() as conn:
            return conn.execute(select(Job.status).where(Job.id == job_id)).scalar_one_or_none()

    def cancel_requested(self, job_id: str) -> bool:
        """Whether the API asked to cancel the job: its status is ``cancelling``, or a cancel is recorded that
        waited on the job's locked row (:mod:`halfcast.core.db.pending_cancels`)."""
        query = select(Job.status, pending_cancels.pending_clause(job_id)).where(Job.id == job_id)
        with self.engine.connect() as conn:  # one round trip: it runs every poll of a running job
            row = conn.execute(query).one_or_none()
        return row is not None and (row.status == "cancelling" or bool(row[1]))

    def finish(
        self,
        fence: Fence,
        status: str,
        reason: str | None = None,
        message: str | None = None,
        end_info: dict[str, object] | None = None,
    ) -> bool:
        """Give the attempt its terminal ``status`` and typed error; ``False`` if it no longer owns the job.

        A ``cancelled`` job keeps no error (``error`` is null in the resource). ``end_info``:
        what the run's ``end`` record said (:func:`worker.records.ingest.end_info`), kept in
        ``jobs.end_info`` when given.
        """
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"{status!r} is not a terminal status")
        status = JobStatus(status)
        reason = reason[:MAX_REASON_CHARS] if reason else None
        if status == "cancelled":
            message = None
        now = utcnow()
        with self.begin() as conn:
            finished = compare_and_set(
                conn,
                fence.job_id,
                Expected.fenced(fence),
                to=status,
                error_reason=reason if status != "cancelled" else None,
                error_message=message,
                finished_at=now,
                lease_expires_at=None,
                **({"end_info": end_info} if end_info is not None else {}),
            )
            if not finished:
                return False
            end_attempt(conn, fence, status, reason, now)
            pending_cancels.clear(conn, fence.job_id)
        return True


def end_attempt(conn: Connection, fence: Fence, status: str, reason: str | None, ended_at: datetime) -> None:
    """Record how attempt ``fence.attempt`` ended (its ``attempts`` row), inside ``conn``'s transaction."""
    conn.execute(
        update(Attempt)
        .where(Attempt.job_id == fence.job_id, Attempt.attempt == fence.attempt, Attempt.ended_at.is_(None))
        .values(ended_at=ended_at, status=str(status), reason=reason[:MAX_REASON_CHARS] if reason else None)
    )


def _rewind_job(conn: Connection, job_id: str, step: int) -> None:
    """Delete the step and evaluation records after ``step``; ``step``, ``latest`` and ``eval`` as at ``step``.

    ``eval`` becomes the newest evaluation at or before ``step`` (``None`` if none).
    Runs inside a transaction whose fenced update already matched the job's row.
    """
    steps, evals = models.StepRow, models.EvalRow
    latest = conn.execute(select(steps.data).where(steps.job_id == job_id, steps.step == step)).scalar_one_or_none()
    conn.execute(delete(steps).where(steps.job_id == job_id, steps.step > step))
    conn.execute(delete(evals).where(evals.job_id == job_id, evals.step > step))
    write_progress(conn, job_id, step=step, latest=latest, eval=_newest_eval(job_id))


def _newest_eval(job_id: str) -> Any:
    """The stored evaluation of ``job_id`` with the highest step, as a scalar subquery (NULL if none)."""
    evals = models.EvalRow
    query = select(evals.data).where(evals.job_id == job_id).order_by(evals.step.desc()).limit(1)
    return query.scalar_subquery()


#: The fields that identify a precision switch (a retry that replays one records it once).
SWITCH_KEYS = ("step", "from", "to", "reason", "rewound_to_step")


def _record_switches(conn: Connection, job_id: str, progress: Progress) -> None:
    """Rewind for each of ``progress.switches`` in order, then append the new switches to ``precision_switches``."""
    for switch in progress.switches:
        _rewind_job(conn, job_id, switch.rewound_to_step)
    stored = list(conn.execute(select(Job.precision_switches).where(Job.id == job_id)).scalar_one_or_none() or [])
    known = {tuple(item.get(key) for key in SWITCH_KEYS) for item in stored}
    candidates: list[records.PrecisionSwitch] = [
        *progress.known_switches,
        *progress.switches,
    ]
    for candidate in candidates:
        body = candidate.body()
        identity = tuple(body.get(key) for key in SWITCH_KEYS)
        if identity not in known:
            known.add(identity)
            stored.append(body)
    write_progress(conn, job_id, precision_switches=stored)


def _runtime_used(conn: Connection, job_id: str) -> float:
    """Seconds the job's ended attempts ran (each from its start to its end)."""
    rows = conn.execute(select(Attempt.started_at, Attempt.ended_at).where(Attempt.job_id == job_id))
    return sum(
        max(0.0, (as_utc(ended) - as_utc(started)).total_seconds()) for started, ended in rows if ended is not None
    )


class _ProgressValues(TypedDict, total=False):
    """The job columns a poll's progress sets (``updated_at`` alone when it brings none of the others)."""

    latest: dict[str, object]
    step: int
    world_size: int
    startup: dict[str, str | float | None]
    data_report: dict[str, object]
    updated_at: datetime


class _RecordRow(TypedDict):
    """A ``step_records``/``eval_records`` row."""

    job_id: str
    step: int
    time: float
    data: dict[str, object]


def _progress_values(progress: Progress) -> _ProgressValues:
    values: _ProgressValues = {}
    if progress.steps:
        latest = max(progress.steps, key=lambda record: record.step)
        values["latest"] = latest.body()
        values["step"] = latest.step
    if progress.world_size is not None:
        values["world_size"] = progress.world_size
    if progress.startup is not None:
        values["startup"] = records.finite(progress.startup)
    if progress.data is not None:
        values["data_report"] = records.finite(progress.data)
    return values


def _record_row(job_id: str, record: records.StepRecord | records.EvalRecord) -> _RecordRow:
    """A ``step_records``/``eval_records`` row: the record keyed by ``(job_id, step)``, whole in ``data``."""
    return {"job_id": job_id, "step": record.step, "time": float(record.time or 0.0), "data": record.body()}


def _insert_ignore(
    conn: Connection, table: type[models.StepRow] | type[models.EvalRow], rows: list[_RecordRow]
) -> None:
    """Insert ``rows`` into ``table``, skipping steps already stored.

    On PostgreSQL and SQLite one ``INSERT ... ON CONFLICT DO NOTHING`` statement executed for all
    the rows (an executemany): compiled once per table and cached, where a multi-row ``VALUES``
    of this poll's length was compiled and converted anew on every poll.
    """
    if not rows:
        return
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        conn.execute(_insert_ignore_statement(dialect, table), rows)
        return
    steps = [row["step"] for row in rows]
    query = select(table.step).where(table.job_id == rows[0]["job_id"], table.step.in_(steps))
    existing = set(conn.execute(query).scalars())
    fresh = [row for row in rows if row["step"] not in existing]
    if fresh:
        conn.execute(insert(table), fresh)


@cache
def _insert_ignore_statement(dialect: str, table: type[models.StepRow] | type[models.EvalRow]) -> Insert:
    """``INSERT INTO table ... ON CONFLICT (job_id, step) DO NOTHING`` for ``dialect`` (postgresql or sqlite)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing(index_elements=["job_id", "step"])
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=["job_id", "step"])
